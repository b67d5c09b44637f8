// The opt-in quantized-query key walk (DecodeOptions::quantized_query) for int8 caches on CPUs with
// AVX512-VNNI, a Highway per-target header with code only for the AVX-512 targets; included by
// decode_simd_bf16-inl.h, whose ChunkDp runs it.
//
// llama.cpp's way: each query row is quantized to int8 codes with one f32 scale (decode.cpp's
// pack_queries), and q . k is an integer dot product, VPDPBUSD: 64 products of an unsigned and a signed
// byte per instruction, exact in int32. K's signed codes are made unsigned by adding 128 (one XOR per 64
// codes, shared by every query row), and each row's dots then carry 128 x the sum of its codes, which
// the row's accumulators start at minus (computed once per run of keys). Per key at head dim 128 with 4
// query rows: 2 XORs and 8 VPDPBUSD, where the bf16 kernel converts 128 codes (20 instructions) and
// runs 16 VDPBF16PS. The row's q scale multiplies its dots once per run of keys; K's scales are applied
// as in the bf16 kernel (per row by RunChunk, per block of dims here).
//
// The extra error is q's rounding to int8: at most half a q step (the row's largest |q| / 254) per
// element, so |error of q . k| <= (max |q| / 254) x sum |k| (test_decode_quantized_query.cpp measures it).
#if defined(ATTN_DECODE_QUERY_CODES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_DECODE_QUERY_CODES_INL_H_
#undef ATTN_DECODE_QUERY_CODES_INL_H_
#else
#define ATTN_DECODE_QUERY_CODES_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "cpu/dpbf16.hpp"
#include "decode/decode_chunk-inl.h"
#include "decode/decode_internal.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::HWY_NAMESPACE {

#if ATTN_DPBF16_TARGET
// Whether the quantized-query walk takes head dim d and K's k_groups scale blocks per row: d one of
// the head dims WithHeadDim unrolls that is a multiple of 64 (a vector of codes), and K's scales per
// row, per block of 32 dims (q8_0) or per block of a multiple of 64.
inline bool QueryCodesTake(std::int64_t d, std::int64_t k_groups) {
  if (!(d == 64 || d == 128 || d == 192 || d == 256) || k_groups < 1 || d % k_groups != 0) return false;
  const std::int64_t G = d / k_groups;
  return k_groups == 1 || G == 32 || G % 64 == 0;
}

// Whether that walk runs here for head dim d and k_groups: QueryCodesTake on a CPU with its instructions
// (also the test hook decode_query_codes_run, decode_internal.hpp).
inline bool QueryCodesRun(std::int64_t d, std::int64_t k_groups) {
  return cpu_has_avx512bf16() && QueryCodesTake(d, k_groups);
}

// Whether a chunk of a cache of type t takes that walk: q's codes given (quantized_query), an int8 cache,
// and QueryCodesRun for its head dim and K's scale blocks (one per row when K has no block scales).
inline bool QueryCodesWalk(const ChunkArgs<float>& a, DType t) {
  return t == DType::i8 && a.q_codes != nullptr && QueryCodesRun(a.head_dim, a.k_scales != nullptr ? a.k_groups : 1);
}

// A block of NR query rows' codes, held in registers across a run of keys, and what each row's
// accumulators start at: minus 128 x the sum of each lane's four codes (VPDPBUSD of 128 with the codes),
// per vector of codes when K has scales per block of dims, else summed into corr[r][0].
template <int NR, int D>
struct HeldQueryCodes {
  static constexpr int kVectors = D / 64;
  __m512i q[NR][kVectors];
  __m512i corr[NR][kVectors];

  ATTN_DPBF16_ATTR HWY_INLINE HeldQueryCodes(const std::int8_t* rows, bool per_vector) {
    const __m512i u128 = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int r = 0; r < NR; ++r)
      for (int z = 0; z < kVectors; ++z) {
        q[r][z] = _mm512_loadu_si512(rows + r * D + 64 * z);
        corr[r][z] =
            _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), u128, q[r][z]));
        if (!per_vector && z > 0) corr[r][0] = _mm512_add_epi32(corr[r][0], corr[r][z]);
      }
  }
};

// The scales of one vector of 64 dims of K: q8_0's two blocks of 32 (lanes 0-7, whose four products each
// are dims 0-31, then lanes 8-15), or the one of a block of G >= 64 dims.
ATTN_DPBF16_ATTR HWY_INLINE __m512 VectorScales(const float* s, int z, std::int64_t G) {
  if (G == 32) return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s[2 * z]), _mm512_set1_ps(s[2 * z + 1]));
  return _mm512_set1_ps(s[64 * z / G]);
}

