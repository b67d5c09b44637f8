// Dropout (docs/dropout.md): the Philox generator against Random123's known answers, the mask's
// statistics and its documented element mapping, the forward against a textbook attention built in
// this file from the returned mask, the tiled and varlen forwards against the reference for every tile
// size and thread count, the reference backward against finite differences, and the validation rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "attn/backward.hpp"
#include "attn/decode.hpp"
#include "attn/dropout.hpp"
#include "attn/varlen.hpp"
#include "core/philox.hpp"
#include "support.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

using test::max_error;
using test::random_tensor;
using test::Shape;
using test::Tensor;

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

AttentionOptions with_dropout(AttentionOptions o, double p, std::uint64_t seed = 1234, std::uint64_t offset = 5) {
  o.dropout_p = p;
  o.dropout_seed = seed;
  o.dropout_offset = offset;
  return o;
}

// The mask attn::dropout_mask writes for a problem of shape s, as [b][h][i][j].
std::vector<double> mask_of(const Shape& s, const AttentionOptions& o) {
  std::vector<double> m(static_cast<std::size_t>(s.b * s.h * s.sq * s.sk));
  dropout_mask(TensorView::contiguous(m.data(), s.b, s.h, s.sq, s.sk), o);
  return m;
}

// ---- The generator ----

