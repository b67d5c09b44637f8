// The decode chunk kernel for bf16 and 1-byte quantized caches on CPUs with AVX512-BF16 (cpu/dpbf16.hpp), a Highway
// per-target header holding code only for the AVX-512 targets; included by decode_simd.cpp inside
// foreach_target, once per target.
//
// ChunkDp is RunChunk (decode_chunk-inl.h) with these inner steps:
// A quantized cache's codes are turned into bf16 (exactly) as they are loaded, and then go the bf16 values'
// way; their scales are applied as in the generic kernel (decode_simd.cpp).
//   q . k with VDPBF16PS, 32 products per instruction with no widening of K. A bf16 q is its own
//         q_hi; an f16 q is q_hi + q_lo (both bf16) exactly. An f32 q goes to the generic kernel
//         (decode.cpp's pack_queries says why).
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

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/dpbf16.hpp"
#include "core/quant.hpp"
#include "decode/decode_chunk-inl.h"
#include "decode/decode_internal.hpp"
#include "decode/decode_query_codes-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::HWY_NAMESPACE {

#if ATTN_DPBF16_TARGET
// 32 values of a cache row from element x as bf16. A bf16 row is loaded as it is; a quantized row's codes
// become bf16, which holds every i8, e4m3 and e5m2 value exactly (at most 7 significant bits of bf16's 8,
// exponents far inside its range), NaN and Inf included: i8 through f32 (sign-extended, converted, and
// narrowed two vectors at a time), fp8 by a lookup of the magnitude in core/quant.hpp's tables of 128
// bf16 values (one VPERMI2B for their low bytes, one for their high bytes) with the sign put back: four
// instructions per 32 codes, where 16-bit lookups took seven.
template <class T>
ATTN_DPBF16_ATTR HWY_INLINE __m512i LoadBf16x32(const T* row, std::int64_t x) {
  const auto* codes = reinterpret_cast<const std::uint8_t*>(row) + x;
  if constexpr (std::is_same_v<T, bf16_t>) {
    return _mm512_loadu_si512(row + x);
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    const __m512 lo =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
    const __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16))));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // elements 0-15 from lo, 16-31 from hi
  } else {
    const Fp8Bf16Table& t = dtype_of<T>() == DType::fp8_e4m3 ? kE4m3Bf16 : kE5m2Bf16;
    alignas(64) static constexpr std::uint8_t kPairs[64] = {
        0,  0,  1,  1,  2,  2,  3,  3,  4,  4,  5,  5,  6,  6,  7,  7,  8,  8,  9,  9,  10, 10,
        11, 11, 12, 12, 13, 13, 14, 14, 15, 15, 16, 16, 17, 17, 18, 18, 19, 19, 20, 20, 21, 21,
        22, 22, 23, 23, 24, 24, 25, 25, 26, 26, 27, 27, 28, 28, 29, 29, 30, 30, 31, 31};
    // Bytes 2i and 2i + 1 = code i (VPERMB); VPERMI2B looks up bytes by their bits 0-6, the magnitude:
    // the even bytes become the low bytes of the bf16 bits, then the odd ones the high bytes, each
    // lookup keeping the other bytes (its index) as they were.
    const __m512i pairs = _mm512_permutexvar_epi8(
        _mm512_load_si512(kPairs), _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes))));
    const __m512i low = _mm512_mask2_permutex2var_epi8(_mm512_load_si512(t.lo), pairs, 0x5555555555555555ull,
                                                       _mm512_load_si512(t.lo + 64));
    const __m512i mag = _mm512_mask2_permutex2var_epi8(_mm512_load_si512(t.hi), low, 0xAAAAAAAAAAAAAAAAull,
                                                       _mm512_load_si512(t.hi + 64));
    // mag | (low & 0x8000): the code's bit 7, still in low's odd bytes, becomes the sign (0xF8 = A | (B & C)).
    return _mm512_ternarylogic_epi32(mag, low, _mm512_set1_epi16(static_cast<short>(0x8000)), 0xF8);
  }
}

