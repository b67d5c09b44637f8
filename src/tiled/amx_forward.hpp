// The tiled forward on AMX tiles (amx_kernel.cpp): which problems it takes, its tile plan, and the run.
// run_tiled (tiled_kernel.cpp) sends the problems it takes here when amx_backend() names a tile unit.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/attention.hpp"
#include "amx/amx_tiles.hpp"
#include "validate/problem.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn::detail {

// bf16 inputs on any tile unit, f16 inputs on one that runs TDPFP16PS (amx_runs_fp16), f32 inputs split into
// bf16 parts where ATTN_AMX_F32=bf16x3 (amx_f32_by_parts), with every option (masks, windows, soft-cap,
// ALiBi, sinks, GQA, head_dim_v, dropout, the lse, varlen and paged keys).
bool amx_forward_takes(const Problem& p, amx::TileBackend backend);

// Query rows per head and keys per tile: the caller's TileOptions where set, else about 128 stacked rows
// (the group's heads share a tile) and 512 keys; k_tile rounded up to a multiple of 32.
TiledPlan amx_plan(const Problem& p, const TileOptions& tiles);

// Runs every problem (validated, all taken by amx_forward_takes, one head_dim and head_dim_v) on the
// tile unit `backend` (hardware or emulated); first_task as run_tiled builds it.
void run_tiled_amx(const std::vector<Problem>& problems, const std::vector<TiledPlan>& plans,
                   const std::vector<std::int64_t>& first_task, int threads, amx::TileBackend backend);

}  // namespace attn::detail
