// FlashAttention in FlashAttention-2's loop order: the entry point, its tile rule and its argument
// checks. The kernel itself (Highway SIMD, runtime dispatch, one template over the element types) is
// in tiled_kernel.cpp; docs/prefill.md describes both.
#include <algorithm>
#include <string>
#include <unistd.h>
#include <vector>

#include "attn/attention.hpp"
#include "core/tile_ops.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

std::int64_t cache_bytes(int name, std::int64_t fallback) {
  const long v = sysconf(name);
  return v > 0 ? v : fallback;
}
std::int64_t l2_cache_bytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  return cache_bytes(_SC_LEVEL2_CACHE_SIZE, 1 << 20);
#else
  return 1 << 20;  // when the OS does not say
#endif
}

void check_tiles(const char* who, const TileOptions& tiles) {
  if (tiles.q_tile && *tiles.q_tile < 1)
    detail::fail(who, "tiles.q_tile", "must be >= 1, got " + std::to_string(*tiles.q_tile));
  if (tiles.k_tile && *tiles.k_tile < 1)
    detail::fail(who, "tiles.k_tile", "must be >= 1, got " + std::to_string(*tiles.k_tile));
}

}  // namespace

TilePlan plan_tiles(std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t head_dim, DType dtype,
                    const TileOptions& tiles) {
  const char* who = "attn::plan_tiles";
  check_tiles(who, tiles);
  if (head_dim < 1) detail::fail(who, "head_dim", "must be >= 1, got " + std::to_string(head_dim));
  // The rule (docs/prefill.md, "Tile sizes"), in accumulator bytes (8 for f64, 4 otherwise):
  //  * B_c: the packed K_j and V_j tiles (2 B_c d) take at most a quarter of L2, so they stay resident
  //    while every query row of the tile is scored against them: a multiple of 16 in [16, 512].
  //  * B_r: every query tile re-reads the whole K and V of its head (rows a head stride apart, each
  //    key row a cache miss that prefetching only hides), so B_r should be as large as the task's
  //    working set allows: Q^T and O (B_r d each), the score tile (B_r B_c) and K_j, V_j (2 B_c d)
  //    together fill L2, B_r = (L2 / acc - 2 B_c d) / (2 d + B_c), a multiple of 16 in [16, 512].
  //    (The score micro-kernel walks Q^T in 64-query slices, so L1 does not bound B_r.) On a 1 MiB
  //    L2: 384 for d = 128 f32, 304 for d = 64 and 256. Measured, d = 128 f32 seq 8192, 2 threads:
  //    B_r 128 -> 384 raised 146 to 173 GFLOP/s (`attn bench prefill --q-tile`); d = 64 is flat.
  //  With GQA the B_r rows are shared by the group's query heads (stacked, so K_j, V_j are packed once).
  const std::int64_t acc = dtype == DType::f64 ? 8 : 4;
  std::int64_t bc = l2_cache_bytes() / 4 / (2 * head_dim * acc);
  bc = std::clamp<std::int64_t>(bc / 16 * 16, 16, 512);
  std::int64_t br = (l2_cache_bytes() / acc - 2 * bc * head_dim) / (2 * head_dim + bc);
  br = std::clamp<std::int64_t>(br / 16 * 16, 16, 512);
  TilePlan plan{tiles.q_tile.value_or(br), tiles.k_tile.value_or(bc)};
  // A tile larger than the sequence is the whole sequence.
  plan.q_tile = std::min(plan.q_tile, std::max<std::int64_t>(seqlen_q, 1));
  plan.k_tile = std::min(plan.k_tile, std::max<std::int64_t>(seqlen_k, 1));
  return plan;
}

void attention_tiled(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                     const AttentionOptions& opts, const TileOptions& tiles, const TensorView* lse) {
  const char* who = "attn::attention_tiled";
  const detail::Problem p = detail::validate(who, q, k, v, &out, opts, lse);
  check_tiles(who, tiles);
  detail::run_tiled({p}, tiles, detail::resolve_threads(p.num_threads));
}

}  // namespace attn
