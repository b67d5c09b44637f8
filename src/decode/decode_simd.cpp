// The decode chunk kernels for f32, bf16 and f16 caches, in Highway (compiled for every x86/Arm target,
// dispatched at run time). Accumulation in f32. Per chunk of n <= kChunk keys, all kv heads, with the
// R = group x seqlen_q query rows of each kv head g (RunChunk, decode_chunk-inl.h):
//   scores: each K row is loaded once and dotted with up to 4 query rows at a time (q rows stay in L1),
//           in key order (every kv head of key c before key c + 1) so K is read front to back, which
//           the hardware prefetcher streams about twice as fast as the head-by-head order on Zen 4; V
//           row c is prefetched as K row c is consumed, so the head-by-head P V pass finds the chunk's
//           V in cache. The dot goes through the mask's score rule (core/score_rule.hpp), masked keys get -inf.
//   fold:   attn::fold, vectorised over the chunk: the same m/l/o update and the same rescale_factor;
//           p = exp(s - m_new) with Highway's Exp (exp(-inf) = 0 for masked keys).
//   P V:    each V row is loaded once per 4 query rows x a block of output lanes, the o accumulators of
//           that block held in registers across the whole chunk.
// Two kernels fill in the dot products and P V:
//   Chunk<T> (here), any cache type: K and V rows widened to f32 in registers, f32 FMAs; for a quantized
//           cache the codes are widened (decode_quant-inl.h); with one scale per row (i8 per token,
//           fp8 per kv head) RunChunk scales the dots by K's scales and p by V's, with scales per
//           block of dims (q8_0) the dots sum the blocks' partial dots times their scales and P V
//           weights each block by p times its scale (Dots4Grouped, PvSumGrouped).
//   ChunkDp (decode_simd_bf16-inl.h), on AVX512-BF16 CPUs for bf16 caches and the 1-byte quantized ones
//           (their codes turned into bf16 as they are loaded): VDPBF16PS on the bf16 values.
#include <cstdint>
#include <cstring>
#include <type_traits>

// GCC 12 reports the deliberately undefined upper lanes inside its own AVX-512 intrinsics headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "decode/decode_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "cpu/dpbf16.hpp"
#include "core/element.hpp"
#include "decode/decode_chunk-inl.h"
#include "decode/decode_internal.hpp"
#include "decode/decode_quant-inl.h"
#include "decode/decode_simd_bf16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class T>
struct HwyOf {
  using type = T;
};
template <>
struct HwyOf<bf16_t> {
  using type = hwy::bfloat16_t;
};
template <>
struct HwyOf<f16_t> {
  using type = hwy::float16_t;
};

// What a loaded code of T is short of its value (stored_unit; 1 for the float types), folded into the scales.
template <class T>
constexpr float kUnit = stored_unit(dtype_of<T>());

// Lanes [x, x + N) of a cache row, widened to f32 (a quantized cache's codes divided by kUnit<T>).
template <class T>
HWY_INLINE VF LoadRow(DF df, const T* row, std::int64_t x) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, row + x);
  } else if constexpr (is_quantized(dtype_of<T>())) {  // the codes, unscaled (RunChunk applies the scales)
    return LoadStored<dtype_of<T>()>(df, reinterpret_cast<const std::uint8_t*>(row) + x);
  } else {
    using H = typename HwyOf<T>::type;
    const hn::Rebind<H, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const H*>(row) + x));
  }
}

// Lanes [x, x + 2N) of a cache row as two f32 vectors, as LoadRow loads them.
template <class T>
HWY_INLINE void LoadRowPair(DF df, const T* row, std::int64_t x, VF& lo, VF& hi) {
  if constexpr (is_quantized(dtype_of<T>())) {
    LoadStoredPair<dtype_of<T>()>(df, reinterpret_cast<const std::uint8_t*>(row) + x, lo, hi);
  } else {
    lo = LoadRow(df, row, x);
    hi = LoadRow(df, row, x + static_cast<std::int64_t>(hn::Lanes(df)));
  }
}

// One element as LoadRow loads it (the tails of the vector loops).
template <class T>
HWY_INLINE float LoadLane(const T& e) {
  return load<float>(e) / kUnit<T>;
}

