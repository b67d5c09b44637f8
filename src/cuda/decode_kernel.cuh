// Split-K decode (Flash-Decoding) on tensor cores, over contiguous or paged KV caches, templated on a
// traits struct (DecTraits): decode.cu instantiates the library's configurations, and the GPU benchmark
// (bench/gpu/variants.cu) times others against them.
//
// The query rows of one kv head -- its `group` query heads times seqlen_q -- are packed into slabs of 16
// rows (unpack_row), so every K and V row is read from memory once per slab, not once per query head.
// One block per (key slice, kv head x row slab, sequence): the slice's keys stream through shared memory
// in tiles of BK keys, STAGES deep with cp.async (decode is bound by the cache's bytes, so several tiles
// stay in flight); each of the WARPS warps takes BK / WARPS keys of a tile against all 16 rows (S = Q K^T
// and O += P V on mma.sync) and keeps its own online-softmax state. At the end the warp states are merged
// with attn::merge, and either finalised (one slice) or written as the slice's partial state, which the
// merge kernel combines in slice order (attn::merge, attn::finalize).
#pragma once

#include <cuda_runtime.h>

#include "core/rotary_rule.hpp"
#include "cuda/params.hpp"
#include "cuda/tile.cuh"

namespace attn::cuda_detail {

constexpr int kRows = 16;  // query rows of one kv head per block: one mma slab

// Head dim D; tiles of BK keys, STAGES deep; WARPS warps; HB kv heads per block. The warps of one kv
// head (WARPS / HB of them) split each tile's keys, KW each. HB > 1 makes a block read HB heads' rows of
// the same keys: with a [.., keys, kv_heads, d] cache and HB = kv_heads, a tile is one contiguous range.
template <int D_, int BK_, int STAGES_, int WARPS_ = 4, int HB_ = 1>
struct DecTraits {
  static constexpr int D = D_, BK = BK_, STAGES = STAGES_, WARPS = WARPS_, HB = HB_, THREADS = WARPS * 32;
  static constexpr int KW = BK / (WARPS / HB);
  static_assert(WARPS % HB == 0 && KW % 16 == 0, "each warp takes whole 16-key steps of one kv head");
  static constexpr int TILE = HB * BK;  // rows of one K (or V) stage, [HB][BK][D]
  static constexpr int PIPE_BYTES = (HB * kRows + 2 * STAGES * TILE) * D * 2;  // Q, STAGES tiles of K and of V
  static constexpr int MERGE_BYTES = WARPS * kRows * (D + 2) * 4;              // the warps' states, reusing it
  static constexpr int SMEM_BYTES = PIPE_BYTES > MERGE_BYTES ? PIPE_BYTES : MERGE_BYTES;
};

// The keys [lo, hi) of slice w of sequence b, trimmed to the keys some query of the sequence can see
// (keys_per_split: a slice of those); false when the sequence has fewer slices than the grid.
__device__ __forceinline__ bool decode_slice(const DecodeParams& p, const detail::Mask& mask, std::int64_t sk,
                                             std::int64_t w, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t seen_lo = mask.first_key(0), n = mask.seen_count();
  if (p.keys_per_split > 0) {
    const std::int64_t slices = detail::slices_for_keys_per_split(n, p.keys_per_split);
    if (w >= slices) return false;
    const KeyRange r = detail::split_slice(n, slices, w);
    lo = seen_lo + r.begin;
    hi = seen_lo + r.end;
  } else {
    const KeyRange slice = detail::split_slice(sk, p.num_splits, w);
    lo = slice.begin > seen_lo ? slice.begin : seen_lo;
    hi = slice.end < seen_lo + n ? slice.end : seen_lo + n;
  }
  return true;
}

// The K and V tiles of a block's slice [lo, hi) into shared memory, stage by stage. Tile row r is key
// r / HB of kv head g0 + r % HB (memory order); it lands in shared row (r % HB) * BK + r / HB, so each
// head's keys are consecutive rows there. A contiguous cache with one kv head per block is a strided
// tile (load_strided_tile); with several, each row is one multiply-add from the tile's first row; a
// paged one looks each row's page up (a block-uniform branch, once per tile). Rows past the slice are
// zero-filled; their addresses are the last key's.
template <class C>
struct DecodeKvTiles {
  const DecodeParams& p;
  std::int64_t b, g0, lo, hi;
  std::uint16_t *sK, *sV;

