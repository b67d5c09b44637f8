// The score rule (src/core/score_rule.hpp) on its own: the mask against the definition of
// include/attn/options.hpp key by key (windows of every size up to INT64_MAX), the logit's transforms
// and their derivative (the backward pass's), and the per-sequence view. Every kernel takes its masks and logits from
// this type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "core/score_rule.hpp"

namespace attn::detail {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

// options.hpp: query i sees key j iff i + sk - sq - left <= j <= i + sk - sq + right (-1 unbounded),
// evaluated in long double so that no window overflows.
bool sees(std::int64_t sq, std::int64_t sk, std::int64_t left, std::int64_t right, std::int64_t i, std::int64_t j) {
  const long double diag = static_cast<long double>(i) + sk - sq;
  if (left >= 0 && static_cast<long double>(j) < diag - left) return false;
  if (right >= 0 && static_cast<long double>(j) > diag + right) return false;
  return true;
}

TEST(ScoreRule, MaskMatchesTheDefinitionForEveryWindow) {
  std::mt19937_64 rng(7);
  const std::int64_t windows[] = {-1, 0, 1, 2, 5, 17, 64, kMax / 2, kMax - 1, kMax};
  for (int trial = 0; trial < 300; ++trial) {
    const std::int64_t sq = std::uniform_int_distribution<std::int64_t>(1, 40)(rng);
    const std::int64_t sk = std::uniform_int_distribution<std::int64_t>(0, 40)(rng);
    ScoreRule rule;
    rule.window_left = windows[rng() % std::size(windows)];
    rule.window_right = windows[rng() % std::size(windows)];
    const Mask m = rule.mask(sq, sk);
    for (std::int64_t i = 0; i < sq; ++i) {
      std::int64_t count = 0;
      for (std::int64_t j = 0; j < sk; ++j) {
        const bool want = sees(sq, sk, rule.window_left, rule.window_right, i, j);
        EXPECT_EQ(want, m.first_key(i) <= j && j < m.end_key(i))
            << "sq " << sq << " sk " << sk << " window (" << rule.window_left << ", " << rule.window_right << ") i "
            << i << " j " << j;
        count += want;
      }
      EXPECT_EQ(m.visible_count(i), count);
      EXPECT_GE(m.first_key(i), 0);
      EXPECT_LE(m.end_key(i), sk);
      if (i > 0) {  // both ends non-decreasing in i (the kernels' tile ranges rely on it)
        EXPECT_LE(m.first_key(i - 1), m.first_key(i));
        EXPECT_LE(m.end_key(i - 1), m.end_key(i));
      }
    }
  }
}

// Mask::tile_keys, every kernel's per-row tile bounds: exactly the keys of the tile the row sees, as
// visible() says key by key, and lo == hi when it sees none.
TEST(ScoreRule, TileKeysAreTheVisibleKeysOfTheTile) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 400; ++trial) {
    ScoreRule r;
    r.window_left = static_cast<std::int64_t>(rng() % 12) - 1;
    r.window_right = static_cast<std::int64_t>(rng() % 12) - 1;
    const std::int64_t sq = 1 + rng() % 20, sk = rng() % 30, j0 = rng() % 31, n = rng() % 12;
    const Mask m = r.mask(sq, sk);
    for (std::int64_t i = 0; i < sq; ++i) {
      const Mask::TileKeys t = m.tile_keys(i, j0, n);
      ASSERT_LE(0, t.lo);
      ASSERT_LE(t.lo, t.hi);
      ASSERT_LE(t.hi, n);
      for (std::int64_t c = 0; c < n; ++c) {
        const std::int64_t j = j0 + c;
        const bool sees = j < sk && j >= m.first_key(i) && j < m.end_key(i);
        EXPECT_EQ(c >= t.lo && c < t.hi, sees) << "trial " << trial << " row " << i << " key " << j;
      }
    }
  }
}

TEST(ScoreRule, HugeSequencesAndWindowsDoNotOverflow) {
  ScoreRule rule;
  rule.window_left = kMax;
  rule.window_right = kMax;
  const std::int64_t n = std::int64_t{1} << 62;
  const Mask m = rule.mask(n, n);
  EXPECT_EQ(m.first_key(n - 1), 0);
  EXPECT_EQ(m.end_key(0), n);
  EXPECT_EQ(m.diagonal(0), 0);
  rule.window_left = 0;
  rule.window_right = 0;
  EXPECT_EQ(rule.mask(n, n).visible_count(n - 1), 1);
}

TEST(ScoreRule, LogitAppliesScaleThenSoftcapThenAlibi) {
  ScoreRule rule;
  rule.scale = 0.5;
  EXPECT_EQ(rule.logit(3.0, 0, 0.0), 1.5);
  EXPECT_FALSE(rule.transforms_scores());
  rule.softcap = 2.0;
  EXPECT_TRUE(rule.transforms_scores());
  EXPECT_DOUBLE_EQ(rule.logit(3.0, 0, 0.0), 2.0 * std::tanh(1.5 / 2.0));
  // ALiBi: minus slope times |distance|, on either side of the diagonal.
  EXPECT_DOUBLE_EQ(rule.logit(3.0, -4, 0.25), 2.0 * std::tanh(0.75) - 1.0);
  EXPECT_DOUBLE_EQ(rule.logit(3.0, 4, 0.25), 2.0 * std::tanh(0.75) - 1.0);
  // The mask's score is the logit at the pair's distance diagonal(i) - j.
  const Mask m = rule.mask(3, 10);
  EXPECT_DOUBLE_EQ(m.score(3.0, 0, 9, 0.25), rule.logit(3.0, 7 - 9, 0.25));
}

// The backward pass's d logit / d dot is the derivative of `logit` (central differences; the ALiBi
// bias is additive and does not change it).
TEST(ScoreRule, LogitGradIsTheDerivativeOfTheLogit) {
  for (double softcap : {0.0, 0.5, 3.0})
    for (double dot : {-7.0, -0.3, 0.0, 0.2, 1.9, 11.0}) {
      ScoreRule r;
      r.scale = 0.7;
      r.softcap = softcap;
      const double h = 1e-6;
      const double fd = (r.logit(dot + h, 3, 0.25) - r.logit(dot - h, 3, 0.25)) / (2 * h);
      EXPECT_NEAR(r.logit_grad(dot), fd, 1e-8) << "softcap " << softcap << " dot " << dot;
    }
}

TEST(ScoreRule, ForSequencePicksThatSequencesSlopes) {
  const float slopes[] = {1, 2, 3, 4, 5, 6};  // batch 3 x heads 2
  ScoreRule rule;
  rule.alibi_slopes = slopes;
  rule.alibi_batch_stride = 2;
  EXPECT_TRUE(rule.transforms_scores());
  EXPECT_EQ(rule.alibi_slope(2, 1), 6.f);
  const ScoreRule second = rule.for_sequence(1);
  EXPECT_EQ(second.alibi_slope(0, 0), 3.f);
  EXPECT_EQ(second.alibi_slope(0, 1), 4.f);
  EXPECT_EQ(second.alibi_batch_stride, 0);
  rule.alibi_batch_stride = 0;  // one set of slopes for the whole batch
  EXPECT_EQ(rule.for_sequence(2).alibi_slope(0, 1), 2.f);
  EXPECT_EQ(ScoreRule{}.alibi_slope(5, 5), 0.f);
}

}  // namespace
}  // namespace attn::detail
