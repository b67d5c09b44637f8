// Loading 8 lanes' worth of a quantized cache's stored codes as f32 (before scaling), a Highway
// per-target header included by decode_simd.cpp and decode_dequant.cpp inside foreach_target. Bit for
// bit the scalar conversions of core/element.hpp (tests/test_decode_quantized.cpp, every code):
//   i8:   widened to i32, converted to f32.
//   e5m2: the upper byte of an f16, widened through the f16 -> f32 conversion (Inf and NaN mended
//         where Highway emulates that conversion, i.e. below AVX2 on x86).
//   e4m3: sign and the 7 other bits moved into an f16 (exponent field 4 bits wide, so the f16 is the
//         value times 2^-8), widened, times 2^8; the NaN code S.1111.111 comes out as +-480, which no
//         e4m3 value is, and is replaced by NaN.
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

template <DType kType>
HWY_INLINE hn::Vec<hn::ScalableTag<float>> LoadStored(hn::ScalableTag<float> df, const std::uint8_t* p) {
  if constexpr (kType == DType::i8) {
    const hn::Rebind<std::int8_t, decltype(df)> d8;
    const hn::Rebind<std::int32_t, decltype(df)> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, reinterpret_cast<const std::int8_t*>(p))));
  } else {
    const hn::Rebind<std::uint8_t, decltype(df)> du8;
    const hn::Rebind<std::uint16_t, decltype(df)> du16;
    const hn::Rebind<hwy::float16_t, decltype(df)> df16;
    const auto w = hn::PromoteTo(du16, hn::LoadU(du8, p));
    if constexpr (kType == DType::fp8_e5m2) {
      const auto v = hn::PromoteTo(df, hn::BitCast(df16, hn::ShiftLeft<8>(w)));
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
    } else {
      const auto bits =
          hn::Or(hn::ShiftLeft<8>(hn::And(w, hn::Set(du16, 0x80))), hn::ShiftLeft<7>(hn::And(w, hn::Set(du16, 0x7f))));
      const auto v = hn::Mul(hn::PromoteTo(df, hn::BitCast(df16, bits)), hn::Set(df, 256.0f));
      return hn::IfThenElse(hn::Eq(hn::Abs(v), hn::Set(df, 480.0f)), hn::Set(df, std::nanf("")), v);
    }
  }
}

}  // namespace attn::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_DECODE_QUANT_INL_H_