  __device__ __forceinline__ void load(int stage, std::int64_t t) const {
    const std::int64_t j0 = lo + t * C::BK;
    const int keys = valid_rows(hi - j0, C::BK);  // >= 1: t < the slice's tiles
    load_rows(sK + stage * C::TILE * C::D, p.k, p.ks, p.k_head_stride, j0, keys);
    load_rows(sV + stage * C::TILE * C::D, p.v, p.vs, p.v_head_stride, j0, keys);
  }

 private:
  __device__ __forceinline__ void load_rows(std::uint16_t* dst, const void* base, const std::int64_t (&s)[2],
                                            std::int64_t head_stride, std::int64_t j0, int keys) const {
    constexpr int D = C::D, THREADS = C::THREADS, TILE = C::TILE;
    const std::uint16_t* head0 = static_cast<const std::uint16_t*>(base) + g0 * head_stride;
    auto dst_row = [](int r) { return (r % C::HB) * C::BK + r / C::HB; };
    if (!p.index.pages.paged() && C::HB == 1) {
      load_strided_tile<D, THREADS, TILE>(dst, head0 + p.index.key_offset(b, j0, s[0], s[1]), s[1], keys);
    } else if (!p.index.pages.paged()) {
      const std::uint16_t* tile0 = head0 + p.index.key_offset(b, j0, s[0], s[1]);
      load_tile<D, THREADS, TILE>(
          dst,
          [&](int r) {
            return RowSource{tile0 + clamp_row(r / C::HB, keys) * s[1] + (r % C::HB) * head_stride, r / C::HB < keys};
          },
          dst_row);
    } else {
      load_tile<D, THREADS, TILE>(
          dst,
          [&](int r) {
            const std::int64_t j = j0 + clamp_row(r / C::HB, keys);
            return RowSource{head0 + p.index.key_offset(b, j, s[0], s[1]) + (r % C::HB) * head_stride,
                             r / C::HB < keys};
          },
          dst_row);
    }
  }
};

// The block's query slabs (kRows packed rows of each of its HB kv heads, unpack_row) into shared memory;
// rows past the group's are zero-filled.
template <class C>
__device__ __forceinline__ void load_query_slabs(std::uint16_t* sQ, const DecodeParams& p, std::int64_t b,
                                                 std::int64_t g0, std::int64_t r0, std::int64_t rows,
                                                 std::int64_t group) {
  const int q_valid = valid_rows(rows - r0, kRows);  // >= 1: r0 < rows
  load_tile<C::D, C::THREADS, C::HB * kRows>(sQ, [&](int r) {
    const PackedRow pr = unpack_row(r0 + clamp_row(r % kRows, q_valid), g0 + r / kRows, group, p.seqlen_q);
    return RowSource{static_cast<const std::uint16_t*>(p.q) + b * p.qs[0] + pr.query * p.qs[1] + pr.head * p.qs[2],
                     r % kRows < q_valid};
  });
}

// What one warp needs of its rows for every tile: the lane's two rows (lane/4 and lane/4 + 8 of its
// head's slab) as query indices (padding rows: past every query, fully masked) and ALiBi slopes, the
// mask and the slice's end, whether scores need the full transform, and the scale in base 2.
struct DecodeWarpRows {
  detail::Mask mask;
  std::int64_t hi, seqlen_q;
  std::int64_t qi[2];
  float slope[2];
  bool transform;
  float scale_log2;
};

__device__ __forceinline__ DecodeWarpRows decode_warp_rows(const DecodeParams& p, const detail::Mask& mask,
                                                           std::int64_t hi, std::int64_t b, std::int64_t r0,
                                                           std::int64_t rows, std::int64_t head, std::int64_t group,
                                                           int lane) {
  DecodeWarpRows w{mask, hi, p.seqlen_q, {}, {}, false, static_cast<float>(p.rule.scale) * kLog2e};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t r = r0 + lane / 4 + 8 * half;
    const PackedRow pr = unpack_row(r < rows ? r : rows - 1, head, group, p.seqlen_q);
    w.qi[half] = r < rows ? pr.query : p.seqlen_q;
    w.slope[half] = p.rule.alibi_slope(b, pr.head);
  }
  w.transform = mask.transforms_scores(w.slope[0]) || mask.transforms_scores(w.slope[1]);
  return w;
}

