// Test helpers: random tensors in flash-attn's layout, views over them, and error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attn/attention.hpp"
#include "core/element.hpp"

namespace attn::test {

// A dense [b, s, h, d] tensor that owns its storage.
template <class T>
struct Tensor {
  std::int64_t b, s, h, d;
  std::vector<T> data;
  Tensor(std::int64_t b_, std::int64_t s_, std::int64_t h_, std::int64_t d_)
      : b(b_), s(s_), h(h_), d(d_), data(static_cast<std::size_t>(b_ * s_ * h_ * d_)) {}
  TensorView view() const { return TensorView::contiguous(data.data(), b, s, h, d); }
  T& at(std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l) {
    return data[static_cast<std::size_t>(((i * s + j) * h + k) * d + l)];
  }
};

template <class T>
Tensor<T> random_tensor(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, std::uint64_t seed,
                        double amplitude = 1.0) {
  Tensor<T> t(b, s, h, d);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-amplitude, amplitude);
  for (auto& x : t.data) x = detail::store<T>(dist(rng));
  return t;
}

// The same values, converted exactly to double (every f32/bf16/f16 value is a double).
template <class T>
Tensor<double> to_f64(const Tensor<T>& t) {
  Tensor<double> r(t.b, t.s, t.h, t.d);
  for (std::size_t i = 0; i < t.data.size(); ++i) r.data[i] = detail::load<double>(t.data[i]);
  return r;
}

// A problem's shape and flash-attn mask options, as the parameterised tests list them.
struct Shape {
  std::int64_t b, sq, sk, h, hk, d;
  bool causal;
  std::int64_t left = -1, right = -1;
  double softcap = 0;
  bool alibi = false;
};

// The AttentionOptions of a Shape. With alibi, the slopes are slope_base / (1 + x) per (batch, head),
// stored in `slopes`, which must outlive the options.
inline AttentionOptions options_of(const Shape& s, float slope_base, std::vector<float>& slopes) {
  AttentionOptions o;
  o.causal = s.causal;
  o.window_left = s.left;
  o.window_right = s.right;
  o.softcap = s.softcap;
  slopes.clear();
  for (std::int64_t x = 0; x < s.b * s.h; ++x) slopes.push_back(slope_base / float(1 + x));
  if (s.alibi) {
    o.alibi_slopes = slopes.data();
    o.alibi_batch_stride = s.h;
  }
  return o;
}

template <class T, class U>
double max_abs_diff(const std::vector<T>& a, const std::vector<U>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(detail::load<double>(a[i]) - detail::load<double>(b[i])));
  return m;
}

// Max |a - b| over LSE values, treating equal infinities as equal.
inline double lse_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    m = std::max(m, std::abs(a[i] - b[i]));
  }
  return m;
}

}  // namespace attn::test