// Key c's weight for one block of dims: p times the block's scale in a quantized cache whose V has scales
// per block of dims (vs[c]), else p.
HWY_INLINE float BlockWeight(const float* p, std::int64_t c, const float* vs) { return vs ? p[c] * vs[c] : p[c]; }

// o is kept per 32-element block in the order VPUNPCK{L,H}WD leaves it: lanes 0-15 hold elements
// {0-3, 8-11, 16-19, 24-27}, lanes 16-31 elements {4-7, 12-15, 20-23, 28-31} (FinishDispatch restores).
// o_r (permuted, NB blocks of 32 from x) += sum_c w[r][c] v_c, f32 FMAs on V widened by unpacking; w is p
// (times each key's block scale when vs is given: BlockWeight).
template <int NR, int NB, class T>
ATTN_DPBF16_ATTR HWY_INLINE void PvSumBlockDp(const float* p, const T* const* vrows, std::int64_t vhs, std::int64_t n,
                                              float* o, std::int64_t S, std::int64_t x, const float* vs) {
  __m512 acc[NR][2 * NB];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_loadu_ps(o + r * S + x + 16 * v);
  const __m512i zero = _mm512_setzero_si512();
  for (std::int64_t c = 0; c < n; ++c) {
    const T* vr = vrows[c] + vhs;
    __m512 vv[2 * NB];
    for (int b = 0; b < NB; ++b) {
      const __m512i raw = LoadBf16x32(vr, x + 32 * b);
      vv[2 * b] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, raw));
      vv[2 * b + 1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, raw));
    }
    for (int r = 0; r < NR; ++r) {
      const __m512 pr = _mm512_set1_ps(BlockWeight(p + r * kChunk, c, vs));
      for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_fmadd_ps(pr, vv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) _mm512_storeu_ps(o + r * S + x + 16 * v, acc[r][v]);
}

// The same sum with the weights rounded to bf16 and two keys per VDPBF16PS: pb[r][j] holds (w[r][2j],
// w[r][2j + 1]) as bf16, V rows 2j and 2j + 1 are interleaved by VPUNPCK{L,H}WD (the o order above). An
// odd tail pairs the last key with a zero row, never with a real one (0 x NaN is NaN). With sigma, the
// weights are w / sigma[r] and o_r += sigma[r] x the sum (RoundWeightPairs).
template <int NR, int NB, class T>
ATTN_DPBF16_ATTR HWY_INLINE void PvSumBlockDpPairs(const std::uint32_t* pb, const float* sigma, const T* const* vrows,
                                                   std::int64_t vhs, std::int64_t n, float* o, std::int64_t S,
                                                   std::int64_t x) {
  __m512 acc[NR][2 * NB];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) acc[r][v] = sigma ? _mm512_setzero_ps() : _mm512_loadu_ps(o + r * S + x + 16 * v);
  for (std::int64_t c = 0; c < n; c += 2) {
    const T* v0 = vrows[c] + vhs;
    const T* v1 = c + 1 < n ? vrows[c + 1] + vhs : nullptr;
    __m512bh vv[2 * NB];
    for (int b = 0; b < NB; ++b) {
      const __m512i a = LoadBf16x32(v0, x + 32 * b);
      const __m512i z = v1 ? LoadBf16x32(v1, x + 32 * b) : _mm512_setzero_si512();
      vv[2 * b] = (__m512bh)_mm512_unpacklo_epi16(a, z);
      vv[2 * b + 1] = (__m512bh)_mm512_unpackhi_epi16(a, z);
    }
    for (int r = 0; r < NR; ++r) {
      const __m512bh pr = (__m512bh)_mm512_set1_epi32(static_cast<int>(pb[r * (kChunk / 2) + c / 2]));
      for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pr, vv[v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) {
      float* dst = o + r * S + x + 16 * v;
      _mm512_storeu_ps(dst,
                       sigma ? _mm512_fmadd_ps(_mm512_set1_ps(sigma[r]), acc[r][v], _mm512_loadu_ps(dst)) : acc[r][v]);
    }
}

// A row's weights of one chunk as kChunk / 16 vectors: p, zero past n, times each key's scale vs[c] when
// vs is given.
ATTN_DPBF16_ATTR HWY_INLINE void LoadWeights(const float* p, std::int64_t n, const float* vs, __m512* w) {
  for (std::int64_t c = 0; c < kChunk; c += 16) {
    const __mmask16 live = c >= n ? 0 : n - c >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - c)) - 1);
    w[c / 16] = _mm512_maskz_loadu_ps(live, p + c);
    if (vs) w[c / 16] = _mm512_mul_ps(w[c / 16], _mm512_maskz_loadu_ps(live, vs + c));
  }
}

