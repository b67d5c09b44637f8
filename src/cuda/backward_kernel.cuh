// FlashAttention-2's backward (Dao 2023, Algorithm 2) on tensor cores, deterministic: every gradient
// element is summed by one block in a fixed order, no atomics. Four kernels, in order on one stream:
//   row_stats_kernel  D_i = dout_i . out_i and the lse in base 2, per (query head, row), into scratch;
//   dkdv_kernel       one block per (key block of BR keys, kv head, sequence): for every query head of
//                     the group and every tile of BC query rows that may see its keys (query_rows),
//                     S^T = K Q^T, P^T = 2^(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D) d logit/d dot,
//                     then dV += P^T dO and dK += dS^T Q; dK and dV written once;
//   dq_kernel         one block per (query block of BR rows, query head, sequence): S = Q K^T, P, dP =
//                     dO V^T and dS as above over the key tiles its rows see, dQ += dS K;
//   sink_grad_kernel  dsink[h] = -sum over rows of 2^(sink - lse) D (with sinks and dsink), one block
//                     per head.
// Each warp owns 16 of the block's BR rows (keys in dkdv, queries in dq; at d = 256 two warps share them,
// each with half the gradient's columns: BwdTraits) and runs tile.cuh's warp_qk and warp_pv with the
// operands' roles swapped: S^T = K Q^T is warp_qk with K as the A tile and Q as the B
// tile, dV += P^T dO is warp_pv with dO as the B tile. P and dS are rounded to 16 bits as the A operands
// of the second products (flash-attn does the same); d logit / d dot (the scale, and the soft-cap's
// slope) is folded into dS, so no gradient is scaled afterwards. The other side's tiles are double-buffered
// with cp.async (the next tile's copies in flight while this one is multiplied). Non-finite inputs follow
// the forward's rules (pv_confined). docs/cuda.md has the design and what is unmeasured.
#pragma once

#include <cuda_runtime.h>

#include "cuda/forward_kernel.cuh"

