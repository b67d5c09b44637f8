// Partial states computed in bounded groups and merged in slice order: the scheme split-K and decode
// share. Work items are numbered so that each row's slices come in slice order. A group of items
// [i0, i1) is computed in parallel into a buffer of bounded size; then every row merges the group's
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

// compute(item, slot) fills the partials of `item` at buffer position `slot` = item - i0;
// merge(row, i0, i1) folds the partials of items [i0, i1) that belong to `row` into its running state.
// Call from inside an OpenMP parallel region: every thread walks the same groups.
template <class Compute, class Merge>
void run_slice_groups(std::int64_t items, std::int64_t group, std::int64_t rows, Compute&& compute, Merge&& merge) {
  for (std::int64_t i0 = 0; i0 < items; i0 += group) {
    const std::int64_t i1 = std::min(items, i0 + group);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t it = i0; it < i1; ++it) compute(it, it - i0);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) merge(r, i0, i1);
  }
}

}  // namespace attn::detail
