// The per-score timing of the micro-benchmarks of the AMX kernels' vector steps (philox_rate.cpp,
// split_rate.cpp): one 512-key row of scores repeated for 4096 rows, the median of 15 runs.
#pragma once

#include <hwy/highway.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include "cpu/exp_simd-inl.h"

namespace attn::micro {

constexpr std::size_t kKeys = 512, kRows = 4096;

// The median over 15 runs of f (which does kRows x kKeys scores) of its time per score, in ns.
template <class F>
double median_ns_per_score(F&& f) {
  std::vector<double> t;
  for (int run = 0; run < 15; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
                static_cast<double>(kKeys * kRows));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A row of raw scores in [-2, 1.6]: s[c] = (c mod 37) / 10 - 2.
inline void fill_scores(float* s) {
  for (std::size_t c = 0; c < kKeys; ++c) s[c] = static_cast<float>(c % 37) * 0.1f - 2.0f;
}

// The AMX forward's weight step over kRows copies of the row s, on this build's static target: P = Exp2 of
// one multiply-add of each score, summed, and each vector of P handed to store(pv, c) (c its first key).
// Returns the sum, so that nothing is left out.
template <class D, class Store>
float weight_steps(D d, const float* s, Store&& store) {
  namespace hn = hwy::HWY_NAMESPACE;
  const auto c1 = hn::Set(d, 0.125f * 1.4426950408889634f), mc = hn::Set(d, 1.5f);
  auto sum = hn::Zero(d);
  for (std::size_t r = 0; r < kRows; ++r)
    for (std::size_t c = 0; c < kKeys; c += hn::Lanes(d)) {
      const auto pv = detail::exp_simd::HWY_NAMESPACE::Exp2(d, hn::MulSub(hn::Load(d, s + c), c1, mc));
      sum = hn::Add(sum, pv);
      store(pv, c);
    }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

}  // namespace attn::micro
