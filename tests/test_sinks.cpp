// Attention sinks (AttentionOptions::sinks): the fold law of online_softmax.hpp, the reference against
// a textbook softmax with the sink as one more logit, and every CPU algorithm -- tiled at any tiles,
// split-K at any split count (the sink counted once), varlen, decode at any split count -- against the
// reference, exact in f64 on every SIMD target, within twice the textbook's error in f32. lse includes
// the sink; a row that sees no key gets out = 0 and lse = its head's sink.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "attn/online_softmax.hpp"
#include "attn/varlen.hpp"
#include "support.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Sinks, FoldingTheSinkIsFoldingAKeyWithAZeroValueRow) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> g(0, 3);
  const std::vector<double> zero(8, 0.0);
  for (int t = 0; t < 200; ++t) {
    PartialState<double> a(8), b(8);
    const int keys = t % 4;  // 0: the neutral state
    for (int k = 0; k < keys; ++k) {
      std::vector<double> v(8);
      for (double& x : v) x = g(rng);
      const double s = g(rng);
      fold(a.view(), &s, 1, v.data(), 0);
    }
    b = a;
    const double sink = t % 7 == 0 ? -kInf : g(rng);
    fold_sink(a.view(), sink);
    fold(b.view(), &sink, 1, zero.data(), 0);
    ASSERT_EQ(a.m, b.m);
    ASSERT_EQ(a.l, b.l);
    ASSERT_EQ(a.o, b.o);
  }
  PartialState<double> s(2);
  fold_sink(s.view(), std::nan(""));
  EXPECT_TRUE(std::isnan(s.m) && std::isnan(s.l));
}

// The textbook with the sink as an extra logit: causal (bottom-right) rows, scale 1/sqrt(d), per head.
std::vector<double> textbook(const test::Tensor<double>& q, const test::Tensor<double>& k,
                             const test::Tensor<double>& v, const std::vector<float>& sinks, std::int64_t left,
                             std::vector<double>& lse) {
  const std::int64_t B = q.b, SQ = q.s, SK = k.s, H = q.h, HK = k.h, D = q.d;
  std::vector<double> out(q.data.size());
  lse.assign(static_cast<std::size_t>(B * H * SQ), 0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < SQ; ++i) {
        const std::int64_t diag = i + SK - SQ;
        std::vector<double> s;
        std::vector<std::int64_t> js;
        for (std::int64_t j = 0; j < SK; ++j) {
          if (j > diag || (left >= 0 && j < diag - left)) continue;
          double x = 0;
          for (std::int64_t c = 0; c < D; ++c)
            x += q.data[static_cast<std::size_t>(((b * SQ + i) * H + h) * D + c)] *
                 k.data[static_cast<std::size_t>(((b * SK + j) * HK + h / (H / HK)) * D + c)];
          s.push_back(x / std::sqrt(double(D)));
          js.push_back(j);
        }
        s.push_back(sinks[static_cast<std::size_t>(h)]);
        double m = -kInf, sum = 0;
        for (double x : s) m = std::max(m, x);
        if (m == -kInf) {  // no key and no sink: out 0, lse -inf
          lse[static_cast<std::size_t>((b * H + h) * SQ + i)] = -kInf;
          continue;
        }
        for (double x : s) sum += std::exp(x - m);
        lse[static_cast<std::size_t>((b * H + h) * SQ + i)] = m + std::log(sum);
        for (std::size_t n = 0; n < js.size(); ++n)
          for (std::int64_t c = 0; c < D; ++c)
            out[static_cast<std::size_t>(((b * SQ + i) * H + h) * D + c)] +=
                std::exp(s[n] - m) / sum *
                v.data[static_cast<std::size_t>(((b * SK + js[n]) * HK + h / (H / HK)) * D + c)];
      }
  return out;
}

struct Case {
  std::int64_t B = 2, SQ = 37, SK = 53, H = 4, HK = 2, D = 24, left = -1;
};

