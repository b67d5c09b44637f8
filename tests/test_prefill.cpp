// The SIMD prefill kernel (attention_tiled) in every mode, against the f64 oracle with flash-attn's
// accuracy rule (at most twice the textbook method's error at the same precision), forcing each code
// path: each head-dim register block (64, 80, 96, 128, 256) and odd head dims, each dtype, sequence
// lengths that leave tails in both tile directions, the default and explicit tile sizes, GQA stacking,
// masks, soft-capping, ALiBi, LSE, and 1 vs 2 threads. Every test runs on every SIMD target the CPU
// supports and the kernel was compiled for (test::for_each_simd_target), not only on the one the
// dispatch picks: AVX3 (bf16 scores with VDPBF16PS where the CPU has AVX512-BF16), AVX2 and SSE4 (bf16
// widened to f32), and the scalar fallback.
#include <gtest/gtest.h>

#include <cmath>

#include "support.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

using test::max_error;
using test::random_tensor;

// f(target) on each SIMD target of the tiled kernel, the dispatch pinned to it.
template <class F>
void on_every_target(F&& f) {
  test::for_each_simd_target("tiled", detail::tiled_target, f);
}

struct Case {
  std::int64_t b, sq, sk, h, hk, d;
  bool causal = false;
  std::int64_t left = -1, right = -1;
  double softcap = 0;
  bool alibi = false;
  std::int64_t q_tile = 0, k_tile = 0;  // 0 = the default plan
  int threads = 2;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "b" << c.b << " sq" << c.sq << " sk" << c.sk << " h" << c.h << "/" << c.hk << " d" << c.d
            << (c.causal ? " causal" : "") << " win(" << c.left << "," << c.right << ") cap" << c.softcap
            << (c.alibi ? " alibi" : "") << " tiles " << c.q_tile << "x" << c.k_tile << " thr" << c.threads;
}

template <class T>
void expect_accurate(const Case& c) {
  SCOPED_TRACE(::testing::Message() << c << " dtype " << dtype_name(dtype_of<T>()));
  const auto p = test::random_qkv<T>(c.b, c.sq, c.sk, c.h, c.hk, c.d, 11);
  std::vector<float> slopes;
  AttentionOptions o =
      test::options_of({c.b, c.sq, c.sk, c.h, c.hk, c.d, c.causal, c.left, c.right, c.softcap, c.alibi}, 0.5f, slopes);
  o.num_threads = c.threads;
  TileOptions t;
  if (c.q_tile) t.q_tile = c.q_tile;
  if (c.k_tile) t.k_tile = c.k_tile;
  const std::size_t nl = static_cast<std::size_t>(c.b * c.h * c.sq);

  std::vector<double> oracle_lse;
  const std::vector<double> oracle = test::oracle_forward(p, o, &oracle_lse);
  std::vector<float> textbook_lse;
  const double base = max_error(test::textbook_forward(p, o, &textbook_lse), oracle);
  const double lse_base = max_error(textbook_lse, oracle_lse);

  on_every_target([&](std::int64_t) {
    std::vector<T> got(p.q.data.size());
    std::vector<float> got_lse(nl, 42.0f);
    TensorView gl = TensorView::contiguous(got_lse.data(), c.b, c.h, c.sq);
    attention_tiled(p.q.view(), p.k.view(), p.v.view(), TensorView::contiguous(got.data(), c.b, c.sq, c.h, c.d), o, t,
                    &gl);
    EXPECT_TRUE(
        test::meets_textbook_rule(max_error(got, oracle), base, test::kForwardFactor, test::textbook_floor<T>()));
    // A row that sees no key has lse -inf (and out 0), as the oracle's.
    EXPECT_TRUE(test::meets_textbook_rule(max_error(got_lse, oracle_lse), lse_base, test::kForwardFactor, 1e-5))
        << "lse";
  });
}

class Prefill : public ::testing::TestWithParam<Case> {};

