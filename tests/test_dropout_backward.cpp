// Dropout in the tiled backward (attention_backward, attention_varlen_backward): the gradients equal
// the textbook backward's with the same regenerated mask (f64, 1e-12 of the largest element) for every
// tiling and SIMD target, do not depend on the thread count, sequence b of a varlen batch uses batch
// index b's mask, and f32 stays within 3x the textbook backward's error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "attn/varlen.hpp"
#include "backward/backward_kernel.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;
using test::Tensor;

AttentionOptions dropping(double p, bool causal) {
  AttentionOptions o;
  o.dropout_p = p;
  o.dropout_seed = 0x5eed1234abcdull;
  o.dropout_offset = 77;
  o.causal = causal;
  return o;
}

template <class T>
struct Case {
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  Tensor<T> q, k, v, dout, out;
  std::vector<L> lse;
  AttentionOptions o;
  Case(std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t h, std::int64_t hk, std::int64_t d,
       const AttentionOptions& opts)
      : q(random_tensor<T>(b, sq, h, d, 1, 1.5)),
        k(random_tensor<T>(b, sk, hk, d, 2, 1.5)),
        v(random_tensor<T>(b, sk, hk, d, 3)),
        dout(random_tensor<T>(b, sq, h, d, 4)),
        out(b, sq, h, d),
        lse(static_cast<std::size_t>(b * h * sq)),
        o(opts) {
    attention_reference(q.view(), k.view(), v.view(), out.view(), o, &lse_view_ref());
  }
  TensorView lse_view() const { return TensorView::contiguous(lse.data(), q.b, q.h, q.s); }
  const TensorView& lse_view_ref() {
    view_ = lse_view();
    return view_;
  }
  // {dq, dk, dv} of the tiled backward (or the textbook one).
  std::array<Tensor<T>, 3> grads(bool textbook, const TileOptions& tiles = {}, int threads = 0) const {
    std::array<Tensor<T>, 3> g{Tensor<T>(q.b, q.s, q.h, q.d), Tensor<T>(k.b, k.s, k.h, k.d),
                               Tensor<T>(k.b, k.s, k.h, k.d)};
    AttentionOptions ot = o;
    ot.num_threads = threads;
    if (textbook)
      attention_backward_reference(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_view(), g[0].view(),
                                   g[1].view(), g[2].view(), ot);
    else
      attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_view(), g[0].view(), g[1].view(),
                         g[2].view(), ot, tiles);
    return g;
  }

 private:
  TensorView view_;
};

TEST(DropoutBackward, TiledEqualsTheTextbookForEveryTilingAndTarget) {
  for (bool causal : {false, true}) {
    const Case<double> c(2, 19, 23, 4, 2, 12, dropping(0.3, causal));
    const auto want = c.grads(true);
    test::for_each_simd_target("backward", detail::backward_target, [&](std::int64_t) {
      for (auto [bq, bk] : {std::pair<int, int>{1, 1}, {3, 5}, {8, 4}, {19, 23}, {64, 64}}) {
        TileOptions t;
        t.q_tile = bq;
        t.k_tile = bk;
        const auto got = c.grads(false, t);
        for (int g = 0; g < 3; ++g)
          EXPECT_LE(test::relative_error(got[g].data, want[g].data), test::kF64Tolerance)
              << "grad " << g << " causal " << causal << " tiles " << bq << "x" << bk;
      }
    });
  }
}

TEST(DropoutBackward, BitwiseTheSameForAnyThreadCount) {
  const Case<float> c(1, 70, 90, 4, 1, 32, dropping(0.5, true));
  const auto one = c.grads(false, {}, 1);
  for (int threads : {2, 3}) {
    const auto again = c.grads(false, {}, threads);
    for (int g = 0; g < 3; ++g) EXPECT_EQ(one[g].data, again[g].data) << "grad " << g << " threads " << threads;
  }
}