// Sinks around the rows' own logits (some far above, one -inf = no sink for that head).
std::vector<float> sinks_for(std::int64_t H) {
  std::vector<float> s;
  for (std::int64_t h = 0; h < H; ++h) s.push_back(h == 1 ? -INFINITY : 0.7f * float(h) - 0.5f + (h == 3 ? 6.f : 0.f));
  return s;
}

TEST(Sinks, TheReferenceIsTheTextbookWithTheSinkAsALogit) {
  for (const Case c : {Case{}, Case{1, 40, 9, 4, 4, 16, 2}}) {  // the second: rows that see no key
    const auto in = test::random_qkv<double>(c.B, c.SQ, c.SK, c.H, c.HK, c.D, 1);
    const test::Tensor<double>&q = in.q, &k = in.k, &v = in.v;
    const std::vector<float> sinks = sinks_for(c.H);
    std::vector<double> want_lse;
    const std::vector<double> want = textbook(q, k, v, sinks, c.left, want_lse);
    AttentionOptions o;
    o.causal = true;
    o.window_left = c.left;
    o.sinks = sinks;
    std::vector<double> out(q.data.size()), lse(want_lse.size());
    TensorView lv = TensorView::contiguous(lse.data(), c.B, c.H, c.SQ);
    attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), c.B, c.SQ, c.H, c.D), o, &lv);
    EXPECT_LE(test::max_error(out, want), test::kF64Tolerance);
    EXPECT_LE(test::max_error(lse, want_lse), test::kF64Tolerance);
    if (c.left >= 0)  // row 0 of head 0 sees no key: out 0, lse = the sink
      EXPECT_EQ(lse[0], double(sinks[0]));
  }
}

// f64: every CPU algorithm against the reference, to 1e-12, on every SIMD target.
TEST(Sinks, EveryAlgorithmIsExactInF64) {
  const Case c{2, 37, 53, 4, 2, 24, 5};
  const auto in = test::random_qkv<double>(c.B, c.SQ, c.SK, c.H, c.HK, c.D, 4);
  const test::Tensor<double>&q = in.q, &k = in.k, &v = in.v;
  const std::vector<float> sinks = sinks_for(c.H);
  AttentionOptions o;
  o.causal = true;
  o.window_left = c.left;
  o.sinks = sinks;
  const std::size_t nl = static_cast<std::size_t>(c.B * c.H * c.SQ);
  std::vector<double> want(q.data.size()), want_lse(nl);
  TensorView wl = TensorView::contiguous(want_lse.data(), c.B, c.H, c.SQ);
  attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(want.data(), c.B, c.SQ, c.H, c.D), o, &wl);
  auto expect_exact = [&](const std::vector<double>& out, const std::vector<double>& lse, const char* what) {
    EXPECT_LE(test::max_error(out, want), test::kF64Tolerance) << what;
    EXPECT_LE(test::max_error(lse, want_lse), test::kF64Tolerance) << what;
  };
  test::for_each_simd_target("tiled", detail::tiled_target, [&](std::int64_t) {
    for (std::int64_t qt : {1, 7, 64})
      for (std::int64_t kt : {1, 5, 64}) {
        std::vector<double> out(q.data.size()), lse(nl);
        TensorView lv = TensorView::contiguous(lse.data(), c.B, c.H, c.SQ);
        attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), c.B, c.SQ, c.H, c.D), o,
                        {qt, kt}, &lv);
        expect_exact(out, lse, "tiled");
      }
  });
  for (std::int64_t splits : {1, 3, 7, 80}) {
    std::vector<double> out(q.data.size()), lse(nl);
    TensorView lv = TensorView::contiguous(lse.data(), c.B, c.H, c.SQ);
    attention_splitk(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), c.B, c.SQ, c.H, c.D), o, {splits},
                     &lv);
    expect_exact(out, lse, "splitk");
  }
}

