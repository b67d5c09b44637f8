// The AMX forward's split of an f32 into three bf16 parts (f32 on the tiles by parts, bf16x3;
// amx/amx_round-inl.h): the scalar SplitBf16x3; on every SIMD target this CPU runs, the split on lanes in
// software (the packing's, and P's on the emulated tiles), for every kind of f32; and, where the CPU has
// AVX512-BF16 (every AMX CPU; Zen 4), P's split by VCVTNEPS2BF16 as the kernel runs it on the CPU's tiles.
// The lanes give the scalar split's parts, bit for bit.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "test_amx_split.cpp"
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

#include "amx/amx_round-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::test_split {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Part k of x[i] into out[k n + i]; n a multiple of the widest vector (16 floats). kNative: the
// instruction where this target has it (AVX3), else the same software split.
template <bool kNative>
void Split(const float* x, std::size_t n, std::uint16_t* out) {
  const hn::ScalableTag<float> d;
  for (std::size_t i = 0; i < n; i += hn::Lanes(d))
    detail::amx_simd::HWY_NAMESPACE::StoreSplitBf16x3<kNative>(d, hn::LoadU(d, x + i), out + i, n);
}
void SplitSoftware(const float* x, std::size_t n, std::uint16_t* out) { Split<false>(x, n, out); }
void SplitNative(const float* x, std::size_t n, std::uint16_t* out) { Split<true>(x, n, out); }
std::int64_t Target() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace attn::test_split
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cpu/dpbf16.hpp"
#include "support.hpp"

namespace attn::test_split {
HWY_EXPORT(SplitSoftware);
HWY_EXPORT(SplitNative);
HWY_EXPORT(Target);

namespace {

std::int64_t split_target() { return HWY_DYNAMIC_DISPATCH(Target)(); }

// P's values: exp(s - m) times a dropout factor, in (0, 10], and those that end a row (0, 1); from 2^-60
// up, so that no rest is subnormal (where VCVTNEPS2BF16 reads it as zero: the same tile products).
std::vector<float> weights() {
  std::mt19937 rng(13);
  std::vector<float> xs{0.0f, 1.0f, 0.5f, 10.0f, std::ldexp(1.0f, -60)};
  for (int i = 0; i < (1 << 16); ++i) xs.push_back(std::uniform_real_distribution<float>(0.0f, 10.0f)(rng));
  for (int i = 0; i < (1 << 14); ++i) xs.push_back(std::exp(std::uniform_real_distribution<float>(-41.0f, 0.0f)(rng)));
  xs.resize((xs.size() + 15) / 16 * 16, 0.25f);
  return xs;
}

void expect_scalar_parts(const std::vector<float>& xs, const std::vector<std::uint16_t>& got) {
  for (std::size_t i = 0; i < xs.size(); ++i)
    for (std::size_t k = 0; k < 3; ++k)
      ASSERT_EQ(got[k * xs.size() + i], detail::amx_simd::HWY_NAMESPACE::SplitBf16x3(xs[i]).part[k])
          << "part " << k << " of " << xs[i];
}

// f32 on the tiles by parts (bf16x3): the three bf16 parts of a normal f32 sum back to it exactly (smallest
// first) and each is the bf16 nearest to what the earlier ones left; an Inf or NaN is its first part and
// zeros; a value past bf16's largest is truncated, not rounded to Inf.
TEST(AmxSplit, PartsSumBackToTheF32) {
  using detail::amx_simd::HWY_NAMESPACE::SplitBf16x3;
  auto bf16_value = [](std::uint16_t b) { return detail::load<float>(bf16_t{b}); };
  auto bf16_bits = [](float x) { return detail::store<bf16_t>(x).bits; };
  auto sum = [&](const auto& p) { return (bf16_value(p.part[2]) + bf16_value(p.part[1])) + bf16_value(p.part[0]); };
  std::mt19937 rng(12);
  for (int i = 0; i < (1 << 18); ++i) {
    const float x = detail::bits_float(static_cast<std::uint32_t>(rng()));
    if (!std::isfinite(x) || std::fabs(x) < std::ldexp(1.0f, -100)) continue;  // low parts would be subnormal
    const auto p = SplitBf16x3(x);
    ASSERT_EQ(sum(p), x) << x;
    const bool overflows = std::isinf(bf16_value(bf16_bits(x)));  // past bf16's largest: truncated
    ASSERT_EQ(p.part[0], overflows ? detail::float_bits(x) >> 16 : bf16_bits(x)) << x;
    ASSERT_EQ(p.part[1], bf16_bits(x - bf16_value(p.part[0]))) << x;
  }
  for (const float x : {INFINITY, -INFINITY, NAN}) {
    const auto p = SplitBf16x3(x);
    EXPECT_EQ(p.part[1], 0u);
    EXPECT_EQ(p.part[2], 0u);
    EXPECT_EQ(detail::float_bits(bf16_value(p.part[0])) & 0x7f800000u, 0x7f800000u);
  }
  const float big = std::numeric_limits<float>::max();
  EXPECT_TRUE(std::isfinite(bf16_value(SplitBf16x3(big).part[0])));
  EXPECT_EQ(sum(SplitBf16x3(big)), big);
}

// The split on lanes in software (the packing's, and P's on the emulated tiles) gives the scalar split's
// parts for every kind of f32: random bit patterns (subnormals, Inf, NaN, values past bf16's largest) and
// P's values.
TEST(AmxSplit, SoftwareGivesTheScalarParts) {
  std::vector<float> xs = weights();
  std::mt19937 rng(14);
  for (int i = 0; i < (1 << 16); ++i) xs.push_back(detail::bits_float(static_cast<std::uint32_t>(rng())));
  const float big = std::numeric_limits<float>::max();
  xs.insert(xs.end(), {INFINITY, -INFINITY, NAN, big, -big, std::nextafter(big, 0.0f), 1e-40f, -0.0f});
  xs.resize((xs.size() + 15) / 16 * 16, 0.25f);
  test::for_each_simd_target("split", &split_target, [&](std::int64_t) {
    std::vector<std::uint16_t> got(3 * xs.size());
    HWY_DYNAMIC_DISPATCH(SplitSoftware)(xs.data(), xs.size(), got.data());
    expect_scalar_parts(xs, got);
  });
}

TEST(AmxSplit, Vcvtneps2bf16GivesTheScalarParts) {
#if HWY_TARGETS & HWY_AVX3
  if (!detail::cpu_has_avx512bf16() || !(hwy::SupportedTargets() & HWY_AVX3))
    GTEST_SKIP() << "needs a CPU with AVX512-BF16 (VCVTNEPS2BF16)";
  const std::vector<float> xs = weights();
  std::vector<std::uint16_t> got(3 * xs.size());
  N_AVX3::SplitNative(xs.data(), xs.size(), got.data());
  expect_scalar_parts(xs, got);
#else
  GTEST_SKIP() << "AVX3 is not compiled in this build";
#endif
}

}  // namespace
}  // namespace attn::test_split
#endif  // HWY_ONCE
