// FlashAttention-2 forward on tensor cores (Dao 2023, Algorithm 1 on a GPU), templated on a traits
// struct (FwdTraits): forward.cu instantiates the library's configurations, and the GPU benchmark
// (bench/gpu/variants.cu) times others against them.
//
// One block per (row block of BR queries, query head, sequence); WARPS warps, each owning MT slabs of
// 16 query rows that share every K and V fragment the warp loads (so MT = 2 halves the shared-memory
// reads per mma, the tile's bottleneck with one slab: docs/cuda.md, "Machine code"). The block walks the
// key tiles its rows can see (key_tiles: causal tiles above the diagonal are skipped), K and V tiles of
// BC keys double-buffered in shared memory with cp.async so the next tile streams in while this one is
// multiplied. Per tile and slab: S = Q K^T (mma.sync m16n8k16,
// f32 accumulators); the online-softmax step in base 2 (attn::rescale_factor's rule), on the raw dots
// with the scale folded into each exponent's FFMA, or on tiles that straddle a mask edge and when softcap
// or ALiBi is on after the full transform and mask (mask_scores), chosen per tile (raw_scores_fold);
// P cast to 16 bits straight from the accumulator
// registers into the A operand of O += P V. The epilogue divides by l and writes out and the LSE.
#pragma once

#include <cuda_runtime.h>

#include "core/cache_index.hpp"
#include "cuda/params.hpp"
#include "cuda/tile.cuh"

namespace attn::cuda_detail {

// Head dim D; WARPS warps, each owning MT slabs of 16 query rows (BR rows per block); key tiles of BC
// keys, K and V double-buffered; MIN_BLOCKS: blocks per SM the register allocation must allow
// (__launch_bounds__), 1 = no limit beyond 255 registers per thread.
template <int D_, int WARPS_, int MT_, int BC_, int MIN_BLOCKS_ = 1>
struct FwdTraits {
  static constexpr int D = D_, WARPS = WARPS_, MT = MT_, BC = BC_, MIN_BLOCKS = MIN_BLOCKS_;
  static constexpr int THREADS = WARPS * 32, BR = WARPS * 16 * MT;
  static constexpr int SMEM_BYTES = (BR + 4 * BC) * D * 2;  // Q, then 2 stages of K and of V (16-bit)
};

// One block's rows and keys: sequence b's query and key counts, and where its rows start in a packed
// (varlen) batch.
struct ForwardExtent {
  std::int64_t sq, sk, q_off, k_off;
};
__device__ __forceinline__ ForwardExtent forward_extent(const FwdParams& p, std::int64_t b) {
  ForwardExtent e{p.seqlen_q, p.seqlen_k, 0, 0};
  if (p.cu_q) {
    e.q_off = p.cu_q[b];
    e.sq = p.cu_q[b + 1] - e.q_off;
    e.k_off = p.cu_k[b];
    e.sk = p.cu_k[b + 1] - e.k_off;
  }
  return e;
}

// Tile t of the block's K or V rows into shared memory. Tiles lie in [0, sk) and row blocks start below
// sq, so each has at least one valid row. A paged tile (PAGED) looks each row's page up; rows past the
// sequence name its last key.
template <class C, bool PAGED>
struct ForwardKvTiles {
  const FwdParams& p;
  std::int64_t b, sk;
  __device__ __forceinline__ void load(std::uint16_t* dst, const std::uint16_t* base, const std::int64_t (&s)[3],
                                       std::int64_t t) const {
    constexpr int D = C::D, THREADS = C::THREADS, BC = C::BC;
    const int valid = valid_rows(sk - t * BC, BC);
    if constexpr (!PAGED) {
      load_strided_tile<D, THREADS, BC>(dst, base + t * BC * s[1], s[1], valid);
    } else {
      load_tile<D, THREADS, BC>(dst, [&](int r) {
        const std::int64_t j = t * BC + clamp_row(r, valid);
        return RowSource{base + p.pages.offset(b, j, s[0], s[1]), r < valid};
      });
    }
  }
};

// What every tile of a block needs beyond its buffers: the mask, the row block's first query, the
// warp's slabs, the score transform's inputs.
struct ForwardRows {
  detail::Mask mask;
  std::int64_t i0;
  int warp, lane;
  float scale_log2, slope;
  bool transform;
  // The query row a lane holds: slab mt of the warp, half 0 (row lane/4) or 1 (row lane/4 + 8).
  template <int MT>
  __device__ __forceinline__ std::int64_t lane_row(int mt, int half) const {
    return i0 + (warp * MT + mt) * 16 + lane / 4 + 8 * half;
  }
};

// Key tile t (shared stage `stage`; K(t) and V(t) in flight, the next tile's loads issued here): S = Q K^T
// per slab, the mask or transform where needed, the online-softmax step, then, once V(t) has landed,
// the non-finite values' rows and O += P V.
template <class E, class C, bool PAGED>
__device__ __forceinline__ void forward_tile(float (&o)[C::MT][C::D / 8][4], float (&m)[C::MT][2], float (&l)[C::MT][2],
                                             const ForwardRows& fr, const ForwardKvTiles<C, PAGED>& kv,
                                             const FwdParams& p, const std::uint16_t* k, const std::uint16_t* v,
                                             const std::uint16_t* sQ, std::uint16_t* sK, std::uint16_t* sV,
                                             std::int64_t t, std::int64_t t_end, int stage) {
  constexpr int D = C::D, BR = C::BR, BC = C::BC, NT = BC / 8, DT = D / 8;
  cp_async_wait<1>();  // K(t) (and Q) landed; V(t) may still be in flight
  __syncthreads();
  if (t + 1 < t_end) kv.load(sK + (stage ^ 1) * BC * D, k, p.ks, t + 1);
  cp_async_commit();

  const bool need_mask = tile_needs_mask(fr.mask, fr.i0, BR, BC, t);
  float s[C::MT][NT][4];
  warp_qk<E, D, NT, C::MT>(s, sQ, fr.warp * C::MT * 16, sK + stage * BC * D, 0);
  const bool raw = raw_scores_fold(need_mask, fr.transform, fr.scale_log2);
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt) {
    if (!raw)
      mask_scores<NT>(
          s[mt], fr.mask, fr.slope, fr.slope, need_mask, [&](int half) { return fr.lane_row<C::MT>(mt, half); },
          [&](int n, int e) { return t * BC + n * 8 + (fr.lane % 4) * 2 + (e & 1); },
          [&](int, std::int64_t i, std::int64_t j) { return visible(fr.mask, i, j); });
    softmax_step<NT, DT>(s[mt], m[mt], l[mt], o[mt], raw ? fr.scale_log2 : 1.f);
  }

