// The backward with attention sinks: dsink is the derivative of the loss (central differences of the f64
// reference forward, with and without dropout), dq/dk/dv through the sink-including lse likewise; the
// SIMD backward and the varlen backward agree with the textbook backward to 1e-12 in f64, bitwise for any
// thread count; a bad dsink is rejected with nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "backward/backward_kernel.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;

struct Problem {
  std::int64_t B = 2, SQ = 23, SK = 31, H = 4, HK = 2, D = 16;
  test::Tensor<double> q, k, v, dout;
  std::vector<float> sinks{0.5f, -INFINITY, 2.0f, -1.25f};  // multiples of 2^-10: sink +- 2^-10 is exact
  AttentionOptions o;
  Problem()
      : q(random_tensor<double>(B, SQ, H, D, 1, 1.5)),
        k(random_tensor<double>(B, SK, HK, D, 2, 1.5)),
        v(random_tensor<double>(B, SK, HK, D, 3)),
        dout(random_tensor<double>(B, SQ, H, D, 4)) {
    o.causal = true;
    o.window_left = 6;
    o.sinks = sinks;
  }
  // The loss sum(dout * out) of the reference forward, its out and lse.
  double loss(const AttentionOptions& opts, std::vector<double>* out = nullptr,
              std::vector<double>* lse = nullptr) const {
    std::vector<double> o_(q.data.size()), l_(static_cast<std::size_t>(B * H * SQ));
    TensorView lv = TensorView::contiguous(l_.data(), B, H, SQ);
    attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(o_.data(), B, SQ, H, D), opts, &lv);
    double s = 0;
    for (std::size_t i = 0; i < o_.size(); ++i) s += o_[i] * dout.data[i];
    if (out) *out = o_;
    if (lse) *lse = l_;
    return s;
  }
};

struct Grads {
  std::vector<double> dq, dk, dv, dsink;
  explicit Grads(const Problem& p)
      : dq(p.q.data.size()), dk(p.k.data.size()), dv(p.v.data.size()), dsink(static_cast<std::size_t>(p.H), 42.0) {}
};

// Runs a backward `f` (reference or tiled) on the problem's forward and returns every gradient.
template <class F>
Grads backward(const Problem& p, const AttentionOptions& opts, F&& f) {
  std::vector<double> out, lse;
  p.loss(opts, &out, &lse);
  Grads g(p);
  TensorView ds = TensorView::contiguous(g.dsink.data(), 1, p.H, 1);
  f(TensorView::contiguous(out.data(), p.B, p.SQ, p.H, p.D), TensorView::contiguous(lse.data(), p.B, p.H, p.SQ),
    TensorView::contiguous(g.dq.data(), p.B, p.SQ, p.H, p.D), TensorView::contiguous(g.dk.data(), p.B, p.SK, p.HK, p.D),
    TensorView::contiguous(g.dv.data(), p.B, p.SK, p.HK, p.D), ds);
  return g;
}

Grads reference_grads(const Problem& p, const AttentionOptions& opts) {
  return backward(p, opts, [&](auto out, auto lse, auto dq, auto dk, auto dv, auto ds) {
    attention_backward_reference(p.q.view(), p.k.view(), p.v.view(), out, p.dout.view(), lse, dq, dk, dv, opts, &ds);
  });
}

TEST(SinksBackward, DsinkIsTheDerivativeOfTheLoss) {
  Problem p;
  AttentionOptions with_dropout = p.o;
  with_dropout.dropout_p = 0.3;
  with_dropout.dropout_seed = 5;
  for (const AttentionOptions& base : {p.o, with_dropout}) {
    const Grads g = reference_grads(p, base);
    EXPECT_EQ(g.dsink[1], 0.0) << "a head without a sink";
    for (std::int64_t h : {0, 2, 3}) {
      const float eps = 1.0f / 1024;
      std::vector<float> up = p.sinks, down = p.sinks;
      up[static_cast<std::size_t>(h)] += eps;
      down[static_cast<std::size_t>(h)] -= eps;
      AttentionOptions ou = base, od = base;
      ou.sinks = up;
      od.sinks = down;
      const double fd = (p.loss(ou) - p.loss(od)) / (2.0 * eps);
      EXPECT_NEAR(g.dsink[static_cast<std::size_t>(h)], fd, 1e-6 * std::max(1.0, std::abs(fd))) << "head " << h;
    }
  }
}

