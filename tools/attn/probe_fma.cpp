// fma_peak_gflops: the machine's f32 FMA ceiling, measured. Each thread runs kChains independent
// multiply-add chains on the widest vector unit Highway finds at run time (AVX-512 on Zen 4, AVX2+FMA,
// NEON, ...): enough chains to cover the FMA latency times the number of FMA pipes on current cores
// (4 cycles x 2 pipes), all in registers, so only the FMA units limit the rate. Zen 4 runs AVX-512 as
// two 256-bit halves, so the probe reports the same peak whichever width it picks there.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attn/probe_fma.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include <omp.h>

#include "probes.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::cli {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs `iters` rounds of 12 independent FMAs; returns the flops done (2 per lane per FMA). The
// result is folded into `sink` so the compiler cannot drop the chains.
double FmaChains(std::int64_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  const auto a = hn::Set(d, 0.999999f), b = hn::Set(d, 1e-7f);
  auto c0 = hn::Set(d, 1.0f), c1 = hn::Set(d, 1.1f), c2 = hn::Set(d, 1.2f), c3 = hn::Set(d, 1.3f);
  auto c4 = hn::Set(d, 1.4f), c5 = hn::Set(d, 1.5f), c6 = hn::Set(d, 1.6f), c7 = hn::Set(d, 1.7f);
  auto c8 = hn::Set(d, 1.8f), c9 = hn::Set(d, 1.9f), c10 = hn::Set(d, 2.0f), c11 = hn::Set(d, 2.1f);
  for (std::int64_t i = 0; i < iters; ++i) {
    c0 = hn::MulAdd(c0, a, b);
    c1 = hn::MulAdd(c1, a, b);
    c2 = hn::MulAdd(c2, a, b);
    c3 = hn::MulAdd(c3, a, b);
    c4 = hn::MulAdd(c4, a, b);
    c5 = hn::MulAdd(c5, a, b);
    c6 = hn::MulAdd(c6, a, b);
    c7 = hn::MulAdd(c7, a, b);
    c8 = hn::MulAdd(c8, a, b);
    c9 = hn::MulAdd(c9, a, b);
    c10 = hn::MulAdd(c10, a, b);
    c11 = hn::MulAdd(c11, a, b);
  }
  const auto s =
      hn::Add(hn::Add(hn::Add(c0, c1), hn::Add(c2, c3)),
              hn::Add(hn::Add(hn::Add(c4, c5), hn::Add(c6, c7)), hn::Add(hn::Add(c8, c9), hn::Add(c10, c11))));
  *sink += hn::GetLane(s);
  return 2.0 * 12.0 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iters);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::cli
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::cli {
HWY_EXPORT(FmaChains);

double fma_peak_gflops(int threads) {
  threads = std::max(threads, 1);
  const std::int64_t iters = 20'000'000;  // about 0.1 s per thread at 100 GFLOP/s per core
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {  // the best of three: the probe measures the ceiling
    double flops = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      float sink = 0;
      flops += HWY_DYNAMIC_DISPATCH(FmaChains)(iters, &sink);
      if (sink == 12345.f) flops += 1;  // keeps the chains observable
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / s / 1e9);
  }
  return best;
}
}  // namespace attn::cli
#endif  // HWY_ONCE
