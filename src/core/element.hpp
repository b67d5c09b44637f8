// Element types: loading any storage type into its accumulator type and storing back.
// f64 accumulates in double (exact to 1e-12); f32, bf16 and f16 accumulate in float.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attn/tensor.hpp"

namespace attn::detail {

template <class T> struct AccumulatorOf { using type = float; };
template <> struct AccumulatorOf<double> { using type = double; };
template <class T> using Acc = typename AccumulatorOf<T>::type;

inline float bf16_to_float(bf16_t x) {
  const std::uint32_t u = static_cast<std::uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN (quieted)
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  // Both results, then a select: no branch, so loops over arrays vectorise.
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40u;
  return {static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded)};
}
inline float f16_to_float(f16_t x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
}
inline f16_t float_to_f16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  f16_t r;
  std::memcpy(&r.bits, &h, 2);
  return r;
}

template <class A, class T> inline A load(const T& x) {
  if constexpr (std::is_same_v<T, bf16_t>) return static_cast<A>(bf16_to_float(x));
  else if constexpr (std::is_same_v<T, f16_t>) return static_cast<A>(f16_to_float(x));
  else return static_cast<A>(x);
}
template <class T, class A> inline T store(A x) {
  if constexpr (std::is_same_v<T, bf16_t>) return float_to_bf16(static_cast<float>(x));
  else if constexpr (std::is_same_v<T, f16_t>) return float_to_f16(static_cast<float>(x));
  else return static_cast<T>(x);
}

// Calls f.template operator()<T>() with T the C++ type of `t`.
template <class F> decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f64: return f.template operator()<double>();
    case DType::f32: return f.template operator()<float>();
    case DType::bf16: return f.template operator()<bf16_t>();
    case DType::f16: return f.template operator()<f16_t>();
  }
  return f.template operator()<float>();
}

}  // namespace attn::detail
