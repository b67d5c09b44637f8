// The tiled backward's memory, outside the per-target code: an aligned buffer, and the layout of one
// job (every problem's tasks, and the dK/dV partials each task accumulates into).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "backward/backward_kernel.hpp"

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
// its (b, kv head, chunk): 2 seqlen_k dp accumulators, dK first.
struct BackwardLayout {
  struct Task {
    std::uint32_t problem;
    std::int64_t b, hk, chunk;
  };
  std::vector<std::int64_t> first_task{0}, first_head{0};
  std::vector<std::size_t> first_partial{0};
  std::size_t partial_elements = 0, max_R = 0, max_bc = 1, dp;

  // `row_multiple`: a query tile's rows are padded to a multiple of it (the lanes, the block rows).
  BackwardLayout(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& plans, std::size_t dp_,
                 std::size_t row_multiple)
      : dp(dp_) {
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const BackwardProblem& p = ps[i];
      const std::int64_t heads = p.batch * p.kv_heads;
      first_task.push_back(first_task.back() + heads * plans[i].chunks);
      first_head.push_back(first_head.back() + heads);
      const std::size_t per_task = 2 * static_cast<std::size_t>(p.seqlen_k) * dp;
      first_partial.push_back(first_partial.back() + static_cast<std::size_t>(heads * plans[i].chunks) * per_task);
      const std::size_t r = static_cast<std::size_t>(plans[i].q_tile);
      max_R = std::max(max_R, (r + row_multiple - 1) / row_multiple * row_multiple);
      max_bc = std::max(max_bc, static_cast<std::size_t>(plans[i].k_tile));
    }
    partial_elements = first_partial.back();
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
    return first_partial[t.problem] + static_cast<std::size_t>(index) * 2 * static_cast<std::size_t>(p.seqlen_k) * dp;
  }
};

}  // namespace attn::detail