// dst[r] = q_r . k for NR <= 4 query rows (stride d) and one key row; dst[NR ..] = 0. D > 0 is d at
// compile time (64, 128, 256: the loop unrolls and the out-of-order core overlaps more keys).
template <int NR, int D, class T>
HWY_INLINE void Dots4(const float* q, std::int64_t d, const T* k, float* dst) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df)), dd = D > 0 ? D : d;
  VF acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = hn::Zero(df);
  std::int64_t x = 0;
#pragma GCC unroll 8
  for (; x + 2 * N <= dd; x += 2 * N) {
    VF k0, k1;
    LoadRowPair(df, k, x, k0, k1);
    for (int r = 0; r < NR; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + r * dd + x), k0, acc[r]);
    for (int r = 0; r < NR; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + r * dd + x + N), k1, acc[r]);
  }
#pragma GCC unroll 16
  for (; x + N <= dd; x += N) {
    const VF kv = LoadRow(df, k, x);
    for (int r = 0; r < NR; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + r * dd + x), kv, acc[r]);
  }
  StoreSum4(df, acc[0], acc[1], acc[2], acc[3], dst);
  if constexpr (D == 0 || D % hn::MaxLanes(df) != 0) {  // else the vector loop covered d
    for (; x < dd; ++x) {
      const float kx = LoadLane(k[x]);
      for (int r = 0; r < NR; ++r) dst[r] += q[r * dd + x] * kx;
    }
  }
}

// o_r[x .. x + NV*N) += sum_c p[r][c] v_c[x ..] for NR rows (states stride S, p stride kChunk).
template <int NR, int NV, class T>
HWY_INLINE void PvSumBlock(const float* p, const T* const* vrows, std::int64_t vhs, std::int64_t n, float* o,
                           std::int64_t S, std::int64_t x) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::LoadU(df, o + r * S + x + v * N);
  for (std::int64_t c = 0; c < n; ++c) {
    const T* vr = vrows[c] + vhs;
    VF vv[NV];
    int v0 = 0;
    for (; v0 + 2 <= NV; v0 += 2) LoadRowPair(df, vr, x + v0 * N, vv[v0], vv[v0 + 1]);
    for (int v = v0; v < NV; ++v) vv[v] = LoadRow(df, vr, x + v * N);
    for (int r = 0; r < NR; ++r) {
      const VF pr = hn::Set(df, p[r * kChunk + c]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(pr, vv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[r][v], df, o + r * S + x + v * N);
}

// Output vectors per P V block: NR x kPvVectors accumulators, kPvVectors V vectors and a broadcast p
// must fit the register file. x86 up to AVX2 has 16 vector registers: 4 x 4 + 4 + 1 = 21 spilled the
// accumulators to the stack on every key (seen in perf annotate on Zen 3), 4 x 2 + 2 + 1 = 11 does not;
// AVX-512 and Arm have 32.
#if HWY_ARCH_X86 && HWY_TARGET >= HWY_AVX2
constexpr int kPvVectors = 2;
#else
constexpr int kPvVectors = 4;
#endif

// o_r += sum_{c < n} p[r][c] v_c for NR rows over all of d: blocks of kPvVectors vectors, then single
// vectors, then lane by lane.
template <int NR, class T>
HWY_INLINE void PvSum(const float* p, const T* const* vrows, std::int64_t vhs, std::int64_t n, float* o, std::int64_t S,
                      std::int64_t d) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t x = 0;
  for (; x + kPvVectors * N <= d; x += kPvVectors * N) PvSumBlock<NR, kPvVectors>(p, vrows, vhs, n, o, S, x);
  for (; x + N <= d; x += N) PvSumBlock<NR, 1>(p, vrows, vhs, n, o, S, x);
  for (; x < d; ++x)
    for (int r = 0; r < NR; ++r) {
      float acc = o[r * S + x];
      for (std::int64_t c = 0; c < n; ++c) acc += p[r * kChunk + c] * LoadLane(vrows[c][vhs + x]);
      o[r * S + x] = acc;
    }
}

// The key walk with Dots4.
template <class T, int D>
void ScoreKeys(const ChunkArgs<float>& a, float* dots4) {
  const auto dots = [](auto rows, const float* q, std::int64_t d, const T* k, float* dst) {
    Dots4<decltype(rows)::value, D>(q, d, k, dst);
  };
  WalkKeys<T>(a, dots4, [&](std::int64_t nr, std::int64_t row, const T* k, float* dst, std::int64_t, std::int64_t) {
    const std::int64_t d = D > 0 ? D : a.head_dim;
    WithRowCount(nr, dots, a.q + row * d, d, k, dst);
  });
}

// ---- Quantized caches with scales per block of G dims (llama.cpp's q8_0: G = 32) ----

// dst[r] = q_r . k for NR <= 4 rows, k dequantized block by block as it is loaded: its codes times the
// block's scale s[b] (one f32 multiply per value, core/quant.hpp's rule, so the dot is the textbook dot on the
// dequantized cache). Scaling K's 16 values per vector costs one multiply, against one FMA per query row for
// scaling each row's partial dot.
template <int NR, class T>
HWY_INLINE void Dots4Grouped(const float* q, std::int64_t d, const T* k, const float* s, std::int64_t G, float* dst) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[4];
  float tail[4] = {0, 0, 0, 0};
  for (int r = 0; r < 4; ++r) acc[r] = hn::Zero(df);
  for (std::int64_t x0 = 0, b = 0; x0 < d; x0 += G, ++b) {
    const VF vs = hn::Set(df, s[b] * kUnit<T>);
    std::int64_t x = x0;
    for (; x + N <= x0 + G; x += N) {
      const VF kv = hn::Mul(LoadRow(df, k, x), vs);
      for (int r = 0; r < NR; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + r * d + x), kv, acc[r]);
    }
    for (; x < x0 + G; ++x)
      for (int r = 0; r < NR; ++r) tail[r] += q[r * d + x] * (load<float>(k[x]) * s[b]);
  }
  StoreSum4(df, acc[0], acc[1], acc[2], acc[3], dst);
  for (int r = 0; r < NR; ++r) dst[r] += tail[r];
}

