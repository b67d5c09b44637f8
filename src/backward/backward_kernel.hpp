// The tiled backward kernel's internal interface: a list of validated backward problems run as one
// job. attention_backward passes one problem; attention_varlen_backward passes one per sequence.
#pragma once

#include <vector>

#include "attn/attention.hpp"
#include "core/backward_problem.hpp"

namespace attn::detail {

// Runs the backward of every problem (all with the same dtype and head_dim; each writes its own dq,
// dk and dv) with `threads` threads. The tile sizes come from `tiles`, clamped to each problem's
// lengths. Problems have been validated; nothing here throws except std::bad_alloc, which is raised
// before any gradient is written.
void run_backward(const std::vector<BackwardProblem>& problems, const TileOptions& tiles, int threads);

}  // namespace attn::detail
