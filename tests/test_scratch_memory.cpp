// The tiled algorithm never allocates anything of size seqlen_q x seqlen_k: its heap use, measured by
// counting every operator new in this program, is O(tile sizes x head_dim) and does not grow with the
// sequence. The reference, which materialises S, is measured the same way as a control. The tiled
// backward likewise: its scratch is O(tile sizes x head_dim) plus D, one value per query row.
#include <gtest/gtest.h>

#include "alloc_tracker.hpp"
#include "attn/backward.hpp"
#include "support.hpp"

namespace attn {
namespace {

std::size_t peak_heap_of(std::int64_t n, std::int64_t d, std::int64_t br, std::int64_t bc, bool tiled) {
  auto q = test::random_tensor<float>(1, n, 1, d, 1), k = test::random_tensor<float>(1, n, 1, d, 2),
       v = test::random_tensor<float>(1, n, 1, d, 3);
  std::vector<float> out(q.data.size());
  AttentionOptions o;
  o.num_threads = 1;
  TileOptions t;
  t.q_tile = br;
  t.k_tile = bc;
  tools::HeapPeakScope scope;
  if (tiled)
    attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, n, 1, d), o, t);
  else
    attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, n, 1, d), o);
  return scope.peak_growth();
}

TEST(ScratchMemory, TiledIsBoundedByTilesTimesHeadDim) {
  const std::int64_t d = 32;
  for (auto [br, bc] : {std::pair<std::int64_t, std::int64_t>{16, 16}, {64, 128}, {8, 256}}) {
    // Per-thread scratch of the SIMD kernel (src/tiled/tiled_kernel.cpp): Q^T, O (R x dp), S (bc x R),
    // 8 per-row values and dropout's 2 per-row counter words (R), K (bc x d), V (bc x dp), one output
    // row (dp), where R = br and dp = d rounded up to the widest vector (16 floats), plus a small
    // constant for the containers themselves (the problem list, the plan, the aligned block's header).
    const std::int64_t R = (br + 15) / 16 * 16, dp = (d + 15) / 16 * 16;
    const std::size_t bound = sizeof(float) * (R * (2 * dp + bc + 10) + bc * (d + dp) + dp) + 1024;
    for (std::int64_t n : {512, 2048}) {
      const std::size_t used = peak_heap_of(n, d, br, bc, true);
      EXPECT_LE(used, bound) << "n=" << n << " tiles " << br << "x" << bc;
      EXPECT_GT(used, 0u);
    }
  }
}

TEST(ScratchMemory, TiledDoesNotGrowWithSequenceWhileReferenceGrowsQuadratically) {
  const std::size_t tiled_small = peak_heap_of(256, 16, 32, 32, true);
  const std::size_t tiled_large = peak_heap_of(2048, 16, 32, 32, true);
  EXPECT_EQ(tiled_small, tiled_large);
  const std::size_t ref_large = peak_heap_of(2048, 16, 32, 32, false);
  EXPECT_GE(ref_large, sizeof(float) * 2048 * 2048);  // the control: S is really there
}

// The tiled backward's heap use: per thread (one here) Q, dO, dQ (br x d), lse and D (br), K, V, dK,
// dV (bc x d), P and dX (br x bc), two row bounds (br int64), plus D (n floats) and the containers.
TEST(ScratchMemory, TiledBackwardIsBoundedByTilesAndRows) {
  const std::int64_t d = 16, br = 32, bc = 48;
  for (std::int64_t n : {256, 1024}) {
    auto q = test::random_tensor<float>(1, n, 1, d, 1), k = test::random_tensor<float>(1, n, 1, d, 2),
         v = test::random_tensor<float>(1, n, 1, d, 3), dout = test::random_tensor<float>(1, n, 1, d, 4);
    std::vector<float> out(q.data.size()), lse(static_cast<std::size_t>(n)), dq(out.size()), dk(out.size()),
        dv(out.size());
    AttentionOptions o;
    o.num_threads = 1;
    o.causal = true;
    const TensorView lv = TensorView::contiguous(lse.data(), 1, 1, n);
    attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, n, 1, d), o, &lv);
    TileOptions t;
    t.q_tile = br;
    t.k_tile = bc;
    tools::HeapPeakScope scope;
    attention_backward(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, n, 1, d), dout.view(), lv,
                       TensorView::contiguous(dq.data(), 1, n, 1, d), TensorView::contiguous(dk.data(), 1, n, 1, d),
                       TensorView::contiguous(dv.data(), 1, n, 1, d), o, t);
    const std::size_t bound = sizeof(float) * ((3 * d + 2) * br + 4 * d * bc + 2 * br * bc + n) + 8 * 2 * br + 1024;
    EXPECT_LE(scope.peak_growth(), bound) << "n=" << n;
    EXPECT_GT(scope.peak_growth(), 0u);
  }
}

}  // namespace
}  // namespace attn
