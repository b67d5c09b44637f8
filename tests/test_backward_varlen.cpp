// attention_varlen_backward: packed variable-length batches give, sequence by sequence, the gradients
// the textbook backward gives on each sequence alone (f64, 1e-12), including sequences without
// queries (dk = dv = 0) or without keys (dq = 0); bad arguments are rejected with the argument named
// and every gradient untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "attn/backward.hpp"
#include "attn/varlen.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;
using test::Tensor;

// A packed f64 problem: inputs, the forward's out and lse, and gradients pre-filled with 42.
struct VarlenCase {
  test::CuSeqlens p;
  std::int64_t H, HK, D, TQ, TK;
  Tensor<double> q, k, v, dout, out, dq, dk, dv;
  std::vector<double> lse;
  std::vector<float> slopes;
  AttentionOptions opts;

  VarlenCase(const std::vector<std::pair<int, int>>& lens, std::int64_t h, std::int64_t hk, std::int64_t d)
      : p(lens),
        H(h),
        HK(hk),
        D(d),
        TQ(p.total_q()),
        TK(p.total_k()),
        q(random_tensor<double>(1, TQ, H, D, 11, 2.0)),
        k(random_tensor<double>(1, TK, HK, D, 12, 2.0)),
        v(random_tensor<double>(1, TK, HK, D, 13)),
        dout(random_tensor<double>(1, TQ, H, D, 14)),
        out(1, TQ, H, D),
        dq(1, TQ, H, D),
        dk(1, TK, HK, D),
        dv(1, TK, HK, D),
        lse(static_cast<std::size_t>(H * TQ)) {
    for (std::int64_t x = 0; x < p.batch() * H; ++x) slopes.push_back(0.25f / float(1 + x));
    for (auto* g : {&dq, &dk, &dv}) std::fill(g->data.begin(), g->data.end(), 42.0);
  }
  TensorView lse_view() const { return TensorView::contiguous(lse.data(), 1, H, TQ); }
  void forward() {
    const TensorView l = lse_view();
    attention_varlen(q.packed(), k.packed(), v.packed(), out.packed(), p.varlen(), opts, {}, &l);
  }
  void backward(const TileOptions& tiles = {}) {
    attention_varlen_backward(q.packed(), k.packed(), v.packed(), out.packed(), dout.packed(), lse_view(), dq.packed(),
                              dk.packed(), dv.packed(), p.varlen(), opts, tiles);
  }
};

// Every sequence's gradients against attention_backward_reference on that sequence alone.
void expect_matches_sequences(const VarlenCase& c) {
  for (std::int64_t b = 0; b < c.p.batch(); ++b) {
    const std::int64_t q0 = c.p.cu_q[b], nq = c.p.cu_q[b + 1] - q0, k0 = c.p.cu_k[b], nk = c.p.cu_k[b + 1] - k0;
    Tensor<double> dq(1, nq, c.H, c.D), dk(1, nk, c.HK, c.D), dv(1, nk, c.HK, c.D);
    std::vector<double> lse(static_cast<std::size_t>(c.H * nq));
    for (std::int64_t h = 0; h < c.H; ++h) std::copy_n(c.lse.begin() + h * c.TQ + q0, nq, lse.begin() + h * nq);
    AttentionOptions ob = c.opts;
    if (ob.alibi_slopes) ob.alibi_slopes = F32Array(c.slopes).from(b * c.H);
    if (nq > 0)
      attention_backward_reference(c.q.rows(q0, nq), c.k.rows(k0, nk), c.v.rows(k0, nk), c.out.rows(q0, nq),
                                   c.dout.rows(q0, nq), TensorView::contiguous(lse.data(), 1, c.H, nq), dq.view(),
                                   dk.view(), dv.view(), ob);
    const std::pair<const Tensor<double>*, std::int64_t> want[] = {{&dq, q0}, {&dk, k0}, {&dv, k0}};
    const Tensor<double>* got[] = {&c.dq, &c.dk, &c.dv};
    for (int g = 0; g < 3; ++g) {
      const Tensor<double>& w = *want[g].first;
      const auto first = got[g]->data.begin() + want[g].second * w.h * w.d;
      const std::vector<double> mine(first, first + static_cast<std::ptrdiff_t>(w.data.size()));
      if (nq == 0 || nk == 0)
        for (std::size_t x = 0; x < w.data.size(); ++x)
          ASSERT_EQ(mine[x], w.data[x]) << "sequence " << b << " grad " << g << " element " << x;
      EXPECT_LE(test::relative_error(mine, w.data), test::kF64Tolerance) << "sequence " << b << " grad " << g;
    }
  }
}

