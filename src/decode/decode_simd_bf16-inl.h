// The decode chunk kernel for bf16 caches on CPUs with AVX512-BF16 (core/dpbf16.hpp), a Highway
// per-target header holding code only for the AVX-512 targets; included by decode_simd.cpp inside
// foreach_target, once per target.
//
// ChunkDp is RunChunk (decode_chunk-inl.h) with these inner steps:
//   q . k with VDPBF16PS, 32 products per instruction with no widening of K. q is split into
//         q_hi + q_lo (both bf16) when it is not exactly a bf16 value, so an f32 q loses nothing that
//         matters (|q_lo| <= 2^-9 |q|, and the rounding of q_lo is 2^-17 |q|, far below f32
//         accumulation error).
//   P V:  with a bf16 output, p is rounded to bf16 and VDPBF16PS does two keys per instruction
//         (PvSumBlockDpPairs); otherwise f32 FMAs on V widened by unpacking (PvSumBlockDp). Both leave o
//         in the unpack order, which FinishDispatch (decode_simd.cpp) restores once per work item.
//
// Every kernel function here carries ATTN_DPBF16_ATTR (it holds the intrinsic or inlines one that does),
// and so does every lambda handed to the shared steps (WalkKeys, RunChunk): GCC copies the mark onto a
// lambda from the function around it, Clang does not.
#if defined(ATTN_DECODE_SIMD_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_DECODE_SIMD_BF16_INL_H_
#undef ATTN_DECODE_SIMD_BF16_INL_H_
#else
#define ATTN_DECODE_SIMD_BF16_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "core/dpbf16.hpp"
#include "decode/decode_chunk-inl.h"
#include "decode/decode_internal.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::HWY_NAMESPACE {

#if ATTN_DPBF16_TARGET
// o is kept per 32-element block in the order VPUNPCK{L,H}WD leaves it: lanes 0-15 hold elements
// {0-3, 8-11, 16-19, 24-27}, lanes 16-31 elements {4-7, 12-15, 20-23, 28-31} (FinishDispatch restores).
// o_r (permuted, NB blocks of 32 from x) += sum_c p[r][c] v_c, f32 FMAs on V widened by unpacking.
template <int NR, int NB>
ATTN_DPBF16_ATTR HWY_INLINE void PvSumBlockDp(const float* p, const std::uint16_t* const* vrows, std::int64_t vhs,
                                              std::int64_t n, float* o, std::int64_t S, std::int64_t x) {
  __m512 acc[NR][2 * NB];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_loadu_ps(o + r * S + x + 16 * v);
  const __m512i zero = _mm512_setzero_si512();
  for (std::int64_t c = 0; c < n; ++c) {
    const std::uint16_t* vr = vrows[c] + vhs + x;
    __m512 vv[2 * NB];
    for (int b = 0; b < NB; ++b) {
      const __m512i raw = _mm512_loadu_si512(vr + 32 * b);
      vv[2 * b] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, raw));
      vv[2 * b + 1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, raw));
    }
    for (int r = 0; r < NR; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * kChunk + c]);
      for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_fmadd_ps(pr, vv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) _mm512_storeu_ps(o + r * S + x + 16 * v, acc[r][v]);
}

// The same sum with p rounded to bf16 and two keys per VDPBF16PS: pb[r][j] holds (p[r][2j], p[r][2j + 1])
// as bf16, V rows 2j and 2j + 1 are interleaved by VPUNPCK{L,H}WD (the o order above). An odd tail
// pairs the last key with a zero row, never with a real one (0 x NaN is NaN).
template <int NR, int NB>
ATTN_DPBF16_ATTR HWY_INLINE void PvSumBlockDpPairs(const std::uint32_t* pb, const std::uint16_t* const* vrows,
                                                   std::int64_t vhs, std::int64_t n, float* o, std::int64_t S,
                                                   std::int64_t x) {
  __m512 acc[NR][2 * NB];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_loadu_ps(o + r * S + x + 16 * v);
  for (std::int64_t c = 0; c < n; c += 2) {
    const std::uint16_t* v0 = vrows[c] + vhs + x;
    const std::uint16_t* v1 = c + 1 < n ? vrows[c + 1] + vhs + x : nullptr;
    __m512bh vv[2 * NB];
    for (int b = 0; b < NB; ++b) {
      const __m512i a = _mm512_loadu_si512(v0 + 32 * b);
      const __m512i z = v1 ? _mm512_loadu_si512(v1 + 32 * b) : _mm512_setzero_si512();
      vv[2 * b] = (__m512bh)_mm512_unpacklo_epi16(a, z);
      vv[2 * b + 1] = (__m512bh)_mm512_unpackhi_epi16(a, z);
    }
    for (int r = 0; r < NR; ++r) {
      const __m512bh pr = (__m512bh)_mm512_set1_epi32(static_cast<int>(pb[r * (kChunk / 2) + c / 2]));
      for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pr, vv[v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) _mm512_storeu_ps(o + r * S + x + 16 * v, acc[r][v]);
}

// o_r += sum_{c < n} p[r][c] v_c for NR rows over all of d (a multiple of 32), in blocks of 64 then 32.
template <int NR>
ATTN_DPBF16_ATTR HWY_INLINE void PvSumDp(const float* p, const std::uint16_t* const* vrows, std::int64_t vhs,
                                         std::int64_t n, float* o, std::int64_t S, std::int64_t d, bool bf16_p) {
  std::int64_t x = 0;
  if (bf16_p) {
    // p rows [0, n) rounded to bf16 (round to nearest even), zero past n: pairs are 32-bit words.
    alignas(64) std::uint32_t pb[NR * (kChunk / 2)];
    for (int r = 0; r < NR; ++r) {
      const float* pr = p + r * kChunk;
      auto* dst = reinterpret_cast<__m256bh*>(pb + r * (kChunk / 2));
      for (std::int64_t c = 0; c < kChunk; c += 16) {
        const __mmask16 live = c >= n ? 0 : n - c >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - c)) - 1);
        dst[c / 16] = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(live, pr + c));
      }
    }
    for (; x + 64 <= d; x += 64) PvSumBlockDpPairs<NR, 2>(pb, vrows, vhs, n, o, S, x);
    if (x < d) PvSumBlockDpPairs<NR, 1>(pb, vrows, vhs, n, o, S, x);
    return;
  }
  for (; x + 64 <= d; x += 64) PvSumBlockDp<NR, 2>(p, vrows, vhs, n, o, S, x);
  if (x < d) PvSumBlockDp<NR, 1>(p, vrows, vhs, n, o, S, x);
}