TEST_P(Prefill, F32WithinTwiceTheTextbookError) { expect_accurate<float>(GetParam()); }
TEST_P(Prefill, Bf16WithinTwiceTheTextbookError) { expect_accurate<bf16_t>(GetParam()); }
TEST_P(Prefill, F16WithinTwiceTheTextbookError) { expect_accurate<f16_t>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(HeadDims, Prefill,
                         ::testing::Values(Case{1, 67, 131, 2, 1, 64}, Case{1, 67, 131, 2, 1, 80},
                                           Case{1, 67, 131, 2, 1, 96}, Case{1, 67, 131, 2, 2, 128},
                                           Case{1, 40, 75, 2, 1, 256}, Case{1, 33, 45, 2, 2, 1},
                                           Case{1, 33, 45, 2, 2, 3}, Case{1, 33, 45, 2, 2, 17},
                                           Case{1, 33, 45, 2, 2, 100}, Case{1, 21, 29, 1, 1, 200}));

INSTANTIATE_TEST_SUITE_P(
    TilesAndTails, Prefill,
    ::testing::Values(Case{2, 150, 150, 2, 2, 64, false, -1, -1, 0, false, 0, 0, 1},  // default plan, 1 thread
                      Case{1, 150, 301, 4, 1, 64, true},                              // MQA, causal, default plan
                      Case{1, 90, 90, 2, 2, 32, true, -1, -1, 0, false, 7, 9},        // tiny tiles, tails
                      Case{1, 90, 90, 8, 2, 32, false, -1, -1, 0, false, 5, 13, 2},   // GQA stacking, odd tiles
                      Case{1, 1, 300, 4, 4, 64, true},                                // one query row
                      Case{1, 300, 5, 2, 1, 16, true}));                              // first rows see nothing

INSTANTIATE_TEST_SUITE_P(
    Masks, Prefill,
    ::testing::Values(Case{1, 80, 120, 2, 1, 64, false, 17, 5},                         // sliding window
                      Case{1, 120, 80, 2, 2, 64, true, 30},                             // causal + left window
                      Case{1, 64, 64, 2, 2, 64, false, 0, 0},                           // one key per row
                      Case{1, 70, 90, 4, 2, 64, false, -1, -1, 30.0},                   // softcap
                      Case{2, 70, 90, 4, 2, 64, true, -1, -1, 0, true},                 // ALiBi, per batch and head
                      Case{1, 70, 130, 2, 1, 128, false, 40, 3, 20.0, true, 16, 32}));  // all together

// The result does not depend on the number of threads: every task computes the same bits.
TEST(PrefillThreads, OneAndTwoThreadsGiveIdenticalBits) {
  auto q = random_tensor<float>(2, 200, 4, 96, 1), k = random_tensor<float>(2, 230, 2, 96, 2),
       v = random_tensor<float>(2, 230, 2, 96, 3);
  on_every_target([&](std::int64_t) {
    std::vector<float> a(q.data.size()), b(q.data.size());
    AttentionOptions o;
    o.causal = true;
    for (auto [threads, out] : {std::pair<int, std::vector<float>*>{1, &a}, {2, &b}}) {
      o.num_threads = threads;
      attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(out->data(), 2, 200, 4, 96), o);
    }
    EXPECT_EQ(a, b);
  });
}

// f64 runs the same SIMD kernel (double lanes) and stays exact, in every head-dim block.
TEST(PrefillF64, ExactToTheReferenceForEveryHeadDimBlock) {
  for (std::int64_t d : {1, 7, 64, 80, 96, 128, 256}) {
    auto q = random_tensor<double>(1, 37, 4, d, 1), k = random_tensor<double>(1, 53, 2, d, 2),
         v = random_tensor<double>(1, 53, 2, d, 3);
    std::vector<double> want(q.data.size());
    AttentionOptions o;
    o.causal = true;
    o.softcap = 5;
    attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(want.data(), 1, 37, 4, d), o);
    on_every_target([&](std::int64_t) {
      std::vector<double> got(q.data.size());
      attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(got.data(), 1, 37, 4, d), o);
      EXPECT_LE(max_error(got, want), test::kF64Tolerance) << "d=" << d;
    });
  }
}

