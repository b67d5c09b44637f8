// The tests' one error measure: the largest |a - b| over two sequences of values of any element types
// (f64, f32, bf16, f16, or one of each), where a NaN on either side, or an infinity the other side does
// not equal, is an infinite error and equal infinities are none. So a result that has a NaN, or an
// overflow, where the reference has none never passes an error bound, while the -inf of a row that sees
// no key (its lse) agrees with the reference's -inf. The LSE error is the same function on LSE vectors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>

#include "common/tensor.hpp"
#include "core/element.hpp"

namespace attn::test {

// |a - b| of one pair of values, with the rules above.
inline double abs_error(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return INFINITY;
  if (std::isinf(a) || std::isinf(b)) return a == b ? 0.0 : INFINITY;
  return std::abs(a - b);
}

// The largest abs_error of corresponding elements; sequences of different lengths are infinitely apart.
template <class A, class B>
double max_error(const A& a, const B& b) {
  if (std::size(a) != std::size(b)) return INFINITY;
  double m = 0;
  auto y = std::begin(b);
  for (auto x = std::begin(a); x != std::end(a); ++x, ++y)
    m = std::max(m, abs_error(detail::load<double>(*x), detail::load<double>(*y)));
  return m;
}

// Tensors of different shapes are infinitely apart.
template <class T, class U>
double max_error(const Tensor<T>& a, const Tensor<U>& b) {
  if (a.b != b.b || a.s != b.s || a.h != b.h || a.d != b.d) return INFINITY;
  return max_error(a.data, b.data);
}

// The largest finite |x| (0 for none): the size of a result, for relative tolerances.
template <class A>
double max_magnitude(const A& a) {
  double m = 0;
  for (const auto& x : a) {
    const double v = detail::load<double>(x);
    if (std::isfinite(v)) m = std::max(m, std::abs(v));
  }
  return m;
}

// max_error(a, b) relative to b's size (b the more exact), which counts as at least `floor`.
template <class A, class B>
double relative_error(const A& a, const B& b, double floor = 1e-300) {
  return max_error(a, b) / std::max(floor, max_magnitude(b));
}

// How many elements are NaN.
template <class A>
std::int64_t count_nan(const A& a) {
  std::int64_t n = 0;
  for (const auto& x : a) n += std::isnan(detail::load<double>(x));
  return n;
}

}  // namespace attn::test
