// The tiled backward on AMX tiles (amx_backward.cpp): which problems it takes, its plan, and the run.
// run_backward (backward_kernel.cpp) sends bf16 problems here when amx_backend() names a tile unit.
#pragma once

#include <vector>

#include "attn/attention.hpp"
#include "amx/amx_tiles.hpp"
#include "backward/backward_kernel.hpp"
#include "validate/backward_problem.hpp"

namespace attn::detail {

// bf16 problems (f16 on a tile unit that runs TDPFP16PS: amx_runs_fp16) whose q, k and dout are finite,
// with every option (dropout, masks, windows, soft-cap, ALiBi, sinks, GQA, head_dim_v, varlen). A tile
// product multiplies the zero weights of the pairs a row does not see by these inputs, and 0 x Inf would
// reach gradients the vector kernel keeps finite; such a call (rare) runs on the vector kernel. Reads q,
// k and dout once.
bool amx_backward_takes(const BackwardProblem& p, amx::TileBackend backend);

// Query rows and keys per tile: the caller's TileOptions where set, else 256 and 128 (docs/backward.md
// has the sweep), k_tile rounded up to a multiple of 32; the chunks as plan_backward splits them.
BackwardPlan amx_backward_plan(const BackwardProblem& p, const TileOptions& tiles);

// Runs the backward of every problem (validated, all taken by amx_backward_takes, one head_dim and
// head_dim_v) on the tile unit `backend` (hardware or emulated). Memory is allocated before any
// gradient is written.
void run_backward_amx(const std::vector<BackwardProblem>& problems, const std::vector<BackwardPlan>& plans, int threads,
                      amx::TileBackend backend);

}  // namespace attn::detail