// One warp's KW keys of a tile, starting at key j0 (tile keys [tile_lo, tile_lo + BK)): S = Q K^T, the
// mask or transform where needed, the online-softmax step, O += P V.
template <class E, class C>
__device__ __forceinline__ void decode_tile(float (&o1)[1][C::D / 8][4], float (&m)[2], float (&l)[2],
                                            const DecodeWarpRows& w, const std::uint16_t* sQ, int q_row0,
                                            const std::uint16_t* kt, std::uint16_t* vt, int row0, std::int64_t j0,
                                            std::int64_t tile_lo) {
  constexpr int D = C::D, KW = C::KW, NT = KW / 8, DT = D / 8;
  const int lane = threadIdx.x % 32;
  float s1[1][NT][4];
  auto& s = s1[0];
  warp_qk<E, D, NT, 1>(s1, sQ, q_row0, kt, row0);
  // Every row sees [j0, j0 + KW) unless the sub-tile runs past the slice or straddles a mask edge.
  // Padding rows (a GQA group of fewer than 16 rows) need no mask: their q is zero-filled, so their
  // scores are finite or NaN from the key alone, and their states are never merged or written.
  const bool need_mask = j0 + KW > w.hi || !all_rows_see(w.mask, 0, w.seqlen_q - 1, j0, j0 + KW);
  const bool raw = raw_scores_fold(need_mask, w.transform, w.scale_log2);
  if (!raw)
    mask_scores<NT>(
        s, w.mask, w.slope[0], w.slope[1], need_mask, [&](int half) { return w.qi[half]; },
        [&](int n, int e) { return j0 + n * 8 + (lane % 4) * 2 + (e & 1); },
        [&](int, std::int64_t i, std::int64_t j) { return j < w.hi && visible(w.mask, i, j); });
  softmax_step<NT, DT>(s, m, l, o1[0], raw ? w.scale_log2 : 1.f);
  // Some query masks some key of this tile (block-uniform): then a NaN or infinity in V must reach only
  // the rows that see its key (tile.cuh). Keys past the slice are zero-filled, so they need nothing.
  const bool tile_cut = !all_rows_see(w.mask, 0, w.seqlen_q - 1, tile_lo, tile_lo + C::BK);
  if (tile_cut && any_nonfinite<E, D, C::TILE, C::THREADS>(vt)) {
    add_nonfinite_values<E, D, NT>(o1[0], s, vt, row0, [&](int half, int j) {
      const std::int64_t key = j0 + j;
      return key < w.hi && visible(w.mask, w.qi[half], key);
    });
    __syncthreads();
    zero_nonfinite<E, D, C::TILE, C::THREADS>(vt);
    __syncthreads();
  }
  warp_pv<E, D, NT, 1>(o1, s1, vt, row0);
}

// Each warp's state -> shared memory: per warp and row, o[D] then m (natural units, for attn::merge), l.
template <class C>
__device__ __forceinline__ void store_warp_state(float* sm, const float (&o)[C::D / 8][4], const float (&m)[2],
                                                 const float (&l)[2], int warp, int lane) {
  constexpr int D = C::D, DT = D / 8, S = D + 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = lane / 4 + 8 * half;
    float* st = sm + (warp * kRows + r) * S;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      st[d * 8 + (lane % 4) * 2] = o[d][2 * half];
      st[d * 8 + (lane % 4) * 2 + 1] = o[d][2 * half + 1];
    }
    const float lsum = quad_sum(l[half]);
    if (lane % 4 == 0) {
      st[D] = m[half] * kLn2;
      st[D + 1] = lsum;
    }
  }
}

// A row's merged state, finished: the sink folded in (attn::fold_sink), out = o / l and the lse
// (attn::finalize) written for this item's COLS columns from column c0.
template <class E, int COLS>
__device__ __forceinline__ void finalize_row(const DecodeParams& p, float mm, float ll, float (&oo)[COLS],
                                             std::int64_t b, const PackedRow& pr, int c0) {
  float res[COLS];
  fold_sink(RowState<float>{&mm, &ll, oo, COLS}, p.rule.sink(pr.head));  // each item: same m, l; its columns
  const float lse = finalize(RowState<float>{&mm, &ll, oo, COLS}, res);
  std::uint16_t* out = static_cast<std::uint16_t*>(p.out) + b * p.os[0] + pr.query * p.os[1] + pr.head * p.os[2] + c0;
#pragma unroll
  for (int c = 0; c < COLS; c += 2) *reinterpret_cast<std::uint32_t*>(out + c) = pack2<E>(res[c], res[c + 1]);
  if (p.lse && c0 == 0) p.lse[b * p.ls[0] + pr.head * p.ls[1] + pr.query * p.ls[2]] = lse;
}

