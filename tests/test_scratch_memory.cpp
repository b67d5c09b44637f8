// The tiled algorithm never allocates anything of size seqlen_q x seqlen_k: its heap use, measured by
// counting every operator new in this program, is O(tile sizes x head_dim) and does not grow with the
// sequence. The reference, which materialises S, is measured the same way as a control.
#include <gtest/gtest.h>

#include "alloc_tracker.hpp"
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
    // 8 per-row values (R), K (bc x d), V (bc x dp), one output row (dp), where R = br and dp = d
    // rounded up to the widest vector (16 floats), plus a small constant for the containers
    // themselves (the problem list, the plan, the aligned block's header).
    const std::int64_t R = (br + 15) / 16 * 16, dp = (d + 15) / 16 * 16;
    const std::size_t bound = sizeof(float) * (R * (2 * dp + bc + 8) + bc * (d + dp) + dp) + 1024;
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

}  // namespace
}  // namespace attn
