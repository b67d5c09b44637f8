// Masks, GQA/MQA, strides, odd sizes and reduced precision, for every algorithm (the tiled kernel on
// every SIMD target it was compiled for and the CPU supports).
#include <gtest/gtest.h>

#include <functional>

#include "support.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

using test::max_error;
using test::random_tensor;
using test::Tensor;

enum class Algo { reference, tiled, splitk };
const char* name(Algo a) { return a == Algo::reference ? "reference" : a == Algo::tiled ? "tiled" : "splitk"; }

void run(Algo a, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
         const AttentionOptions& o, const TensorView* lse = nullptr, std::int64_t tile = 7, std::int64_t splits = 5) {
  switch (a) {
    case Algo::reference:
      return attention_reference(q, k, v, out, o, lse);
    case Algo::tiled: {
      TileOptions t;
      t.q_tile = tile;
      t.k_tile = tile + 2;
      return attention_tiled(q, k, v, out, o, t, lse);
    }
    case Algo::splitk: {
      SplitKOptions s;
      s.num_splits = splits;
      return attention_splitk(q, k, v, out, o, s, lse);
    }
  }
}

// An independent, deliberately naive statement of the semantics (flash-attn's): per (b, h, i), loop
// over keys j; query i sits at key position i + sk - sq (bottom-right alignment); causal keeps
// j <= that position, a window (left, right) keeps [pos - left, pos + right]; the score is
// qk * scale, soft-capped, minus slope * |pos - j|; kv head = h / (H / Hk).
std::vector<double> naive(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                          const AttentionOptions& o, std::vector<double>* lse = nullptr) {
  std::vector<double> out(q.data.size(), 0.0);
  if (lse) lse->assign(static_cast<std::size_t>(q.b * q.h * q.s), -INFINITY);
  const std::int64_t group = q.h / k.h;
  for (std::int64_t b = 0; b < q.b; ++b)
    for (std::int64_t h = 0; h < q.h; ++h)
      for (std::int64_t i = 0; i < q.s; ++i) {
        std::vector<double> w;
        std::vector<std::int64_t> js;
        for (std::int64_t j = 0; j < k.s; ++j) {
          const std::int64_t pos = i + k.s - q.s;
          if (o.causal && j > pos) continue;
          if (o.window_left >= 0 && j < pos - o.window_left) continue;
          if (o.window_right >= 0 && j > pos + o.window_right) continue;
          double dot = 0;
          for (std::int64_t c = 0; c < q.d; ++c)
            dot += q.data[((b * q.s + i) * q.h + h) * q.d + c] * k.data[((b * k.s + j) * k.h + h / group) * k.d + c];
          double score = dot * o.softmax_scale.value_or(1 / std::sqrt(double(q.d)));
          if (o.softcap > 0) score = o.softcap * std::tanh(score / o.softcap);
          if (o.alibi_slopes) score -= o.alibi_slopes[b * o.alibi_batch_stride + h] * std::abs(double(pos - j));
          w.push_back(score);
          js.push_back(j);
        }
        if (w.empty()) continue;
        double m = *std::max_element(w.begin(), w.end()), sum = 0;
        for (double& x : w) sum += (x = std::exp(x - m));
        for (std::size_t t = 0; t < w.size(); ++t)
          for (std::int64_t c = 0; c < q.d; ++c)
            out[((b * q.s + i) * q.h + h) * q.d + c] +=
                w[t] / sum * v.data[((b * k.s + js[t]) * k.h + h / group) * k.d + c];
        if (lse) (*lse)[(b * q.h + h) * q.s + i] = m + std::log(sum);
      }
  return out;
}

using test::Shape;

class Semantics : public ::testing::TestWithParam<Shape> {};

