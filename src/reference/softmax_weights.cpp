// attn::softmax_weights: the unnormalised softmax weights exp(s_ij - m_i) of a problem, row by row in
// f64 with the score rule's Mask, as the textbook method forms them (reference.cpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attn/dropout.hpp"
#include "core/element.hpp"
#include "validate/problem.hpp"
#include "validate/validate.hpp"

namespace attn {
namespace {

constexpr const char* kDims[] = {"batch", "heads", "seqlen_q", "seqlen_k"};

// The logits query i of (b, h) sees, [lo, hi) of them, into s (seqlen_k values).
template <class T>
void row_logits(const detail::Problem& p, const detail::Mask& mask, std::int64_t b, std::int64_t h, std::int64_t i,
                std::int64_t lo, std::int64_t hi, std::vector<double>& s) {
  const T* q = detail::row_ptr<T>(p.q, b, i, h);
  const double slope = p.rule.alibi_slope(b, h);
  for (std::int64_t j = lo; j < hi; ++j) {
    const T* k = detail::row_ptr<T>(p.k, b, j, p.kv_head_of(h));
    double dot = 0;
    for (std::int64_t c = 0; c < p.head_dim; ++c)
      dot += detail::load<double>(q[c * p.q.strides[3]]) * detail::load<double>(k[c * p.k.strides[3]]);
    s[static_cast<std::size_t>(j)] = mask.score(dot, i, j, slope);
  }
}

template <class T, class A>
void write_weights(const detail::Problem& p, const TensorView& w) {
  const detail::Mask mask = p.mask();
  std::vector<double> s(static_cast<std::size_t>(p.seqlen_k));
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        const std::int64_t lo = mask.first_key(i), hi = std::max(lo, mask.end_key(i));
        row_logits<T>(p, mask, b, h, i, lo, hi, s);
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = lo; j < hi; ++j) m = std::max(m, s[static_cast<std::size_t>(j)]);
        A* row = static_cast<A*>(w.data) + b * w.strides[0] + h * w.strides[1] + i * w.strides[2];
        for (std::int64_t j = 0; j < p.seqlen_k; ++j)
          row[j * w.strides[3]] =
              j < lo || j >= hi ? A(0) : static_cast<A>(std::exp(s[static_cast<std::size_t>(j)] - m));
      }
}

}  // namespace

void softmax_weights(const TensorView& q, const TensorView& k, const TensorView& weights,
                     const AttentionOptions& opts) {
  const char* who = "attn::softmax_weights";
  const detail::Problem p = detail::validate(who, q, k, k, nullptr, opts, nullptr);
  if (weights.rank != 4) detail::fail(who, "weights", "rank must be 4, got " + std::to_string(weights.rank));
  if (weights.dtype != DType::f64 && weights.dtype != DType::f32)
    detail::fail(who, "weights", "dtype must be f64 or f32, got " + std::string(dtype_name(weights.dtype)));
  const std::int64_t want[] = {p.batch, p.heads, p.seqlen_q, p.seqlen_k};
  for (int i = 0; i < 4; ++i)
    if (weights.shape[i] != want[i])
      detail::fail(
          who, "weights",
          std::string(kDims[i]) + " must be " + std::to_string(want[i]) + ", got " + std::to_string(weights.shape[i]));
  detail::check_view(who, "weights", weights, 4, false);
  detail::check_no_self_alias(who, "weights", weights);
  detail::dispatch_dtype(p.dtype, [&]<class T>() {
    if (weights.dtype == DType::f64)
      write_weights<T, double>(p, weights);
    else
      write_weights<T, float>(p, weights);
  });
}

}  // namespace attn
