// The tiled (FlashAttention-2) kernel's internal interface: a list of validated problems run as one
// parallel job. attention_tiled passes one problem; attention_varlen passes one per sequence, so short
// and long sequences share the threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attn/attention.hpp"
#include "validate/problem.hpp"

namespace attn::detail {

// One unit of parallel work: the query tile [i0, i0 + rows) of every query head that shares kv head
// `kv_head` of batch `b` in problem `problem` (GQA heads are stacked so each K/V tile is packed once).
struct TileTask {
  std::uint32_t problem;
  std::int64_t b, kv_head, i0, rows;
};

// The tile sizes of one problem after GQA stacking: q_tile queries per head, g heads stacked.
struct TiledPlan {
  std::int64_t q_tile, k_tile;
};

// Task t of problem p, enumerated so that tiles with more visible keys come first (a longest-first
// order that dynamic scheduling turns into a balanced split for causal masks): the query tile index
// runs backwards when later queries see more keys (causal, bottom-right windows), forwards otherwise.
// Head-major: consecutive tasks (on any thread) reuse the same K and V from the shared L3.
inline TileTask task_of(const Problem& p, const TiledPlan& plan, std::uint32_t pi, std::int64_t t) {
  const std::int64_t q_tiles = (p.seqlen_q + plan.q_tile - 1) / plan.q_tile;
  std::int64_t qt = t % q_tiles;
  if (p.rule.window_right >= 0) qt = q_tiles - 1 - qt;
  const std::int64_t bh = t / q_tiles;
  TileTask task{pi, bh / p.kv_heads, bh % p.kv_heads, qt * plan.q_tile, 0};
  task.rows = std::min(plan.q_tile, p.seqlen_q - task.i0);
  return task;
}

// Runs every problem (all must have the same dtype, head_dim and head_dim_v; each writes its own out and lse) with
// `threads` threads. Problems have been validated; nothing here throws. out is of the problem's dtype, or
// f32 for bf16 and f16 problems (partial outputs kept for a later merge: ring attention's blocks).
void run_tiled(const std::vector<Problem>& problems, const TileOptions& tiles, int threads);

// The SIMD target (a Highway target bit, HWY_AVX2 ...) that run_tiled dispatches to now: the best one
// this CPU supports among those the kernel was compiled for. For tests that pin each target in turn.
std::int64_t tiled_target();

}  // namespace attn::detail