TEST_P(Semantics, EveryAlgorithmMatchesTheNaiveDefinition) {
  const Shape s = GetParam();
  auto q = random_tensor<double>(s.b, s.sq, s.h, s.d, 100), k = random_tensor<double>(s.b, s.sk, s.hk, s.d, 101),
       v = random_tensor<double>(s.b, s.sk, s.hk, s.d, 102);
  std::vector<float> slopes;
  AttentionOptions o = test::options_of(s, 0.25f, slopes);
  std::vector<double> want_lse;
  const auto want = naive(q, k, v, o, &want_lse);
  auto check = [&](Algo a) {
    std::vector<double> out(q.data.size(), 42.0), lse(want_lse.size(), 42.0);
    TensorView lv = TensorView::contiguous(lse.data(), s.b, s.h, s.sq);
    run(a, q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), s.b, s.sq, s.h, s.d), o, &lv);
    EXPECT_LE(max_error(out, want), test::kF64Tolerance) << name(a);
    EXPECT_LE(max_error(lse, want_lse), test::kF64Tolerance) << name(a);
  };
  check(Algo::reference);
  test::for_each_simd_target("tiled", detail::tiled_target, [&](std::int64_t) { check(Algo::tiled); });
  check(Algo::splitk);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Semantics,
    ::testing::Values(Shape{1, 5, 9, 2, 2, 4, true},    // seqlen_q < seqlen_k: bottom-right causal
                      Shape{1, 9, 5, 2, 2, 4, true},    // seqlen_q > seqlen_k: the first rows see nothing
                      Shape{2, 7, 7, 4, 4, 3, true},    // square causal
                      Shape{2, 6, 11, 8, 2, 5, false},  // GQA, 4 query heads per kv head
                      Shape{1, 6, 11, 6, 1, 5, true},   // MQA
                      Shape{1, 1, 1, 1, 1, 1, false},   // size 1 everywhere
                      Shape{1, 7, 113, 3, 1, 7, true},  // odd sizes
                      Shape{1, 113, 7, 2, 2, 113, false}, Shape{1, 3, 1023, 2, 1, 16, true},
                      Shape{1, 1, 0, 2, 1, 8, false},                        // no keys: out = 0, lse = -inf
                      Shape{2, 20, 20, 2, 1, 8, false, 3, 2},                // sliding window (3, 2)
                      Shape{1, 12, 30, 2, 2, 8, true, 5},                    // causal + left window
                      Shape{1, 30, 12, 2, 2, 8, false, 0, 0},                // window (0, 0): one key per row at most
                      Shape{1, 9, 17, 2, 1, 8, false, -1, -1, 2.0},          // softcap
                      Shape{2, 9, 17, 4, 2, 8, true, -1, -1, 0, true},       // ALiBi per batch and head
                      Shape{1, 16, 16, 2, 2, 8, false, 4, -1, 5.0, true}));  // all together

TEST(Semantics, RowsWithNoVisibleKeyGetZeroAndMinusInfinity) {
  // seqlen_q = 6 > seqlen_k = 3: query i sees keys j <= i - 3, so rows 0..2 see nothing.
  auto q = random_tensor<double>(1, 6, 1, 4, 1), k = random_tensor<double>(1, 3, 1, 4, 2),
       v = random_tensor<double>(1, 3, 1, 4, 3);
  AttentionOptions o;
  o.causal = true;
  for (Algo a : {Algo::reference, Algo::tiled, Algo::splitk}) {
    std::vector<double> out(24, 5.0), lse(6, 5.0);
    TensorView lv = TensorView::contiguous(lse.data(), 1, 1, 6);
    run(a, q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, 6, 1, 4), o, &lv);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(lse[i], -INFINITY) << name(a);
      for (int c = 0; c < 4; ++c) EXPECT_EQ(out[i * 4 + c], 0.0) << name(a);
    }
    for (int i = 3; i < 6; ++i) EXPECT_TRUE(std::isfinite(lse[i])) << name(a);
  }
}

