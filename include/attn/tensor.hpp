// Non-owning views over attention tensors, in flash-attn's layout.
//
// q, k, v and out are rank-4 views `[batch, seqlen, heads, head_dim]`; the log-sum-exp output is a
// rank-3 view `[batch, heads, seqlen_q]`. Strides are in elements (not bytes), like PyTorch's, so a
// slice of a larger buffer (a KV cache, a packed QKV projection) is passed without a copy.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace attn {

// Element types. Accumulation is in double for f64 and in float for every other type.
// i8, fp8_e4m3 and fp8_e5m2 are the stored types of quantized KV caches (attention_decode only, with
// scales: include/attn/decode.hpp); every other view of every entry point rejects them by name.
enum class DType : std::uint8_t { f64, f32, bf16, f16, i8, fp8_e4m3, fp8_e5m2 };

constexpr bool is_quantized(DType t) { return t == DType::i8 || t == DType::fp8_e4m3 || t == DType::fp8_e5m2; }

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
      return 8;
    case DType::f32:
      return 4;
    case DType::bf16:
    case DType::f16:
      return 2;
    case DType::i8:
    case DType::fp8_e4m3:
    case DType::fp8_e5m2:
      return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "f64";
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i8:
      return "i8";
    case DType::fp8_e4m3:
      return "fp8_e4m3";
    case DType::fp8_e5m2:
      return "fp8_e5m2";
  }
  return "?";
}

// 16-bit storage types. They only carry bits; arithmetic converts to float (see src/core/element.hpp).
struct bf16_t {
  std::uint16_t bits;
};
struct f16_t {
  std::uint16_t bits;
};
// OCP 8-bit floats: e4m3 (bias 7, no infinities, S.1111.111 is NaN; max 448: PyTorch's float8_e4m3fn)
// and e5m2 (bias 15, IEEE-like with infinities; max 57344: float8_e5m2).
struct fp8_e4m3_t {
  std::uint8_t bits;
};
struct fp8_e5m2_t {
  std::uint8_t bits;
};

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<bf16_t>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<f16_t>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<std::int8_t>() {
  return DType::i8;
}
template <>
constexpr DType dtype_of<fp8_e4m3_t>() {
  return DType::fp8_e4m3;
}
template <>
constexpr DType dtype_of<fp8_e5m2_t>() {
  return DType::fp8_e5m2;
}

struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};  // in elements

  // A dense row-major view (last dimension contiguous). Inputs are passed as `const T*`; attn never
  // writes through a view it was given as an input.
  template <class T>
  static TensorView contiguous(const T* data, std::int64_t d0, std::int64_t d1, std::int64_t d2, std::int64_t d3) {
    return dense(const_cast<T*>(data), dtype_of<T>(), {d0, d1, d2, d3}, 4);
  }
  template <class T>
  static TensorView contiguous(const T* data, std::int64_t d0, std::int64_t d1, std::int64_t d2) {
    return dense(const_cast<T*>(data), dtype_of<T>(), {d0, d1, d2, 1}, 3);
  }
  // Any strides, in elements.
  template <class T>
  static TensorView strided(const T* data, std::array<std::int64_t, 4> shape, std::array<std::int64_t, 4> strides) {
    TensorView v;
    v.data = const_cast<T*>(data);
    v.dtype = dtype_of<T>();
    v.rank = 4;
    v.shape = shape;
    v.strides = strides;
    return v;
  }

  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }

 private:
  static TensorView dense(void* data, DType t, std::array<std::int64_t, 4> shape, int rank) {
    TensorView v;
    v.data = data;
    v.dtype = t;
    v.rank = rank;
    v.shape = shape;
    std::int64_t s = 1;
    for (int i = rank - 1; i >= 0; --i) {
      v.strides[i] = s;
      s *= shape[i];
    }
    if (rank < kMaxRank) {
      v.shape[3] = 1;
      v.strides[3] = 1;
    }
    return v;
  }
};

}  // namespace attn