// Merges each head's warps in key order: 8 threads per row and head, D/8 columns each (the merge is
// column-wise, so each thread merges its columns with its own copy of m and l); then finishes the row
// (one slice) or writes it as slice w's partial state.
template <class E, class C>
__device__ __forceinline__ void merge_warps(const DecodeParams& p, float* sm, std::int64_t b, std::int64_t g0,
                                            std::int64_t r0, std::int64_t rows, std::int64_t group, std::int64_t w) {
  constexpr int D = C::D, HB = C::HB, S = D + 2, COLS = D / 8;
  for (int item = threadIdx.x; item < HB * kRows * 8; item += C::THREADS) {
    const int hq = item / (kRows * 8), r = (item / 8) % kRows, c0 = (item % 8) * COLS;
    if (r0 + r >= rows) continue;
    const float* first = sm + (hq * kRows + r) * S;
    float mm = first[D], ll = first[D + 1], oo[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) oo[c] = first[c0 + c];
#pragma unroll
    for (int k = 1; k < C::WARPS / HB; ++k) {
      float* st = sm + ((hq + k * HB) * kRows + r) * S;
      merge(RowState<float>{&mm, &ll, oo, COLS}, RowState<float>{st + D, st + D + 1, st + c0, COLS});
    }
    const PackedRow pr = unpack_row(r0 + r, g0 + hq, group, p.seqlen_q);
    if (p.num_splits == 1 && p.keys_per_split == 0) {
      finalize_row<E, COLS>(p, mm, ll, oo, b, pr, c0);
      continue;
    }
    const std::int64_t orow = (b * p.heads + pr.head) * p.seqlen_q + pr.query;
    float* part = p.partial + (orow * p.num_splits + w) * S;
#pragma unroll
    for (int c = 0; c < COLS; ++c) part[c0 + c] = oo[c];
    if (c0 == 0) {
      part[D] = mm;
      part[D + 1] = ll;
    }
  }
}

template <class E, class C>
__global__ void __launch_bounds__(C::THREADS) decode_kernel(const DecodeParams p) {
  constexpr int D = C::D, BK = C::BK, HB = C::HB, KW = C::KW, TILE = C::TILE, DT = D / 8, STAGES = C::STAGES;
  ATTN_DYNAMIC_SMEM(std::uint16_t, smem);
  std::uint16_t* sQ = smem;                 // [HB][kRows][D]
  std::uint16_t* sK = sQ + HB * kRows * D;  // [STAGES][HB][BK][D]
  std::uint16_t* sV = sK + STAGES * TILE * D;

  const std::int64_t w = blockIdx.x, b = blockIdx.z;
  const std::int64_t g0 = blockIdx.y / p.row_blocks * HB, r0 = (blockIdx.y % p.row_blocks) * kRows;
  const std::int64_t group = p.heads / p.kv_heads, rows = group * p.seqlen_q;
  // Sequence b's keys, read where the CPU reads them: p.index (core/cache_index.hpp).
  const detail::Mask mask = p.rule.mask(p.seqlen_q, p.index.seqlen_k(b));
  std::int64_t lo = 0, hi = 0;
  if (!decode_slice(p, mask, p.index.seqlen_k(b), w, lo, hi)) return;  // the whole block
  const std::int64_t n_tiles = hi > lo ? (hi - lo + BK - 1) / BK : 0;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hw = warp % HB, kw = warp / HB;  // this warp's kv head (g0 + hw) and its KW keys of each tile
  const DecodeKvTiles<C> kv{p, b, g0, lo, hi, sK, sV};
  load_query_slabs<C>(sQ, p, b, g0, r0, rows, group);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < n_tiles) kv.load(s, s);
    cp_async_commit();
  }
  const DecodeWarpRows wr = decode_warp_rows(p, mask, hi, b, r0, rows, g0 + hw, group, lane);

  float o1[1][DT][4], m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};  // one slab of 16 rows per warp
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) o1[0][d][e] = 0.f;

  for (std::int64_t t = 0; t < n_tiles; ++t) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (t + STAGES - 1 < n_tiles) kv.load(static_cast<int>((t + STAGES - 1) % STAGES), t + STAGES - 1);
    cp_async_commit();
    const int stage = static_cast<int>(t % STAGES);
    const int row0 = hw * BK + kw * KW;  // this warp's keys in the stage, from key lo + t BK + kw KW
    decode_tile<E, C>(o1, m, l, wr, sQ, hw * kRows, sK + stage * TILE * D, sV + stage * TILE * D, row0,
                      lo + t * BK + kw * KW, lo + t * BK);
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the merge buffer
  float* sm = reinterpret_cast<float*>(smem);
  store_warp_state<C>(sm, o1[0], m, l, warp, lane);
  __syncthreads();
  merge_warps<E, C>(p, sm, b, g0, r0, rows, group, w);
}