const std::vector<std::pair<int, int>> kLens = {{5, 7}, {0, 4}, {9, 9}, {3, 0}, {1, 1}, {13, 6}, {0, 0}, {4, 11}};

TEST(BackwardVarlen, EachSequenceMatchesTheTextbookAlone) {
  for (int variant = 0; variant < 4; ++variant) {
    VarlenCase c(kLens, 4, 2, 5);
    c.opts.causal = variant == 1;
    if (variant == 2) c.opts.window_left = 2, c.opts.window_right = 1;
    if (variant == 3) c.opts.alibi_slopes = c.slopes, c.opts.alibi_batch_stride = c.H, c.opts.softcap = 3;
    c.forward();
    for (auto [bq, bk] : {std::pair<int, int>{1, 1}, {3, 2}, {16, 16}}) {
      SCOPED_TRACE("variant " + std::to_string(variant) + " tiles " + std::to_string(bq) + "x" + std::to_string(bk));
      TileOptions t;
      t.q_tile = bq;
      t.k_tile = bk;
      c.backward(t);
      expect_matches_sequences(c);
    }
  }
}

TEST(BackwardVarlen, ThreadCountDoesNotChangeABit) {
  VarlenCase c(kLens, 4, 1, 8);
  c.opts.causal = true;
  c.forward();
  c.opts.num_threads = 1;
  c.backward();
  const auto one = c.dq.data, one_k = c.dk.data, one_v = c.dv.data;
  c.opts.num_threads = 3;
  c.backward();
  EXPECT_EQ(one, c.dq.data);
  EXPECT_EQ(one_k, c.dk.data);
  EXPECT_EQ(one_v, c.dv.data);
}

// A bad argument throws naming it, and no gradient changes.
void expect_rejected(VarlenCase& c, const std::function<void()>& call, const std::string& arg) {
  const auto dq = c.dq.data, dk = c.dk.data, dv = c.dv.data;
  try {
    call();
    ADD_FAILURE() << "no exception for " << arg;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("attn::attention_varlen_backward: " + arg), std::string::npos) << e.what();
  }
  EXPECT_EQ(dq, c.dq.data);
  EXPECT_EQ(dk, c.dk.data);
  EXPECT_EQ(dv, c.dv.data);
}

TEST(BackwardVarlen, BadArgumentsAreNamedAndNothingIsWritten) {
  VarlenCase c(kLens, 2, 2, 4);
  c.forward();
  const auto call = [&](const TensorView& lse, const TensorView& dq, const std::int32_t* cu_q, std::int64_t batch) {
    return [&c, lse, dq, cu_q, batch] {
      attention_varlen_backward(c.q.packed(), c.k.packed(), c.v.packed(), c.out.packed(), c.dout.packed(), lse, dq,
                                c.dk.packed(), c.dv.packed(), cu_q, c.p.cu_k.data(), batch, c.opts);
    };
  };
  const TensorView lse = c.lse_view(), dq = c.dq.packed();
  expect_rejected(c, call(lse, dq, c.p.cu_q.data(), 0), "batch");
  expect_rejected(c, call(lse, c.dq.view(), c.p.cu_q.data(), c.p.batch()), "dq");
  expect_rejected(c, call(TensorView::contiguous(c.lse.data(), 1, c.H, c.TQ - 1), dq, c.p.cu_q.data(), c.p.batch()),
                  "lse");
  expect_rejected(c, call(lse, dq, nullptr, c.p.batch()), "cu_seqlens_q");
  std::vector<std::int32_t> bad = c.p.cu_q;
  bad[2] = bad[1] - 1;
  expect_rejected(c, call(lse, dq, bad.data(), c.p.batch()), "cu_seqlens_q");
  expect_rejected(c, call(lse, c.q.packed(), c.p.cu_q.data(), c.p.batch()), "dq");  // aliases q
}

}  // namespace
}  // namespace attn