  cp_async_wait<1>();  // V(t) landed; K(t+1) may still be in flight
  __syncthreads();
  if (t + 1 < t_end) kv.load(sV + (stage ^ 1) * BC * D, v, p.vs, t + 1);
  cp_async_commit();
  std::uint16_t* vt = sV + stage * BC * D;
  if (need_mask && any_nonfinite<E, D, BC, C::THREADS>(vt)) {  // rare: see tile.cuh
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) {
      add_nonfinite_values<E, D, NT>(o[mt], s[mt], vt, 0, [&](int half, int j) {
        return visible(fr.mask, fr.lane_row<C::MT>(mt, half), t * BC + j);
      });
    }
    __syncthreads();
    zero_nonfinite<E, D, BC, C::THREADS>(vt);
    __syncthreads();
  }
  warp_pv<E, D, NT, C::MT>(o, s, vt, 0);
}

// Epilogue: head h's sink folded in (attn::fold_sink in base 2: one key of logit sink whose value row is
// zero), then out = o / l (0 for a row that saw nothing), lse = m ln 2 + log l (-inf; m is in base 2),
// as attn::finalize.
template <class E, class C>
__device__ __forceinline__ void forward_store_rows(const FwdParams& p, const float (&o)[C::MT][C::D / 8][4],
                                                   const float (&m)[C::MT][2], const float (&l)[C::MT][2],
                                                   const ForwardRows& fr, const ForwardExtent& e, std::int64_t b,
                                                   std::int64_t h) {
  constexpr int DT = C::D / 8;
  const float sink2 = p.rule.sink(h) * kLog2e;  // -inf without a sink
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const std::int64_t i = fr.lane_row<C::MT>(mt, half);
      float lsum = quad_sum(l[mt][half]), mrow = m[mt][half], o_scale = 1.f;
      if (i >= e.sq) continue;
      if (sink2 != kNegInf) {
        const float m_new = fmaxf(mrow, sink2);
        o_scale = mrow == kNegInf ? 0.f : exp2f(mrow - m_new);
        lsum = lsum * o_scale + exp2f(sink2 - m_new);
        mrow = m_new;
      }
      const float inv = lsum == 0.f ? 0.f : o_scale / lsum;
      std::uint16_t* out =
          static_cast<std::uint16_t*>(p.out) + (p.cu_q ? 0 : b * p.os[0]) + (e.q_off + i) * p.os[1] + h * p.os[2];
#pragma unroll
      for (int d = 0; d < DT; ++d) {
        const int c = d * 8 + (fr.lane % 4) * 2;
        *reinterpret_cast<std::uint32_t*>(out + c) = pack2<E>(o[mt][d][2 * half] * inv, o[mt][d][2 * half + 1] * inv);
      }
      if (p.lse && fr.lane % 4 == 0)
        p.lse[(p.cu_q ? 0 : b * p.ls[0]) + h * p.ls[1] + (e.q_off + i) * p.ls[2]] =
            lsum == 0.f ? kNegInf : mrow * kLn2 + logf(lsum);
    }
}

