// PyTorch's bf16 math attention, the reference of flash-attn's accuracy rule for kernels that round P to
// bf16 (the AMX forward and decode): their error against the f64 oracle at most twice this one's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "support.hpp"
#include "validate/problem.hpp"

namespace attn::test {

inline float round_bf16(float x) { return detail::load<float>(detail::store<bf16_t>(x)); }

// PyTorch's math attention in bf16 (softmax(q k^T scale) v with bf16 tensors): each matmul accumulates in
// f32 and rounds its output to bf16, the score rule's result is rounded to bf16, the softmax runs in f32
// and rounds P to bf16. Sinks join the softmax's denominator.
inline std::vector<bf16_t> math_reference_bf16(const Tensor<bf16_t>& q, const Tensor<bf16_t>& k,
                                               const Tensor<bf16_t>& v, const AttentionOptions& o) {
  std::vector<bf16_t> out(static_cast<std::size_t>(q.b * q.s * q.h * v.d));
  const detail::Problem p = detail::validate("math_reference_bf16", q.view(), k.view(), v.view(), nullptr, o, nullptr);
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
          s[j] = round_bf16(mask.score(round_bf16(dot), i, j, slope));
          m = std::max(m, s[j]);
        }
        float l = std::exp(sink - m);
        for (std::int64_t j = lo; j < hi; ++j) l += std::exp(s[j] - m);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (std::int64_t j = lo; j < hi; ++j) {
          const float pj = round_bf16(std::exp(s[j] - m) / l);
          for (std::int64_t x = 0; x < v.d; ++x)
            acc[x] += pj * detail::load<float>(v.data[((b * v.s + j) * v.h + kh) * v.d + x]);
        }
        for (std::int64_t x = 0; x < v.d; ++x)
          out[((b * q.s + i) * q.h + h) * v.d + x] = detail::store<bf16_t>(hi > lo ? acc[x] : 0.0f);
      }
  return out;
}

}  // namespace attn::test
