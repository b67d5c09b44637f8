// ExpDiff (cpu/exp_simd-inl.h), the softmax's exponential in every CPU kernel, on every SIMD target
// this CPU runs: its error against std::exp in double, its special values (NaN poisons, -inf and far
// below the row's maximum give exactly 0, 0 gives exactly 1), on f32 and f64 lanes.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "test_exp_simd.cpp"
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

#include "cpu/exp_simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::test_exp {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[i] = ExpDiff(s[i], m[i]), n a multiple of the widest vector (16 floats / 8 doubles).
template <class T>
void Run(const T* s, const T* m, T* out, std::size_t n) {
  const hn::ScalableTag<T> d;
  for (std::size_t i = 0; i < n; i += hn::Lanes(d))
    hn::StoreU(detail::exp_simd::HWY_NAMESPACE::ExpDiff(d, hn::LoadU(d, s + i), hn::LoadU(d, m + i)), d, out + i);
}
void RunF32(const float* s, const float* m, float* out, std::size_t n) { Run(s, m, out, n); }
void RunF64(const double* s, const double* m, double* out, std::size_t n) { Run(s, m, out, n); }
std::int64_t Target() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace attn::test_exp
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "support.hpp"

namespace attn::test_exp {
HWY_EXPORT(RunF32);
HWY_EXPORT(RunF64);
HWY_EXPORT(Target);

namespace {

std::int64_t exp_target() { return HWY_DYNAMIC_DISPATCH(Target)(); }

template <class T>
std::vector<T> exp_diff(std::vector<T> s, std::vector<T> m) {
  const std::size_t n = (s.size() + 15) / 16 * 16;
  s.resize(n, T(0));
  m.resize(n, T(0));
  std::vector<T> out(n);
  if constexpr (sizeof(T) == 4)
    HWY_DYNAMIC_DISPATCH(RunF32)(s.data(), m.data(), out.data(), n);
  else
    HWY_DYNAMIC_DISPATCH(RunF64)(s.data(), m.data(), out.data(), n);
  return out;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Every f32 x = s - m from -86 to 0 in steps of 2^-12 with m = 0, and random (s, m) pairs with both up
// to 100 in magnitude. The bound: t = x log2(e) in f32 (log2(e) rounded to f32 is 1.3e-8 low, the
// product rounds by up to 2^-24) moves 2^t by up to 1.25 |x| 2^-24 relative, so the terms far below the
// row's largest, which weigh least, carry the largest relative error; in absolute terms, which is what
// reaches l and o, it stays below 2^-22 of the largest term. The polynomial and the last product add
// about 2 ulp.
TEST(ExpSimd, F32WithinItsBoundOfStdExp) {
  std::vector<float> s, m;
  for (int k = -86 * 4096; k <= 0; ++k) {
    s.push_back(static_cast<float>(k) / 4096.0f);
    m.push_back(0.0f);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-100, 100);
  for (int k = 0; k < 100000; ++k) {
    const float a = u(rng), b = u(rng), lo = std::min(a, b), hi = std::max(a, b);
    if (lo - hi < -86.0f) continue;
    s.push_back(lo);
    m.push_back(hi);
  }
  test::for_each_simd_target("exp", &exp_target, [&](std::int64_t) {
    const std::vector<float> got = exp_diff(s, m);
    double worst = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      // x = s - m is exact in float for these pairs or not: the reference takes the float difference,
      // as the kernels' scores are floats.
      const float x = s[i] - m[i];
      const double want = std::exp(static_cast<double>(x));
      const double err = std::abs(got[i] - want) / want / (1.25 * std::abs(x) + 3.0);
      worst = std::max(worst, err);
      ASSERT_LE(err, std::ldexp(1.0, -24)) << "x " << x << " got " << got[i] << " want " << want;
      ASSERT_LE(std::abs(got[i] - want), std::ldexp(1.0, -22)) << "x " << x;
    }
    EXPECT_GT(worst, 0.0);
  });
}

TEST(ExpSimd, F32SpecialValues) {
  const std::vector<float> s = {0.0f, 5.0f, -kInf, -kInf, -87.0f, -200.0f, -1e30f, kNaN,
                                1.0f, kNaN, kInf,  kInf,  90.0f,  1e30f,   -86.0f, 88.0f};
  const std::vector<float> m = {0.0f, 5.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
                                kNaN, kNaN, kInf, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  test::for_each_simd_target("exp", &exp_target, [&](std::int64_t) {
    const std::vector<float> got = exp_diff(s, m);
    EXPECT_EQ(got[0], 1.0f);  // the row's largest term weighs exactly 1
    EXPECT_EQ(got[1], 1.0f);
    EXPECT_EQ(got[2], 0.0f);  // masked: no weight at all
    EXPECT_EQ(got[3], 0.0f);
    EXPECT_EQ(got[4], 0.0f);  // below 2^-125 of the largest term
    EXPECT_EQ(got[5], 0.0f);
    EXPECT_EQ(got[6], 0.0f);
    for (int i : {7, 8, 9, 10}) EXPECT_TRUE(std::isnan(got[i])) << i << ": " << got[i];  // poisons the row
    for (int i : {11, 12, 13}) EXPECT_EQ(got[i], kInf) << i;
    EXPECT_NEAR(got[14], std::exp(-86.0), 1e-5 * std::exp(-86.0));
    EXPECT_NEAR(got[15], std::exp(88.0), 1e-5 * std::exp(88.0));
  });
}

// AVX-512 computes 2^t with VRNDSCALEPS and VSCALEFPS, AVX2 with the shifter (exp_simd::Exp2): both
// with FMAs in the polynomial, so they agree to the bit (one ulp at most: below) on every input, the special ones too,
// but for t = x log2(e) in [127.5, 128), where 2^t is finite (below FLT_MAX) and the shifter's factor
// 2^128 is already inf: there AVX-512 gives 2^t and AVX2 inf (the kernels' t is <= 0).
TEST(ExpSimd, F32Avx512AndAvx2GiveTheSameBits) {
  const std::int64_t runs = hwy::SupportedTargets();
  if (!(runs & HWY_AVX3) || !(runs & HWY_AVX2)) GTEST_SKIP() << "needs a CPU that runs AVX-512 and AVX2";
  std::vector<float> s, m;
  for (int k = -131 * 1024; k <= 131 * 1024; ++k) {  // t across [-189, 189]: both range ends
    s.push_back(static_cast<float>(k) / 1024.0f);
    m.push_back(0.0f);
  }
  for (float x : {kInf, -kInf, kNaN, 1e30f, -1e30f, 88.72f, 88.73f, -86.64f, -86.65f, -0.0f}) {
    s.push_back(x);
    m.push_back(0.0f);
    s.push_back(0.0f);
    m.push_back(x);
  }
  std::vector<std::uint32_t> bits[2];
  int i = 0;
  for (const std::int64_t target : {std::int64_t{HWY_AVX3}, std::int64_t{HWY_AVX2}}) {
    const test::PinTarget pin(target);
    const std::vector<float> got = exp_diff(s, m);
    for (const float g : got) {
      std::uint32_t u;
      std::memcpy(&u, &g, 4);
      bits[i].push_back(u);
    }
    ++i;
  }
  for (std::size_t k = 0; k < s.size(); ++k) {
    const double t = (static_cast<double>(s[k]) - m[k]) * 1.4426950408889634;
    if (t >= 127.5 && t < 128.0) {
      float a;
      std::memcpy(&a, &bits[0][k], 4);
      const double x = static_cast<double>(s[k] - m[k]);  // within F32WithinItsBoundOfStdExp's bound
      EXPECT_NEAR(a, std::exp(x), (1.25 * x + 3.0) * std::ldexp(1.0, -24) * a) << "s " << s[k];
      continue;
    }
    // The same bits in the release build (GCC); clang's -O0 sanitizer build differs from it by one ulp on a
    // few inputs near t = -125, so one ulp is what every build is held to.
    const std::uint32_t a = bits[0][k], b = bits[1][k];
    ASSERT_LE(a > b ? a - b : b - a, 1u) << "s " << s[k] << " m " << m[k];
  }
}

TEST(ExpSimd, F64AsHighwaysExpWithNaNPassedThrough) {
  std::vector<double> s, m;
  for (int k = -700 * 64; k <= 0; ++k) {
    s.push_back(k / 64.0);
    m.push_back(0.0);
  }
  s.insert(s.end(), {-INFINITY, std::nan(""), 0.0, INFINITY});
  m.insert(m.end(), {0.0, 0.0, std::nan(""), INFINITY});
  test::for_each_simd_target("exp", &exp_target, [&](std::int64_t) {
    const std::vector<double> got = exp_diff(s, m);
    const std::size_t n = s.size() - 4;
    for (std::size_t i = 0; i < n; ++i) {
      const double want = std::exp(s[i]);
      ASSERT_LE(std::abs(got[i] - want), 4e-16 * want) << "x " << s[i];
    }
    EXPECT_EQ(got[n], 0.0);
    for (std::size_t i = n + 1; i < n + 4; ++i) EXPECT_TRUE(std::isnan(got[i])) << i - n;
  });
}

}  // namespace
}  // namespace attn::test_exp
#endif  // HWY_ONCE