// PAGED: k and v are a paged cache read through p.pages (varlen only). A template parameter, not a
// run-time branch: the page lookup's registers made the d = 64 kernel spill (ptxas), paged or not.
template <class E, class C, bool PAGED = false>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS) forward_kernel(const FwdParams p) {
  constexpr int D = C::D, THREADS = C::THREADS, BR = C::BR, BC = C::BC, DT = D / 8;
  ATTN_DYNAMIC_SMEM(std::uint16_t, smem);
  std::uint16_t* sQ = smem;
  std::uint16_t* sK = sQ + BR * D;  // [2][BC][D]
  std::uint16_t* sV = sK + 2 * BC * D;

  const std::int64_t b = blockIdx.z, h = blockIdx.y, i0 = std::int64_t{blockIdx.x} * BR;
  const ForwardExtent e = forward_extent(p, b);
  if (i0 >= e.sq) return;
  const std::int64_t kvh = h / (p.heads / p.kv_heads);
  const std::uint16_t* q =
      static_cast<const std::uint16_t*>(p.q) + (p.cu_q ? 0 : b * p.qs[0]) + e.q_off * p.qs[1] + h * p.qs[2];
  // Key rows: packed from row k_off (varlen), or batch b's, or (paged) each row looked up in the block table
  // from kv head kvh's row of page 0.
  const std::int64_t k_first = PAGED ? 0 : e.k_off, k_batch = PAGED || p.cu_q ? 0 : b;
  const std::uint16_t* k =
      static_cast<const std::uint16_t*>(p.k) + k_batch * p.ks[0] + k_first * p.ks[1] + kvh * p.ks[2];
  const std::uint16_t* v =
      static_cast<const std::uint16_t*>(p.v) + k_batch * p.vs[0] + k_first * p.vs[1] + kvh * p.vs[2];

  const float slope = p.rule.alibi_slope(b, h);
  const detail::Mask mask = p.rule.mask(e.sq, e.sk);
  const ForwardRows fr{mask,
                       i0,
                       static_cast<int>(threadIdx.x / 32),
                       static_cast<int>(threadIdx.x % 32),
                       static_cast<float>(p.rule.scale) * kLog2e,
                       slope,
                       mask.transforms_scores(slope)};
  const TileRange tiles = key_tiles(fr.mask, i0, BR, BC);
  const ForwardKvTiles<C, PAGED> kv{p, b, e.sk};
  if (tiles.first < tiles.end) {
    load_strided_tile<D, THREADS, BR>(sQ, q + i0 * p.qs[1], p.qs[1], valid_rows(e.sq - i0, BR));
    kv.load(sK, k, p.ks, tiles.first);
    cp_async_commit();
    kv.load(sV, v, p.vs, tiles.first);
    cp_async_commit();
  }

  float o[C::MT][DT][4];
  float m[C::MT][2], l[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
      for (int x = 0; x < 4; ++x) o[mt][d][x] = 0.f;
    m[mt][0] = m[mt][1] = kNegInf;
    l[mt][0] = l[mt][1] = 0.f;
  }
  for (std::int64_t t = tiles.first; t < tiles.end; ++t)
    forward_tile<E, C, PAGED>(o, m, l, fr, kv, p, k, v, sQ, sK, sV, t, tiles.end,
                              static_cast<int>((t - tiles.first) & 1));
  cp_async_wait<0>();
  forward_store_rows<E, C>(p, o, m, l, fr, e, b, h);
}

template <class E, class C>
int launch_forward_with(const FwdParams& p, std::int64_t max_seqlen_q, cudaStream_t stream) {
  constexpr int BR = C::BR, smem = C::SMEM_BYTES;
  auto kernel = p.pages.paged() ? forward_kernel<E, C, true> : forward_kernel<E, C, false>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) return e;
  const dim3 grid(static_cast<unsigned>((max_seqlen_q + BR - 1) / BR), static_cast<unsigned>(p.heads),
                  static_cast<unsigned>(p.batch));
  ATTN_LAUNCH(kernel, grid, C::THREADS, smem, stream)(p);
  return cudaGetLastError();
}

}  // namespace attn::cuda_detail