namespace attn::cuda_detail {

// Head dim D; WARPS warps in SPLIT groups, warp w owning the block's rows 16 (w % SLABS) .. + 15 and the
// gradient's columns DC (w / SLABS) .. + DC - 1 (BR rows a block; SPLIT = 2 halves the accumulators'
// registers where a warp's 16 x D of dK and dV would not fit, at the cost of both groups computing the
// same S and dP); the other side's tiles of BC rows.
template <int D_, int WARPS_, int BC_, int SPLIT_>
struct BwdTraits {
  static constexpr int D = D_, WARPS = WARPS_, BC = BC_, SPLIT = SPLIT_;
  static constexpr int THREADS = WARPS * 32, SLABS = WARPS / SPLIT, BR = SLABS * 16, DC = D / SPLIT;
  // The block's two [BR][D] tiles (K and V, or Q and dO), two stages of the other side's two [BC][D]
  // tiles, and (dkdv) two stages of BC rows' lse and D (f32).
  static constexpr int SMEM_BYTES = (2 * BR + 4 * BC) * D * 2 + 4 * BC * 4;
};

// Row (b, i)'s index in the scratch arrays of head h (BwdParams::rows).
__device__ __forceinline__ std::int64_t scratch_row(const BwdParams& p, const ForwardExtent& e, std::int64_t b,
                                                    std::int64_t i) {
  return p.f.cu_q ? e.q_off + i : b * p.f.seqlen_q + i;
}

// Row i of sequence b, head h, of a [batch, seq, heads, d] tensor (or a packed varlen one) with strides s;
// first: the sequence's first packed row (varlen) or 0.
template <class T>
__device__ __forceinline__ T* row_at(T* base, const std::int64_t (&s)[3], bool packed, std::int64_t b,
                                     std::int64_t first, std::int64_t i, std::int64_t h) {
  return base + (packed ? 0 : b * s[0]) + (first + i) * s[1] + h * s[2];
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// One warp per query row (4 a block): D = dout . out in f32, and lse x log2(e) (+inf for a row whose lse
// is -inf: it has no weights, and 2^(s - inf) = 0 gives it none).
template <class E, int D>
__global__ void __launch_bounds__(128) row_stats_kernel(const BwdParams p) {
  const std::int64_t b = blockIdx.z, h = blockIdx.y;
  const ForwardExtent e = forward_extent(p.f, b);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t i = std::int64_t{blockIdx.x} * 4 + warp;
  if (i >= e.sq) return;
  const bool packed = p.f.cu_q != nullptr;
  const auto* o = row_at(static_cast<const std::uint16_t*>(p.f.out), p.f.os, packed, b, e.q_off, i, h);
  const auto* d = row_at(static_cast<const std::uint16_t*>(p.dout), p.dos, packed, b, e.q_off, i, h);
  float acc = 0.f;
#pragma unroll
  for (int x = lane; x < D; x += 32) acc += to_float<E>(o[x]) * to_float<E>(d[x]);
  acc = warp_sum(acc);
  if (lane == 0) {
    const std::int64_t r = h * p.rows + scratch_row(p, e, b, i);
    const float lse = p.f.lse[(packed ? 0 : b * p.f.ls[0]) + h * p.f.ls[1] + (e.q_off + i) * p.f.ls[2]];
    p.delta[r] = acc;
    p.lse2[r] = lse == kNegInf ? -kNegInf : lse * kLog2e;
  }
}

// What turns one slab's dots into weights and score gradients: the mask of the sequence, the head's
// ALiBi slope, the scale (base 2 for the exponent), whether the soft-cap's slope applies.
struct GradRule {
  detail::Mask mask;
  float slope, scale, scale_log2;
  bool softcap;
};

// One warp's 16 x 8 NT slab: s (dots) becomes P = 2^(score - lse) and dp (dO . v) becomes dS = P (dP - D)
// d logit / d dot, both 0 where the query does not see the key (a select, so a NaN in a masked key's dP
// stays out). pair(n, e) gives element (n, e)'s query and key, stats(n, e) its row's lse2 and D. Raw
// tiles (raw_scores_fold) take the exponent from the dot in one FFMA, as the forward does.
template <int NT, class PairFn, class StatsFn>
__device__ __forceinline__ void weights_and_grads(float (&s)[NT][4], float (&dp)[NT][4], const GradRule& g,
                                                  bool need_mask, PairFn pair, StatsFn stats) {
  const bool raw = raw_scores_fold(need_mask, g.mask.transforms_scores(g.slope), g.scale_log2);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const auto [i, j] = pair(n, e);
      const auto [lse2, delta] = stats(n, e);
      const float dot = s[n][e];
      const bool seen = !need_mask || visible(g.mask, i, j);
      const float x = raw ? fmaf(dot, g.scale_log2, -lse2) : g.mask.score(dot, i, j, g.slope) * kLog2e - lse2;
      const float pv = seen ? exp2_fast(x) : 0.f;
      const float slope = g.softcap ? g.mask.rule.logit_grad(dot) : g.scale;
      dp[n][e] = seen ? pv * (dp[n][e] - delta) * slope : 0.f;
      s[n][e] = pv;
    }
}

struct QueryKey {
  std::int64_t i, j;
};
struct RowStats {
  float lse2, delta;
};

// The block's rows (BwdTraits): the warp's slab, its 16 rows 16 slab .. 16 slab + 15, the lane's rows
// lane/4 (half 0) and lane/4 + 8 (half 1) of it; the column of element (n, e) of a slab's fragments, 8 n +
// 2 (lane % 4) + (e & 1); the first of the warp's DC gradient columns.
template <class C>
__device__ __forceinline__ int warp_slab() {
  return static_cast<int>(threadIdx.x / 32) % C::SLABS;
}
template <class C>
__device__ __forceinline__ int slab_row(int half) {
  return warp_slab<C>() * 16 + static_cast<int>(threadIdx.x % 32 / 4) + 8 * half;
}
__device__ __forceinline__ int slab_col(int n, int e) {
  return n * 8 + static_cast<int>(threadIdx.x % 4) * 2 + (e & 1);
}
template <class C>
__device__ __forceinline__ int warp_col0() {
  return static_cast<int>(threadIdx.x / 32) / C::SLABS * C::DC;
}

// Stores a warp's 16 x DC f32 accumulator rows as E: row r of the block (slab_row) to row_ptr(r) from the
// warp's first column on, rows at or past `valid` skipped.
template <class E, class C, class RowPtr>
__device__ __forceinline__ void store_slab(const float (&acc)[C::DC / 8][4], int valid, RowPtr row_ptr) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = slab_row<C>(half);
    if (r >= valid) continue;
    std::uint16_t* row = row_ptr(r) + warp_col0<C>();
#pragma unroll
    for (int d = 0; d < C::DC / 8; ++d)
      *reinterpret_cast<std::uint32_t*>(row + slab_col(d, 0)) = pack2<E>(acc[d][2 * half], acc[d][2 * half + 1]);
  }
}

