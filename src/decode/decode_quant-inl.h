// Loading N lanes' worth of a quantized cache's stored codes as f32 (before scaling), a Highway
// per-target header included by decode_simd.cpp and decode_dequant.cpp inside foreach_target. The value
// loaded is the code's value divided by stored_unit(type), a power of two that callers fold into the
// scale (exactly: both factors are powers of two or codes far from f32's limits), bit for bit the scalar
// conversions of core/element.hpp otherwise (tests/test_decode_quantized.cpp, every code):
//   i8:   widened to i32, converted to f32 (unit 1).
//   e5m2: the upper byte of an f16, widened through the f16 -> f32 conversion (unit 1; Inf and NaN
//         mended where Highway emulates that conversion, i.e. below AVX2 on x86).
//   e4m3: the code sign-extended to 16 bits and shifted left by 7 is S.S.EEEE.MMM.0000000; with bit 14
//         cleared it is the f16 of the value times 2^-8 (unit 256: f16's exponent field is one bit wider
//         and its bias 8 larger), subnormal codes included. The NaN code S.1111.111 would read 1.875 and
//         is replaced by an f16 NaN before the widening (where the f16 conversion is emulated, by an f32
//         NaN after it). Three integer operations and a blend on 16-bit lanes: the FMA ports, which the
//         decode kernel saturates, see no multiply and no f32 compare (an earlier version widened first
//         and then multiplied by 256 and mended NaN in f32, about twice the operations per code).
#if defined(ATTN_DECODE_QUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_DECODE_QUANT_INL_H_
#undef ATTN_DECODE_QUANT_INL_H_
#else
#define ATTN_DECODE_QUANT_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstdint>

#include "attn/tensor.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The power of two a loaded code is short of its value (above).
constexpr float stored_unit(DType t) { return t == DType::fp8_e4m3 ? 256.0f : 1.0f; }

// e4m3 codes p[0 .. Lanes(d16)) as the f16 bits of their values times 2^-8 (NaN codes as f16 NaN where the
// f16 conversion is native; else as 1.875, which E4m3ToF32 mends).
template <class D16>
HWY_INLINE hn::Vec<D16> E4m3F16Bits(D16 d16, const std::uint8_t* p) {
  const hn::Rebind<std::int8_t, D16> d8;
  const auto x = hn::PromoteTo(d16, hn::LoadU(d8, reinterpret_cast<const std::int8_t*>(p)));
  const auto bits = hn::And(hn::ShiftLeft<7>(x), hn::Set(d16, static_cast<std::int16_t>(0xBFFF)));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // the NaN codes' low 7 bits are all ones: x | 0xFF80 is then -1
  const auto nan = hn::Eq(hn::Or(x, hn::Set(d16, static_cast<std::int16_t>(0xFF80))), hn::Set(d16, -1));
  return hn::IfThenElse(nan, hn::Set(d16, 0x7E00), bits);
#else
  return bits;
#endif
}

// Lanes(df) of E4m3F16Bits' f16 bits widened to f32.
template <class DF, class V16>
HWY_INLINE hn::Vec<DF> E4m3ToF32(DF df, V16 bits) {
  const hn::Rebind<hwy::float16_t, DF> df16;
  const auto v = hn::PromoteTo(df, hn::BitCast(df16, bits));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return v;
#else
  return hn::IfThenElse(hn::Eq(hn::Abs(v), hn::Set(df, 1.875f)), hn::Set(df, std::nanf("")), v);
#endif
}

template <DType kType>
HWY_INLINE hn::Vec<hn::ScalableTag<float>> LoadStored(hn::ScalableTag<float> df, const std::uint8_t* p) {
  if constexpr (kType == DType::i8) {
    const hn::Rebind<std::int8_t, decltype(df)> d8;
    const hn::Rebind<std::int32_t, decltype(df)> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, reinterpret_cast<const std::int8_t*>(p))));
  } else if constexpr (kType == DType::fp8_e5m2) {
    const hn::Rebind<std::uint8_t, decltype(df)> du8;
    const hn::Rebind<std::uint16_t, decltype(df)> du16;
    const hn::Rebind<hwy::float16_t, decltype(df)> df16;
    const auto v = hn::PromoteTo(df, hn::BitCast(df16, hn::ShiftLeft<8>(hn::PromoteTo(du16, hn::LoadU(du8, p)))));
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    return v;  // F16C (part of Highway's AVX2 and later targets) converts Inf and NaN as such
#else
    // Highway's emulated f16 conversion reads exponent 31 as a number (2^16 x 1.m): Inf and NaN are
    // put back from the magnitude, which no finite e5m2 value (at most 57344) reaches.
    const auto a = hn::Abs(v);
    const auto inf = hn::CopySign(hn::Set(df, HUGE_VALF), v);
    const auto special =
        hn::IfThenElse(hn::Or(hn::Eq(a, hn::Set(df, 65536.0f)), hn::IsInf(v)), inf, hn::Set(df, std::nanf("")));
    return hn::IfThenElse(hn::Gt(a, hn::Set(df, 57344.0f)), special, v);
#endif
  } else {  // e4m3
    const hn::Rebind<std::int16_t, decltype(df)> di16;
    return E4m3ToF32(df, E4m3F16Bits(di16, p));
  }
}

// Lanes [0, 2N) of codes as two f32 vectors (lo, hi): for e4m3 the 16-bit steps run once on a full vector
// of 2N lanes instead of twice on half vectors.
template <DType kType>
HWY_INLINE void LoadStoredPair(hn::ScalableTag<float> df, const std::uint8_t* p, hn::Vec<decltype(df)>& lo,
                               hn::Vec<decltype(df)>& hi) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kType == DType::fp8_e4m3) {
    const hn::Repartition<std::int16_t, decltype(df)> d16;
    const hn::Half<decltype(d16)> dh;
    const auto bits = E4m3F16Bits(d16, p);
    lo = E4m3ToF32(df, hn::LowerHalf(dh, bits));
    hi = E4m3ToF32(df, hn::UpperHalf(dh, bits));
    return;
  }
#endif
  lo = LoadStored<kType>(df, p);
  hi = LoadStored<kType>(df, p + hn::Lanes(df));
}

}  // namespace attn::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_DECODE_QUANT_INL_H_
