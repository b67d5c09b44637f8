// The textbook baseline (see bench_textbook.hpp). The softmax is Highway SIMD with runtime dispatch,
// like the kernels it is compared with, so the baseline is as strong as sgemm makes it.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attn/bench_textbook.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <cblas.h>
#include <omp.h>

#include "bench_textbook.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cli {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// row[0..n) <- softmax(row[0..n)), row[n..len) <- 0 (masked keys).
void SoftmaxRow(float* row, std::int64_t n, std::int64_t len) {
  const hn::ScalableTag<float> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  auto mx = hn::Set(d, -std::numeric_limits<float>::infinity());
  std::int64_t j = 0;
  for (; j + N <= n; j += N) mx = hn::Max(mx, hn::LoadU(d, row + j));
  float m = hn::GetLane(hn::MaxOfLanes(d, mx));
  for (; j < n; ++j) m = std::max(m, row[j]);
  const auto vm = hn::Set(d, m);
  auto sum = hn::Zero(d);
  for (j = 0; j + N <= n; j += N) {
    const auto p = hn::Exp(d, hn::Sub(hn::LoadU(d, row + j), vm));
    hn::StoreU(p, d, row + j);
    sum = hn::Add(sum, p);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; j < n; ++j) s += (row[j] = std::exp(row[j] - m));
  const auto inv = hn::Set(d, 1.0f / s);
  for (j = 0; j + N <= n; j += N) hn::StoreU(hn::Mul(hn::LoadU(d, row + j), inv), d, row + j);
  for (; j < n; ++j) row[j] /= s;
  std::fill(row + n, row + len, 0.0f);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::cli
HWY_AFTER_NAMESPACE();

#if HWY_ONCE

namespace attn::cli {
HWY_EXPORT(SoftmaxRow);

void textbook_attention(const float* q, const float* k, const float* v, float* out, std::int64_t seq_q,
                        std::int64_t seq_k, std::int64_t heads, std::int64_t kv_heads, std::int64_t d, bool causal,
                        int threads) {
  openblas_set_num_threads(threads);
  const std::int64_t rows = std::clamp<std::int64_t>((64 << 20) / (4 * std::max<std::int64_t>(seq_k, 1)), 1, seq_q);
  std::vector<float> s(static_cast<std::size_t>(rows * seq_k));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::int64_t g = heads / kv_heads;
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* kh = k + (h / g) * d;
    const float* vh = v + (h / g) * d;
    for (std::int64_t i0 = 0; i0 < seq_q; i0 += rows) {
      const std::int64_t n = std::min(rows, seq_q - i0);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(seq_k),
                  static_cast<int>(d), scale, q + (i0 * heads + h) * d, static_cast<int>(heads * d), kh,
                  static_cast<int>(kv_heads * d), 0.0f, s.data(), static_cast<int>(seq_k));
#pragma omp parallel for num_threads(threads) schedule(static)
      for (std::int64_t r = 0; r < n; ++r) {
        const std::int64_t i = i0 + r;
        const std::int64_t visible = causal ? std::clamp<std::int64_t>(i + seq_k - seq_q + 1, 0, seq_k) : seq_k;
        HWY_DYNAMIC_DISPATCH(SoftmaxRow)(s.data() + r * seq_k, visible, seq_k);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), static_cast<int>(d),
                  static_cast<int>(seq_k), 1.0f, s.data(), static_cast<int>(seq_k), vh, static_cast<int>(kv_heads * d),
                  0.0f, out + (i0 * heads + h) * d, static_cast<int>(heads * d));
    }
  }
}

}  // namespace attn::cli
#endif  // HWY_ONCE