TEST(Philox, Random123KnownAnswers) {
  // Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter[4] key[2] -> output[4].
  struct Kat {
    std::uint32_t c[4], k[2], want[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& t : kats) {
    const detail::PhiloxWords r = detail::philox4x32_10(t.c[0], t.c[1], t.c[2], t.c[3], t.k[0], t.k[1]);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(r.w[w], t.want[w]) << "word " << w << " of counter " << std::hex << t.c[0];
  }
}

TEST(DropoutMask, IsTheDocumentedElementMapping) {
  // mask[b, h, i, j] kept iff word j % 4 of Philox(counter {j/4, i, b*heads + h, offset}, key seed) is
  // below floor((1 - p) 2^32): the mapping docs/dropout.md and core/dropout.hpp document.
  const Shape s{3, 5, 11, 4, 4, 1, false};
  const double p = 0.375;
  const std::uint64_t seed = 0x0123456789abcdefull, offset = 77;
  const std::vector<double> m = mask_of(s, with_dropout({}, p, seed, offset));
  const auto threshold = static_cast<std::uint32_t>(std::floor((1 - p) * 4294967296.0));
  std::size_t e = 0;
  for (std::uint32_t b = 0; b < 3; ++b)
    for (std::uint32_t h = 0; h < 4; ++h)
      for (std::uint32_t i = 0; i < 5; ++i)
        for (std::uint32_t j = 0; j < 11; ++j, ++e) {
          const auto r = detail::philox4x32_10(j / 4, i, b * 4 + h, offset, static_cast<std::uint32_t>(seed),
                                               static_cast<std::uint32_t>(seed >> 32));
          ASSERT_EQ(m[e], r.w[j % 4] < threshold ? 1 / (1 - p) : 0.0) << b << " " << h << " " << i << " " << j;
        }
}

TEST(DropoutMask, KeepFractionIsOneMinusPWithinStatisticalBounds) {
  const Shape s{2, 64, 1000, 3, 3, 1, false};
  for (double p : {0.1, 0.5, 0.9}) {
    std::vector<float> m(static_cast<std::size_t>(s.b * s.h * s.sq * s.sk));
    dropout_mask(TensorView::contiguous(m.data(), s.b, s.h, s.sq, s.sk), with_dropout({}, p, 99, 0));
    // Per lane j % 4 too: each Philox word must be fair on its own.
    double kept[4] = {0, 0, 0, 0};
    for (std::size_t e = 0; e < m.size(); ++e) {
      ASSERT_TRUE(m[e] == 0.0f || m[e] == static_cast<float>(1 / (1 - p))) << m[e];
      kept[e % 4] += m[e] != 0.0f;
    }
    const double n = static_cast<double>(m.size()) / 4, sd = std::sqrt(p * (1 - p) / n);
    for (int lane = 0; lane < 4; ++lane)  // 6 standard deviations: a false alarm about once in 10^9 runs
      EXPECT_NEAR(kept[lane] / n, 1 - p, 6 * sd) << "p " << p << " lane " << lane;
    // Another offset or seed: an independent mask, so the two agree on p^2 + (1 - p)^2 of the elements.
    for (auto [seed, offset] : {std::pair<std::uint64_t, std::uint64_t>{99, 1}, {100, 0}}) {
      std::vector<float> m2(m.size());
      dropout_mask(TensorView::contiguous(m2.data(), s.b, s.h, s.sq, s.sk), with_dropout({}, p, seed, offset));
      double same = 0;
      for (std::size_t e = 0; e < m.size(); ++e) same += m[e] == m2[e];
      const double agree = p * p + (1 - p) * (1 - p), N = static_cast<double>(m.size());
      EXPECT_NEAR(same / N, agree, 6 * std::sqrt(agree * (1 - agree) / N)) << "p " << p << " seed " << seed;
    }
  }
}

// ---- The forward ----

// A problem in f64 with its options (the Shape's masks and ALiBi, plus dropout).
struct Case {
  Shape s;
  Tensor<double> q, k, v;
  std::vector<float> slopes;
  AttentionOptions opts;
  Case(const Shape& shape, double p, std::uint64_t seed)
      : s(shape),
        q(random_tensor<double>(s.b, s.sq, s.h, s.d, seed, 2.0)),
        k(random_tensor<double>(s.b, s.sk, s.hk, s.d, seed + 1, 2.0)),
        v(random_tensor<double>(s.b, s.sk, s.hk, s.d, seed + 2)) {
    opts = with_dropout(test::options_of(s, 0.3f, slopes), p, seed * 7 + 3, seed % 5);
  }
  std::vector<double> run(const std::function<void(const TensorView&, const TensorView&)>& f,
                          std::vector<double>* lse = nullptr) const {
    std::vector<double> out(q.data.size()), l(static_cast<std::size_t>(s.b * s.h * s.sq));
    f(TensorView::contiguous(out.data(), s.b, s.sq, s.h, s.d), TensorView::contiguous(l.data(), s.b, s.h, s.sq));
    if (lse) *lse = l;
    return out;
  }
  std::vector<double> reference(std::vector<double>* lse = nullptr, const AttentionOptions* o = nullptr) const {
    return run([&](const TensorView& out,
                   const TensorView& l) { attention_reference(q.view(), k.view(), v.view(), out, o ? *o : opts, &l); },
               lse);
  }
  std::vector<double> tiled(std::int64_t br, std::int64_t bc, int threads = 0) const {
    TileOptions t;
    t.q_tile = br;
    t.k_tile = bc;
    AttentionOptions o = opts;
    o.num_threads = threads;
    return run([&](const TensorView& out, const TensorView& l) {
      attention_tiled(q.view(), k.view(), v.view(), out, o, t, &l);
    });
  }
};

// The textbook attention written here, trusting nothing of the library but the mask: softmax over the
// visible keys (bottom-right aligned masks, scale 1/sqrt(d), no softcap or ALiBi), then the kept
// weights times 1 / (1 - p) (the mask's values) times v.
std::vector<double> textbook(const Case& c, const std::vector<double>& mask) {
  const Shape& s = c.s;
  std::vector<double> out(c.q.data.size());
  auto at = [](const Tensor<double>& t, std::int64_t b, std::int64_t n, std::int64_t h, std::int64_t x) {
    return t.data[static_cast<std::size_t>(((b * t.s + n) * t.h + h) * t.d + x)];
  };
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t i = 0; i < s.sq; ++i) {
        const std::int64_t hk = h / (s.h / s.hk), diag = i + s.sk - s.sq;
        std::vector<double> w(static_cast<std::size_t>(s.sk), 0.0);
        double mx = -INFINITY, sum = 0;
        auto visible = [&](std::int64_t j) {
          const std::int64_t right = s.causal ? 0 : s.right;
          return (s.left < 0 || j >= diag - s.left) && (right < 0 || j <= diag + right);
        };
        for (std::int64_t j = 0; j < s.sk; ++j) {
          if (!visible(j)) continue;
          double x = 0;
          for (std::int64_t e = 0; e < s.d; ++e) x += at(c.q, b, i, h, e) * at(c.k, b, j, hk, e);
          w[j] = x / std::sqrt(static_cast<double>(s.d));
          mx = std::max(mx, w[j]);
        }
        for (std::int64_t j = 0; j < s.sk; ++j) sum += visible(j) ? (w[j] = std::exp(w[j] - mx)) : 0;
        for (std::int64_t j = 0; j < s.sk; ++j) {
          if (!visible(j)) continue;
          const double z = mask[static_cast<std::size_t>(((b * s.h + h) * s.sq + i) * s.sk + j)];
          for (std::int64_t e = 0; e < s.d; ++e)
            out[static_cast<std::size_t>(((b * s.sq + i) * s.h + h) * s.d + e)] +=
                w[j] / sum * z * at(c.v, b, j, hk, e);
        }
      }
  return out;
}

