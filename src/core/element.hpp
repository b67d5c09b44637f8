// Element types: loading any storage type into its accumulator type and storing back.
// f64 accumulates in double (exact to 1e-12); f32, bf16 and f16 accumulate in float.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "attn/tensor.hpp"

namespace attn::detail {

template <class T>
struct AccumulatorOf {
  using type = float;
};
template <>
struct AccumulatorOf<double> {
  using type = double;
};
template <class T>
using Acc = typename AccumulatorOf<T>::type;

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float bf16_to_float(bf16_t x) { return bits_float(static_cast<std::uint32_t>(x.bits) << 16); }
inline bf16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN (quieted)
  const std::uint32_t u = float_bits(f);
  // Both results, then a select: no branch, so loops over arrays vectorise.
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
  return {static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
}
// f16 <-> f32 with float arithmetic and integer bit operations only: no branch, no call. (GCC turns a
// _Float16 conversion into a libgcc call unless the whole build targets F16C, and those calls were 15%
// of a short f16 decode.) Tested against _Float16 on every f16 value, every halfway point and 2^20
// random floats.
inline float f16_to_float(f16_t x) {
  const std::uint32_t w = static_cast<std::uint32_t>(x.bits) << 16, sign = w & 0x80000000u, mag = w << 1;
  // Normal, Inf, NaN: exponent and mantissa moved into f32 position with the exponent raised by 224,
  // then scaled by 2^-112: e + 224 - 112 = e - 15 + 127 (Inf/NaN stay Inf/NaN through the multiply).
  const float normal = bits_float((mag >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal (exponent 0): m * 2^-24, formed exactly as (0.5 + m * 2^-24) - 0.5.
  const float subnormal = bits_float((mag >> 17) | (126u << 23)) - 0.5f;
  return bits_float(sign | float_bits(mag < (1u << 27) ? subnormal : normal));
}
inline f16_t float_to_f16(float f) {  // round to nearest even, overflow to Inf, NaN stays NaN (quieted)
  const std::uint32_t w = float_bits(f), mag = w << 1, sign = w & 0x80000000u;
  // |f| scaled by 2^112 then 2^-110: values beyond f16's range become Inf, the rest are |f| * 4.
  float base = (bits_float(w & 0x7fffffffu) * 0x1.0p+112f) * 0x1.0p-110f;
  // Adding 2^(e + 15) (e: f's exponent, at least -14 so that subnormals round at 2^-24) leaves exactly
  // f16's 10 mantissa bits of |f| * 4 in the sum, rounded to nearest even by the FPU.
  const std::uint32_t bias = std::max(mag & 0xFF000000u, 0x71000000u);
  base = bits_float((bias >> 1) + 0x07800000u) + base;
  const std::uint32_t bits = float_bits(base);
  // The sum's exponent bits become f16's exponent; a mantissa that rounded up carries into it.
  const std::uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  return {static_cast<std::uint16_t>((sign >> 16) | (mag > 0xFF000000u ? 0x7E00u : nonsign))};
}

// The OCP 8-bit floats of quantized caches (stored types only: nothing is computed in them).
inline float fp8_e4m3_to_float(std::uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  // Subnormal m/8 * 2^-6 = m * 2^-9; normal (1 + m/8) * 2^(e - 7) = (8 + m) * 2^(e - 10).
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(static_cast<float>(8 + m), e - 10);
  return (b & 0x80) ? -mag : mag;
}
// e5m2 is the upper byte of an f16 (same exponent, two mantissa bits).
inline float fp8_e5m2_to_float(std::uint8_t b) { return f16_to_float(f16_t{static_cast<std::uint16_t>(b << 8)}); }

template <class A, class T>
inline A load(const T& x) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return static_cast<A>(bf16_to_float(x));
  else if constexpr (std::is_same_v<T, f16_t>)
    return static_cast<A>(f16_to_float(x));
  else if constexpr (std::is_same_v<T, fp8_e4m3_t>)
    return static_cast<A>(fp8_e4m3_to_float(x.bits));
  else if constexpr (std::is_same_v<T, fp8_e5m2_t>)
    return static_cast<A>(fp8_e5m2_to_float(x.bits));
  else
    return static_cast<A>(x);
}
template <class T, class A>
inline T store(A x) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return float_to_bf16(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, f16_t>)
    return float_to_f16(static_cast<float>(x));
  else
    return static_cast<T>(x);
}

// Calls f.template operator()<T>() with T the C++ type of `t`.
template <class F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f64:
      return f.template operator()<double>();
    case DType::f32:
      return f.template operator()<float>();
    case DType::bf16:
      return f.template operator()<bf16_t>();
    case DType::f16:
      return f.template operator()<f16_t>();
    case DType::i8:
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:  // stored cache types: validation lets them reach the dequantizing paths only
      throw std::logic_error("attn: internal error: a quantized dtype reached a floating-point kernel");
  }
  return f.template operator()<float>();
}

}  // namespace attn::detail