// The shared-memory tiles of one stage of a block's loop: the other side's two [BC][D] tiles (Q and dO,
// or K and V) and, in dkdv, their rows' lse2 and D. Two stages: the next tile's copies land in one while
// the warps multiply the other.
struct Stage {
  std::uint16_t *a, *b;
  float *lse2, *delta;
};
template <class C>
__device__ __forceinline__ Stage stage_at(std::uint16_t* first, int stage) {
  constexpr int BC = C::BC, D = C::D;
  std::uint16_t* a = first + stage * 2 * BC * D;
  float* stats = reinterpret_cast<float*>(first + 4 * BC * D) + stage * 2 * BC;
  return {a, a + BC * D, stats, stats + BC};
}

// The (query head, query tile) pairs of a dkdv block in order, heads outer: pair w is head first_head +
// w / tiles, rows from begin + (w % tiles) BC.
struct QueryTiles {
  std::int64_t first_head, begin, tiles, count;
  __device__ __forceinline__ QueryTiles(std::int64_t kvh, std::int64_t group, RowRange rows, int bc)
      : first_head(kvh * group),
        begin(rows.begin),
        tiles(rows.end > rows.begin ? (rows.end - rows.begin + bc - 1) / bc : 0),
        count(group * tiles) {}
  __device__ __forceinline__ std::int64_t head(std::int64_t w) const { return first_head + w / tiles; }
  __device__ __forceinline__ std::int64_t row0(std::int64_t w, int bc) const { return begin + w % tiles * bc; }
};

// Issues the copies of head h's query tile from i0 (Q, dO) into stage st, one cp.async group, and
// stores its rows' lse2 and D (rows past the sequence: no weights).
template <class C>
__device__ __forceinline__ void load_query_tile(const BwdParams& p, const ForwardExtent& e, std::int64_t b,
                                                std::int64_t h, std::int64_t i0, const Stage& st) {
  constexpr int D = C::D, BC = C::BC;
  const bool packed = p.f.cu_q != nullptr;
  const int valid = valid_rows(e.sq - i0, BC);
  load_strided_tile<D, C::THREADS, BC>(
      st.a, row_at(static_cast<const std::uint16_t*>(p.f.q), p.f.qs, packed, b, e.q_off, i0, h), p.f.qs[1], valid);
  load_strided_tile<D, C::THREADS, BC>(
      st.b, row_at(static_cast<const std::uint16_t*>(p.dout), p.dos, packed, b, e.q_off, i0, h), p.dos[1], valid);
  cp_async_commit();
  for (int c = static_cast<int>(threadIdx.x); c < BC; c += C::THREADS) {
    const bool ok = c < valid;
    const std::int64_t r = h * p.rows + scratch_row(p, e, b, i0 + (ok ? c : 0));
    st.lse2[c] = ok ? p.lse2[r] : -kNegInf;
    st.delta[c] = ok ? p.delta[r] : 0.f;
  }
}

// acc += w B for one warp_pv whose B tile [BC][D] may hold a NaN or infinity in a tile the mask cuts
// (need_mask, the same for the whole block): as in the forward (tile.cuh), those elements are added on
// CUDA cores for the rows that see their row of B (sees(half, j)), then zeroed, so that a row masked from
// them weights a 0 by 0, not NaN by 0. All threads of the block; a barrier when need_mask.
template <class E, class C, class SeesFn>
__device__ __forceinline__ void pv_confined(float (&acc)[1][C::DC / 8][4], const float (&w)[1][C::BC / 8][4],
                                            std::uint16_t* tile, bool need_mask, SeesFn sees) {
  constexpr int D = C::D, BC = C::BC, NT = BC / 8;
  if (need_mask && any_nonfinite<E, D, BC, C::THREADS>(tile)) {  // rare
    add_nonfinite_values<E, D, NT, C::DC>(acc[0], w[0], tile, 0, sees, warp_col0<C>());
    __syncthreads();
    zero_nonfinite<E, D, BC, C::THREADS>(tile);
    __syncthreads();
  }
  warp_pv<E, D, NT, 1, C::DC>(acc, w, tile, 0, warp_col0<C>());
}

