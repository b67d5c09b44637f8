// Dropout's generator against the softmax's exponential, per score, on this CPU's widest Highway target:
// the cost that dropout adds where the vector units are the bound (the AMX kernels, whose block
// products run on the tiles). Times, per score element, over one 512-key row repeated:
//   exp        the AMX forward's weight step: Exp2 of a multiply-add, summed, rounded to bf16 and stored
//   row        DropRowFactors, lanes along key groups (the AMX forward's dropout)
//   rows       GroupFactors, lanes along query rows (the tiled kernels' DropTile, the AMX backward)
// and prints the medians of 15 runs and the ratios to exp.
//
//   c++ -O2 -std=c++20 -march=native -Iinclude -Isrc bench/micro/philox_rate.cpp -lhwy -o /tmp/philox_rate
//   /tmp/philox_rate
#include <hwy/highway.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "amx/amx_round-inl.h"
#include "core/dropout.hpp"
#include "cpu/exp_simd-inl.h"
#include "per_score.hpp"
#include "cpu/philox-inl.h"

namespace hn = hwy::HWY_NAMESPACE;
namespace ps = attn::detail::philox_simd::HWY_NAMESPACE;

using attn::micro::kKeys;
using attn::micro::kRows;
using attn::micro::median_ns_per_score;

int main() {
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  const std::size_t N = hn::Lanes(d);
  attn::detail::DropoutRule rule;
  rule.p = 0.1;
  rule.scale = 1 / 0.9;
  rule.threshold = static_cast<std::uint32_t>(0.9 * 4294967296.0);
  rule.seed = 1234;
  rule.heads = 16;
  alignas(64) static float s[kKeys], factors[kKeys + 64];
  alignas(64) static std::uint16_t p[kKeys];
  attn::micro::fill_scores(s);
  float sink = 0;
  // P rounded by VCVTNEPS2BF16 where the CPU has it (every AMX CPU does), else in software.
  const bool native = __builtin_cpu_supports("avx512bf16");
  auto exp_step = [&]<bool kNative>() {
    sink += attn::micro::weight_steps(d, s, [&](auto pv, std::size_t c) {
      attn::detail::amx_simd::HWY_NAMESPACE::StoreRounded<attn::bf16_t, kNative>(d, pv, &p[c]);
    });
  };
  const double exp_ns = median_ns_per_score([&] {
    if (native)
      exp_step.template operator()<true>();
    else
      exp_step.template operator()<false>();
  });
  const double row_ns = median_ns_per_score([&] {
    for (std::size_t r = 0; r < kRows; ++r) {
      ps::DropRowFactors(d, rule, static_cast<std::uint32_t>(r), 3u, 0, kKeys / 4, factors);
      sink += factors[r % kKeys];
    }
  });
  const double rows_ns = median_ns_per_score([&] {
    auto acc = hn::Zero(d);
    for (std::size_t r = 0; r < kRows; r += N) {
      const auto ci = hn::Add(hn::Iota(du, 0u), hn::Set(du, static_cast<std::uint32_t>(r))), ch = hn::Set(du, 3u);
      for (std::size_t g = 0; g < kKeys / 4; ++g) {
        hn::Vec<decltype(d)> f[4];
        ps::GroupFactors(d, rule, static_cast<std::int64_t>(g), ci, ch, f);
        acc = hn::Add(acc, hn::Add(hn::Add(f[0], f[1]), hn::Add(f[2], f[3])));
      }
    }
    sink += hn::GetLane(hn::SumOfLanes(d, acc));
  });
  std::printf("target %s, %zu f32 lanes, P rounded %s; ns per score (median of 15 runs of %zu x %zu)\n",
              hwy::TargetName(HWY_TARGET), N, native ? "by VCVTNEPS2BF16" : "in software", kRows, kKeys);
  std::printf("exp  (AMX forward's weights)      %.3f\n", exp_ns);
  std::printf("row  (DropRowFactors, AMX fwd)    %.3f  %.2fx exp\n", row_ns, row_ns / exp_ns);
  std::printf("rows (GroupFactors, DropTile)     %.3f  %.2fx exp\n", rows_ns, rows_ns / exp_ns);
  return sink == 12345.678f ? 1 : 0;
}
