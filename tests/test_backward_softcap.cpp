// The soft-cap's derivative where the logits saturate. d logit / d dot = scale sech^2(u), u = dot * scale /
// softcap; written 1 - tanh^2(u) it keeps only the rounding error of tanh(u) next to 1 (at u = 15 about 3e-4
// of the value in f64), so every gradient through a saturated cap would lose its digits. These tests hold
// the derivative itself to a few ulps, and the textbook and tiled backward to 1e-12 of an oracle computed
// in long double from the exact form, on a problem whose every logit is saturated (|u| in [13, 17]).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "core/score_rule.hpp"

namespace attn {
namespace {

using L = long double;

L sech2(L u) {
  const L c = std::cosh(u);
  return 1 / (c * c);
}

template <class A>
void expect_slope_within_ulps(A u, int ulps) {
  const L want = sech2(static_cast<L>(u));
  const A got = detail::ScoreRule::softcap_slope(u);
  const L tol = ulps * std::numeric_limits<A>::epsilon() * want;
  EXPECT_LE(std::abs(static_cast<L>(got) - want), tol) << "u = " << u;
}

TEST(SoftcapSlope, FewUlpsFromZeroToSaturation) {
  for (double u = -40; u <= 40; u += 0.37) {
    expect_slope_within_ulps<double>(u, 8);
    expect_slope_within_ulps<float>(static_cast<float>(u), 8);
  }
  EXPECT_EQ(detail::ScoreRule::softcap_slope(0.0), 1.0);
  EXPECT_EQ(detail::ScoreRule::softcap_slope(INFINITY), 0.0);
  EXPECT_TRUE(std::isnan(detail::ScoreRule::softcap_slope(NAN)));
}

// One head group (heads 2, kv heads 1) of [seqlen, heads, d] rows, batch 1: q > 0 on head 0 and < 0 on
// head 1, k > 0, so every dot is near +-4 d and u = dot * scale / cap is near +-15.
struct Saturated {
  static constexpr std::int64_t sq = 5, sk = 7, h = 2, d = 8;
  static constexpr double cap = 1.0, scale = 15.0 / (4 * d);
  std::vector<double> q, k, v, dout, out, lse;
  Saturated() : q(sq * h * d), k(sk * d), v(sk * d), dout(sq * h * d), out(sq * h * d), lse(h * sq) {
    std::mt19937_64 rng(20261206);
    std::uniform_real_distribution<double> near_two(1.9, 2.1), any(-1, 1);
    for (std::int64_t i = 0; i < sq; ++i)
      for (std::int64_t hh = 0; hh < h; ++hh)
        for (std::int64_t c = 0; c < d; ++c) q[(i * h + hh) * d + c] = (hh == 0 ? 1 : -1) * near_two(rng);
    for (auto& x : k) x = near_two(rng);
    for (auto& x : v) x = any(rng);
    for (auto& x : dout) x = any(rng);
    const TensorView l = lse_view();
    attention_reference(q_view(), k_view(), v_view(), TensorView::contiguous(out.data(), 1, sq, h, d), options(), &l);
  }
  AttentionOptions options() const {
    AttentionOptions o;
    o.softcap = cap;
    o.softmax_scale = scale;
    return o;
  }
  TensorView q_view() const { return TensorView::contiguous(q.data(), 1, sq, h, d); }
  TensorView k_view() const { return TensorView::contiguous(k.data(), 1, sk, 1, d); }
  TensorView v_view() const { return TensorView::contiguous(v.data(), 1, sk, 1, d); }
  TensorView lse_view() const { return TensorView::contiguous(lse.data(), 1, h, sq); }
};

struct Grads {
  std::vector<L> dq, dk, dv;
};

// The textbook backward in long double with the exact sech^2.
Grads oracle(const Saturated& s) {
  const std::int64_t sq = s.sq, sk = s.sk, h = s.h, d = s.d;
  Grads g{std::vector<L>(sq * h * d), std::vector<L>(sk * d), std::vector<L>(sk * d)};
  for (std::int64_t hh = 0; hh < h; ++hh)
    for (std::int64_t i = 0; i < sq; ++i) {
      const double* qi = &s.q[(i * h + hh) * d];
      const double* gi = &s.dout[(i * h + hh) * d];
      std::vector<L> u(sk), p(sk), dp(sk);
      L big = -INFINITY, sum = 0;
      for (std::int64_t j = 0; j < sk; ++j) {
        L dot = 0;
        for (std::int64_t c = 0; c < d; ++c) dot += static_cast<L>(qi[c]) * s.k[j * d + c];
        u[j] = dot * static_cast<L>(s.scale) / s.cap;
        p[j] = s.cap * std::tanh(u[j]);
        big = std::max(big, p[j]);
      }
      for (std::int64_t j = 0; j < sk; ++j) sum += std::exp(p[j] - big);
      for (std::int64_t j = 0; j < sk; ++j) p[j] = std::exp(p[j] - big) / sum;
      std::vector<L> o(d, 0);
      for (std::int64_t j = 0; j < sk; ++j)
        for (std::int64_t c = 0; c < d; ++c) o[c] += p[j] * s.v[j * d + c];
      L D = 0;
      for (std::int64_t c = 0; c < d; ++c) D += static_cast<L>(gi[c]) * o[c];
      for (std::int64_t j = 0; j < sk; ++j) {
        L dpj = 0;
        for (std::int64_t c = 0; c < d; ++c) dpj += static_cast<L>(gi[c]) * s.v[j * d + c];
        const L ds = p[j] * (dpj - D) * static_cast<L>(s.scale) * sech2(u[j]);
        for (std::int64_t c = 0; c < d; ++c) {
          g.dq[(i * h + hh) * d + c] += ds * s.k[j * d + c];
          g.dk[j * d + c] += ds * qi[c];
          g.dv[j * d + c] += p[j] * gi[c];
        }
      }
    }
  return g;
}

// max |got - want| / max |want|.
double relative_error(const std::vector<double>& got, const std::vector<L>& want) {
  L diff = 0, big = 0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    diff = std::max(diff, std::abs(got[e] - want[e]));
    big = std::max(big, std::abs(want[e]));
  }
  return static_cast<double>(diff / big);
}

void expect_exact(const Saturated& s, const Grads& want, bool tiled, std::int64_t q_tile, std::int64_t k_tile) {
  std::vector<double> dq(s.q.size()), dk(s.k.size()), dv(s.v.size());
  const TensorView o = TensorView::contiguous(s.out.data(), 1, s.sq, s.h, s.d);
  const TensorView g = TensorView::contiguous(s.dout.data(), 1, s.sq, s.h, s.d);
  const TensorView dqv = TensorView::contiguous(dq.data(), 1, s.sq, s.h, s.d);
  const TensorView dkv = TensorView::contiguous(dk.data(), 1, s.sk, 1, s.d);
  const TensorView dvv = TensorView::contiguous(dv.data(), 1, s.sk, 1, s.d);
  if (tiled) {
    TileOptions t;  // q_tile 0: the default tiles
    if (q_tile > 0) {
      t.q_tile = q_tile;
      t.k_tile = k_tile;
    }
    attention_backward(s.q_view(), s.k_view(), s.v_view(), o, g, s.lse_view(), dqv, dkv, dvv, s.options(), t);
  } else {
    attention_backward_reference(s.q_view(), s.k_view(), s.v_view(), o, g, s.lse_view(), dqv, dkv, dvv, s.options());
  }
  // The scores' derivatives are about 1e-12 of their size unsaturated: a relative bound is the exact one.
  EXPECT_LE(relative_error(dq, want.dq), 1e-12) << "dq, tiles " << q_tile << "x" << k_tile;
  EXPECT_LE(relative_error(dk, want.dk), 1e-12) << "dk, tiles " << q_tile << "x" << k_tile;
  EXPECT_LE(relative_error(dv, want.dv), 1e-12) << "dv, tiles " << q_tile << "x" << k_tile;
}

TEST(SoftcapBackward, SaturatedLogitsKeepTheirDigits) {
  const Saturated s;
  const Grads want = oracle(s);
  expect_exact(s, want, false, 0, 0);
  for (auto [qt, kt] : {std::pair<std::int64_t, std::int64_t>{0, 0}, {1, 1}, {2, 3}, {5, 7}, {3, 4}})
    expect_exact(s, want, true, qt, kt);
}

}  // namespace
}  // namespace attn