TEST(DropoutForward, ReferenceIsTheTextbookWithTheReturnedMask) {
  for (const Shape& s :
       {Shape{2, 9, 13, 4, 2, 8, false}, Shape{1, 13, 9, 2, 1, 5, true}, Shape{2, 7, 7, 2, 2, 3, false, 2, 1}}) {
    for (double p : {0.2, 0.75}) {
      const Case c(s, p, 11);
      std::vector<double> lse, lse_undropped;
      const std::vector<double> got = c.reference(&lse);
      EXPECT_LE(max_error(got, textbook(c, mask_of(s, c.opts))), 1e-13) << "p " << p << " sq " << s.sq;
      // lse is the undropped softmax's: the same as without dropout.
      AttentionOptions off = c.opts;
      off.dropout_p = 0;
      const std::vector<double> plain = c.reference(&lse_undropped, &off);
      EXPECT_TRUE(same_bytes(lse, lse_undropped));
      EXPECT_TRUE(test::differ_by_more_than(got, plain, 1e-3)) << "dropout changed nothing";
    }
  }
}

TEST(DropoutForward, PZeroIsBitwiseNoDropout) {
  const Case c(Shape{2, 19, 23, 4, 2, 16, true}, 0.0, 5);
  AttentionOptions none = c.opts;
  none.dropout_seed = none.dropout_offset = 0;
  std::vector<double> lse_a, lse_b;
  EXPECT_TRUE(same_bytes(c.reference(&lse_a), c.reference(&lse_b, &none)));
  EXPECT_TRUE(same_bytes(lse_a, lse_b));
  const std::vector<double> tiled_seeded = c.tiled(4, 5);
  Case plain = c;
  plain.opts = none;
  EXPECT_TRUE(same_bytes(tiled_seeded, plain.tiled(4, 5)));
}

TEST(DropoutForward, TiledEqualsReferenceForEveryTileSize) {
  const Shape shapes[] = {Shape{2, 13, 17, 4, 2, 5, false}, Shape{1, 17, 11, 4, 1, 3, true},
                          Shape{2, 11, 19, 2, 2, 6, false, 4, 2}, Shape{1, 9, 9, 3, 3, 7, false, -1, 0, 2.5, true}};
  for (const Shape& s : shapes) {
    const Case c(s, 0.3, 21);
    const std::vector<double> want = c.reference();
    test::for_each_simd_target("tiled", detail::tiled_target, [&](std::int64_t) {
      for (std::int64_t br = 1; br <= s.sq; br += (br < 4 ? 1 : 4))
        for (std::int64_t bc = 1; bc <= s.sk + 1; ++bc)
          ASSERT_LE(max_error(c.tiled(br, bc), want), test::kF64Tolerance)
              << "sq " << s.sq << " tiles " << br << "x" << bc;
      ASSERT_LE(max_error(c.tiled(s.sq, s.sk), want), test::kF64Tolerance);
    });
  }
}

