// Quantized KV caches: what a stored i8 / fp8 value means and how a value is quantized. One place for
// the append (decode_append.cpp), the dequantizing decode path (decode_dequant.cpp, whose SIMD
// conversions are tested against these), the validation and the tests' oracle.
//
// A stored value q with its scale s (f32, or f16 widened) stands for float(q) * s, one f32 multiply.
// Quantizing x with scale s: q = round_to_nearest_even(x / s), saturated to the type's largest finite
// value (127 for i8, symmetric as in llama.cpp's q8_0; 448 for e4m3; 57344 for e5m2). A scale computed
// from the data is amax / that largest value, rounded to the scale's type; x is then divided by the
// rounded scale, so that float(q) * s is as close to x as the stored scale allows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attn/tensor.hpp"
#include "core/element.hpp"

namespace attn::detail {

constexpr float quant_max(DType t) { return t == DType::i8 ? 127.0f : t == DType::fp8_e4m3 ? 448.0f : 57344.0f; }

// x rounded to the nearest (ties to even) value of an 8-bit float with kMant mantissa bits and
// exponent bias kBias; a finite x beyond the largest finite value (encoding max_bits) saturates to it;
// NaN gives nan_bits and an infinity inf_bits (with x's sign).
template <int kMant, int kBias>
std::uint8_t encode_fp8(float x, std::uint8_t max_bits, std::uint8_t nan_bits, std::uint8_t inf_bits) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return nan_bits;
  if (std::isinf(x)) return static_cast<std::uint8_t>(sign | inf_bits);
  const double a = std::fabs(static_cast<double>(x));
  int e = 0;
  std::frexp(a, &e);                                      // a = f * 2^e, f in [0.5, 1): a's exponent is e - 1
  int exp = std::max(e - 1, 1 - kBias);                   // subnormals share the smallest normal's quantum
  double q = std::nearbyint(std::ldexp(a, kMant - exp));  // a / quantum, ties to even (the default mode)
  if (q >= double(2 << kMant)) {                          // rounded up to the next binade
    q /= 2;
    ++exp;
  }
  const int mant_one = 1 << kMant;
  long bits = q < mant_one ? static_cast<long>(q) : (long{exp + kBias} << kMant) + static_cast<long>(q) - mant_one;
  if (bits > max_bits) bits = max_bits;  // beyond the largest finite value (or onto e4m3's NaN code)
  return static_cast<std::uint8_t>(sign | bits);
}
inline std::uint8_t float_to_fp8_e4m3(float x) { return encode_fp8<3, 7>(x, 0x7e, 0x7f, 0x7f); }  // Inf -> NaN
inline std::uint8_t float_to_fp8_e5m2(float x) { return encode_fp8<2, 15>(x, 0x7b, 0x7e, 0x7c); }

// The value a stored element stands for before scaling.
inline float stored_value(DType t, std::uint8_t bits) {
  switch (t) {
    case DType::i8:
      return static_cast<float>(static_cast<std::int8_t>(bits));
    case DType::fp8_e4m3:
      return fp8_e4m3_to_float(bits);
    default:
      return fp8_e5m2_to_float(bits);
  }
}

// The bf16 bits of the fp8 codes 0..127 of type t (fp8_e4m3 or fp8_e5m2; M mantissa bits, exponent
// bias B, E the all-ones exponent): every fp8 value is a bf16 value, so the table is stored_value exactly
// (tests/test_decode_quantized.cpp checks every code), NaN and Inf included. Code c is sign (bit 7) and
// magnitude c & 127: its bf16 is (hi[c & 127] << 8 | lo[c & 127]) with bit 15 set from bit 7. Stored as
// two tables of bytes (four 512-bit registers), one byte lookup each, which VPERMI2B does for 64 codes
// at a time (decode_simd_bf16-inl.h).
struct Fp8Bf16Table {
  alignas(64) std::uint8_t lo[128];
  alignas(64) std::uint8_t hi[128];
};
template <int M, int B, bool kIeeeSpecials>
constexpr Fp8Bf16Table make_fp8_bf16_table() {
  Fp8Bf16Table t{};
  for (int c = 0; c < 128; ++c) {
    const int e = c >> M, m = c & ((1 << M) - 1), top = (1 << (7 - M)) - 1;
    int bits = 0;
    if (kIeeeSpecials && e == top) {  // e5m2: Inf, NaN
      bits = m == 0 ? 0x7f80 : 0x7fc0;
    } else if (!kIeeeSpecials && c == 127) {  // e4m3: S.1111.111 is its only NaN
      bits = 0x7fc0;
    } else if (e != 0 || m != 0) {
      // value = f * 2^x with f = 1.m (normal) or 0.m (subnormal, x = 1 - B): normalise to 1.g * 2^x.
      int f = e == 0 ? m : (1 << M) | m, x = (e == 0 ? 1 : e) - B - M;  // value = f * 2^x, f integer
      while (f < (1 << M)) f <<= 1, --x;                                // now 2^M <= f < 2^(M+1)
      const int exponent = x + M + 127, fraction = (f - (1 << M)) << (7 - M);
      bits = exponent << 7 | fraction;
    }
    t.lo[c] = static_cast<std::uint8_t>(bits & 0xff);
    t.hi[c] = static_cast<std::uint8_t>(bits >> 8);
  }
  return t;
}
inline constexpr Fp8Bf16Table kE4m3Bf16 = make_fp8_bf16_table<3, 7, false>();
inline constexpr Fp8Bf16Table kE5m2Bf16 = make_fp8_bf16_table<2, 15, true>();

// x / scale stored in type t (see the header comment); scale 0 stores 0.
inline std::uint8_t quantize_value(DType t, float x, float scale) {
  if (scale == 0) return 0;
  const float y = x / scale;
  if (t == DType::i8) {
    if (std::isnan(y)) return 0;  // only with a NaN scale, which makes the dequantized value NaN anyway
    const float r = std::nearbyint(std::clamp(y, -127.0f, 127.0f));
    return static_cast<std::uint8_t>(static_cast<std::int8_t>(r));
  }
  return t == DType::fp8_e4m3 ? float_to_fp8_e4m3(y) : float_to_fp8_e5m2(y);
}

// The scale computed from a group's largest magnitude, as stored in a scale of type scale_dtype (f32
// or f16): amax / quant_max(t). A non-finite amax gives NaN, so that a NaN or infinite input poisons
// the group's dequantized values (NaN scale) instead of vanishing into finite codes.
inline float scale_for(DType t, float amax, DType scale_dtype) {
  const float s = std::isfinite(amax) ? amax / quant_max(t) : std::numeric_limits<float>::quiet_NaN();
  return scale_dtype == DType::f16 ? f16_to_float(float_to_f16(s)) : s;
}

// The scale at element offset `at` of a scale view (f32 or f16).
inline float read_scale(const TensorView& s, std::int64_t at) {
  return s.dtype == DType::f16 ? f16_to_float(static_cast<const f16_t*>(s.data)[at])
                               : static_cast<const float*>(s.data)[at];
}
inline void write_scale(const TensorView& s, std::int64_t at, float x) {
  if (s.dtype == DType::f16)
    static_cast<f16_t*>(s.data)[at] = float_to_f16(x);
  else
    static_cast<float*>(s.data)[at] = x;
}

}  // namespace attn::detail
