// The tiled backward's memory, outside the per-target code: an aligned buffer, and the layout of one
// job (every problem's tasks, and the dK/dV partials each task accumulates into).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <vector>

#include "backward/backward_kernel.hpp"
#include "core/element.hpp"

namespace attn::detail {

// `n` elements of A, 64-byte aligned (whole-vector loads need the alignment of the widest target).
template <class A>
class AlignedBuffer {
 public:
  explicit AlignedBuffer(std::size_t n)
      : data_(static_cast<A*>(::operator new (std::max<std::size_t>(n, 1) * sizeof(A), std::align_val_t{64}))),
        size_(n) {}
  ~AlignedBuffer() { ::operator delete (data_, std::align_val_t{64}); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr; }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(AlignedBuffer&&) = delete;
  A* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  A* data_;
  std::size_t size_;
};

// The tasks of a job: problem-major, then (b, kv head, chunk). Each task owns the dK and dV partials of
// its (b, kv head, chunk): 2 keys(p) dp accumulators, dK first, keys(p) = seqlen_k rounded up to
// `key_multiple` (the AMX kernel's tiles store whole blocks of 32 keys).
struct BackwardLayout {
  struct Task {
    std::uint32_t problem;
    std::int64_t b, hk, chunk;
  };
  std::vector<std::int64_t> first_task{0}, first_head{0};
  std::vector<std::size_t> first_partial{0};
  std::size_t partial_elements = 0, max_R = 0, max_bc = 1, max_keys = 0, dp, key_multiple;

  // `row_multiple`: a query tile's rows are padded to a multiple of it (the lanes, the block rows).
  BackwardLayout(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& plans, std::size_t dp_,
                 std::size_t row_multiple, std::size_t key_multiple_ = 1)
      : dp(dp_), key_multiple(key_multiple_) {
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const BackwardProblem& p = ps[i];
      const std::int64_t heads = p.batch * p.kv_heads;
      first_task.push_back(first_task.back() + heads * plans[i].chunks);
      first_head.push_back(first_head.back() + heads);
      const std::size_t per_task = 2 * keys(p) * dp;
      max_keys = std::max(max_keys, keys(p));
      first_partial.push_back(first_partial.back() + static_cast<std::size_t>(heads * plans[i].chunks) * per_task);
      const std::size_t r = static_cast<std::size_t>(plans[i].q_tile);
      max_R = std::max(max_R, (r + row_multiple - 1) / row_multiple * row_multiple);
      max_bc = std::max(max_bc, static_cast<std::size_t>(plans[i].k_tile));
    }
    partial_elements = first_partial.back();
  }
  std::size_t keys(const BackwardProblem& p) const {
    return (static_cast<std::size_t>(p.seqlen_k) + key_multiple - 1) / key_multiple * key_multiple;
  }
  std::uint32_t problem_of(const std::vector<std::int64_t>& first, std::int64_t t) const {
    return static_cast<std::uint32_t>(std::upper_bound(first.begin(), first.end(), t) - first.begin() - 1);
  }
  // Task t: chunks innermost, so a (b, kv head)'s chunks run side by side and share K and V in L3.
  Task task(const std::vector<BackwardPlan>& plans, const std::vector<BackwardProblem>& ps, std::int64_t t) const {
    const std::uint32_t pi = problem_of(first_task, t);
    const std::int64_t local = t - first_task[pi], chunks = plans[pi].chunks, kvh = ps[pi].kv_heads;
    return {pi, local / chunks / kvh, local / chunks % kvh, local % chunks};
  }
  // Head e of the merge: (problem, b, kv head) with chunk 0.
  Task head(const std::vector<BackwardProblem>& ps, std::int64_t e) const {
    const std::uint32_t pi = problem_of(first_head, e);
    const std::int64_t local = e - first_head[pi];
    return {pi, local / ps[pi].kv_heads, local % ps[pi].kv_heads, 0};
  }
  std::size_t partial_offset(const std::vector<BackwardPlan>& plans, const std::vector<BackwardProblem>& ps,
                             const Task& t) const {
    const BackwardProblem& p = ps[t.problem];
    const std::int64_t index = (t.b * p.kv_heads + t.hk) * plans[t.problem].chunks + t.chunk;
    return first_partial[t.problem] + static_cast<std::size_t>(index) * 2 * keys(p) * dp;
  }
};

// Gradient rows [s0, s0 + n) of head h from `src` (rows ld apart) into t, as T, or in the accumulator type
// when the view has it (a ring block's partial gradients, summed later: src/distributed/ring_grad.cpp).
template <class T, class A>
void store_gradient_rows(const TensorView& t, const A* src, std::size_t ld, std::int64_t b, std::int64_t s0,
                         std::int64_t n, std::int64_t h, std::size_t dim) {
  if constexpr (!std::is_same_v<T, A>)
    if (t.dtype != dtype_of<T>()) return store_gradient_rows<A, A>(t, src, ld, b, s0, n, h, dim);
  for (std::int64_t r = 0; r < n; ++r) {
    T* dst = row_ptr<T>(t, b, s0 + r, h);
    const A* row = src + static_cast<std::size_t>(r) * ld;
    for (std::size_t x = 0; x < dim; ++x) dst[x * t.strides[3]] = store<T>(row[x]);
  }
}

// Head e of the merge (problem, b, kv head): its chunks' dK, dV partials summed into chunk 0's in chunk
// order (the same sums for any thread count), then stored as dK and dV.
template <class T, class A>
void store_key_gradients(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& plans,
                         const BackwardLayout& layout, A* partials, std::int64_t e) {
  BackwardLayout::Task task = layout.head(ps, e);
  const BackwardProblem& p = ps[task.problem];
  A* first = partials + layout.partial_offset(plans, ps, task);
  const std::size_t half = layout.keys(p) * layout.dp;
  for (task.chunk = 1; task.chunk < plans[task.problem].chunks; ++task.chunk) {
    const A* part = partials + layout.partial_offset(plans, ps, task);
    for (std::size_t x = 0; x < 2 * half; ++x) first[x] += part[x];
  }
  const std::size_t dp = layout.dp;
  store_gradient_rows<T>(p.dk, first, dp, task.b, 0, p.seqlen_k, task.hk, static_cast<std::size_t>(p.head_dim));
  store_gradient_rows<T>(p.dv, first + half, dp, task.b, 0, p.seqlen_k, task.hk,
                         static_cast<std::size_t>(p.head_dim_v));
}

}  // namespace attn::detail