// f64, every target: each mask, score transform and GQA ratio, on odd head dims and lengths, through
// tile sizes from 1 x 1 (every tile a tail, every key tile cut by the mask) to the default plan; out
// and LSE agree with the reference to 1e-12.
TEST(PrefillF64, ExactOnEveryTargetForEveryMaskAndTileSize) {
  const test::Shape shapes[] = {{1, 37, 53, 4, 2, 7, false},         // GQA 2, odd head dim, no mask
                                {2, 29, 41, 6, 1, 16, true},         // MQA, causal, seqlen_q < seqlen_k
                                {1, 45, 19, 3, 3, 33, true},         // seqlen_q > seqlen_k: the first rows see nothing
                                {1, 40, 40, 8, 2, 12, false, 6, 3},  // sliding window, GQA 4
                                {1, 31, 50, 2, 1, 9, true, 11},      // causal + left window
                                {1, 23, 23, 2, 2, 5, false, 0, 0},   // one key per row
                                {2, 33, 47, 4, 2, 24, false, -1, -1, 4.0},        // softcap
                                {2, 26, 39, 4, 2, 11, true, -1, -1, 0, true},     // ALiBi per batch and head
                                {1, 35, 57, 6, 2, 20, false, 13, 2, 3.0, true}};  // all together
  const std::pair<std::int64_t, std::int64_t> tiles[] = {{0, 0}, {1, 1}, {1, 5}, {3, 1}, {5, 7}, {13, 4}, {64, 64}};
  for (const test::Shape& s : shapes) {
    auto q = random_tensor<double>(s.b, s.sq, s.h, s.d, 21, 2.0),
         k = random_tensor<double>(s.b, s.sk, s.hk, s.d, 22, 2.0), v = random_tensor<double>(s.b, s.sk, s.hk, s.d, 23);
    std::vector<float> slopes;
    const AttentionOptions o = test::options_of(s, 0.4f, slopes);
    const std::size_t nl = static_cast<std::size_t>(s.b * s.h * s.sq);
    std::vector<double> want(q.data.size()), want_lse(nl);
    const TensorView wl = TensorView::contiguous(want_lse.data(), s.b, s.h, s.sq);
    attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(want.data(), s.b, s.sq, s.h, s.d), o, &wl);
    on_every_target([&](std::int64_t) {
      for (auto [qt, kt] : tiles) {
        TileOptions t;
        if (qt) t.q_tile = qt;
        if (kt) t.k_tile = kt;
        std::vector<double> got(q.data.size(), 42.0), lse(nl, 42.0);
        const TensorView gl = TensorView::contiguous(lse.data(), s.b, s.h, s.sq);
        attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(got.data(), s.b, s.sq, s.h, s.d), o, t,
                        &gl);
        EXPECT_LE(max_error(got, want), test::kF64Tolerance)
            << "shape " << s.b << "x" << s.sq << "x" << s.sk << " h" << s.h << "/" << s.hk << " d" << s.d << " tiles "
            << qt << "x" << kt;
        EXPECT_LE(max_error(lse, want_lse), test::kF64Tolerance) << "lse, tiles " << qt << "x" << kt;
      }
    });
  }
}

// Strided bf16 inputs (head-major, padded rows) go through the element-wise packing path.
TEST(PrefillStrides, StridedBf16MatchesContiguous) {
  const std::int64_t S = 50, H = 2, D = 64;
  auto q = random_tensor<bf16_t>(1, S, H, D, 1), k = random_tensor<bf16_t>(1, S, H, D, 2),
       v = random_tensor<bf16_t>(1, S, H, D, 3);
  // Every element two apart: stride[3] = 2.
  auto spread = [&](const test::Tensor<bf16_t>& t, std::vector<bf16_t>& buf) {
    buf.assign(t.data.size() * 2, bf16_t{0x7fc0});
    for (std::size_t i = 0; i < t.data.size(); ++i) buf[2 * i] = t.data[i];
    return TensorView::strided(buf.data(), {1, S, H, D}, {S * H * D * 2, H * D * 2, D * 2, 2});
  };
  on_every_target([&](std::int64_t) {
    std::vector<bf16_t> qb, kb, vb;
    std::vector<bf16_t> want(q.data.size()), got(q.data.size());
    attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(want.data(), 1, S, H, D));
    attention_tiled(spread(q, qb), spread(k, kb), spread(v, vb), TensorView::contiguous(got.data(), 1, S, H, D));
    EXPECT_EQ(max_error(got, want), 0.0);
  });
}

}  // namespace
}  // namespace attn
