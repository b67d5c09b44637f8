// The project's accuracy rule (docs/STANDARDS.md), in one place:
//   f32, bf16, f16: the error against the f64 oracle is at most kForwardFactor (2) times the error of the
//     textbook method computed at the same precision (kGradientFactor, 3, for gradients), plus a floor
//     for a textbook error that happens to be about 0;
//   f64: agrees with the reference to kF64Tolerance (1e-12).
// Errors are test::max_error's (common/error.hpp). The oracle is attention_reference on the inputs'
// values converted exactly to f64; the textbook method is attention_reference on the inputs themselves.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <type_traits>
#include <vector>

#include "attn/attention.hpp"
#include "common/error.hpp"
#include "common/tensor.hpp"
#include "core/element.hpp"

namespace attn::test {

inline constexpr double kF64Tolerance = 1e-12;
inline constexpr double kForwardFactor = 2;
inline constexpr double kGradientFactor = 3;

// The floor of the forward rule at T's precision, for a textbook error that happens to be about 0.
template <class T>
constexpr double textbook_floor() {
  if constexpr (std::is_same_v<T, double>)
    return kF64Tolerance;
  else if constexpr (std::is_same_v<T, float>)
    return 2e-7;
  else if constexpr (std::is_same_v<T, bf16_t>)
    return 1e-3;
  else
    return 1e-4;
}

// The largest error the rule allows where the textbook method's error is textbook_err.
inline double textbook_bound(double textbook_err, double factor = kForwardFactor, double floor = 0) {
  return factor * textbook_err + floor;
}

// Whether err meets the rule. A textbook error that is not finite (the textbook method gave a NaN or an
// infinity the oracle does not have) sets no bar, so nothing meets it.
inline bool within_textbook_rule(double err, double textbook_err, double factor = kForwardFactor, double floor = 0) {
  return std::isfinite(textbook_err) && err <= textbook_bound(textbook_err, factor, floor);
}

// within_textbook_rule for EXPECT_TRUE / ASSERT_TRUE: a failure prints both errors and the bound.
inline ::testing::AssertionResult meets_textbook_rule(double err, double textbook_err, double factor = kForwardFactor,
                                                      double floor = 0) {
  if (within_textbook_rule(err, textbook_err, factor, floor)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "error " << err << " is over " << factor << " x the textbook error "
                                       << textbook_err << " + " << floor << " = "
                                       << textbook_bound(textbook_err, factor, floor);
}

// For EXPECT_TRUE: whether two results differ by more than `by` somewhere (a test that an option or a path
// has an effect). A NaN on either side fails it: its infinite error must not stand in for a difference.
template <class A, class B>
::testing::AssertionResult differ_by_more_than(const A& a, const B& b, double by) {
  if (count_nan(a) + count_nan(b) > 0) return ::testing::AssertionFailure() << "a result has a NaN";
  const double err = max_error(a, b);
  if (err > by) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "they differ by at most " << err << ", not more than " << by;
}

// The forward of q, k, v under `o` in the f64 oracle: out [b, sq, h, v.d], and lse [b, h, sq] into *lse.
template <class T>
std::vector<double> oracle_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                   const AttentionOptions& o, std::vector<double>* lse = nullptr) {
  std::vector<double> out(static_cast<std::size_t>(q.b * q.s * q.h * v.d));
  TensorView lv;
  if (lse) {
    lse->assign(static_cast<std::size_t>(q.b * q.h * q.s), 0);
    lv = TensorView::contiguous(lse->data(), q.b, q.h, q.s);
  }
  attention_reference(to_f64(q).view(), to_f64(k).view(), to_f64(v).view(),
                      TensorView::contiguous(out.data(), q.b, q.s, q.h, v.d), o, lse ? &lv : nullptr);
  return out;
}
template <class T>
std::vector<double> oracle_forward(const Qkv<T>& p, const AttentionOptions& o, std::vector<double>* lse = nullptr) {
  return oracle_forward(p.q, p.k, p.v, o, lse);
}

// The same forward by the textbook method at T's precision (lse in T's accumulator type).
template <class T>
std::vector<T> textbook_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o,
                                std::vector<detail::Acc<T>>* lse = nullptr) {
  std::vector<T> out(static_cast<std::size_t>(q.b * q.s * q.h * v.d));
  TensorView lv;
  if (lse) {
    lse->assign(static_cast<std::size_t>(q.b * q.h * q.s), 0);
    lv = TensorView::contiguous(lse->data(), q.b, q.h, q.s);
  }
  attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), q.b, q.s, q.h, v.d), o,
                      lse ? &lv : nullptr);
  return out;
}
template <class T>
std::vector<T> textbook_forward(const Qkv<T>& p, const AttentionOptions& o,
                                std::vector<detail::Acc<T>>* lse = nullptr) {
  return textbook_forward(p.q, p.k, p.v, o, lse);
}

}  // namespace attn::test