// One query tile of a dkdv block (its Q, dO and row stats in `st`, landed): the warp's S^T, dP^T, P^T,
// dS^T, and dV += P^T dO, dK += dS^T Q.
template <class E, class C>
__device__ __forceinline__ void dkdv_tile(float (&dk)[1][C::DC / 8][4], float (&dv)[1][C::DC / 8][4], std::int64_t j0,
                                          std::int64_t i0, const GradRule& g, const std::uint16_t* sK,
                                          const std::uint16_t* sV, const Stage& st) {
  constexpr int D = C::D, NT = C::BC / 8;
  const int slab = warp_slab<C>();
  float s[1][NT][4], dp[1][NT][4];
  warp_qk<E, D, NT, 1>(s, sK, slab * 16, st.a, 0);
  warp_qk<E, D, NT, 1>(dp, sV, slab * 16, st.b, 0);
  const bool need_mask = tile_needs_mask(g.mask, i0, C::BC, C::BR, blockIdx.x);
  weights_and_grads<NT>(
      s[0], dp[0], g, need_mask,
      [&](int n, int x) {
        return QueryKey{i0 + slab_col(n, x), j0 + slab_row<C>(x >> 1)};
      },
      [&](int n, int x) {
        return RowStats{st.lse2[slab_col(n, x)], st.delta[slab_col(n, x)]};
      });
  auto sees = [&](int half, int c) { return visible(g.mask, i0 + c, j0 + slab_row<C>(half)); };
  pv_confined<E, C>(dv, s, st.b, need_mask, sees);   // dO: rows that mask a query's dO get 0 x 0
  pv_confined<E, C>(dk, dp, st.a, need_mask, sees);  // Q, after S^T and dP^T are done with it
}

template <class C>
__device__ __forceinline__ void zero_accumulators(float (&acc)[1][C::DC / 8][4]) {
#pragma unroll
  for (int d = 0; d < C::DC / 8; ++d)
#pragma unroll
    for (int x = 0; x < 4; ++x) acc[0][d][x] = 0.f;
}

template <class E, class C>
__global__ void __launch_bounds__(C::THREADS) dkdv_kernel(const BwdParams p) {
  constexpr int D = C::D, BR = C::BR, BC = C::BC;
  ATTN_DYNAMIC_SMEM(std::uint16_t, smem);
  std::uint16_t* sK = smem;  // [BR][D]
  std::uint16_t* sV = sK + BR * D;
  std::uint16_t* stages = sV + BR * D;  // 2 x (Q, dO [BC][D]), then 2 x (lse2, D [BC])

  const std::int64_t b = blockIdx.z, kvh = blockIdx.y, j0 = std::int64_t{blockIdx.x} * BR;
  const ForwardExtent e = forward_extent(p.f, b);
  if (j0 >= e.sk) return;
  const bool packed = p.f.cu_q != nullptr;
  const int valid = valid_rows(e.sk - j0, BR);
  load_strided_tile<D, C::THREADS, BR>(
      sK, row_at(static_cast<const std::uint16_t*>(p.f.k), p.f.ks, packed, b, e.k_off, j0, kvh), p.f.ks[1], valid);
  load_strided_tile<D, C::THREADS, BR>(
      sV, row_at(static_cast<const std::uint16_t*>(p.f.v), p.f.vs, packed, b, e.k_off, j0, kvh), p.f.vs[1], valid);
  cp_async_commit();  // waited for with the first query tile's copies

  float dk[1][C::DC / 8][4], dv[1][C::DC / 8][4];
  zero_accumulators<C>(dk);
  zero_accumulators<C>(dv);
  const detail::Mask mask = p.f.rule.mask(e.sq, e.sk);
  const QueryTiles work(kvh, p.f.heads / p.f.kv_heads, query_rows(mask, j0, j0 + valid), BC);
  const float scale = static_cast<float>(p.f.rule.scale);
  if (work.count > 0) load_query_tile<C>(p, e, b, work.head(0), work.row0(0, BC), stage_at<C>(stages, 0));
  for (std::int64_t w = 0; w < work.count; ++w) {
    cp_async_wait<0>();  // tile w landed
    __syncthreads();     // for every thread, and every warp is done with tile w - 1's stage
    if (w + 1 < work.count)
      load_query_tile<C>(p, e, b, work.head(w + 1), work.row0(w + 1, BC), stage_at<C>(stages, (w + 1) & 1));
    const std::int64_t h = work.head(w);
    const GradRule g{mask, p.f.rule.alibi_slope(b, h), scale, scale * kLog2e, p.f.rule.softcap > 0};
    dkdv_tile<E, C>(dk, dv, j0, work.row0(w, BC), g, sK, sV, stage_at<C>(stages, w & 1));
  }
  cp_async_wait<0>();  // no query tile: K and V's copies end before the block does
  store_slab<E, C>(dk[0], valid, [&](int r) {
    return row_at(static_cast<std::uint16_t*>(p.dk), p.dks, packed, b, e.k_off, j0 + r, kvh);
  });
  store_slab<E, C>(dv[0], valid, [&](int r) {
    return row_at(static_cast<std::uint16_t*>(p.dv), p.dvs, packed, b, e.k_off, j0 + r, kvh);
  });
}