template <class T>
void ScoreKeysGrouped(const ChunkArgs<float>& a, float* dots4) {
  const std::int64_t d = a.head_dim, G = d / a.k_groups;
  const auto dots = [](auto rows, const float* q, std::int64_t d, const T* k, const float* s, std::int64_t G,
                       float* dst) { Dots4Grouped<decltype(rows)::value>(q, d, k, s, G, dst); };
  WalkKeys<T>(a, dots4, [&](std::int64_t nr, std::int64_t row, const T* k, float* dst, std::int64_t c, std::int64_t g) {
    WithRowCount(nr, dots, a.q + row * d, d, k, KeyBlockScales(a, c, g), G, dst);
  });
}

// PvSum with key c's scale of block b at vs[b * kChunk + c]: per block, the weights w[r][c] = p[r][c] x
// the scale (times kUnit<T>), n x NR multiplies in vectors, then the unscaled P V over the block's dims
// with w (a scalar multiply and a broadcast per key, row and vector would cost more than the FMAs).
// w: NR x kChunk scratch floats.
template <int NR, class T>
HWY_INLINE void PvSumGrouped(const float* p, const T* const* vrows, std::int64_t vhs, std::int64_t n, float* o,
                             std::int64_t S, std::int64_t d, const float* vs, std::int64_t groups, float* w) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df)), G = d / groups;
  const VF vu = hn::Set(df, kUnit<T>);
  for (std::int64_t b = 0; b < groups; ++b) {
    const float* vsb = vs + b * kChunk;
    for (int r = 0; r < NR; ++r) {
      std::int64_t c = 0;
      for (; c + N <= n; c += N)
        hn::StoreU(hn::Mul(hn::LoadU(df, p + r * kChunk + c), hn::Mul(hn::LoadU(df, vsb + c), vu)), df,
                   w + r * kChunk + c);
      for (; c < n; ++c) w[r * kChunk + c] = p[r * kChunk + c] * (vsb[c] * kUnit<T>);
    }
    std::int64_t x = b * G;
    const std::int64_t end = x + G;
    for (; x + kPvVectors * N <= end; x += kPvVectors * N) PvSumBlock<NR, kPvVectors>(w, vrows, vhs, n, o, S, x);
    if constexpr (kPvVectors > 2)
      for (; x + 2 * N <= end; x += 2 * N) PvSumBlock<NR, 2>(w, vrows, vhs, n, o, S, x);
    for (; x + N <= end; x += N) PvSumBlock<NR, 1>(w, vrows, vhs, n, o, S, x);
    for (; x < end; ++x)
      for (int r = 0; r < NR; ++r) {
        float acc = o[r * S + x];
        for (std::int64_t c = 0; c < n; ++c) acc += w[r * kChunk + c] * LoadLane(vrows[c][vhs + x]);
        o[r * S + x] = acc;
      }
  }
}