TEST(Sinks, VarlenAndDecodeFoldTheSinkOnce) {
  const std::int64_t H = 4, HK = 2, D = 16, SQ = 3, SK = 45;
  const std::vector<float> sinks = sinks_for(H);
  AttentionOptions o;
  o.causal = true;
  o.sinks = sinks;
  // Two sequences of one batch: varlen over them packed equals the reference on each alone.
  const auto in = test::random_qkv<double>(2, SQ, SK, H, HK, D, 7);
  const test::Tensor<double>&q = in.q, &k = in.k, &v = in.v;
  std::vector<double> want(q.data.size()), want_lse(static_cast<std::size_t>(2 * H * SQ));
  TensorView wl = TensorView::contiguous(want_lse.data(), 2, H, SQ);
  attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(want.data(), 2, SQ, H, D), o, &wl);
  const std::vector<std::int32_t> cu_q{0, SQ, 2 * SQ}, cu_k{0, SK, 2 * SK};
  std::vector<double> out(q.data.size()), lse(static_cast<std::size_t>(H * 2 * SQ));
  TensorView lv = TensorView::contiguous(lse.data(), 1, H, 2 * SQ);
  attention_varlen(TensorView::contiguous(q.data.data(), 2 * SQ, H, D),
                   TensorView::contiguous(k.data.data(), 2 * SK, HK, D),
                   TensorView::contiguous(v.data.data(), 2 * SK, HK, D),
                   TensorView::contiguous(out.data(), 2 * SQ, H, D), cu_q.data(), cu_k.data(), 2, o, {}, &lv);
  EXPECT_LE(test::max_error(out, want), test::kF64Tolerance);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < SQ; ++i)
        EXPECT_NEAR(lse[static_cast<std::size_t>(h * 2 * SQ + b * SQ + i)],
                    want_lse[static_cast<std::size_t>((b * H + h) * SQ + i)], test::kF64Tolerance);
  // Decode over the same keys as a cache, at several split counts.
  const std::vector<std::int32_t> seqlens{SK, SK};
  KVCache cache;
  cache.k = k.view();
  cache.v = v.view();
  cache.seqlens = seqlens.data();
  test::for_each_simd_target("decode", test::decode_dispatched, [&](std::int64_t) {
    for (std::int64_t splits : {1, 4, 50}) {
      std::vector<double> dout(q.data.size()), dlse(want_lse.size());
      TensorView dl = TensorView::contiguous(dlse.data(), 2, H, SQ);
      DecodeOptions dec;
      dec.num_splits = splits;
      attention_decode(q.view(), cache, TensorView::contiguous(dout.data(), 2, SQ, H, D), o, dec, &dl);
      EXPECT_LE(test::max_error(dout, want), test::kF64Tolerance) << splits << " splits";
      EXPECT_LE(test::max_error(dlse, want_lse), test::kF64Tolerance) << splits << " splits";
    }
  });
}

TEST(Sinks, F32IsWithinTwiceTheTextbookError) {
  const Case c{1, 130, 200, 4, 1, 64, -1};
  const auto in = test::random_qkv<float>(c.B, c.SQ, c.SK, c.H, c.HK, c.D, 10);
  AttentionOptions o;
  o.causal = true;
  const std::vector<float> sinks = sinks_for(c.H);
  o.sinks = sinks;
  const std::vector<double> oracle = test::oracle_forward(in, o);
  const double base = test::max_error(test::textbook_forward(in, o), oracle);
  test::for_each_simd_target("tiled", detail::tiled_target, [&](std::int64_t) {
    std::vector<float> got(in.q.data.size());
    attention_tiled(in.q.view(), in.k.view(), in.v.view(), TensorView::contiguous(got.data(), c.B, c.SQ, c.H, c.D), o);
    EXPECT_TRUE(test::meets_textbook_rule(test::max_error(got, oracle), base, test::kForwardFactor,
                                          test::textbook_floor<float>()));
  });
}

}  // namespace
}  // namespace attn
