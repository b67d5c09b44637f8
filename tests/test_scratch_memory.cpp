// The tiled algorithm never allocates anything of size seqlen_q x seqlen_k: its heap use, measured by
// counting every operator new in this program, is O(tile sizes x head_dim) and does not grow with the
// sequence. The reference, which materialises S, is measured the same way as a control. The tiled
// backward likewise: its scratch is O(tile sizes x head_dim) plus dK/dV partials of the size of dk and dv.
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

// The tiled backward's heap use: one thread's tile scratch (Q^T, dO^T: d x R; Q, dO, dQ: R x dp; the
// recomputed tiles: 2 bc x R; K, V: 2 bc x d, K again bc x dp; 8 R row facts) and the dK/dV partials,
// 2 chunks seqlen_k dp accumulators (8 chunks here: one (batch, kv head), >= 8 query tiles), with
// R = B_r and dp = d rounded up to 16 (the widest f32 vector). Beyond the partials, tensor-sized like
// dk and dv, nothing grows with the sequence.
TEST(ScratchMemory, TiledBackwardIsBoundedByTilesAndPartials) {
  const std::int64_t d = 16, br = 32, bc = 48;
  std::vector<std::size_t> beyond_partials;
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
    const std::int64_t R = (br + 15) / 16 * 16, dp = (d + 15) / 16 * 16, chunks = 8;
    const std::size_t partials = sizeof(float) * static_cast<std::size_t>(2 * chunks * n * dp);
    const std::size_t tile_scratch =
        sizeof(float) * static_cast<std::size_t>(2 * d * R + 3 * R * dp + 2 * bc * R + bc * dp + 8 * R + 2 * bc * d);
    EXPECT_LE(scope.peak_growth(), partials + tile_scratch + 1024) << "n=" << n;
    EXPECT_GE(scope.peak_growth(), partials) << "n=" << n;
    beyond_partials.push_back(scope.peak_growth() - partials);
  }
  EXPECT_EQ(beyond_partials[0], beyond_partials[1]) << "scratch beyond the partials grew with the sequence";
}

}  // namespace
}  // namespace attn
