// The online-softmax state and its merge: the algebra every algorithm relies on, as tested properties.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attn/online_softmax.hpp"

namespace attn {
namespace {

constexpr std::int64_t kDim = 5;

// The state of a random set of `n` keys, folded one tile at a time.
PartialState<double> random_state(std::mt19937_64& rng, int n, double shift = 0) {
  std::uniform_real_distribution<double> u(-3, 3);
  PartialState<double> s(kDim);
  std::vector<double> scores(n), v(n * kDim);
  for (auto& x : scores) x = u(rng) + shift;
  for (auto& x : v) x = u(rng);
  fold(s.view(), scores.data(), n, v.data(), kDim);
  return s;
}

void expect_near(const PartialState<double>& a, const PartialState<double>& b, double tol) {
  // Compare in a common frame: l and o relative to the same max.
  ASSERT_DOUBLE_EQ(a.m, b.m);
  EXPECT_NEAR(a.l, b.l, tol * std::abs(a.l));
  for (int c = 0; c < kDim; ++c) EXPECT_NEAR(a.o[c], b.o[c], tol * (1 + std::abs(a.o[c])));
}

void expect_bitwise(const PartialState<double>& a, const PartialState<double>& b) {
  EXPECT_EQ(a.m, b.m);
  EXPECT_EQ(a.l, b.l);
  EXPECT_EQ(a.o, b.o);
}

TEST(OnlineSoftmax, MergeIsCommutativeBitwise) {
  std::mt19937_64 rng(1);
  for (int t = 0; t < 200; ++t) {
    auto a = random_state(rng, 1 + t % 7, (t % 3) * 10.0), b = random_state(rng, 1 + t % 5);
    expect_bitwise(merged(a, b), merged(b, a));
  }
}

TEST(OnlineSoftmax, MergeIsAssociative) {
  std::mt19937_64 rng(2);
  for (int t = 0; t < 200; ++t) {
    auto a = random_state(rng, 3, -20), b = random_state(rng, 4), c = random_state(rng, 2, 15);
    expect_near(merged(merged(a, b), c), merged(a, merged(b, c)), 1e-14);
  }
}

TEST(OnlineSoftmax, NeutralElementIsABitwiseNoOp) {
  std::mt19937_64 rng(3);
  const PartialState<double> e(kDim);
  EXPECT_EQ(e.m, -std::numeric_limits<double>::infinity());
  for (int t = 0; t < 50; ++t) {
    auto a = random_state(rng, 1 + t % 9);
    expect_bitwise(merged(a, e), a);
    expect_bitwise(merged(e, a), a);
  }
  expect_bitwise(merged(e, e), e);  // no NaN from exp(-inf - -inf)
  EXPECT_FALSE(std::isnan(merged(e, e).l));
}

TEST(OnlineSoftmax, FoldingTilesEqualsMergingTheirStates) {
  // Folding keys one tile after another is the same as merging the tiles' own states.
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(-5, 5);
  std::vector<double> s(12), v(12 * kDim);
  for (auto& x : s) x = u(rng);
  for (auto& x : v) x = u(rng);
  PartialState<double> all(kDim), left(kDim), right(kDim);
  fold(all.view(), s.data(), 5, v.data(), kDim);
  fold(all.view(), s.data() + 5, 7, v.data() + 5 * kDim, kDim);
  fold(left.view(), s.data(), 5, v.data(), kDim);
  fold(right.view(), s.data() + 5, 7, v.data() + 5 * kDim, kDim);
  expect_near(all, merged(left, right), 1e-14);
}

TEST(OnlineSoftmax, FinalizeMatchesTheTextbookSoftmax) {
  std::vector<double> s = {0.5, -1.25, 3.0, 2.0}, v(4 * kDim);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(double(i));
  PartialState<double> st(kDim);
  fold(st.view(), s.data(), 2, v.data(), kDim);
  fold(st.view(), s.data() + 2, 2, v.data() + 2 * kDim, kDim);  // raises the max: rescale path
  std::vector<double> out(kDim);
  const double lse = finalize(st.view(), out.data());
  double m = 3.0, sum = 0;
  for (double x : s) sum += std::exp(x - m);
  EXPECT_NEAR(lse, m + std::log(sum), 1e-15);
  for (int c = 0; c < kDim; ++c) {
    double want = 0;
    for (int i = 0; i < 4; ++i) want += std::exp(s[i] - m) / sum * v[i * kDim + c];
    EXPECT_NEAR(out[c], want, 1e-15);
  }
}

TEST(OnlineSoftmax, FullyMaskedTileLeavesStateAndFinalizesToZero) {
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> s = {ninf, ninf}, v(2 * kDim, 7.0);
  PartialState<double> st(kDim);
  fold(st.view(), s.data(), 2, v.data(), kDim);
  std::vector<double> out(kDim, 99.0);
  EXPECT_EQ(finalize(st.view(), out.data()), ninf);
  for (double x : out) EXPECT_EQ(x, 0.0);
}

}  // namespace
}  // namespace attn

// Maxima equal up to their sign (+0 and -0) must not make the merged m (and so the LSE) depend on
// the order: EXPECT_EQ above treats +0 and -0 as equal, so compare the bits.
TEST(OnlineSoftmax, MergeIsCommutativeBitwiseForSignedZeroMaxima) {
  attn::PartialState<double> a(2), b(2);
  a.m = 0.0;
  a.l = 1;
  a.o = {1, 2};
  b.m = -0.0;
  b.l = 1;
  b.o = {3, 4};
  const auto ab = attn::merged(a, b), ba = attn::merged(b, a);
  EXPECT_EQ(std::signbit(ab.m), std::signbit(ba.m));
  EXPECT_FALSE(std::signbit(ab.m));
  EXPECT_EQ(ab.l, ba.l);
  EXPECT_EQ(ab.o, ba.o);
}
