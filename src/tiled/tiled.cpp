// FlashAttention, portable C++: the online softmax over key tiles, in FlashAttention-2's loop order.
//
// For each (batch, head, query tile of B_r rows) -- the units of parallel work --
//   pack the B_r query rows, reset B_r states (m = -inf, l = 0, o = 0)
//   for each key tile of B_c keys the tile can see (causal tiles past the diagonal are skipped):
//     pack K_j and V_j, score the B_r x B_c tile (scale, mask), fold each row into its state
//   finalise: out = o / l, lse = m + log l
// Memory: per thread B_r x (2d + B_c + 2) + 2 B_c d accumulator values, independent of the sequence
// lengths; nothing of size seqlen_q x seqlen_k exists. Traffic: q and out once, K and V once per query
// tile (see docs/io-model.md, "FA2 order").
#include <algorithm>
#include <string>
#include <unistd.h>
#include <vector>

#include "attn/attention.hpp"
#include "core/tile_ops.hpp"

namespace attn {
namespace {

std::int64_t l2_cache_bytes() {
  long v = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
  v = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return v > 0 ? v : 1 << 20;  // 1 MiB when the OS does not say
}

void check_tiles(const char* who, const TileOptions& tiles) {
  if (tiles.q_tile && *tiles.q_tile < 1)
    detail::fail(who, "tiles.q_tile", "must be >= 1, got " + std::to_string(*tiles.q_tile));
  if (tiles.k_tile && *tiles.k_tile < 1)
    detail::fail(who, "tiles.k_tile", "must be >= 1, got " + std::to_string(*tiles.k_tile));
}

template <class T>
void run(const detail::Problem& p, TilePlan plan) {
  using A = detail::Acc<T>;
  const std::int64_t d = p.head_dim, br = plan.q_tile, bc = plan.k_tile;
  const std::int64_t q_tiles = (p.seqlen_q + br - 1) / br;
  const std::int64_t tasks = p.batch * p.heads * q_tiles;
  const int threads = detail::resolve_threads(p.num_threads);
  const std::int64_t per_thread = br * (2 * d + bc + 2) + 2 * bc * d + d;
  std::vector<std::vector<A>> scratch(static_cast<std::size_t>(threads));
  for (auto& s : scratch) s.resize(static_cast<std::size_t>(per_thread));

  // Causal query tiles near the bottom see more keys: dynamic scheduling balances them.
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t qt = task % q_tiles, bh = task / q_tiles;
    const std::int64_t b = bh / p.heads, h = bh % p.heads, hk = p.kv_head_of(h);
    const std::int64_t i0 = qt * br, rows = std::min(br, p.seqlen_q - i0);
    A* Q = scratch[static_cast<std::size_t>(omp_get_thread_num())].data();
    A* O = Q + br * d;
    A* S = O + br * d;
    A* M = S + br * bc;
    A* L = M + br;
    A* K = L + br;
    A* V = K + bc * d;
    A* tmp = V + bc * d;
    detail::pack_rows<T>(Q, p.q, b, i0, rows, h, d);
    for (std::int64_t r = 0; r < rows; ++r) reset(RowState<A>{M + r, L + r, O + r * d, d});
    // Key tiles outside every row's window are skipped: rows' windows only move right as i grows.
    const std::int64_t k_begin = p.first_key(i0), k_end = p.end_key(i0 + rows - 1);
    const A slope = static_cast<A>(p.alibi_slope(b, h));
    for (std::int64_t j0 = k_begin; j0 < k_end; j0 += bc) {
      const std::int64_t n = std::min(bc, k_end - j0);
      detail::pack_rows<T>(K, p.k, b, j0, n, hk, d);
      detail::pack_rows<T>(V, p.v, b, j0, n, hk, d);
      for (std::int64_t r = 0; r < rows; ++r) {
        A* s = S + r * bc;
        detail::score_row(p, s, Q + r * d, K, n, j0, i0 + r, slope);
        fold(RowState<A>{M + r, L + r, O + r * d, d}, s, n, V, d);
      }
    }
    for (std::int64_t r = 0; r < rows; ++r)
      detail::store_row<T>(p, RowState<A>{M + r, L + r, O + r * d, d}, tmp, b, i0 + r, h);
  }
}

}  // namespace

TilePlan plan_tiles(std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t head_dim, DType dtype,
                    const TileOptions& tiles) {
  const char* who = "attn::plan_tiles";
  check_tiles(who, tiles);
  if (head_dim < 1) detail::fail(who, "head_dim", "must be >= 1, got " + std::to_string(head_dim));
  // Rule: the packed K_j and V_j tiles (2 B_c d accumulator values) take at most a quarter of L2, so
  // they stay resident while every query row of the tile is scored against them, with room for the
  // query tile, the output accumulators and the next tile's stream. B_r = 64 rows amortises each K/V
  // tile load over many queries while Q_i and O_i (2 B_r d values) stay within L2 too.
  const std::int64_t acc = dtype == DType::f64 ? 8 : 4;
  std::int64_t bc = l2_cache_bytes() / 4 / (2 * head_dim * acc);
  bc = std::clamp<std::int64_t>(bc / 16 * 16, 16, 512);
  std::int64_t br = 64;
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
  const TilePlan plan = plan_tiles(p.seqlen_q, p.seqlen_k, p.head_dim, p.dtype, tiles);
  detail::dispatch_dtype(p.dtype, [&]<class T>() { run<T>(p, plan); });
}

}  // namespace attn
