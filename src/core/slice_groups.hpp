// Partial states computed in bounded groups and merged in slice order: the scheme split-K and decode
// share. Work items are numbered so that each row's slices come in slice order. A group of items
// [begin, end) is computed in parallel into a buffer of bounded size; then every row merges the group's
// partials of that row into its running state, in item order. That is one left fold over the slices
// whatever the group size, so neither the grouping nor the thread count changes a bit of the result,
// and any number of slices runs in bounded memory.
#pragma once

#include <algorithm>
#include <cstdint>

namespace attn::detail {

// Items per group so that their partial states fit in `budget` accumulator values.
inline std::int64_t items_per_group(std::int64_t budget, std::int64_t values_per_item, std::int64_t items) {
  return std::clamp<std::int64_t>(budget / std::max<std::int64_t>(1, values_per_item), 1,
                                  std::max<std::int64_t>(1, items));
}

// compute(item, slot) fills the partials of `item` at buffer position `slot` = item - begin;
// merge(row, begin, end) folds the partials of items [begin, end) that belong to `row` into its running
// state.
// Call from inside an OpenMP parallel region: every thread walks the same groups.
template <class Compute, class Merge>
void run_slice_groups(std::int64_t items, std::int64_t group, std::int64_t rows, Compute&& compute, Merge&& merge) {
  for (std::int64_t begin = 0; begin < items; begin += group) {
    const std::int64_t end = std::min(items, begin + group);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t it = begin; it < end; ++it) compute(it, it - begin);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) merge(r, begin, end);
  }
}

}  // namespace attn::detail