TEST(DropoutForward, TiledIsBitwiseTheSameForAnyThreadCount) {
  const Case c(Shape{2, 100, 130, 4, 2, 32, true}, 0.4, 3);
  const std::vector<double> one = c.tiled(16, 32, 1);
  for (int threads : {2, 3}) EXPECT_TRUE(same_bytes(one, c.tiled(16, 32, threads))) << threads << " threads";
}

TEST(DropoutForward, VarlenSequenceBIsBatchIndexB) {
  // Sequence b of a varlen batch draws the mask of batch index b: it equals the same sequence run by
  // attention_tiled at batch index b of a batch of b + 1 (the other entries: copies, ignored).
  const std::int64_t H = 4, HK = 2, D = 8;
  const std::vector<std::int32_t> cq{0, 5, 5, 17, 24}, ck{0, 9, 12, 12 + 17, 29 + 3};
  const std::int64_t batch = 4, tq = cq.back(), tk = ck.back();
  auto q = random_tensor<double>(1, tq, H, D, 1), k = random_tensor<double>(1, tk, HK, D, 2),
       v = random_tensor<double>(1, tk, HK, D, 3);
  AttentionOptions o = with_dropout({}, 0.5, 42, 9);
  o.causal = true;
  std::vector<double> out(q.data.size());
  attention_varlen(q.packed(), k.packed(), v.packed(), TensorView::contiguous(out.data(), tq, H, D), cq.data(),
                   ck.data(), batch, o);
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t nq = cq[b + 1] - cq[b], nk = ck[b + 1] - ck[b];
    if (nq == 0) continue;
    Tensor<double> qb(b + 1, nq, H, D), kb(b + 1, nk, HK, D), vb(b + 1, nk, HK, D), ob(b + 1, nq, H, D);
    for (std::int64_t c = 0; c <= b; ++c) {  // every entry a copy of sequence b
      std::copy_n(&q.at(0, cq[b], 0, 0), nq * H * D, &qb.at(c, 0, 0, 0));
      if (nk > 0) std::copy_n(&k.at(0, ck[b], 0, 0), nk * HK * D, &kb.at(c, 0, 0, 0));
      if (nk > 0) std::copy_n(&v.at(0, ck[b], 0, 0), nk * HK * D, &vb.at(c, 0, 0, 0));
    }
    attention_tiled(qb.view(), kb.view(), vb.view(), ob.view(), o);
    const std::vector<double> want(&ob.at(b, 0, 0, 0), &ob.at(b, 0, 0, 0) + nq * H * D);
    const std::vector<double> got(&out[static_cast<std::size_t>(cq[b] * H * D)],
                                  &out[static_cast<std::size_t>(cq[b] * H * D)] + nq * H * D);
    EXPECT_TRUE(same_bytes(got, want)) << "sequence " << b << ": " << max_error(got, want);
    if (b > 0) {  // and not batch index 0's mask (a sequence with keys)
      const std::vector<double> first(&ob.at(0, 0, 0, 0), &ob.at(0, 0, 0, 0) + nq * H * D);
      if (nk > 0) EXPECT_TRUE(test::differ_by_more_than(got, first, 1e-6)) << "sequence " << b;
    }
  }
}

// The accuracy rule (common/accuracy.hpp) for the tiled kernel with dropout, on every SIMD target, with
// `slack` as the floor. The vector kernel's: bf16 on AMX tiles rounds P and is held to the bf16 math
// reference instead (test_amx_forward.cpp).
template <class T>
void check_precision(double slack) {
  const test::ScopedAmxEnv vector_kernel{std::string("off")};
  const std::int64_t B = 1, SQ = 130, SK = 257, H = 4, HK = 2, D = 64;
  const auto p = test::random_qkv<T>(B, SQ, SK, H, HK, D, 31);
  for (bool causal : {false, true}) {
    AttentionOptions o = with_dropout({}, 0.25, 8, 1);
    o.causal = causal;
    const std::vector<double> oracle = test::oracle_forward(p, o);
    const double base = max_error(test::textbook_forward(p, o), oracle);
    test::for_each_simd_target("tiled", detail::tiled_target, [&](std::int64_t) {
      TileOptions t;
      t.q_tile = 32;
      t.k_tile = 7;
      std::vector<T> out(p.q.data.size());
      attention_tiled(p.q.view(), p.k.view(), p.v.view(), TensorView::contiguous(out.data(), B, SQ, H, D), o, t);
      EXPECT_TRUE(test::meets_textbook_rule(max_error(out, oracle), base, test::kForwardFactor, slack))
          << "causal " << causal;
    });
  }
}