// pb[r][c / 2] = the weights of keys c and c + 1 of row r rounded to bf16 (round to nearest even), zero
// past n: p, or p times each key's block scale (BlockWeight). With sigma (a quantized cache), the weights
// are first divided by their largest, sigma[r] (1 if they are all 0), so that the largest is exactly 1:
// rounding p to bf16 is exact for the key that sets the row's maximum (p = exp(0) = 1), and p times a
// scale would lose that, costing the most accurate term its accuracy (a nearly one-hot row).
template <int NR>
ATTN_DPBF16_ATTR HWY_INLINE void RoundWeightPairs(const float* p, std::int64_t n, const float* vs, float* sigma,
                                                  std::uint32_t* pb) {
  for (int r = 0; r < NR; ++r) {
    __m512 w[kChunk / 16];
    LoadWeights(p + r * kChunk, n, vs, w);
    __m512 top_v = _mm512_set1_ps(1.0f);
    bool divide = false;
    if (sigma) {
      __m512 m = _mm512_setzero_ps();
      for (const __m512 v : w) m = _mm512_max_ps(m, v);
      const float top = _mm512_reduce_max_ps(m);
      sigma[r] = top > 0 ? top : 1.0f;
      top_v = _mm512_set1_ps(sigma[r]);
      divide = sigma[r] != 1.0f;
    }
    auto* dst = reinterpret_cast<__m256bh*>(pb + r * (kChunk / 2));
    for (std::int64_t c = 0; c < kChunk; c += 16)  // x / x = 1 exactly
      dst[c / 16] = _mm512_cvtneps_pbh(divide ? _mm512_div_ps(w[c / 16], top_v) : w[c / 16]);
  }
}

// An i8 cache's P V on integers, for bf16 outputs (where P may be rounded: flash-attn's rule): each
// row's weights w = p x scale, divided by their largest sigma[r], in 15-bit fixed point (round(w / sigma x
// 32767), 0 .. 32767 in int16), and the codes sign-extended to int16 (VPMOVSXBW, one instruction per 32
// codes where bf16 needs five); VPDPWSSD adds two keys' products per 32-bit lane, exactly in int32 (a
// chunk's sum is below 64 x 2 x 32767 x 128 < 2^29), and o_r += sigma[r] / 32767 x the sum once per
// chunk. Against bf16 weights (8 significant bits, relative rounding) a weight's error here is at most
// sigma / 65534, absolute: smaller for every key whose weight is above sigma / 128, and the key that sets
// the maximum is exact in both; those below add at most kChunk x sigma / 65534 per chunk, a fraction of
// the bf16 output's own rounding. pw[r][c] holds the fixed-point weight of key c (zero past n), so
// pw's uint32 word j is the pair of keys 2j, 2j + 1 that one VPDPWSSD takes, interleaved with V rows 2j
// and 2j + 1 by VPUNPCK{L,H}WD (the o order of PvSumBlockDp). Returns false, with nothing done, when a
// row's weights are not all finite (a NaN or infinite scale: those take the bf16 weights, which carry NaN), or
// their largest is below f32's normal range.
template <int NR>
ATTN_DPBF16_ATTR HWY_INLINE bool FixedWeights(const float* p, std::int64_t n, const float* vs, float* sigma,
                                              std::int16_t* pw) {
  for (int r = 0; r < NR; ++r) {
    __m512 w[kChunk / 16];
    LoadWeights(p + r * kChunk, n, vs, w);
    __m512 m = _mm512_setzero_ps();
    for (const __m512 v : w) {
      m = _mm512_max_ps(m, v);
      if (_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q) != 0xFFFF) return false;  // NaN fails the ordered compare
    }
    // +Inf, and a largest weight below f32's normal range (32767 / top would overflow)
    const float top = _mm512_reduce_max_ps(m);
    if (!(top < HUGE_VALF) || (top > 0 && top < FLT_MIN)) return false;
    sigma[r] = top > 0 ? top / 32767.0f : 1.0f;
    const __m512 inv = _mm512_set1_ps(top > 0 ? 32767.0f / top : 0.0f);
    auto* dst = reinterpret_cast<__m256i*>(pw + r * kChunk);
    for (std::int64_t c = 0; c < kChunk; c += 16)  // top x (32767 / top) rounds to 32767 at most
      _mm256_storeu_si256(dst + c / 16, _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(w[c / 16], inv))));
  }
  return true;
}

