// Device building blocks shared by the forward and decode kernels: loading a tile into swizzled shared
// memory with cp.async, S = Q K^T and O += P V for one warp's 16 x n slab on tensor cores, and the
// online-softmax step over a slab's registers (the rescale rule is attn::rescale_factor).
#pragma once

#include <cstdint>
#include <limits>

#include "attn/online_softmax.hpp"
#include "cuda/layout.hpp"
#include "cuda/ptx.cuh"

namespace attn::cuda_detail {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Loads rows [0, rows) of a [rows][D] tile: row r comes from src(r) (a pointer to D contiguous 16-bit
// elements), or when src(r) is null is zero-filled without reading (cp.async with source size 0; it
// still names `any_global`, a valid global address). All threads of the block take part.
template <int D, int THREADS, class SrcFn>
__device__ __forceinline__ void load_tile(std::uint16_t* smem, int rows, const void* any_global, SrcFn src) {
  constexpr int kChunks = D / 8;
  const int tid = threadIdx.x;
  for (int c = tid; c < rows * kChunks; c += THREADS) {
    const int r = c / kChunks, ch = c % kChunks;
    const std::uint16_t* g = src(r);
    const std::uint32_t dst = smem_addr(smem + swizzle(r, ch * 8, D));
    if (g) cp_async_16(dst, g + ch * 8, 16);
    else cp_async_16(dst, any_global, 0);
  }
}

// s[n][.] = Q[q_row0 .. +16) K[k_row0 .. +8*NT)^T for one warp; Q and K are swizzled [*][D] tiles.
template <class E, int D, int NT>
__device__ __forceinline__ void warp_qk(float (&s)[NT][4], const std::uint16_t* sq, int q_row0, const std::uint16_t* sk,
                                        int k_row0) {
  static_assert(NT % 2 == 0);
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
  const RowCol qa = ldmatrix_a_addr(lane), kb = ldmatrix_b_addr(lane);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[4];
    ldmatrix_x4(a, smem_addr(sq + swizzle(q_row0 + qa.row, kk * 16 + qa.col, D)));
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; ++n2) {
      std::uint32_t b[4];
      ldmatrix_x4(b, smem_addr(sk + swizzle(k_row0 + n2 * 16 + kb.row, kk * 16 + kb.col, D)));
      mma_16816<E>(s[2 * n2], a, b[0], b[1]);
      mma_16816<E>(s[2 * n2 + 1], a, b[2], b[3]);
    }
  }
}

// o[d][.] += P V[v_row0 .. +8*NT) for one warp; p holds the 16 x 8*NT probabilities in C-fragment
// layout (as warp_qk left them), V is a swizzled [*][D] tile.
template <class E, int D, int NT>
__device__ __forceinline__ void warp_pv(float (&o)[D / 8][4], const float (&p)[NT][4], const std::uint16_t* sv, int v_row0) {
  const int lane = threadIdx.x % 32;
  const RowCol vb = ldmatrix_bt_addr(lane);
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    // The C fragments of n-tiles 2kk and 2kk+1 are exactly the A fragment of a 16 x 16 k-step.
    const std::uint32_t a[4] = {pack2<E>(p[2 * kk][0], p[2 * kk][1]), pack2<E>(p[2 * kk][2], p[2 * kk][3]),
                                pack2<E>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                pack2<E>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int d2 = 0; d2 < D / 16; ++d2) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, smem_addr(sv + swizzle(v_row0 + kk * 16 + vb.row, d2 * 16 + vb.col, D)));
      mma_16816<E>(o[2 * d2], a, b[0], b[1]);
      mma_16816<E>(o[2 * d2 + 1], a, b[2], b[3]);
    }
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The online-softmax step for one warp's 16 rows: the lane holds rows lane/4 (half 0) and lane/4 + 8
// (half 1). s holds scaled, masked scores (-inf = masked) and becomes p = exp(s - m_new); m is the
// running max, l the lane's partial row sum (summed over the quad at the end), and o is rescaled by
// attn::rescale_factor(m_old, m_new).
template <int NT, int DT>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[DT][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = kNegInf;
#pragma unroll
    for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
    mx = quad_max(mx);
    const float m_new = fmaxf(m[half], mx);
    const float alpha = rescale_factor(m[half], m_new);
    const float m_use = m_new == kNegInf ? 0.f : m_new;  // a row with nothing visible yet: p = exp(-inf) = 0
    m[half] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = __expf(s[n][2 * half + e] - m_use);
        s[n][2 * half + e] = pv;
        sum += pv;
      }
    l[half] = l[half] * alpha + sum;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      o[d][2 * half] *= alpha;
      o[d][2 * half + 1] *= alpha;
    }
  }
}

// Scores of one 16 x 8*NT slab: scale (and the mask's score transform when softcap or ALiBi is on),
// then -inf outside the mask. row_of(half) and key_of(n, e) give the query index and key index.
template <int NT, class RowFn, class KeyFn, class VisibleFn>
__device__ __forceinline__ void score_slab(float (&s)[NT][4], const detail::Mask& mask, float scale, bool transform,
                                           float slope0, float slope1, bool need_mask, RowFn row_of, KeyFn key_of,
                                           VisibleFn visible_fn) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1;
      const std::int64_t i = row_of(half), j = key_of(n, e);
      float x = transform ? mask.score(s[n][e], i, j, half ? slope1 : slope0) : s[n][e] * scale;
      if (need_mask && !visible_fn(half, i, j)) x = kNegInf;
      s[n][e] = x;
    }
}

}  // namespace attn::cuda_detail