template <class T>
void Chunk(const ChunkArgs<float>& a) {
  constexpr bool kQuantized = is_quantized(dtype_of<T>());
  const T* const* vrows = reinterpret_cast<const T* const*>(a.v_rows);
  RunChunk<T>(
      a, kUnit<T>,
      [&](float* dots4) {
        if constexpr (kQuantized)
          if (a.k_groups > 1) return ScoreKeysGrouped<T>(a, dots4);
        WithHeadDim(a.head_dim, [&](auto D) { ScoreKeys<T, decltype(D)::value>(a, dots4); });
      },
      [&](auto nr, std::int64_t g, const float* p, std::int64_t c0, std::int64_t m, float* o) {
        if constexpr (kQuantized)
          if (a.v_groups > 1)
            return PvSumGrouped<decltype(nr)::value>(
                p, vrows + c0, g * a.v_head_stride, m, o, a.state_stride, a.head_dim_v,
                a.v_scales + g * a.v_groups * kChunk + c0, a.v_groups,
                a.scratch + chunk_weights_offset(a.kv_heads, a.group * a.seqlen_q, a.head_dim, a.head_dim_v));
        PvSum<decltype(nr)::value>(p, vrows + c0, g * a.v_head_stride, m, o, a.state_stride, a.head_dim_v);
      });
}

// Puts back in order the o that ChunkDp keeps in the unpack order (decode_simd_bf16-inl.h).
void FinishDispatch(const ChunkArgs<float>& a, DType t) {
  if (!UseDp(a, t)) return;
  float tmp[32];
  for (std::int64_t r = 0; r < a.kv_heads * a.group * a.seqlen_q; ++r)
    for (std::int64_t x = 0; x < a.head_dim_v; x += 32) {
      float* o = a.states + r * a.state_stride + x;
      for (int i = 0; i < 16; ++i) {  // lane i of each half: element 8 (i / 4) + i % 4 (+ 4 in the upper half)
        tmp[8 * (i / 4) + i % 4] = o[i];
        tmp[8 * (i / 4) + i % 4 + 4] = o[16 + i];
      }
      std::memcpy(o, tmp, sizeof tmp);
    }
}

void ChunkDispatch(const ChunkArgs<float>& a, DType t) {
#if ATTN_DPBF16_TARGET
  if (UseDp(a, t)) return ChunkDpOf(a, t);
#endif
  switch (t) {
    case DType::bf16:
      return Chunk<bf16_t>(a);
    case DType::f16:
      return Chunk<f16_t>(a);
    case DType::i8:
      return Chunk<std::int8_t>(a);
    case DType::fp8_e4m3:
      return Chunk<fp8_e4m3_t>(a);
    case DType::fp8_e5m2:
      return Chunk<fp8_e5m2_t>(a);
    default:
      return Chunk<float>(a);
  }
}

}  // namespace attn::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
HWY_EXPORT(ChunkDispatch);
HWY_EXPORT(FinishDispatch);
HWY_EXPORT(CodesToBf16);
HWY_EXPORT(QueryCodesRun);
void decode_chunk_simd(const ChunkArgs<float>& a, DType cache_dtype) {
  HWY_DYNAMIC_DISPATCH(ChunkDispatch)(a, cache_dtype);
}
void decode_finish_simd(const ChunkArgs<float>& a, DType cache_dtype) {
  HWY_DYNAMIC_DISPATCH(FinishDispatch)(a, cache_dtype);
}
bool decode_codes_to_bf16(DType t, const std::uint8_t* codes, std::int64_t n, std::uint16_t* out) {
  return HWY_DYNAMIC_DISPATCH(CodesToBf16)(t, codes, n, out);
}
bool decode_query_codes_run(std::int64_t head_dim, std::int64_t k_groups) {
  return HWY_DYNAMIC_DISPATCH(QueryCodesRun)(head_dim, k_groups);
}
}  // namespace attn::detail
#endif