TEST(Strides, NonContiguousInputsAndOutputsGiveTheSameResult) {
  // q, k, v stored head-major [b, h, s, d] with padded rows, out with padding between heads: passed
  // through strides, no copies.
  const std::int64_t B = 2, S = 19, H = 4, HK = 2, D = 6, PAD = 3;
  auto q = random_tensor<double>(B, S, H, D, 1), k = random_tensor<double>(B, S, HK, D, 2),
       v = random_tensor<double>(B, S, HK, D, 3);
  auto head_major = [&](const Tensor<double>& t, std::vector<double>& buf) {
    const std::int64_t row = t.d + PAD;
    buf.assign(static_cast<std::size_t>(t.b * t.h * t.s * row), NAN);
    for (std::int64_t b = 0; b < t.b; ++b)
      for (std::int64_t s = 0; s < t.s; ++s)
        for (std::int64_t h = 0; h < t.h; ++h)
          for (std::int64_t c = 0; c < t.d; ++c)
            buf[((b * t.h + h) * t.s + s) * row + c] = t.data[((b * t.s + s) * t.h + h) * t.d + c];
    return TensorView::strided(buf.data(), {t.b, t.s, t.h, t.d}, {t.h * t.s * row, row, t.s * row, 1});
  };
  std::vector<double> qb, kb, vb;
  const TensorView qs = head_major(q, qb), ks = head_major(k, kb), vs = head_major(v, vb);
  AttentionOptions o;
  o.causal = true;
  std::vector<double> want(q.data.size());
  attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(want.data(), B, S, H, D), o);
  for (Algo a : {Algo::reference, Algo::tiled, Algo::splitk}) {
    // out: [b, s, h, d] with 2 spare elements after each head's row and every element 2 apart.
    std::vector<double> ob(static_cast<std::size_t>(B * S * H * (2 * D + 2)), -7.0);
    TensorView out = TensorView::strided(ob.data(), {B, S, H, D}, {S * H * (2 * D + 2), H * (2 * D + 2), 2 * D + 2, 2});
    run(a, qs, ks, vs, out, o);
    std::vector<double> got;  // [b, s, h, d], dense
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t c = 0; c < D; ++c) {
            got.push_back(ob[b * out.strides[0] + s * out.strides[1] + h * out.strides[2] + c * 2]);
            EXPECT_EQ(ob[b * out.strides[0] + s * out.strides[1] + h * out.strides[2] + c * 2 + 1], -7.0)
                << "wrote a gap";
          }
    EXPECT_LE(max_error(got, want), test::kF64Tolerance) << name(a);
  }
}

// The accuracy rule (common/accuracy.hpp) for the tiled kernel on every SIMD target and for split-K, with
// `slack` as the floor.
template <class T>
void check_precision(double slack) {
  const std::int64_t B = 1, SQ = 130, SK = 257, H = 4, HK = 2, D = 64;
  const auto p = test::random_qkv<T>(B, SQ, SK, H, HK, D, 31);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const std::vector<double> oracle = test::oracle_forward(p, o);
    const double base = max_error(test::textbook_forward(p, o), oracle);
    auto check = [&](Algo a) {
      std::vector<T> out(p.q.data.size());
      run(a, p.q.view(), p.k.view(), p.v.view(), TensorView::contiguous(out.data(), B, SQ, H, D), o, nullptr, 32, 7);
      EXPECT_TRUE(test::meets_textbook_rule(max_error(out, oracle), base, test::kForwardFactor, slack))
          << name(a) << " causal " << causal;
    };
    test::for_each_simd_target("tiled", detail::tiled_target, [&](std::int64_t) { check(Algo::tiled); });
    check(Algo::splitk);
  }
}

TEST(Precision, F32WithinTwiceTheTextbookError) { check_precision<float>(1e-7); }
TEST(Precision, Bf16WithinTwiceTheTextbookError) { check_precision<bf16_t>(1e-3); }
TEST(Precision, F16WithinTwiceTheTextbookError) { check_precision<f16_t>(1e-4); }

TEST(Scale, CustomSoftmaxScaleIsApplied) {
  auto q = random_tensor<double>(1, 4, 1, 8, 1), k = random_tensor<double>(1, 6, 1, 8, 2),
       v = random_tensor<double>(1, 6, 1, 8, 3);
  // scale 2/sqrt(8) on q equals the default scale on 2q.
  auto q2 = q;
  for (auto& x : q2.data) x *= 2;
  std::vector<double> want(32), out(32);
  attention_reference(q2.view(), k.view(), v.view(), TensorView::contiguous(want.data(), 1, 4, 1, 8));
  AttentionOptions o;
  o.softmax_scale = 2 / std::sqrt(8.0);
  for (Algo a : {Algo::reference, Algo::tiled, Algo::splitk}) {
    run(a, q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, 4, 1, 8), o);
    EXPECT_LE(max_error(out, want), 1e-14) << name(a);
  }
}

}  // namespace
}  // namespace attn