// acc += VPDPWSSD(a, b), written in place. GCC 12 does not keep VPDPWSSD's accumulator in its register
// across a loop: with the intrinsic the 4 x 4 block below copied every accumulator before each product and
// spilled some to the stack (82 instructions per pair of keys where 34 do the work).
ATTN_DPBF16_ATTR HWY_INLINE void DpwssdInPlace(__m512i& acc, __m512i a, __m512i b) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

// o_r (permuted, NB blocks of 32 from x) += sigma[r] x sum_c pw[r][c] v_c over an i8 cache's rows, two
// keys per VPDPWSSD (FixedWeights). An odd tail pairs the last key with a zero row.
template <int NR, int NB>
ATTN_DPBF16_ATTR HWY_INLINE void PvSumBlockFixed(const std::int16_t* pw, const float* sigma,
                                                 const std::int8_t* const* vrows, std::int64_t vhs, std::int64_t n,
                                                 float* o, std::int64_t S, std::int64_t x) {
  __m512i acc[NR][2 * NB];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_setzero_si512();
  const auto widen = [](const std::int8_t* row) ATTN_DPBF16_ATTR {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
  };
  for (std::int64_t c = 0; c < n; c += 2) {
    const std::int8_t* v0 = vrows[c] + vhs + x;
    const std::int8_t* v1 = c + 1 < n ? vrows[c + 1] + vhs + x : nullptr;
    __m512i vv[2 * NB];
    for (int b = 0; b < NB; ++b) {
      const __m512i a = widen(v0 + 32 * b);
      const __m512i z = v1 ? widen(v1 + 32 * b) : _mm512_setzero_si512();
      vv[2 * b] = _mm512_unpacklo_epi16(a, z);
      vv[2 * b + 1] = _mm512_unpackhi_epi16(a, z);
    }
    for (int r = 0; r < NR; ++r) {
      std::int32_t pair;
      std::memcpy(&pair, pw + r * kChunk + c, sizeof pair);
      const __m512i pr = _mm512_set1_epi32(pair);
      for (int v = 0; v < 2 * NB; ++v) DpwssdInPlace(acc[r][v], pr, vv[v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) {
      float* dst = o + r * S + x + 16 * v;
      _mm512_storeu_ps(dst,
                       _mm512_fmadd_ps(_mm512_set1_ps(sigma[r]), _mm512_cvtepi32_ps(acc[r][v]), _mm512_loadu_ps(dst)));
    }
}

// o_r += sum_{c < n} p[r][c] v_c for NR rows over dims [x, end) (multiples of 32), in blocks of 64 then
// 32; with vs, key c's weight is p times vs[c] (the scale of V's block of dims there). With
// bf16_p the weights are rounded to bf16, and for a quantized cache (its scales in the weights) first
// divided by their largest (RoundWeightPairs).
template <int NR, class T>
ATTN_DPBF16_ATTR HWY_INLINE void PvSumDpRange(const float* p, const T* const* vrows, std::int64_t vhs, std::int64_t n,
                                              float* o, std::int64_t S, std::int64_t x, std::int64_t end, bool bf16_p,
                                              const float* vs) {
  if constexpr (std::is_same_v<T, std::int8_t>)
    if (bf16_p) {
      alignas(64) std::int16_t pw[NR * kChunk];
      float sigma[NR];
      if (FixedWeights<NR>(p, n, vs, sigma, pw)) {
        for (; x + 64 <= end; x += 64) PvSumBlockFixed<NR, 2>(pw, sigma, vrows, vhs, n, o, S, x);
        if (x < end) PvSumBlockFixed<NR, 1>(pw, sigma, vrows, vhs, n, o, S, x);
        return;
      }
    }
  if (bf16_p) {
    constexpr bool kQuantized = is_quantized(dtype_of<T>());
    alignas(64) std::uint32_t pb[NR * (kChunk / 2)];
    float sigma[NR];
    float* sg = kQuantized ? sigma : nullptr;
    RoundWeightPairs<NR>(p, n, vs, sg, pb);
    for (; x + 64 <= end; x += 64) PvSumBlockDpPairs<NR, 2>(pb, sg, vrows, vhs, n, o, S, x);
    if (x < end) PvSumBlockDpPairs<NR, 1>(pb, sg, vrows, vhs, n, o, S, x);
    return;
  }
  for (; x + 64 <= end; x += 64) PvSumBlockDp<NR, 2>(p, vrows, vhs, n, o, S, x, vs);
  if (x < end) PvSumBlockDp<NR, 1>(p, vrows, vhs, n, o, S, x, vs);
}

// P V over all of d; V's scales per block of dims (groups > 1, vs[b * kChunk + c]) weight each block.
template <int NR, class T>
ATTN_DPBF16_ATTR HWY_INLINE void PvSumDp(const float* p, const T* const* vrows, std::int64_t vhs, std::int64_t n,
                                         float* o, std::int64_t S, std::int64_t d, bool bf16_p, const float* vs,
                                         std::int64_t groups) {
  if (groups <= 1) return PvSumDpRange<NR>(p, vrows, vhs, n, o, S, 0, d, bf16_p, nullptr);
  const std::int64_t G = d / groups;
  for (std::int64_t b = 0; b < groups; ++b)
    PvSumDpRange<NR>(p, vrows, vhs, n, o, S, b * G, (b + 1) * G, bf16_p, vs + b * kChunk);
}

// Dots4 (decode_simd.cpp) with VDPBF16PS: dst[r] = q_r . k for NR <= 4 query rows and one key row of dd
// dims (a multiple of 32); dst[NR ..] = 0. q(r, x, lo) is row r's q_hi (q_lo with lo, used when kLo) at
// dims [x, x + 32): a load, or a register the caller holds. With scales per block of G dims (s given, G a
// multiple of 32), each block's partial dot is multiplied by its scale s[x / G] as it is added up.
template <int NR, bool kLo, class T, class QFn>
ATTN_DPBF16_ATTR HWY_INLINE void DotsDp(QFn&& q, std::int64_t dd, const T* k, const float* s, std::int64_t G,
                                        float* dst) {
  __m512 acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = _mm512_setzero_ps();
  const auto add_dots = [&](__m512* sum, std::int64_t x) ATTN_DPBF16_ATTR {
    const __m512bh kv = (__m512bh)LoadBf16x32(k, x);
    for (int r = 0; r < NR; ++r) {
      sum[r] = _mm512_dpbf16_ps(sum[r], q(r, x, false), kv);
      if constexpr (kLo) sum[r] = _mm512_dpbf16_ps(sum[r], q(r, x, true), kv);
    }
  };
  if (s == nullptr) {
#pragma GCC unroll 8
    for (std::int64_t x = 0; x < dd; x += 32) add_dots(acc, x);
  } else {
    __m512 part[NR];
    for (int r = 0; r < NR; ++r) part[r] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (std::int64_t x = 0; x < dd; x += 32) {
      add_dots(part, x);
      // q8_0's blocks are one vector each: no division for them
      const bool one_vector = G == 32;
      if (!one_vector && (x + 32) % G != 0) continue;
      const __m512 vs = _mm512_set1_ps(s[one_vector ? x / 32 : x / G]);
      for (int r = 0; r < NR; ++r) {
        acc[r] = _mm512_fmadd_ps(part[r], vs, acc[r]);
        part[r] = _mm512_setzero_ps();
      }
    }
  }
  StoreSum4(DF(), VF{acc[0]}, VF{acc[1]}, VF{acc[2]}, VF{acc[3]}, dst);
}

// The key walk with DotsDp and q loaded for every key (WalkKeys); kLo: q_lo is there (q is not exactly
// bf16).
template <class T, int D, bool kLo>
ATTN_DPBF16_ATTR void ScoreKeysDp(const ChunkArgs<float>& a, float* dots4) {
  const auto dots = [](auto rows, const std::uint16_t* qh, const std::uint16_t* ql, std::int64_t d, const T* k,
                       const float* s, std::int64_t G, float* dst) ATTN_DPBF16_ATTR {
    const auto q = [&](int r, std::int64_t x, bool lo)
                       ATTN_DPBF16_ATTR { return (__m512bh)_mm512_loadu_si512((lo ? ql : qh) + r * d + x); };
    DotsDp<decltype(rows)::value, kLo>(q, D > 0 ? D : d, k, s, G, dst);  // a constant bound where D is known
  };
  WalkKeys<T>(a, dots4,
              [&](std::int64_t nr, std::int64_t row, const T* k, float* dst, std::int64_t c, std::int64_t g)
                  ATTN_DPBF16_ATTR {
                    const std::int64_t d = D > 0 ? D : a.head_dim;
                    WithRowCount(nr, dots, a.q_hi + row * d, kLo ? a.q_lo + row * d : nullptr, d, k,
                                 KeyBlockScales(a, c, g), d / a.k_groups, dst);
                  });
}

// The key walk with DotsDp and each block's q_hi held in registers across runs of keys (WalkHeads): for a
// quantized cache, q that is exactly bf16 and a head dim whose 4 rows fit in 16 registers.
template <class T, int D>
ATTN_DPBF16_ATTR void ScoreKeysDpHeld(const ChunkArgs<float>& a, float* dots4) {
  static_assert(D > 0 && D / 32 * 4 <= 16);
  const T* const* krows = reinterpret_cast<const T* const*>(a.k_rows);
  const auto keys = [&](auto rows, std::int64_t row, std::int64_t g, bool prefetch_v, float* dst, std::int64_t c0,
                        std::int64_t c1) ATTN_DPBF16_ATTR {
    constexpr int NR = decltype(rows)::value;
    __m512bh held[NR][D / 32];
    for (int r = 0; r < NR; ++r)
      for (int x = 0; x < D / 32; ++x) held[r][x] = (__m512bh)_mm512_loadu_si512(a.q_hi + (row + r) * D + 32 * x);
    const auto q = [&](int r, std::int64_t x, bool) ATTN_DPBF16_ATTR { return held[r][x / 32]; };
    for (std::int64_t c = c0; c < c1; ++c) {
      if (prefetch_v) PrefetchV<T>(a, c, g);
      DotsDp<NR, false>(q, D, krows[c] + g * a.k_head_stride, KeyBlockScales(a, c, g), D / a.k_groups, dst + 4 * c);
    }
  };
  WalkHeads(a, dots4,
            [&](std::int64_t nr, std::int64_t row, std::int64_t g, bool prefetch_v, float* dst, std::int64_t c0,
                std::int64_t c1) ATTN_DPBF16_ATTR { WithRowCount(nr, keys, row, g, prefetch_v, dst, c0, c1); });
}

template <class T>
ATTN_DPBF16_ATTR void ChunkDp(const ChunkArgs<float>& a) {
  const T* const* vrows = reinterpret_cast<const T* const*>(a.v_rows);
  const bool v_grouped = a.v_scales != nullptr && a.v_groups > 1;
  RunChunk<T>(
      a, 1.0f,  // LoadBf16x32 gives the codes' exact values
      [&](float* dots4) ATTN_DPBF16_ATTR {
        WithHeadDim(a.head_dim, [&](auto D) ATTN_DPBF16_ATTR {
          constexpr int kD = decltype(D)::value;
          if constexpr (kD > 0 && kD % 64 == 0 && std::is_same_v<T, std::int8_t>)
            if (QueryCodesWalk(a, DType::i8)) return ScoreKeysQueryCodes<kD>(a, dots4);
          if constexpr (kD > 0 && kD <= 128 && !std::is_same_v<T, bf16_t>)
            if (a.q_lo == nullptr) return ScoreKeysDpHeld<T, kD>(a, dots4);
          a.q_lo != nullptr ? ScoreKeysDp<T, kD, true>(a, dots4) : ScoreKeysDp<T, kD, false>(a, dots4);
        });
      },
      [&](auto nr, std::int64_t g, const float* p, std::int64_t c0, std::int64_t m, float* o) ATTN_DPBF16_ATTR {
        PvSumDp<decltype(nr)::value>(p, vrows + c0, g * a.v_head_stride, m, o, a.state_stride, a.head_dim_v, a.bf16_out,
                                     v_grouped ? a.v_scales + g * a.v_groups * kChunk + c0 : nullptr,
                                     v_grouped ? a.v_groups : 1);
      });
}

// ChunkDp for cache type t (one that dots_in_bf16 takes).
ATTN_DPBF16_ATTR void ChunkDpOf(const ChunkArgs<float>& a, DType t) {
  switch (t) {
    case DType::i8:
      return ChunkDp<std::int8_t>(a);
    case DType::fp8_e4m3:
      return ChunkDp<fp8_e4m3_t>(a);
    case DType::fp8_e5m2:
      return ChunkDp<fp8_e5m2_t>(a);
    default:
      return ChunkDp<bf16_t>(a);
  }
}

// The path ChunkDp serves: a cache type whose values bf16 holds (dots_in_bf16), on a CPU with the
// instruction, q split (q_hi set), head_dim and head_dim_v multiples of 32, and a quantized cache's blocks
// of dims (if it has scales per block) multiples of 32.
// With q's codes (quantized_query), an int8 cache takes it on any CPU with the instructions, for the
// head dims its walk unrolls (QueryCodesWalk), whether or not VDPBF16PS pays there: that walk and the
// int8 P V run none.
bool UseDp(const ChunkArgs<float>& a, DType t) {
  const auto blocks_fit = [](std::int64_t d, std::int64_t groups) { return groups <= 1 || (d / groups) % 32 == 0; };
  if (!(a.head_dim % 32 == 0 && a.head_dim_v % 32 == 0 &&
        (a.k_scales == nullptr || blocks_fit(a.head_dim, a.k_groups)) &&
        (a.v_scales == nullptr || blocks_fit(a.head_dim_v, a.v_groups))))
    return false;
  return QueryCodesWalk(a, t) || (bf16_dots() && dots_in_bf16(t) && a.q_hi != nullptr);
}

// The test hook decode_codes_to_bf16 (decode_internal.hpp): LoadBf16x32 over n codes (a multiple of 32).
ATTN_DPBF16_ATTR void CodesToBf16Dp(DType t, const std::uint8_t* codes, std::int64_t n, std::uint16_t* out) {
  const auto run = [&](auto type) ATTN_DPBF16_ATTR {
    using T = decltype(type);
    for (std::int64_t x = 0; x < n; x += 32)
      _mm512_storeu_si512(out + x, LoadBf16x32(reinterpret_cast<const T*>(codes), x));
  };
  if (t == DType::i8) return run(std::int8_t{});
  if (t == DType::fp8_e4m3) return run(fp8_e4m3_t{});
  run(fp8_e5m2_t{});
}
bool CodesToBf16(DType t, const std::uint8_t* codes, std::int64_t n, std::uint16_t* out) {
  if (!cpu_has_avx512bf16()) return false;
  CodesToBf16Dp(t, codes, n, out);
  return true;
}
#else
bool UseDp(const ChunkArgs<float>&, DType) { return false; }
bool QueryCodesRun(std::int64_t, std::int64_t) { return false; }
bool CodesToBf16(DType, const std::uint8_t*, std::int64_t, std::uint16_t*) { return false; }
#endif  // ATTN_DPBF16_TARGET

}  // namespace attn::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_DECODE_SIMD_BF16_INL_H_
