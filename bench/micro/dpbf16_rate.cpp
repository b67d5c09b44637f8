// How often this core issues VDPBF16PS against a 512-bit FMA: the measurement behind bf16_dots()'s
// default (src/cpu/dpbf16.hpp; docs/prefill.md, "Where the dot products pay"). One VDPBF16PS does 32
// products, one FMA 16, so the instruction pays where it issues at more than half the FMA rate.
//
// K independent accumulators per loop: 24 hide either instruction's latency (throughput), 4 do not
// (latency). The accumulators are reduced afterwards so that they stay in registers. Best of 3 runs.
//
//   c++ -O2 -o dpbf16_rate bench/micro/dpbf16_rate.cpp
//   ./dpbf16_rate      # e.g. a 2-core Intel Xeon VM (Emerald Rapids): fma 0.20 ns, dp 0.80 ns, ratio 4.0
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace {

constexpr long kIters = 20000000;

template <int K, bool Dp>
__attribute__((target("avx512f,avx512bf16"), noinline)) double ns_per_instruction() {
  __m512 acc[K];
  for (int k = 0; k < K; ++k) acc[k] = _mm512_set1_ps(static_cast<float>(k));
  const __m512 a = _mm512_set1_ps(1.0001f), b = _mm512_set1_ps(0.9999f);
  const __m512bh pa = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // two bf16 1.0
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < kIters; ++i) {
#pragma GCC unroll 32
    for (int k = 0; k < K; ++k) {
      if constexpr (Dp)
        acc[k] = _mm512_dpbf16_ps(acc[k], pa, pa);
      else
        acc[k] = _mm512_fmadd_ps(acc[k], a, b);
      __asm__ volatile("" ::"v"(acc[k]));  // uses every result, so each instruction stays in the loop
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float sum = 0;
  for (int k = 0; k < K; ++k) sum += _mm512_reduce_add_ps(acc[k]);
  if (sum == 1.5f) std::printf(" ");
  return s / (static_cast<double>(kIters) * K) * 1e9;
}

template <int K, bool Dp>
double best() {
  double m = 1e30;
  for (int r = 0; r < 3; ++r) m = std::min(m, ns_per_instruction<K, Dp>());
  return m;
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("avx512bf16")) {
    std::printf("this CPU has no AVX512-BF16\n");
    return 1;
  }
  const double fma = best<24, false>(), dp = best<24, true>();
  std::printf("throughput (24 chains): fma %.3f ns, dp %.3f ns per instruction, ratio dp / fma %.2f\n", fma, dp,
              dp / fma);
  std::printf("  -> VDPBF16PS does %.2fx the products per second of FMAs (it pays where > 1)\n", 2 * fma / dp);
  std::printf("latency (4 chains): fma %.3f ns, dp %.3f ns per instruction\n", best<4, false>(), best<4, true>());
  return 0;
}
