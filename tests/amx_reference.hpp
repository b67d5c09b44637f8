// PyTorch's bf16 math attention and its backward, the references of flash-attn's accuracy rule for kernels
// that round P to bf16 (the AMX forward, decode and backward): their error against the f64 oracle at most
// twice this one's (forward), three times (gradients).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "support.hpp"
#include "validate/problem.hpp"

namespace attn::test {

template <class T>
float round_to(float x) {
  return detail::load<float>(detail::store<T>(x));
}

// PyTorch's math attention in bf16 (softmax(q k^T scale) v with bf16 tensors): each matmul accumulates in
// f32 and rounds its output to bf16, the score rule's result is rounded to bf16, the softmax runs in f32
// and rounds P to bf16. Sinks join the softmax's denominator. Dropout (the options' rule, the library's
// mask) multiplies the rounded P by Z / (1 - p) and rounds again, as torch.dropout on a bf16 tensor.
// math_reference<f16_t>: the same with f16 tensors (PyTorch's f16 math attention).
template <class T>
std::vector<T> math_reference(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
  const auto round = round_to<T>;
  std::vector<T> out(static_cast<std::size_t>(q.b * q.s * q.h * v.d));
  const detail::Problem p = detail::validate("math_reference", q.view(), k.view(), v.view(), nullptr, o, nullptr);
  const detail::Mask mask = p.mask();
  std::vector<float> s(static_cast<std::size_t>(k.s)), acc(static_cast<std::size_t>(v.d));
  for (std::int64_t b = 0; b < q.b; ++b)
    for (std::int64_t h = 0; h < q.h; ++h)
      for (std::int64_t i = 0; i < q.s; ++i) {
        const std::int64_t kh = p.kv_head_of(h), lo = mask.first_key(i), hi = mask.end_key(i);
        const float slope = p.rule.alibi_slope(b, h), sink = p.rule.sink(h);
        float m = sink;
        for (std::int64_t j = lo; j < hi; ++j) {
          float dot = 0;
          for (std::int64_t x = 0; x < q.d; ++x)
            dot += detail::load<float>(q.data[((b * q.s + i) * q.h + h) * q.d + x]) *
                   detail::load<float>(k.data[((b * k.s + j) * k.h + kh) * k.d + x]);
          s[j] = round(mask.score(round(dot), i, j, slope));
          m = std::max(m, s[j]);
        }
        float l = std::exp(sink - m);
        for (std::int64_t j = lo; j < hi; ++j) l += std::exp(s[j] - m);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t j = lo; j < hi; ++j) {
          const float pj = round(round(std::exp(s[j] - m) / l) * p.dropout.factor<float>(b, h, i, j));
          for (std::int64_t x = 0; x < v.d; ++x)
            acc[x] += pj * detail::load<float>(v.data[((b * v.s + j) * v.h + kh) * v.d + x]);
        }
        for (std::int64_t x = 0; x < v.d; ++x)
          out[((b * q.s + i) * q.h + h) * v.d + x] = detail::store<T>(hi > lo ? acc[x] : 0.0f);
      }
  return out;
}
inline std::vector<bf16_t> math_reference_bf16(const Tensor<bf16_t>& q, const Tensor<bf16_t>& k,
                                               const Tensor<bf16_t>& v, const AttentionOptions& o) {
  return math_reference<bf16_t>(q, k, v, o);
}

// The gradients of math_reference_bf16's attention as PyTorch's autograd computes them with bf16 tensors:
// each matmul accumulates in f32 and rounds its output to bf16 (S, P, dP = dO V^T, and dV, dQ, dK at the
// end), the softmax's backward dS = P (dP - sum P dP) runs in f32 and rounds to bf16, and so does its
// product with d logit / d dot. With dropout, dP and dV's P are the dropped ones (times Z / (1 - p),
// rounded to bf16), as autograd through torch.dropout gives.
// math_reference_backward<f16_t>: the same with f16 tensors.
template <class T>
struct MathGrads {
  std::vector<T> dq, dk, dv;
};
using Bf16Grads = MathGrads<bf16_t>;
template <class T>
MathGrads<T> math_reference_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& dout,
                                     const AttentionOptions& o) {
  const auto round = round_to<T>;  // the tensors' precision
  const detail::Problem p =
      detail::validate("math_reference_backward", q.view(), k.view(), v.view(), nullptr, o, nullptr);
  const detail::Mask mask = p.mask();
  auto f = [](T x) { return detail::load<float>(x); };
  std::vector<float> dq(q.data.size()), dk(k.data.size()), dv(v.data.size());
  std::vector<float> s(static_cast<std::size_t>(k.s)), pr(s.size()), dropped(s.size()), dp(s.size()), dot(s.size());
  for (std::int64_t b = 0; b < q.b; ++b)
    for (std::int64_t h = 0; h < q.h; ++h)
      for (std::int64_t i = 0; i < q.s; ++i) {
        const std::int64_t kh = p.kv_head_of(h), lo = mask.first_key(i), hi = mask.end_key(i);
        const float slope = p.rule.alibi_slope(b, h), sink = p.rule.sink(h);
        float m = sink;
        for (std::int64_t j = lo; j < hi; ++j) {
          float acc = 0;
          for (std::int64_t x = 0; x < q.d; ++x) acc += f(q.at(b, i, h, x)) * f(k.at(b, j, kh, x));
          dot[j] = round(acc);
          s[j] = round(mask.score(dot[j], i, j, slope));
          m = std::max(m, s[j]);
        }
        float l = std::exp(sink - m), sum_pdp = 0;
        for (std::int64_t j = lo; j < hi; ++j) l += std::exp(s[j] - m);
        for (std::int64_t j = lo; j < hi; ++j) {
          pr[j] = round(std::exp(s[j] - m) / l);
          const float z = p.dropout.factor<float>(b, h, i, j);
          dropped[j] = round(pr[j] * z);
          float acc = 0;
          for (std::int64_t x = 0; x < v.d; ++x) acc += f(dout.at(b, i, h, x)) * f(v.at(b, j, kh, x));
          dp[j] = round(round(acc) * z);
          sum_pdp += pr[j] * dp[j];
        }
        for (std::int64_t j = lo; j < hi; ++j) {
          const float ds = round(round(pr[j] * (dp[j] - sum_pdp)) * p.rule.logit_grad(dot[j]));
          for (std::int64_t x = 0; x < q.d; ++x) {
            dq[static_cast<std::size_t>(((b * q.s + i) * q.h + h) * q.d + x)] += ds * f(k.at(b, j, kh, x));
            dk[static_cast<std::size_t>(((b * k.s + j) * k.h + kh) * k.d + x)] += ds * f(q.at(b, i, h, x));
          }
          for (std::int64_t x = 0; x < v.d; ++x)
            dv[static_cast<std::size_t>(((b * v.s + j) * v.h + kh) * v.d + x)] += dropped[j] * f(dout.at(b, i, h, x));
        }
      }
  auto rounded = [](const std::vector<float>& a) {
    std::vector<T> r(a.size());
    for (std::size_t e = 0; e < a.size(); ++e) r[e] = detail::store<T>(a[e]);
    return r;
  };
  return {rounded(dq), rounded(dk), rounded(dv)};
}
inline Bf16Grads math_reference_backward_bf16(const Tensor<bf16_t>& q, const Tensor<bf16_t>& k, const Tensor<bf16_t>& v,
                                              const Tensor<bf16_t>& dout, const AttentionOptions& o) {
  return math_reference_backward<bf16_t>(q, k, v, dout, o);
}

}  // namespace attn::test
