// The softmax's exponential on SIMD lanes, a Highway per-target header: ExpDiff(d, s, m) = exp(s - m),
// the one vectorised exp of the CPU kernels (tiled forward, backward, decode). It runs once per score,
// so after the two products it is the largest cost of a tile (18% of a d = 64 f32 prefill on AVX2 with
// Highway's Exp, measured with perf: docs/prefill.md).
//
// f32 lanes: exp(x) = 2^t, t = x log2(e) = n + f with n = round(t) and |f| <= 1/2, so
//   2^t = 2^n * (1 + f c1 + ... + f^6 c6)
// The rounding is the 1.5 * 2^23 shifter (t + M - M rounds t to an integer in float arithmetic), so
// no float-to-int conversion runs (undefined for NaN on the emulated targets, and patched for overflow
// on x86); 2^n comes from the shifter's low bits moved into the exponent field. The polynomial is a
// relative minimax fit of 2^f on [-1/2, 1/2] (1.2 ulp evaluated in f32 without FMA; about 1 ulp
// with it, as Highway's Exp). About 16 operations against Highway's 26 plus the NaN guards its
// float-to-int conversion needs.
//   NaN in x gives NaN (f is NaN, and the last step multiplies), as std::exp does: a NaN score must
//   poison its row. x = -inf and any x below -86.6 (t < -125) give exactly 0: masked scores have no
//   weight, and the true value there is below 2^-125 of the row's largest term. x above 88.7 gives
//   +inf (t is bounded by 128 before the shifter, and 2^128 is inf).
// f64 lanes: Highway's Exp (exact to an ulp, which the 1e-12 tests need), NaN passed through.
#if defined(ATTN_EXP_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_EXP_SIMD_INL_H_
#undef ATTN_EXP_SIMD_INL_H_
#else
#define ATTN_EXP_SIMD_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace attn::detail::exp_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 2^f for |f| <= 1/2: 1 + f (c1 + f (c2 + ... + f c6)), Horner in FMAs.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Exp2Fraction(D d, V f) {
  V q = hn::Set(d, 1.5353361959569156e-4f);
  q = hn::MulAdd(q, f, hn::Set(d, 1.3398875016719103e-3f));
  q = hn::MulAdd(q, f, hn::Set(d, 9.6184369176626205e-3f));
  q = hn::MulAdd(q, f, hn::Set(d, 5.5503323674201965e-2f));
  q = hn::MulAdd(q, f, hn::Set(d, 2.4022647738456726e-1f));
  q = hn::MulAdd(q, f, hn::Set(d, 6.9314718246459961e-1f));
  return hn::MulAdd(q, f, hn::Set(d, 1.0f));
}

// 2^t on f32 lanes, the base-2 core of ExpDiff: for kernels that fold log2(e) (and their scale) into the
// one multiply-add that forms t (the AMX forward). Same range rules: t < -125 gives 0, t >= 128 +inf,
// NaN gives NaN.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V Exp2(D d, V t) {
  static_assert(sizeof(hn::TFromD<D>) == 4, "Exp2 is the f32 lanes' exponential");
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // AVX-512: n = round(t) by VRNDSCALEPS and p 2^n by VSCALEFPS, 4 instructions fewer than the shifter
  // below and the same value (n from the same clamped t, f = t - n from the raw t, the product by 2^n
  // exact where it is kept, t < -125 zeroed): the same bits in the release build, within one ulp in
  // every build, but for t in [127.5, 128): 2^t is finite there, and the shifter's factor 2^128 already
  // inf (test_exp_simd). Softmax arguments are <= 0.
  if constexpr (sizeof(V) == 64) {
    // The masked form with every lane kept: the plain one reads an undefined vector, which GCC 12 warns of.
    const __m512 tc = hn::Min(t, hn::Set(d, 128.0f)).raw;
    const V n{_mm512_mask_roundscale_ps(tc, 0xFFFF, tc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
    const V q = Exp2Fraction(d, hn::Sub(t, n));
    const __mmask16 kept = _mm512_cmp_ps_mask(t.raw, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
    return V{_mm512_maskz_scalef_ps(kept, q.raw, n.raw)};
  }
#endif
  const hn::RebindToUnsigned<D> du;
  const V shifter = hn::Set(d, 12582912.0f);  // 1.5 * 2^23: t + it keeps round(t) in its low bits
  // Only t <= 128 needs bounding (2^n must not wrap past inf): below -125 the select discards p.
  const V r = hn::Add(hn::Min(t, hn::Set(d, 128.0f)), shifter);
  const V n = hn::Sub(r, shifter);
  // r's low 9 bits hold n mod 512 (the shifter's own low bits are 0x400000); shifted into the
  // exponent field and biased they are 2^n, for the kept n in [-125, 128] (128 gives +inf).
  const V two_n = hn::BitCast(d, hn::Add(hn::ShiftLeft<23>(hn::BitCast(du, r)), hn::Set(du, 127u << 23)));
  const V p = hn::Mul(Exp2Fraction(d, hn::Sub(t, n)), two_n);
  return hn::IfThenZeroElse(hn::Lt(t, hn::Set(d, -125.0f)), p);
}

template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpDiff(D d, V s, V m) {
  if constexpr (sizeof(hn::TFromD<D>) == 4) {
    return Exp2(d, hn::Mul(hn::Sub(s, m), hn::Set(d, 1.44269504088896341f)));
  } else {
    const V x = hn::Sub(s, m);
    // NaN lanes go to Exp as 0 (converting NaN to an integer inside Exp is undefined behaviour on the
    // emulated targets) and come out NaN; Highway's Exp would return 0 for them.
    const auto is_nan = hn::IsNaN(x);
    return hn::IfThenElse(is_nan, x, hn::Exp(d, hn::IfThenZeroElse(is_nan, x)));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::exp_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_EXP_SIMD_INL_H_
