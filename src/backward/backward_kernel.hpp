// The tiled backward kernel's internal interface: a list of validated backward problems run as one
// job. attention_backward passes one problem; attention_varlen_backward passes one per sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/attention.hpp"
#include "validate/backward_problem.hpp"

namespace attn::detail {

// One problem's tile sizes and its split of the query tiles into `chunks` interleaved groups (chunk w
// takes tiles w, w + chunks, ...), each a task with its own dK/dV partials. All from the problem's
// shape and the cache sizes, never the thread count (src/heuristics/cpu.cpp).
struct BackwardPlan {
  std::int64_t q_tile, k_tile, chunks;
};
BackwardPlan plan_backward(const BackwardProblem& p, const TileOptions& tiles);

// Runs the backward of every problem (all with the same dtype and head_dim; each writes its own dq,
// dk and dv, of the problem's dtype or, for bf16 and f16 problems, f32: a ring block's partial
// gradients) with `threads` threads, one parallel job over all problems' tasks. The tile sizes come
// from `tiles`, clamped to each problem's lengths. Problems have been validated; nothing here throws
// except std::bad_alloc, which is raised before any gradient is written.
void run_backward(const std::vector<BackwardProblem>& problems, const TileOptions& tiles, int threads);

// The SIMD target (a Highway target bit) that run_backward dispatches to now. For tests that pin each
// target in turn.
std::int64_t backward_target();

}  // namespace attn::detail