// One key tile t of a dq block (its K and V in `st`, landed): the warp's S, dP, P, dS and dQ += dS K.
template <class E, class C>
__device__ __forceinline__ void dq_tile(float (&dq)[1][C::DC / 8][4], std::int64_t i0, std::int64_t t,
                                        const GradRule& g, const RowStats (&row)[2], const std::uint16_t* sQ,
                                        const std::uint16_t* sdO, const Stage& st) {
  constexpr int D = C::D, BC = C::BC, NT = BC / 8;
  const int slab = warp_slab<C>();
  float s[1][NT][4], dp[1][NT][4];
  warp_qk<E, D, NT, 1>(s, sQ, slab * 16, st.a, 0);
  warp_qk<E, D, NT, 1>(dp, sdO, slab * 16, st.b, 0);
  const bool need_mask = tile_needs_mask(g.mask, i0, C::BR, BC, t);
  weights_and_grads<NT>(
      s[0], dp[0], g, need_mask,
      [&](int n, int x) {
        return QueryKey{i0 + slab_row<C>(x >> 1), t * BC + slab_col(n, x)};
      },
      [&](int, int x) { return row[x >> 1]; });
  pv_confined<E, C>(dq, dp, st.a, need_mask,
                    [&](int half, int c) { return visible(g.mask, i0 + slab_row<C>(half), t * BC + c); });
}

template <class E, class C>
__global__ void __launch_bounds__(C::THREADS) dq_kernel(const BwdParams p) {
  constexpr int D = C::D, BR = C::BR, BC = C::BC;
  ATTN_DYNAMIC_SMEM(std::uint16_t, smem);
  std::uint16_t* sQ = smem;  // [BR][D]
  std::uint16_t* sdO = sQ + BR * D;
  std::uint16_t* stages = sdO + BR * D;  // 2 x (K, V [BC][D])

  const std::int64_t b = blockIdx.z, h = blockIdx.y, i0 = std::int64_t{blockIdx.x} * BR;
  const ForwardExtent e = forward_extent(p.f, b);
  if (i0 >= e.sq) return;
  const bool packed = p.f.cu_q != nullptr;
  const std::int64_t kvh = h / (p.f.heads / p.f.kv_heads);
  const int valid = valid_rows(e.sq - i0, BR);
  load_strided_tile<D, C::THREADS, BR>(
      sQ, row_at(static_cast<const std::uint16_t*>(p.f.q), p.f.qs, packed, b, e.q_off, i0, h), p.f.qs[1], valid);
  load_strided_tile<D, C::THREADS, BR>(
      sdO, row_at(static_cast<const std::uint16_t*>(p.dout), p.dos, packed, b, e.q_off, i0, h), p.dos[1], valid);
  cp_async_commit();

  RowStats row[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = slab_row<C>(half);
    const std::int64_t at = h * p.rows + scratch_row(p, e, b, i0 + (r < valid ? r : 0));
    row[half] = r < valid ? RowStats{p.lse2[at], p.delta[at]} : RowStats{-kNegInf, 0.f};
  }
  const detail::Mask mask = p.f.rule.mask(e.sq, e.sk);
  const float scale = static_cast<float>(p.f.rule.scale);
  const GradRule g{mask, p.f.rule.alibi_slope(b, h), scale, scale * kLog2e, p.f.rule.softcap > 0};
  const TileRange tiles = key_tiles(mask, i0, BR, BC);
  const std::uint16_t* k = row_at(static_cast<const std::uint16_t*>(p.f.k), p.f.ks, packed, b, e.k_off, 0, kvh);
  const std::uint16_t* v = row_at(static_cast<const std::uint16_t*>(p.f.v), p.f.vs, packed, b, e.k_off, 0, kvh);
  auto load_keys = [&](std::int64_t t, const Stage& st) {  // key tile t's K and V, one cp.async group
    const int kv_valid = valid_rows(e.sk - t * BC, BC);
    load_strided_tile<D, C::THREADS, BC>(st.a, k + t * BC * p.f.ks[1], p.f.ks[1], kv_valid);
    load_strided_tile<D, C::THREADS, BC>(st.b, v + t * BC * p.f.vs[1], p.f.vs[1], kv_valid);
    cp_async_commit();
  };
  float dq[1][C::DC / 8][4];
  zero_accumulators<C>(dq);
  if (tiles.first < tiles.end) load_keys(tiles.first, stage_at<C>(stages, 0));
  for (std::int64_t t = tiles.first; t < tiles.end; ++t) {
    const int stage = static_cast<int>((t - tiles.first) & 1);
    cp_async_wait<0>();  // tile t (and Q, dO) landed
    __syncthreads();     // for every thread, and every warp is done with tile t - 1's stage
    if (t + 1 < tiles.end) load_keys(t + 1, stage_at<C>(stages, stage ^ 1));
    dq_tile<E, C>(dq, i0, t, g, row, sQ, sdO, stage_at<C>(stages, stage));
  }
  cp_async_wait<0>();  // no key tile: Q and dO's copies end before the block does
  store_slab<E, C>(dq[0], valid, [&](int r) {
    return row_at(static_cast<std::uint16_t*>(p.dq), p.dqs, packed, b, e.q_off, i0 + r, h);
  });
}