// One block per output row: each of its kMergeWarps warps merges a consecutive run of the row's slices
// (split_slice over the slices) in order with attn::merge, loading the next slice while it merges
// this one; then warp 0 merges the warps' states in order and finalises. The order is fixed, so the
// result is deterministic, and the row's slices are read by eight chains instead of one.
constexpr int kMergeWarps = 8;
template <class E, int D>
__global__ void __launch_bounds__(kMergeWarps * 32) merge_kernel(const DecodeParams p) {
  constexpr int COLS = D / 32, S = D + 2;
  __shared__ float states[kMergeWarps][S];
  const std::int64_t row = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* part = p.partial + row * p.num_splits * S;
  const std::int64_t i = row % p.seqlen_q, h = (row / p.seqlen_q) % p.heads, b = row / (p.seqlen_q * p.heads);
  std::int64_t slices = p.num_splits;
  if (p.keys_per_split > 0)  // this sequence's own slices (decode_kernel's rule)
    slices =
        detail::slices_for_keys_per_split(p.rule.mask(p.seqlen_q, p.index.seqlen_k(b)).seen_count(), p.keys_per_split);
  const KeyRange mine = detail::split_slice(slices, kMergeWarps, warp);
  float m = kNegInf, l = 0.f, o[COLS];
#pragma unroll
  for (int c = 0; c < COLS; ++c) o[c] = 0.f;
  float nm = 0.f, nl = 0.f, no[COLS];
  auto load = [&](std::int64_t s) {
    const float* st = part + s * S;
    nm = st[D];
    nl = st[D + 1];
#pragma unroll
    for (int c = 0; c < COLS; ++c) no[c] = st[lane * COLS + c];
  };
  if (mine.begin < mine.end) load(mine.begin);
  for (std::int64_t s = mine.begin; s < mine.end; ++s) {
    float cm = nm, cl = nl, co[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) co[c] = no[c];
    if (s + 1 < mine.end) load(s + 1);
    merge(RowState<float>{&m, &l, o, COLS}, RowState<float>{&cm, &cl, co, COLS});
  }
#pragma unroll
  for (int c = 0; c < COLS; ++c) states[warp][lane * COLS + c] = o[c];
  if (lane == 0) {
    states[warp][D] = m;
    states[warp][D + 1] = l;
  }
  __syncthreads();
  if (warp != 0) return;
  m = states[0][D];
  l = states[0][D + 1];
#pragma unroll
  for (int c = 0; c < COLS; ++c) o[c] = states[0][lane * COLS + c];
#pragma unroll
  for (int ww = 1; ww < kMergeWarps; ++ww)
    merge(RowState<float>{&m, &l, o, COLS},
          RowState<float>{&states[ww][D], &states[ww][D + 1], &states[ww][lane * COLS], COLS});
  float res[COLS];
  fold_sink(RowState<float>{&m, &l, o, COLS}, p.rule.sink(h));  // once, after the merge of the splits
  const float lse = finalize(RowState<float>{&m, &l, o, COLS}, res);
  std::uint16_t* out = static_cast<std::uint16_t*>(p.out) + b * p.os[0] + i * p.os[1] + h * p.os[2] + lane * COLS;
#pragma unroll
  for (int c = 0; c < COLS; c += 2) *reinterpret_cast<std::uint32_t*>(out + c) = pack2<E>(res[c], res[c + 1]);
  if (p.lse && lane == 0) p.lse[b * p.ls[0] + h * p.ls[1] + i * p.ls[2]] = lse;
}

// Feature x of a 16-bit row (unit stride) at position pos, rotated when rotary is on and x < rotary_dim
// (core/rotary_rule.hpp, in f32 as the CPU does), as the 16-bit value it is stored as.
template <class E>
__device__ __forceinline__ std::uint16_t rotated(const DecodeParams& p, const std::uint16_t* row, std::int64_t x,
                                                 std::int64_t pos) {
  const detail::RotarySpec& r = p.rotary;
  if (!r.enabled() || x >= r.rotary_dim) return row[x];
  const std::int64_t c = r.column(x), at = pos * r.half() + c;
  const detail::RotaryPair pair = r.pair(c);
  float a = to_float<E>(row[pair.first]), b = to_float<E>(row[pair.second]);
  detail::rotate_pair(a, b, static_cast<const float*>(r.cos)[at], static_cast<const float*>(r.sin)[at]);
  return static_cast<std::uint16_t>(pack2<E>(x == pair.first ? a : b, 0.f) & 0xFFFFu);
}