// dst[r] = codes_r . k (in q's code units) for NR rows and one int8 K row, dst[NR ..] = 0; q(r, z) and
// corr(r, z) give row r's vector z of codes and of corrections (HeldQueryCodes' corr: with s == nullptr
// only z = 0, the sum). With K's scales per block (s given) each vector's dots are scaled as they are
// added up.
template <int NR, int D, class QFn, class CorrFn>
ATTN_DPBF16_ATTR HWY_INLINE void DotsQueryCodes(QFn&& q, CorrFn&& corr, const std::int8_t* k, const float* s,
                                                std::int64_t G, float* dst) {
  constexpr int Z = D / 64;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 f[4];
  for (int r = 0; r < 4; ++r) f[r] = _mm512_setzero_ps();
  if (s == nullptr) {
    __m512i acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = corr(r, 0);
    for (int z = 0; z < Z; ++z) {
      const __m512i ku = _mm512_xor_si512(_mm512_loadu_si512(k + 64 * z), flip);  // k + 128, unsigned
      for (int r = 0; r < NR; ++r) acc[r] = _mm512_dpbusd_epi32(acc[r], ku, q(r, z));
    }
    for (int r = 0; r < NR; ++r) f[r] = _mm512_cvtepi32_ps(acc[r]);  // exact: |lanes| < 2^24
  } else {
    for (int z = 0; z < Z; ++z) {
      const __m512i ku = _mm512_xor_si512(_mm512_loadu_si512(k + 64 * z), flip);
      const __m512 vs = VectorScales(s, z, G);
      for (int r = 0; r < NR; ++r)
        f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(corr(r, z), ku, q(r, z))), vs, f[r]);
    }
  }
  StoreSum4(DF(), VF{f[0]}, VF{f[1]}, VF{f[2]}, VF{f[3]}, dst);
}

// dst[4 c + t] *= scale[t] for keys c0 <= c < c1, t < 4: the rows' q scales on a run's dots.
ATTN_DPBF16_ATTR HWY_INLINE void ScaleRunByRows(const float* scale, int nr, float* dst, std::int64_t c0,
                                                std::int64_t c1) {
  const __m512 rows = _mm512_broadcast_f32x4(_mm_maskz_loadu_ps(static_cast<__mmask8>((1u << nr) - 1), scale));
  for (std::int64_t c = c0; c < c1; c += 4) {
    const __mmask16 live = c1 - c >= 4 ? 0xFFFF : static_cast<__mmask16>((1u << (4 * (c1 - c))) - 1);
    float* at = dst + 4 * c;
    _mm512_mask_storeu_ps(at, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, at), rows));
  }
}

// The key walk on q's codes (WalkHeads: each block's codes held across runs of keys).
template <int D>
ATTN_DPBF16_ATTR void ScoreKeysQueryCodes(const ChunkArgs<float>& a, float* dots4) {
  const std::int8_t* const* krows = reinterpret_cast<const std::int8_t* const*>(a.k_rows);
  const bool per_vector = a.k_scales != nullptr && a.k_groups > 1;
  const auto keys = [&](auto rows, std::int64_t row, std::int64_t g, bool prefetch_v, float* dst, std::int64_t c0,
                        std::int64_t c1) ATTN_DPBF16_ATTR {
    constexpr int NR = decltype(rows)::value;
    const HeldQueryCodes<NR, D> held(a.q_codes + row * D, per_vector);
    const auto q = [&](int r, int z) ATTN_DPBF16_ATTR { return held.q[r][z]; };
    const auto corr = [&](int r, int z) ATTN_DPBF16_ATTR { return held.corr[r][z]; };
    for (std::int64_t c = c0; c < c1; ++c) {
      if (prefetch_v) PrefetchV<std::int8_t>(a, c, g);
      DotsQueryCodes<NR, D>(q, corr, krows[c] + g * a.k_head_stride, KeyBlockScales(a, c, g), D / a.k_groups,
                            dst + 4 * c);
    }
    ScaleRunByRows(a.q_code_scales + row, NR, dst, c0, c1);
  };
  WalkHeads(a, dots4,
            [&](std::int64_t nr, std::int64_t row, std::int64_t g, bool prefetch_v, float* dst, std::int64_t c0,
                std::int64_t c1) ATTN_DPBF16_ATTR { WithRowCount(nr, keys, row, g, prefetch_v, dst, c0, c1); });
}

#endif  // ATTN_DPBF16_TARGET

}  // namespace attn::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_DECODE_QUERY_CODES_INL_H_
