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
std::int64_t l1d_cache_bytes() {
#ifdef _SC_LEVEL1_DCACHE_SIZE
  return cache_bytes(_SC_LEVEL1_DCACHE_SIZE, 32 << 10);
#else
  return 32 << 10;  // when the OS does not say
#endif
}
std::int64_t l2_cache_bytes() {
#ifdef _SC_LEVEL2_CACHE_SIZE
  return cache_bytes(_SC_LEVEL2_CACHE_SIZE, 1 << 20);
#else
  return 1 << 20;
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
  //  * B_r: every query tile re-reads the whole K and V of its head (rows a head stride apart, so
  //    each key row costs a TLB walk and a cache miss that prefetching only hides), so B_r should be
  //    large; the score micro-kernel reads Q^T in 64-query slices of 64 d acc bytes, which must stay
  //    in L1 while 6 keys at a time stream past. B_r = 2 L1 / (d acc), a multiple of 16 in [16, 256]:
  //    128 for d = 128 f32 with a 32 KiB L1, 256 for d = 64 (measured: 64 -> 128 rows gave +15% at
  //    d = 128, seq 8192; docs/prefill.md).
  //  * B_c: the packed K_j and V_j tiles (2 B_c d) take at most a quarter of L2, so they stay resident
  //    while every query row of the tile is scored against them, with room for Q^T, O (B_r x d), the
  //    score tile (B_c x B_r) and the next tiles' stream: a multiple of 16 in [16, 512].
  //  With GQA the B_r rows are shared by the group's query heads (stacked, so K_j, V_j are packed once).
  const std::int64_t acc = dtype == DType::f64 ? 8 : 4;
  std::int64_t br = 2 * l1d_cache_bytes() / (head_dim * acc);
  br = std::clamp<std::int64_t>(br / 16 * 16, 16, 256);
  std::int64_t bc = l2_cache_bytes() / 4 / (2 * head_dim * acc);
  bc = std::clamp<std::int64_t>(bc / 16 * 16, 16, 512);
  TilePlan plan{tiles.q_tile.value_or(br), tiles.k_tile.value_or(bc)};
  // A tile larger than the sequence is the whole sequence.
  plan.q_tile = std::min(plan.q_tile, std::max<std::int64_t>(seqlen_q, 1));
  plan.k_tile = std::min(plan.k_tile, std::max<std::int64_t>(seqlen_k, 1));
  return plan;
}

void attention_tiled(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const AttentionOptions& opts, const TileOptions& tiles,
                     const TensorView* lse) {
  const char* who = "attn::attention_tiled";
  const detail::Problem p = detail::validate(who, q, k, v, &out, opts, lse);
  check_tiles(who, tiles);
  detail::run_tiled({p}, tiles, detail::resolve_threads(p.num_threads));
}

}  // namespace attn