TEST(DropoutBackward, F32WithinThreeTimesTheTextbookError) {
  const Case<float> c(1, 96, 130, 4, 2, 64, dropping(0.2, false));
  Case<double> oracle(1, 96, 130, 4, 2, 64, dropping(0.2, false));  // the same values: f32 -> f64 exactly
  oracle.q = test::to_f64(c.q);
  oracle.k = test::to_f64(c.k);
  oracle.v = test::to_f64(c.v);
  oracle.dout = test::to_f64(c.dout);
  attention_reference(oracle.q.view(), oracle.k.view(), oracle.v.view(), oracle.out.view(), oracle.o,
                      &oracle.lse_view_ref());
  const auto want = oracle.grads(true);
  const auto got = c.grads(false), textbook = c.grads(true);
  for (int g = 0; g < 3; ++g) {
    const double err = test::max_error(got[g].data, want[g].data),
                 base = test::max_error(textbook[g].data, want[g].data);
    EXPECT_TRUE(test::meets_textbook_rule(err, base, test::kGradientFactor, 1e-6)) << "grad " << g;
  }
}

TEST(DropoutBackward, VarlenSequenceBUsesBatchIndexB) {
  // Sequence b of a packed batch against attention_backward on a batch of b + 1 copies of it, entry b.
  const std::int64_t H = 2, HK = 1, D = 8;
  const std::vector<std::int32_t> cq{0, 6, 6, 19}, ck{0, 9, 13, 24};
  const std::int64_t batch = 3, tq = cq.back(), tk = ck.back();
  const AttentionOptions o = dropping(0.4, true);
  auto q = random_tensor<double>(1, tq, H, D, 1), k = random_tensor<double>(1, tk, HK, D, 2),
       v = random_tensor<double>(1, tk, HK, D, 3), dout = random_tensor<double>(1, tq, H, D, 4);
  Tensor<double> out(1, tq, H, D), dq(1, tq, H, D), dk(1, tk, HK, D), dv(1, tk, HK, D);
  std::vector<double> lse(static_cast<std::size_t>(H * tq));
  const TensorView lv = TensorView::contiguous(lse.data(), 1, H, tq);
  attention_varlen(q.packed(), k.packed(), v.packed(), out.packed(), cq.data(), ck.data(), batch, o, {}, &lv);
  attention_varlen_backward(q.packed(), k.packed(), v.packed(), out.packed(), dout.packed(), lv, dq.packed(),
                            dk.packed(), dv.packed(), cq.data(), ck.data(), batch, o);
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t nq = cq[b + 1] - cq[b], nk = ck[b + 1] - ck[b];
    if (nq == 0 || nk == 0) continue;
    Tensor<double> qb(b + 1, nq, H, D), kb(b + 1, nk, HK, D), vb(b + 1, nk, HK, D), db(b + 1, nq, H, D),
        ob(b + 1, nq, H, D), gq(b + 1, nq, H, D), gk(b + 1, nk, HK, D), gv(b + 1, nk, HK, D);
    for (std::int64_t c = 0; c <= b; ++c) {
      std::copy_n(&q.at(0, cq[b], 0, 0), nq * H * D, &qb.at(c, 0, 0, 0));
      std::copy_n(&dout.at(0, cq[b], 0, 0), nq * H * D, &db.at(c, 0, 0, 0));
      std::copy_n(&k.at(0, ck[b], 0, 0), nk * HK * D, &kb.at(c, 0, 0, 0));
      std::copy_n(&v.at(0, ck[b], 0, 0), nk * HK * D, &vb.at(c, 0, 0, 0));
    }
    std::vector<double> lb(static_cast<std::size_t>((b + 1) * H * nq));
    const TensorView lbv = TensorView::contiguous(lb.data(), b + 1, H, nq);
    attention_tiled(qb.view(), kb.view(), vb.view(), ob.view(), o, {}, &lbv);
    attention_backward(qb.view(), kb.view(), vb.view(), ob.view(), db.view(), lbv, gq.view(), gk.view(), gv.view(), o);
    const std::vector<double> want_q(&gq.at(b, 0, 0, 0), &gq.at(b, 0, 0, 0) + nq * H * D),
        got_q(&dq.at(0, cq[b], 0, 0), &dq.at(0, cq[b], 0, 0) + nq * H * D),
        want_k(&gk.at(b, 0, 0, 0), &gk.at(b, 0, 0, 0) + nk * HK * D),
        got_k(&dk.at(0, ck[b], 0, 0), &dk.at(0, ck[b], 0, 0) + nk * HK * D);
    EXPECT_LE(test::relative_error(got_q, want_q), test::kF64Tolerance) << "sequence " << b;
    EXPECT_LE(test::relative_error(got_k, want_k), test::kF64Tolerance) << "sequence " << b;
  }
}

}  // namespace
}  // namespace attn