// k_new/v_new -> the cache at positions seqlens[b] .. (one block per new row and sequence), k_new rotated
// by its position when rotary is on.
template <class E>
__global__ void append_kernel(const DecodeParams p) {
  const std::int64_t j = blockIdx.x, b = blockIdx.y, pos = p.index.append_position(b, j);
  const std::int64_t n = p.kv_heads * p.head_dim;
  const std::int64_t ko = p.index.position_offset(b, pos, p.ks[0], p.ks[1]);
  const std::int64_t vo = p.index.position_offset(b, pos, p.vs[0], p.vs[1]);
  for (std::int64_t x = threadIdx.x; x < n; x += blockDim.x) {
    const std::int64_t g = x / p.head_dim, c = x % p.head_dim;
    const auto* k_new = static_cast<const std::uint16_t*>(p.k_new) + b * p.kns[0] + j * p.kns[1] + g * p.kns[2];
    const_cast<std::uint16_t*>(static_cast<const std::uint16_t*>(p.k))[ko + g * p.k_head_stride + c] =
        rotated<E>(p, k_new, c, pos);
    const_cast<std::uint16_t*>(static_cast<const std::uint16_t*>(p.v))[vo + g * p.v_head_stride + c] =
        static_cast<const std::uint16_t*>(p.v_new)[b * p.vns[0] + j * p.vns[1] + g * p.vns[2] + c];
  }
}

// q rotated into p.q_rot (one block per query row and sequence): query row i at position seqlens[b] + i
// when the mask is causal or windowed, else seqlens[b] (RotarySpec::query_position, as on the CPU).
template <class E>
__global__ void rotary_q_kernel(const DecodeParams p) {
  const std::int64_t i = blockIdx.x, b = blockIdx.y;
  const std::int64_t pos = p.rotary.query_position(p.index, b, i), n = p.heads * p.head_dim;
  auto* dst = static_cast<std::uint16_t*>(p.q_rot) + (b * p.seqlen_q + i) * n;
  for (std::int64_t x = threadIdx.x; x < n; x += blockDim.x) {
    const std::int64_t h = x / p.head_dim, c = x % p.head_dim;
    dst[x] = rotated<E>(p, static_cast<const std::uint16_t*>(p.q) + b * p.qs[0] + i * p.qs[1] + h * p.qs[2], c, pos);
  }
}

template <class E, class C>
int launch_decode_with(const DecodeParams& params, cudaStream_t stream) {
  constexpr int D = C::D;
  DecodeParams p = params;
  if (p.index.seqlen_new > 0) {
    ATTN_LAUNCH(append_kernel<E>, dim3(static_cast<unsigned>(p.index.seqlen_new), static_cast<unsigned>(p.batch)), 256,
                0, stream)
    (p);
    if (cudaError_t e = cudaGetLastError()) return e;
  }
  if (p.rotary.enabled()) {  // the decode kernel reads the rotated copy of q
    ATTN_LAUNCH(rotary_q_kernel<E>, dim3(static_cast<unsigned>(p.seqlen_q), static_cast<unsigned>(p.batch)), 256, 0,
                stream)
    (p);
    if (cudaError_t e = cudaGetLastError()) return e;
    p.q = p.q_rot;
    p.qs[2] = p.head_dim;
    p.qs[1] = p.heads * p.head_dim;
    p.qs[0] = p.seqlen_q * p.qs[1];
  }
  constexpr int smem = C::SMEM_BYTES;
  auto kernel = decode_kernel<E, C>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) return e;
  if (p.kv_heads % C::HB != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.kv_heads / C::HB * p.row_blocks),
                  static_cast<unsigned>(p.batch));
  ATTN_LAUNCH(kernel, grid, C::THREADS, smem, stream)(p);
  if (cudaError_t e = cudaGetLastError()) return e;
  if (p.num_splits > 1 || p.keys_per_split > 0) {
    const std::int64_t rows = p.batch * p.heads * p.seqlen_q;
    auto merge = merge_kernel<E, D>;
    ATTN_LAUNCH(merge, static_cast<unsigned>(rows), kMergeWarps * 32, 0, stream)(p);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace attn::cuda_detail
