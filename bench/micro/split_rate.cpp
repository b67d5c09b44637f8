// The AMX forward's weight step with P rounded to one bf16 (bf16 inputs) against P split into three bf16
// parts (f32 inputs on the tiles by parts, bf16x3), per score, on this CPU's widest Highway target: the
// vector work that f32 by parts adds where the vector units are the bound. Times, per score element,
// over one 512-key row repeated (Exp2 of a multiply-add, summed, then P stored):
//   one        one bf16 (VCVTNEPS2BF16 where the CPU has it, as on the tiles)
//   split sw   three parts by RoundToBf16 (integer operations; the emulated tiles' path)
//   split hw   three parts by VCVTNEPS2BF16 (the CPU's tiles' path)
// and prints the medians of 15 runs and the ratios to `one`.
//
//   c++ -O2 -std=c++20 -march=native -Iinclude -Isrc bench/micro/split_rate.cpp -lhwy -o /tmp/split_rate
//   /tmp/split_rate
#include <hwy/highway.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "amx/amx_round-inl.h"
#include "cpu/exp_simd-inl.h"
#include "per_score.hpp"

namespace hn = hwy::HWY_NAMESPACE;
namespace ar = attn::detail::amx_simd::HWY_NAMESPACE;

using attn::micro::kKeys;
using attn::micro::kRows;
using attn::micro::median_ns_per_score;

int main() {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  alignas(64) static float s[kKeys];
  alignas(64) static std::uint16_t p[3 * kKeys];
  attn::micro::fill_scores(s);
  float sink = 0;
  const bool native = __builtin_cpu_supports("avx512bf16");
  // kind 0: one bf16; 1: three parts in software; 2: three parts by the instruction.
  auto step = [&]<int kKind>() {
    sink += attn::micro::weight_steps(d, s, [&](auto pv, std::size_t c) {
      if constexpr (kKind == 0)
        ar::StoreRounded<attn::bf16_t, true>(d, pv, &p[c]);
      else
        ar::StoreSplitBf16x3<kKind == 2>(d, pv, &p[c], kKeys);
    });
  };
  if (!native) {
    std::printf("this CPU has no AVX512-BF16 (VCVTNEPS2BF16): nothing to compare\n");
    return 0;
  }
  const double one = median_ns_per_score([&] { step.template operator()<0>(); });
  const double sw = median_ns_per_score([&] { step.template operator()<1>(); });
  const double hw = median_ns_per_score([&] { step.template operator()<2>(); });
  std::printf("target %s, %zu f32 lanes; ns per score (median of 15 runs of %zu x %zu)\n", hwy::TargetName(HWY_TARGET),
              N, kRows, kKeys);
  std::printf("one bf16 (VCVTNEPS2BF16)          %.3f\n", one);
  std::printf("split, three parts, software      %.3f  %.2fx one\n", sw, sw / one);
  std::printf("split, three parts, VCVTNEPS2BF16 %.3f  %.2fx one\n", hw, hw / one);
  return sink == 12345.678f ? 1 : 0;
}
