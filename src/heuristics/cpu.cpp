// The CPU backend's heuristics, each with the reason for its numbers: the tiled kernel's tile sizes
// (plan_tiles) and decode's split count (decode_num_splits). Both are functions of the problem and the
// machine's cache sizes only, never of the thread count, so results do not depend on threads.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "core/checked.hpp"
#include "validate/problem.hpp"
#include "backward/backward_kernel.hpp"

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

}  // namespace

TilePlan plan_tiles(std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t head_dim, DType dtype,
                    const TileOptions& tiles) {
  const char* who = "attn::plan_tiles";
  detail::validate_tiles(who, tiles);
  if (seqlen_q < 0) detail::fail(who, "seqlen_q", "must be >= 0, got " + std::to_string(seqlen_q));
  if (seqlen_k < 0) detail::fail(who, "seqlen_k", "must be >= 0, got " + std::to_string(seqlen_k));
  if (head_dim < 1) detail::fail(who, "head_dim", "must be >= 1, got " + std::to_string(head_dim));
  if (static_cast<unsigned>(dtype) > static_cast<unsigned>(DType::f16))
    detail::fail(who, "dtype",
                 "must be f64, f32, bf16 or f16, got code " + std::to_string(static_cast<unsigned>(dtype)));
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
  // Saturating: a head_dim too large for any tile to fit gives the smallest tiles, not an overflow.
  using detail::saturating_add, detail::saturating_mul;
  std::int64_t bc = l2_cache_bytes() / 4 / saturating_mul(2 * acc, head_dim);
  bc = std::clamp<std::int64_t>(bc / 16 * 16, 16, 512);
  std::int64_t br =
      (l2_cache_bytes() / acc - saturating_mul(2 * bc, head_dim)) / saturating_add(2 * bc, saturating_mul(2, head_dim));
  br = std::clamp<std::int64_t>(br / 16 * 16, 16, 512);
  TilePlan plan{tiles.q_tile.value_or(br), tiles.k_tile.value_or(bc)};
  // A tile larger than the sequence is the whole sequence.
  plan.q_tile = std::min(plan.q_tile, std::max<std::int64_t>(seqlen_q, 1));
  plan.k_tile = std::min(plan.k_tile, std::max<std::int64_t>(seqlen_k, 1));
  return plan;
}

std::int64_t decode_num_splits(std::int64_t keys, std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim,
                               DType cache_dtype) {
  const char* who = "attn::decode_num_splits";
  if (batch < 1) detail::fail(who, "batch", "must be >= 1, got " + std::to_string(batch));
  if (kv_heads < 1) detail::fail(who, "kv_heads", "must be >= 1, got " + std::to_string(kv_heads));
  if (head_dim < 1) detail::fail(who, "head_dim", "must be >= 1, got " + std::to_string(head_dim));
  if (static_cast<unsigned>(cache_dtype) > static_cast<unsigned>(DType::fp8_e5m2))
    detail::fail(who, "cache_dtype",
                 "must be f64, f32, bf16, f16, i8, fp8_e4m3 or fp8_e5m2, got code " +
                     std::to_string(static_cast<unsigned>(cache_dtype)));
  if (keys <= 0) return 1;
  constexpr double kSliceBytes = 2.0 * 1024 * 1024;  // K and V read per slice, all kv heads
  constexpr std::int64_t kMinItems = 32, kMinKeys = 128;
  const double bytes = 2.0 * static_cast<double>(keys) * static_cast<double>(kv_heads) * static_cast<double>(head_dim) *
                       static_cast<double>(dtype_size(cache_dtype));
  const auto by_bytes = static_cast<std::int64_t>(std::min(1e15, std::ceil(bytes / kSliceBytes)));
  const std::int64_t for_items =
      std::min(detail::saturating_add(kMinItems - 1, batch) / batch, std::max<std::int64_t>(1, keys / kMinKeys));
  return std::clamp<std::int64_t>(std::max(by_bytes, for_items), 1, keys);
}

namespace detail {

// The backward's tiles and split (docs/backward.md, "Tile sizes"). B_r = 384 queries, B_c = 48 keys,
// clamped to the lengths. Every pair of tiles re-packs K_j and V_j (2 B_c d) and reloads the dK_j, dV_j
// partial rows, so a large B_r amortises that per-pair cost; a small B_c keeps the recomputed tiles
// (2 B_c B_r) small next to the query side (5 B_r d). B_c is a multiple of the 3-key score block and
// the 4-row gradient block. Measured, d = 128 f32 seq 2048, one thread, CPU time on the loaded 2-core
// Zen 3 (docs/journal/backward.md): 128 x 96 44 GFLOP/s, 256 x 96 54-57, 384 x 48 59-60, 512 x 48 56-58.
// The split into chunks depends on the shape only: at least kMinTasks tasks in all, so that a problem
// with few (batch, kv head) pairs still spreads over the cores, and no more chunks than query tiles.
// Each chunk costs one more set of dK/dV partials (2 seqlen_k dp accumulators).
BackwardPlan plan_backward(const BackwardProblem& p, const TileOptions& tiles) {
  constexpr std::int64_t kQTile = 384, kKTile = 48, kMinTasks = 8, kTunedDim = 128;
  // Above d = 128 the query tile shrinks so that its query side (5 B_r d accumulators) stays as at 128.
  const std::int64_t q_default =
      p.head_dim <= kTunedDim ? kQTile : std::max<std::int64_t>(16, kQTile * kTunedDim / p.head_dim / 16 * 16);
  BackwardPlan plan{tiles.q_tile.value_or(q_default), tiles.k_tile.value_or(kKTile), 1};
  plan.q_tile = std::max<std::int64_t>(1, std::min(plan.q_tile, p.seqlen_q));
  plan.k_tile = std::max<std::int64_t>(1, std::min(plan.k_tile, p.seqlen_k));
  const std::int64_t q_tiles = (p.seqlen_q + plan.q_tile - 1) / plan.q_tile;
  const std::int64_t heads = std::max<std::int64_t>(1, p.batch * p.kv_heads);
  plan.chunks = std::clamp<std::int64_t>((kMinTasks + heads - 1) / heads, 1, std::max<std::int64_t>(1, q_tiles));
  return plan;
}

}  // namespace detail
}  // namespace attn