TEST(DropoutPrecision, F32TiledWithinTwiceTheTextbookError) { check_precision<float>(1e-7); }
TEST(DropoutPrecision, Bf16TiledWithinTwiceTheTextbookError) { check_precision<bf16_t>(1e-3); }

// ---- The reference backward ----

TEST(DropoutBackward, ReferenceMatchesFiniteDifferencesOfTheForward) {
  // The mask is fixed by the seed, so the loss sum(out * W) is smooth in q, k and v.
  const Shape shapes[] = {Shape{2, 5, 7, 4, 2, 6, false}, Shape{1, 6, 5, 2, 1, 4, true},
                          Shape{1, 5, 8, 2, 2, 3, false, 3, 1, 2.0, true}};
  for (const Shape& s : shapes) {
    Case c(s, 0.35, 17);
    const auto W = random_tensor<double>(s.b, s.sq, s.h, s.d, 99);
    Tensor<double> out(s.b, s.sq, s.h, s.d);
    std::vector<double> lse(static_cast<std::size_t>(s.b * s.h * s.sq));
    const TensorView lv = TensorView::contiguous(lse.data(), s.b, s.h, s.sq);
    attention_reference(c.q.view(), c.k.view(), c.v.view(), out.view(), c.opts, &lv);
    Tensor<double> dq(s.b, s.sq, s.h, s.d), dk(s.b, s.sk, s.hk, s.d), dv(s.b, s.sk, s.hk, s.d);
    attention_backward_reference(c.q.view(), c.k.view(), c.v.view(), out.view(), W.view(), lv, dq.view(), dk.view(),
                                 dv.view(), c.opts);
    auto loss = [&] {
      Tensor<double> o(s.b, s.sq, s.h, s.d);
      attention_reference(c.q.view(), c.k.view(), c.v.view(), o.view(), c.opts);
      double sum = 0;
      for (std::size_t e = 0; e < o.data.size(); ++e) sum += o.data[e] * W.data[e];
      return sum;
    };
    Tensor<double>* inputs[] = {&c.q, &c.k, &c.v};
    const Tensor<double>* grads[] = {&dq, &dk, &dv};
    for (int t = 0; t < 3; ++t) {
      std::vector<double> fd(inputs[t]->data.size());  // central differences
      for (std::size_t e = 0; e < fd.size(); ++e) {
        double& x = inputs[t]->data[e];
        const double x0 = x, step = 1e-5;
        x = x0 + step;
        const double up = loss();
        x = x0 - step;
        const double down = loss();
        x = x0;
        fd[e] = (up - down) / (2 * step);
      }
      const double big = test::max_magnitude(fd);
      EXPECT_LE(max_error(grads[t]->data, fd), 1e-6 * big) << "gradient "
                                                           << "qkv"[t] << " sq " << s.sq << " causal " << s.causal;
      EXPECT_GT(big, 1e-3) << "a vanishing gradient tests nothing";
    }
  }
}

// ---- Validation ----