// Dots4 (decode_simd.cpp) with VDPBF16PS: dst[r] = q_r . k for NR <= 4 query rows (q_hi + q_lo, stride
// d) and one key row (d a multiple of 32); dst[NR ..] = 0.
template <int NR, int D, bool kLo>
ATTN_DPBF16_ATTR HWY_INLINE void DotsDp(const std::uint16_t* qh, const std::uint16_t* ql, std::int64_t d,
                                        const bf16_t* k, float* dst) {
  __m512 acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = _mm512_setzero_ps();
  const std::int64_t dd = D > 0 ? D : d;
#pragma GCC unroll 8
  for (std::int64_t x = 0; x < dd; x += 32) {
    const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + x);
    for (int r = 0; r < NR; ++r) {
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(qh + r * dd + x), kv);
      if constexpr (kLo) acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(ql + r * dd + x), kv);
    }
  }
  StoreSum4(DF(), VF{acc[0]}, VF{acc[1]}, VF{acc[2]}, VF{acc[3]}, dst);
}

// The key walk with DotsDp; kLo: q_lo is there (q is not exactly bf16).
template <int D, bool kLo>
ATTN_DPBF16_ATTR void ScoreKeysDp(const ChunkArgs<float>& a, float* dots4) {
  const auto dots = [](auto rows, const std::uint16_t* qh, const std::uint16_t* ql, std::int64_t d, const bf16_t* k,
                       float* dst) ATTN_DPBF16_ATTR { DotsDp<decltype(rows)::value, D, kLo>(qh, ql, d, k, dst); };
  WalkKeys<bf16_t>(a, dots4,
                   [&](std::int64_t nr, std::int64_t row, const bf16_t* k, float* dst, std::int64_t, std::int64_t)
                       ATTN_DPBF16_ATTR {
                         const std::int64_t d = D > 0 ? D : a.head_dim;
                         WithRowCount(nr, dots, a.q_hi + row * d, kLo ? a.q_lo + row * d : nullptr, d, k, dst);
                       });
}

ATTN_DPBF16_ATTR void ChunkDp(const ChunkArgs<float>& a) {
  const auto* const* vrows = reinterpret_cast<const std::uint16_t* const*>(a.v_rows);
  RunChunk(
      a,
      [&](float* dots4) ATTN_DPBF16_ATTR {
        WithHeadDim(a.head_dim, [&](auto D) ATTN_DPBF16_ATTR {
          constexpr int kD = decltype(D)::value;
          a.q_lo != nullptr ? ScoreKeysDp<kD, true>(a, dots4) : ScoreKeysDp<kD, false>(a, dots4);
        });
      },
      [&](auto nr, std::int64_t g, const float* p, std::int64_t c0, std::int64_t m, float* o) ATTN_DPBF16_ATTR {
        PvSumDp<decltype(nr)::value>(p, vrows + c0, g * a.v_head_stride, m, o, a.state_stride, a.head_dim_v,
                                     a.bf16_out);
      });
}

// The path ChunkDp serves: a bf16 cache on a CPU with the instruction, q split (q_hi set), head_dim and
// head_dim_v multiples of 32.
bool UseDp(const ChunkArgs<float>& a, DType t) {
  return cpu_has_avx512bf16() && t == DType::bf16 && a.head_dim % 32 == 0 && a.head_dim_v % 32 == 0 &&
         a.q_hi != nullptr;
}
#else
bool UseDp(const ChunkArgs<float>&, DType) { return false; }
#endif  // ATTN_DPBF16_TARGET

}  // namespace attn::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_DECODE_SIMD_BF16_INL_H_