TEST(SinksBackward, DqDkDvAreTheDerivativesOfTheLoss) {
  Problem p;
  const Grads g = reference_grads(p, p.o);
  auto central = [&](test::Tensor<double>& t, std::size_t e) {
    const double x = t.data[e], eps = 1e-6;
    t.data[e] = x + eps;
    const double up = p.loss(p.o);
    t.data[e] = x - eps;
    const double down = p.loss(p.o);
    t.data[e] = x;
    return (up - down) / (2 * eps);
  };
  for (std::size_t e : {std::size_t{5}, std::size_t{333}, p.q.data.size() - 7})
    EXPECT_NEAR(g.dq[e], central(p.q, e), 1e-7) << "dq[" << e << "]";
  for (std::size_t e : {std::size_t{9}, p.k.data.size() / 2, p.k.data.size() - 3}) {
    EXPECT_NEAR(g.dk[e], central(p.k, e), 1e-7) << "dk[" << e << "]";
    EXPECT_NEAR(g.dv[e], central(p.v, e), 1e-7) << "dv[" << e << "]";
  }
}

// Gradients are compared relative to the reference's largest element, or absolutely where that is below 1.
constexpr double kScaleFloor = 1.0;

TEST(SinksBackward, TheSimdBackwardIsExactAndBitwiseForAnyThreadCount) {
  Problem p;
  const Grads want = reference_grads(p, p.o);
  test::for_each_simd_target("backward", detail::backward_target, [&](std::int64_t) {
    std::vector<Grads> runs;
    for (int threads : {1, 2, 3}) {
      AttentionOptions o = p.o;
      o.num_threads = threads;
      runs.push_back(backward(p, o, [&](auto out, auto lse, auto dq, auto dk, auto dv, auto ds) {
        attention_backward(p.q.view(), p.k.view(), p.v.view(), out, p.dout.view(), lse, dq, dk, dv, o, {7, 5}, &ds);
      }));
    }
    const Grads& g = runs[0];
    EXPECT_LE(test::relative_error(g.dq, want.dq, kScaleFloor), test::kF64Tolerance);
    EXPECT_LE(test::relative_error(g.dk, want.dk, kScaleFloor), test::kF64Tolerance);
    EXPECT_LE(test::relative_error(g.dv, want.dv, kScaleFloor), test::kF64Tolerance);
    EXPECT_LE(test::relative_error(g.dsink, want.dsink, kScaleFloor), test::kF64Tolerance);
    for (const Grads& r : runs) {
      EXPECT_EQ(std::memcmp(r.dsink.data(), g.dsink.data(), g.dsink.size() * sizeof(double)), 0);
      EXPECT_EQ(std::memcmp(r.dq.data(), g.dq.data(), g.dq.size() * sizeof(double)), 0);
    }
  });
}