struct Fixture {
  Tensor<float> q = random_tensor<float>(1, 4, 2, 8, 1), k = random_tensor<float>(1, 5, 2, 8, 2),
                v = random_tensor<float>(1, 5, 2, 8, 3), dout = random_tensor<float>(1, 4, 2, 8, 4);
  std::vector<float> out = std::vector<float>(64, 123.0f), lse = std::vector<float>(8, 456.0f),
                     grads = std::vector<float>(64 + 2 * 80, 789.0f), mask = std::vector<float>(2 * 4 * 5, 5.0f);
  TensorView ov = TensorView::contiguous(out.data(), 1, 4, 2, 8), lv = TensorView::contiguous(lse.data(), 1, 2, 4);
  const std::vector<float> out0 = out, lse0 = lse, grads0 = grads, mask0 = mask;
  std::vector<std::int32_t> cq{0, 4}, ck{0, 5};

  void expect_rejected(const char* who, const std::function<void()>& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << who << ": no exception";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(std::string("attn::") + who + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
    EXPECT_TRUE(same_bytes(out, out0) && same_bytes(lse, lse0) && same_bytes(grads, grads0) && same_bytes(mask, mask0))
        << who << " wrote an output";
  }
  void all_training_calls(const AttentionOptions& o, const std::string& needle) {
    TensorView dq = TensorView::contiguous(grads.data(), 1, 4, 2, 8),
               dk = TensorView::contiguous(grads.data() + 64, 1, 5, 2, 8),
               dv = TensorView::contiguous(grads.data() + 144, 1, 5, 2, 8);
    const TensorView o3 = TensorView::contiguous(out.data(), 4, 2, 8), l3 = TensorView::contiguous(lse.data(), 1, 2, 4);
    expect_rejected(
        "attention_reference", [&] { attention_reference(q.view(), k.view(), v.view(), ov, o, &lv); }, needle);
    expect_rejected(
        "attention_tiled", [&] { attention_tiled(q.view(), k.view(), v.view(), ov, o, {}, &lv); }, needle);
    expect_rejected(
        "attention_varlen",
        [&] { attention_varlen(q.packed(), k.packed(), v.packed(), o3, cq.data(), ck.data(), 1, o, {}, &l3); }, needle);
    expect_rejected(
        "attention_backward_reference",
        [&] { attention_backward_reference(q.view(), k.view(), v.view(), ov, dout.view(), lv, dq, dk, dv, o); },
        needle);
    expect_rejected(
        "dropout_mask", [&] { dropout_mask(TensorView::contiguous(mask.data(), 1, 2, 4, 5), o); }, needle);
  }
};

TEST(DropoutValidation, BadRatesAndOffsetsAreRejectedByEveryTrainingEntryPoint) {
  Fixture f;
  for (double p : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
    f.all_training_calls(with_dropout({}, p), "dropout_p: must be in [0, 1)");
  f.all_training_calls(with_dropout({}, 0.5, 1, std::uint64_t{1} << 32), "dropout_offset: must be < 2^32");
}

TEST(DropoutValidation, PathsWithoutDropoutRejectAPositiveRate) {
  Fixture f;
  const AttentionOptions o = with_dropout({}, 0.1);
  f.expect_rejected(
      "attention_splitk", [&] { attention_splitk(f.q.view(), f.k.view(), f.v.view(), f.ov, o, {}, &f.lv); },
      "dropout_p: must be 0 (split-K");
  f.expect_rejected(
      "splitk_partials", [&] { splitk_partials(f.q.view(), f.k.view(), f.v.view(), o, {}, 0, 0, 0); },
      "dropout_p: must be 0 (split-K");
  // Decode over a contiguous cache of 5 keys (k as the cache; seqlens 5).
  std::vector<std::int32_t> seqlens{5};
  KVCache cache;
  cache.k = f.k.view();
  cache.v = f.v.view();
  cache.seqlens = seqlens.data();
  const TensorView q1 = TensorView::contiguous(f.q.data.data(), 1, 1, 2, 8),
                   o1 = TensorView::contiguous(f.out.data(), 1, 1, 2, 8);
  f.expect_rejected(
      "attention_decode", [&] { attention_decode(q1, cache, o1, o, {}); }, "dropout_p: must be 0 (decode");
}

TEST(DropoutValidation, TheMaskViewFollowsTheViewRules) {
  Fixture f;
  const AttentionOptions o = with_dropout({}, 0.5);
  std::vector<std::uint16_t> half(40);
  f.expect_rejected(
      "dropout_mask", [&] { dropout_mask(TensorView::contiguous(f.mask.data(), 2, 4, 5), o); }, "mask: rank must be 4");
  f.expect_rejected(
      "dropout_mask",
      [&] { dropout_mask(TensorView::contiguous(reinterpret_cast<bf16_t*>(half.data()), 1, 2, 4, 5), o); },
      "mask: dtype must be f64 or f32");
  f.expect_rejected(
      "dropout_mask", [&] { dropout_mask(TensorView::contiguous(f.mask.data(), 1, 0, 4, 5), o); },
      "mask: heads must be >= 1");
  TensorView aliased = TensorView::contiguous(f.mask.data(), 1, 2, 4, 5);
  aliased.strides[1] = 0;
  f.expect_rejected(
      "dropout_mask", [&] { dropout_mask(aliased, o); }, "mask: strides make elements alias");
  TensorView negative = aliased;
  negative.strides[1] = -20;
  f.expect_rejected(
      "dropout_mask", [&] { dropout_mask(negative, o); }, "mask: stride[1] must be >= 0");
}

// softmax_weights: normalised by their row sums and applied to v they are the textbook output; each row's
// largest weight is 1 (its maximum's); hidden keys and rows that see nothing get 0.
TEST(SoftmaxWeights, NormalisedTheyAreTheTextbookAttention) {
  const Shape s{2, 9, 13, 4, 2, 8, true, 3, -1, 2.5, true};
  std::vector<float> slopes;
  const AttentionOptions o = test::options_of(s, 0.4f, slopes);
  const Tensor<double> q = random_tensor<double>(s.b, s.sq, s.h, s.d, 61),
                       k = random_tensor<double>(s.b, s.sk, s.hk, s.d, 62),
                       v = random_tensor<double>(s.b, s.sk, s.hk, s.d, 63);
  std::vector<double> w(static_cast<std::size_t>(s.b * s.h * s.sq * s.sk), 42.0);
  softmax_weights(q.view(), k.view(), TensorView::contiguous(w.data(), s.b, s.h, s.sq, s.sk), o);
  Tensor<double> want(s.b, s.sq, s.h, s.d), got(s.b, s.sq, s.h, s.d);
  attention_reference(q.view(), k.view(), v.view(), want.view(), o);
  for (std::int64_t b = 0; b < s.b; ++b)
    for (std::int64_t h = 0; h < s.h; ++h)
      for (std::int64_t i = 0; i < s.sq; ++i) {
        const double* row = &w[static_cast<std::size_t>(((b * s.h + h) * s.sq + i) * s.sk)];
        double sum = 0, top = 0;
        for (std::int64_t j = 0; j < s.sk; ++j) sum += row[j], top = std::max(top, row[j]);
        EXPECT_EQ(top, 1.0) << "b " << b << " h " << h << " i " << i;
        for (std::int64_t e = 0; e < s.d; ++e) {
          double x = 0;
          for (std::int64_t j = 0; j < s.sk; ++j)
            x += row[j] / sum * v.data[static_cast<std::size_t>(((b * s.sk + j) * s.hk + h / 2) * s.d + e)];
          got.at(b, i, h, e) = x;
        }
      }
  EXPECT_LE(max_error(got, want), 1e-12);
}

TEST(SoftmaxWeights, BadWeightsAreNamedAndUntouched) {
  const Tensor<float> q = random_tensor<float>(1, 4, 2, 8, 1), k = random_tensor<float>(1, 5, 2, 8, 2);
  std::vector<float> w(40, 7.0f);
  for (const TensorView& bad :
       {TensorView::contiguous(w.data(), 1, 2, 5, 4), TensorView::contiguous(w.data(), 2, 4, 5)}) {
    try {
      softmax_weights(q.view(), k.view(), bad, {});
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("attn::softmax_weights: weights: "), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](float x) { return x == 7.0f; }));
}

}  // namespace
}  // namespace attn
