// The seed's requirements: tiled and split-K agree with the textbook reference to 1e-12 in f64, for
// every tile size from 1 key to the whole sequence and every split count from 1 to 1,500 over 1,000 keys.
#include <gtest/gtest.h>

#include "support.hpp"

namespace attn {
namespace {

using test::max_error;
using test::random_tensor;

struct Case {
  test::Tensor<double> q, k, v;
  std::vector<double> ref, ref_lse;
  Case(std::int64_t sq, std::int64_t sk, std::int64_t h, std::int64_t hk, std::int64_t d, std::uint64_t seed,
       bool causal = false)
      : q(random_tensor<double>(1, sq, h, d, seed)),
        k(random_tensor<double>(1, sk, hk, d, seed + 1)),
        v(random_tensor<double>(1, sk, hk, d, seed + 2)),
        ref(q.data.size()),
        ref_lse(static_cast<std::size_t>(sq * h)) {
    AttentionOptions o;
    o.causal = causal;
    TensorView out = TensorView::contiguous(ref.data(), 1, sq, h, d);
    TensorView lse = TensorView::contiguous(ref_lse.data(), 1, h, sq);
    attention_reference(q.view(), k.view(), v.view(), out, o, &lse);
  }
};

TEST(Exactness, TiledEveryKeyTileFrom1ToWholeSequence) {
  // The widget's check: 48 queries x 48 keys, d = 16.
  Case c(48, 48, 1, 1, 16, 7);
  std::vector<double> out(c.ref.size()), lse(c.ref_lse.size());
  for (std::int64_t bc = 1; bc <= 48; ++bc) {
    TileOptions t;
    t.k_tile = bc;
    attention_tiled(c.q.view(), c.k.view(), c.v.view(), TensorView::contiguous(out.data(), 1, 48, 1, 16), {}, t,
                    nullptr);
    ASSERT_LE(max_error(out, c.ref), test::kF64Tolerance) << "k_tile " << bc;
  }
}

TEST(Exactness, TiledEveryQueryAndKeyTileCausalWithLse) {
  Case c(37, 53, 2, 1, 8, 11, /*causal=*/true);
  std::vector<double> out(c.ref.size()), lse(c.ref_lse.size());
  AttentionOptions o;
  o.causal = true;
  for (std::int64_t br : {1, 2, 5, 16, 36, 37, 100})
    for (std::int64_t bc = 1; bc <= 54; ++bc) {
      TileOptions t;
      t.q_tile = br;
      t.k_tile = bc;
      TensorView lv = TensorView::contiguous(lse.data(), 1, 2, 37);
      attention_tiled(c.q.view(), c.k.view(), c.v.view(), TensorView::contiguous(out.data(), 1, 37, 2, 8), o, t, &lv);
      ASSERT_LE(max_error(out, c.ref), test::kF64Tolerance) << "tiles " << br << "x" << bc;
      ASSERT_LE(max_error(lse, c.ref_lse), test::kF64Tolerance) << "tiles " << br << "x" << bc;
    }
}

TEST(Exactness, SplitKEveryWorkerCountFrom1To1500Over1000Keys) {
  Case c(1, 1000, 1, 1, 16, 21);
  std::vector<double> out(c.ref.size()), lse(1);
  for (std::int64_t w = 1; w <= 1500; ++w) {
    SplitKOptions s;
    s.num_splits = w;
    TensorView lv = TensorView::contiguous(lse.data(), 1, 1, 1);
    attention_splitk(c.q.view(), c.k.view(), c.v.view(), TensorView::contiguous(out.data(), 1, 1, 1, 16), {}, s, &lv);
    ASSERT_LE(max_error(out, c.ref), test::kF64Tolerance) << "splits " << w;
    ASSERT_LE(std::abs(lse[0] - c.ref_lse[0]), test::kF64Tolerance) << "splits " << w;
  }
}

TEST(Exactness, SplitKPartialsMergeToTheOutput) {
  // The per-slice states the CLI shows are the ones split-K merges.
  Case c(1, 4096, 1, 1, 16, 5);
  SplitKOptions s;
  s.num_splits = 4;
  auto parts = splitk_partials(c.q.view(), c.k.view(), c.v.view(), {}, s, 0, 0, 0);
  ASSERT_EQ(parts.size(), 4u);
  PartialState<double> all(16);
  for (auto& p : parts) {
    EXPECT_GT(p.l, 0);
    merge(all.view(), p.view());
  }
  std::vector<double> out(16);
  finalize(all.view(), out.data());
  EXPECT_LE(max_error(out, c.ref), test::kF64Tolerance);
}

TEST(Exactness, SplitKIsBitwiseIdenticalForAnyThreadCount) {
  Case c(3, 777, 4, 2, 32, 9, /*causal=*/true);
  std::vector<double> first(c.ref.size()), out(c.ref.size());
  for (int threads : {1, 2, 3, 8}) {
    AttentionOptions o;
    o.causal = true;
    o.num_threads = threads;
    SplitKOptions s;
    s.num_splits = 13;
    attention_splitk(c.q.view(), c.k.view(), c.v.view(), TensorView::contiguous(out.data(), 1, 3, 4, 32), o, s);
    if (threads == 1) first = out;
    EXPECT_EQ(out, first) << threads << " threads";
    EXPECT_LE(max_error(out, c.ref), test::kF64Tolerance);
  }
}

TEST(Exactness, TiledAgreesForAnyThreadCount) {
  Case c(100, 100, 3, 3, 24, 13, true);
  std::vector<double> out(c.ref.size());
  for (int threads : {1, 2, 5}) {
    AttentionOptions o;
    o.causal = true;
    o.num_threads = threads;
    TileOptions t;
    t.q_tile = 16;
    t.k_tile = 8;
    attention_tiled(c.q.view(), c.k.view(), c.v.view(), TensorView::contiguous(out.data(), 1, 100, 3, 24), o, t);
    EXPECT_LE(max_error(out, c.ref), test::kF64Tolerance) << threads << " threads";
  }
}

}  // namespace
}  // namespace attn