// dsink[h] = -sum over every row of head h of 2^(sink x log2(e) - lse2) D, in f64: each thread's rows in
// order, then a fixed tree, so the same bits on every run.
constexpr int kSinkThreads = 256;
__global__ void __launch_bounds__(kSinkThreads) sink_grad_kernel(const BwdParams p) {
  __shared__ double part[kSinkThreads];
  const std::int64_t h = blockIdx.x;
  const double sink2 = static_cast<double>(p.f.rule.sink(h)) * kLog2e;
  double acc = 0;
  for (std::int64_t r = threadIdx.x; r < p.rows; r += kSinkThreads) {
    const float l2 = p.lse2[h * p.rows + r];
    if (l2 != -kNegInf) acc += exp2(sink2 - l2) * p.delta[h * p.rows + r];
  }
  part[threadIdx.x] = acc;
  for (int half = kSinkThreads / 2; half > 0; half /= 2) {
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
  }
  if (threadIdx.x == 0) p.dsink[h] = static_cast<float>(-part[0]);
}

// A grid of blocks of C::BR rows over `rows` rows, heads and sequences (none when rows is 0).
template <class C, class Kernel>
int launch_blocks(Kernel* kernel, std::int64_t rows, std::int64_t heads, const BwdParams& p, cudaStream_t stream) {
  constexpr int smem = C::SMEM_BYTES;
  if (rows <= 0) return cudaSuccess;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) return e;
  const dim3 grid(static_cast<unsigned>((rows + C::BR - 1) / C::BR), static_cast<unsigned>(heads),
                  static_cast<unsigned>(p.f.batch));
  ATTN_LAUNCH(kernel, grid, C::THREADS, smem, stream)(p);
  return cudaGetLastError();
}

// The four kernels in order on `stream`; max_seqlen_q / _k: the longest sequence's (the grids' rows).
template <class E, class C>
int launch_backward_with(const BwdParams& p, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                         cudaStream_t stream) {
  if (max_seqlen_q > 0) {
    const dim3 grid(static_cast<unsigned>((max_seqlen_q + 3) / 4), static_cast<unsigned>(p.f.heads),
                    static_cast<unsigned>(p.f.batch));
    auto* stats = row_stats_kernel<E, C::D>;
    ATTN_LAUNCH(stats, grid, 128, 0, stream)(p);
    if (cudaError_t e = cudaGetLastError()) return e;
  }
  if (int e = launch_blocks<C>(dkdv_kernel<E, C>, max_seqlen_k, p.f.kv_heads, p, stream)) return e;
  if (int e = launch_blocks<C>(dq_kernel<E, C>, max_seqlen_q, p.f.heads, p, stream)) return e;
  if (p.dsink) {
    ATTN_LAUNCH(sink_grad_kernel, static_cast<unsigned>(p.f.heads), kSinkThreads, 0, stream)(p);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace attn::cuda_detail