TEST(SinksBackward, VarlenSumsDsinkOverTheSequences) {
  Problem p;  // its two batch rows as two sequences of one packed batch
  const Grads want = reference_grads(p, p.o);
  std::vector<double> out, lse;
  p.loss(p.o, &out, &lse);
  const std::int64_t TQ = p.B * p.SQ, TK = p.B * p.SK;
  // lse [1, heads, total_q] from the batched [batch, heads, seqlen_q].
  std::vector<double> packed_lse(static_cast<std::size_t>(p.H * TQ));
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.H; ++h)
      for (std::int64_t i = 0; i < p.SQ; ++i)
        packed_lse[static_cast<std::size_t>(h * TQ + b * p.SQ + i)] =
            lse[static_cast<std::size_t>((b * p.H + h) * p.SQ + i)];
  const std::vector<std::int32_t> cu_q{0, std::int32_t(p.SQ), std::int32_t(TQ)},
      cu_k{0, std::int32_t(p.SK), std::int32_t(TK)};
  Grads g(p);
  TensorView ds = TensorView::contiguous(g.dsink.data(), 1, p.H, 1);
  attention_varlen_backward(
      p.q.packed(), p.k.packed(), p.v.packed(), TensorView::contiguous(out.data(), TQ, p.H, p.D), p.dout.packed(),
      TensorView::contiguous(packed_lse.data(), 1, p.H, TQ), TensorView::contiguous(g.dq.data(), TQ, p.H, p.D),
      TensorView::contiguous(g.dk.data(), TK, p.HK, p.D), TensorView::contiguous(g.dv.data(), TK, p.HK, p.D),
      cu_q.data(), cu_k.data(), p.B, p.o, {}, &ds);
  EXPECT_LE(test::relative_error(g.dsink, want.dsink, kScaleFloor), test::kF64Tolerance);
  EXPECT_LE(test::relative_error(g.dq, want.dq, kScaleFloor), test::kF64Tolerance);
  EXPECT_LE(test::relative_error(g.dk, want.dk, kScaleFloor), test::kF64Tolerance);
}

TEST(SinksBackward, BadDsinkIsRejectedAndNothingIsWritten) {
  Problem p;
  std::vector<double> out, lse;
  p.loss(p.o, &out, &lse);
  std::vector<double> dq(p.q.data.size(), -3), dk(p.k.data.size(), -3), dv(p.v.data.size(), -3), dsink(4, -3);
  std::vector<float> dsink32(4, -3);
  AttentionOptions no_sinks = p.o;
  no_sinks.sinks = nullptr;
  struct Bad {
    std::string rule;
    TensorView dsink;
    const AttentionOptions* opts;
  };
  const std::vector<Bad> cases = {
      {"dsink: needs sinks", TensorView::contiguous(dsink.data(), 1, p.H, 1), &no_sinks},
      {"dsink: must be [1, heads = 4, 1]", TensorView::contiguous(dsink.data(), 1, 2, 2), &p.o},
      {"dsink: dtype must match lse's (f64)", TensorView::contiguous(dsink32.data(), 1, p.H, 1), &p.o},
      {"dsink: overlaps dq", TensorView::contiguous(dq.data() + 3, 1, p.H, 1), &p.o},
      {"dsink: overlaps input out", TensorView::contiguous(out.data(), 1, p.H, 1), &p.o},
  };
  for (const Bad& bad : cases) {
    try {
      attention_backward(p.q.view(), p.k.view(), p.v.view(), TensorView::contiguous(out.data(), p.B, p.SQ, p.H, p.D),
                         p.dout.view(), TensorView::contiguous(lse.data(), p.B, p.H, p.SQ),
                         TensorView::contiguous(dq.data(), p.B, p.SQ, p.H, p.D),
                         TensorView::contiguous(dk.data(), p.B, p.SK, p.HK, p.D),
                         TensorView::contiguous(dv.data(), p.B, p.SK, p.HK, p.D), *bad.opts, {}, &bad.dsink);
      ADD_FAILURE() << "accepted: " << bad.rule;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad.rule), std::string::npos) << e.what();
    }
    for (const auto* g : {&dq, &dk, &dv, &dsink}) ASSERT_EQ(*std::min_element(g->begin(), g->end()), -3) << bad.rule;
    for (const auto* g : {&dq, &dk, &dv, &dsink}) ASSERT_EQ(*std::max_element(g->begin(), g->end()), -3) << bad.rule;
  }
}

}  // namespace
}  // namespace attn
