// The CUDA kernels' index arithmetic (src/cuda/layout.hpp), checked on the CPU: runs in every build,
// with or without nvcc or a GPU. The fragment tests emulate the kernels' data path (swizzled shared
// memory -> ldmatrix -> mma.sync) with the PTX ISA's documented semantics and compare with a plain
// matrix product, so a wrong address map or fragment order fails here rather than on the GPU.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

#include "attn/attention.hpp"
#include "core/split.hpp"
#include "cuda/heuristics.hpp"
#include "cuda/layout.hpp"

namespace attn::cuda_detail {
namespace {

// ---- fragment maps --------------------------------------------------------------------------------

TEST(CudaFragments, MmaFragmentsCoverTheirTilesOnce) {
  std::set<std::pair<int, int>> a, b, c;
  for (int lane = 0; lane < 32; ++lane) {
    for (int e = 0; e < 8; ++e) a.insert({mma_a_coord(lane, e).row, mma_a_coord(lane, e).col});
    for (int e = 0; e < 4; ++e) b.insert({mma_b_coord(lane, e).row, mma_b_coord(lane, e).col});
    for (int e = 0; e < 4; ++e) c.insert({mma_c_coord(lane, e).row, mma_c_coord(lane, e).col});
  }
  EXPECT_EQ(a.size(), 256u);
  EXPECT_EQ(b.size(), 128u);
  EXPECT_EQ(c.size(), 128u);
  for (auto [r, col] : a) EXPECT_TRUE(r < 16 && col < 16);
  for (auto [r, col] : b) EXPECT_TRUE(r < 16 && col < 8);
  for (auto [r, col] : c) EXPECT_TRUE(r < 16 && col < 8);
}

// The accumulators of n-tiles 2k and 2k+1 (16 x 16 of P) are the A operand of the next product, in
// the order warp_pv packs them: reg 0 = C(2k)[0,1], reg 1 = C(2k)[2,3], reg 2 = C(2k+1)[0,1], reg 3 = C(2k+1)[2,3].
TEST(CudaFragments, AccumulatorsReusedAsAOperand) {
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const RowCol a = mma_a_coord(lane, 2 * reg + half);
        const RowCol c = mma_c_coord(lane, 2 * (reg & 1) + half);
        EXPECT_EQ(a.row, c.row);
        EXPECT_EQ(a.col, c.col + 8 * (reg >> 1));
      }
}

// ldmatrix.x4 with the kernels' lane addresses delivers exactly the mma fragments.
TEST(CudaFragments, LdmatrixAddressesProduceTheFragments) {
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        // A: register reg = matrix reg; the lane receives row lane/4, column 2(lane%4)+half of it.
        const RowCol held = ldmatrix_holds(lane, half, false);
        const RowCol row_a = ldmatrix_a_addr(8 * reg + held.row);
        const RowCol want_a = mma_a_coord(lane, 2 * reg + half);
        EXPECT_EQ(row_a.row, want_a.row);
        EXPECT_EQ(row_a.col + held.col, want_a.col);
        // B from [n][k] (K): register reg = b(reg % 2) of n-tile reg / 2.
        const RowCol row_b = ldmatrix_b_addr(8 * reg + held.row);       // {n, k}
        const RowCol want_b = mma_b_coord(lane, 2 * (reg % 2) + half);  // {k, n}
        EXPECT_EQ(row_b.row, want_b.col + 8 * (reg / 2));
        EXPECT_EQ(row_b.col + held.col, want_b.row);
        // B from [k][n] with .trans (V): the lane receives the transpose's element.
        const RowCol held_t = ldmatrix_holds(lane, half, true);       // {row, col} of the stored matrix
        const RowCol row_t = ldmatrix_bt_addr(8 * reg + held_t.row);  // {k, n}
        EXPECT_EQ(row_t.row, want_b.row);
        EXPECT_EQ(row_t.col + held_t.col, want_b.col + 8 * (reg / 2));
      }
}

// ---- emulated data path: swizzled smem -> ldmatrix -> mma ---------------------------------------

// A warp's ldmatrix.x4 (optionally .trans) from a swizzled [rows][dim] tile: addr(lane) gives the
// (row, col) of the 8-element segment lane addresses. Returns regs[lane][reg][half].
template <class AddrFn>
std::vector<std::array<std::array<float, 2>, 4>> ldmatrix(const std::vector<float>& smem, int dim, int row0, int col0,
                                                          bool trans, AddrFn addr) {
  std::vector<std::array<std::array<float, 2>, 4>> out(32);
  for (int lane = 0; lane < 32; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const RowCol held = ldmatrix_holds(lane, half, trans);  // element of matrix reg
        const RowCol seg = addr(8 * reg + held.row);
        out[lane][reg][half] = smem[swizzle(row0 + seg.row, col0 + seg.col + held.col, dim)];
      }
  return out;
}

TEST(CudaFragments, EmulatedWarpProductsMatchPlainMatmul) {
  constexpr int D = 64, N = 16;  // one k-step chain over D, two n-tiles of keys
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dist(-4, 4);
  std::vector<float> q(16 * D), k(N * D), v(N * D), sq(16 * D), sk(N * D), sv(N * D);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < D; ++c) sq[swizzle(r, c, D)] = q[r * D + c] = float(dist(rng));
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < D; ++c) {
      sk[swizzle(r, c, D)] = k[r * D + c] = float(dist(rng));
      sv[swizzle(r, c, D)] = v[r * D + c] = float(dist(rng));
    }
  // S = Q K^T as warp_qk computes it.
  float s[2][32][4] = {};
  for (int kk = 0; kk < D / 16; ++kk) {
    auto a = ldmatrix(sq, D, 0, kk * 16, false, ldmatrix_a_addr);
    auto b = ldmatrix(sk, D, 0, kk * 16, false, ldmatrix_b_addr);
    for (int nt = 0; nt < 2; ++nt) {
      // mma: D[row][col] += sum_k A[row][k] B[k][col] with the ISA's fragment coordinates.
      float A[16][16], B[16][8];
      for (int lane = 0; lane < 32; ++lane) {
        for (int e = 0; e < 8; ++e) A[mma_a_coord(lane, e).row][mma_a_coord(lane, e).col] = a[lane][e / 2][e % 2];
        for (int e = 0; e < 4; ++e)
          B[mma_b_coord(lane, e).row][mma_b_coord(lane, e).col] = b[lane][2 * nt + e / 2][e % 2];
      }
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 4; ++e) {
          const RowCol c = mma_c_coord(lane, e);
          for (int x = 0; x < 16; ++x) s[nt][lane][e] += A[c.row][x] * B[x][c.col];
        }
    }
  }
  for (int lane = 0; lane < 32; ++lane)
    for (int nt = 0; nt < 2; ++nt)
      for (int e = 0; e < 4; ++e) {
        const RowCol c = mma_c_coord(lane, e);
        float want = 0;
        for (int x = 0; x < D; ++x) want += q[c.row * D + x] * k[(nt * 8 + c.col) * D + x];
        ASSERT_EQ(s[nt][lane][e], want) << "lane " << lane << " n-tile " << nt << " e " << e;
      }
  // O = S V as warp_pv computes it: S's accumulators repacked as A, V through ldmatrix.trans.
  std::vector<float> o(16 * D, 0.f);
  for (int d2 = 0; d2 < D / 16; ++d2) {
    auto b = ldmatrix(sv, D, 0, d2 * 16, true, ldmatrix_bt_addr);
    for (int nt = 0; nt < 2; ++nt) {
      float A[16][16], B[16][8];
      for (int lane = 0; lane < 32; ++lane) {
        const float regs[4][2] = {{s[0][lane][0], s[0][lane][1]},
                                  {s[0][lane][2], s[0][lane][3]},
                                  {s[1][lane][0], s[1][lane][1]},
                                  {s[1][lane][2], s[1][lane][3]}};
        for (int e = 0; e < 8; ++e) A[mma_a_coord(lane, e).row][mma_a_coord(lane, e).col] = regs[e / 2][e % 2];
        for (int e = 0; e < 4; ++e)
          B[mma_b_coord(lane, e).row][mma_b_coord(lane, e).col] = b[lane][2 * nt + e / 2][e % 2];
      }
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 4; ++e) {
          const RowCol c = mma_c_coord(lane, e);
          for (int x = 0; x < 16; ++x) o[c.row * D + d2 * 16 + nt * 8 + c.col] += A[c.row][x] * B[x][c.col];
        }
    }
  }
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < D; ++c) {
      float want = 0;
      for (int j = 0; j < N; ++j) {
        float sc = 0;
        for (int x = 0; x < D; ++x) sc += q[r * D + x] * k[j * D + x];
        want += sc * v[j * D + c];
      }
      ASSERT_EQ(o[r * D + c], want) << r << "," << c;
    }
}

// ---- swizzle ----------------------------------------------------------------------------------------

TEST(CudaSwizzle, BijectiveAndConflictFreeForLdmatrix) {
  for (int dim : {64, 128, 256}) {
    std::set<int> seen;
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < dim; ++c) {
        const int a = swizzle(r, c, dim);
        EXPECT_EQ(a / dim, r);
        seen.insert(a);
      }
    EXPECT_EQ(seen.size(), std::size_t(64 * dim));
    // One ldmatrix matrix: 8 consecutive rows (starting at a multiple of 8) read the same 16-byte chunk;
    // 16-byte bank groups are (byte address / 16) % 8.
    for (int r0 = 0; r0 < 64; r0 += 8)
      for (int c = 0; c < dim; c += 8) {
        std::set<int> groups;
        for (int r = r0; r < r0 + 8; ++r) groups.insert((swizzle(r, c, dim) * 2 / 16) % 8);
        EXPECT_EQ(groups.size(), 8u) << "dim " << dim << " rows " << r0 << " col " << c;
      }
  }
}

TEST(CudaSwizzle, LaneOffsetsEqualTheSwizzle) {
  for (int dim : {64, 128, 256})
    for (int row = 0; row < 128; ++row)
      for (int c0 = 0; c0 < 2; ++c0)
        for (int kk = 0; kk < dim / 16; ++kk)
          ASSERT_EQ(tiled_byte_offset(row, c0, kk, dim), 2 * swizzle(row, 16 * kk + 8 * c0, dim))
              << "dim " << dim << " row " << row << " c0 " << c0 << " kk " << kk;
}

// ---- tile schedule ----------------------------------------------------------------------------------

// A random window of up to 40 keys on each side (-1: unbounded), every third trial causal.
detail::ScoreRule random_window(std::mt19937& rng, int trial) {
  std::uniform_int_distribution<int> w(-1, 40);
  detail::ScoreRule rule;
  rule.window_left = w(rng);
  rule.window_right = trial % 3 == 0 ? 0 : w(rng);
  return rule;
}

TEST(CudaTiles, ScheduleSkipsOnlyInvisibleTilesAndMasksOnlyWhereNeeded) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 400; ++trial) {
    const detail::ScoreRule rule = random_window(rng, trial);
    std::uniform_int_distribution<int> len(1, 300);
    const std::int64_t sq = len(rng), sk = std::uniform_int_distribution<int>(0, 300)(rng);
    const detail::Mask m = rule.mask(sq, sk);
    for (std::int64_t rows : {16, 64, 128})
      for (std::int64_t kt : {32, 64}) {
        for (std::int64_t i0 = 0; i0 < m.seqlen_q; i0 += rows) {
          const TileRange tr = key_tiles(m, i0, rows, kt);
          const std::int64_t n_tiles = (m.seqlen_k + kt - 1) / kt;
          for (std::int64_t t = 0; t < n_tiles; ++t) {
            bool any = false, all = true;
            for (std::int64_t i = i0; i < std::min(i0 + rows, m.seqlen_q); ++i)
              for (std::int64_t j = t * kt; j < (t + 1) * kt; ++j) {
                const bool vis = j < m.seqlen_k && m.first_key(i) <= j && j < m.end_key(i);
                EXPECT_EQ(vis, visible(m, i, j));
                any |= vis;
                all &= vis;
              }
            const bool in_range = tr.first <= t && t < tr.end;
            if (any) EXPECT_TRUE(in_range) << "tile " << t << " has visible keys but is skipped";
            if (in_range && !tile_needs_mask(m, i0, rows, kt, t))
              EXPECT_TRUE(all) << "unmasked tile " << t << " hides a masked key";
          }
          EXPECT_LE(tr.end, n_tiles + (tr.first >= tr.end ? 1 : 0));
        }
      }
  }
}

// The backward's key blocks visit the rows query_rows gives: every row that sees a key of the block is
// inside, and the range is no wider than from the first such row to the last.
TEST(CudaTiles, QueryRowsHoldEveryRowThatSeesTheKeys) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 400; ++trial) {
    const detail::ScoreRule rule = random_window(rng, trial);
    std::uniform_int_distribution<int> len(0, 200);
    const detail::Mask m = rule.mask(len(rng), 1 + len(rng));
    for (std::int64_t bk : {16, 64})
      for (std::int64_t j0 = 0; j0 < m.seqlen_k; j0 += bk) {
        const std::int64_t j1 = std::min(j0 + bk, m.seqlen_k);
        const RowRange r = query_rows(m, j0, j1);
        std::int64_t first = m.seqlen_q, last = -1;
        for (std::int64_t i = 0; i < m.seqlen_q; ++i)
          for (std::int64_t j = j0; j < j1; ++j)
            if (visible(m, i, j)) {
              first = std::min(first, i);
              last = std::max(last, i);
            }
        if (last < 0) {
          EXPECT_GE(r.begin, r.end) << "keys [" << j0 << ", " << j1 << ") seen by no row";
          continue;
        }
        EXPECT_EQ(r.begin, first) << "keys [" << j0 << ", " << j1 << ")";
        EXPECT_EQ(r.end, last + 1) << "keys [" << j0 << ", " << j1 << ")";
      }
  }
}

TEST(CudaTiles, CausalSquareSkipsTheUpperTriangle) {
  detail::ScoreRule causal;
  causal.window_right = 0;
  const detail::Mask m = causal.mask(1024, 1024);
  std::int64_t visited = 0;
  for (std::int64_t i0 = 0; i0 < 1024; i0 += 128) {
    const TileRange tr = key_tiles(m, i0, 128, 64);
    visited += tr.end - tr.first;
    EXPECT_EQ(tr.first, 0);
    EXPECT_EQ(tr.end, (i0 + 128) / 64);
  }
  EXPECT_EQ(visited, 2 * (1 + 2 + 3 + 4 + 5 + 6 + 7 + 8));  // 72 of 128 tiles
}

// ---- split-K, packing, varlen, paged ----------------------------------------------------------------

// One split rule for every backend (core/split.hpp): contiguous slices covering [0, keys) in order,
// sizes differing by at most one with the larger first, and the public splitk_slice is that rule.
TEST(CoreSplits, SlicesTileTheKeysLargestFirst) {
  for (std::int64_t keys : {0, 1, 7, 100, 4097})
    for (std::int64_t splits : {1, 2, 3, 8, 33, 200}) {
      std::int64_t next = 0;
      for (std::int64_t w = 0; w < splits; ++w) {
        const KeyRange g = detail::split_slice(keys, splits, w);
        EXPECT_EQ(g.begin, next);
        const std::int64_t size = g.end - g.begin;
        EXPECT_TRUE(size == keys / splits || size == keys / splits + 1) << keys << " / " << splits;
        EXPECT_EQ(size == keys / splits + 1, w < keys % splits);
        EXPECT_EQ(size > 0, w < detail::nonempty_slices(keys, splits) && keys > 0);
        const KeyRange c = splitk_slice(keys, splits, w);
        EXPECT_EQ(g.begin, c.begin);
        EXPECT_EQ(g.end, c.end);
        next = g.end;
      }
      EXPECT_EQ(next, keys);
    }
}

TEST(CudaSplits, HeuristicFillsTheGpuWithoutTinySlices) {
  // The decode benchmark's shape: batch 1, 8 kv heads, one slab of rows each, 132 SMs.
  const std::int64_t s = gpu_num_splits(131072, 8, 132);
  EXPECT_GE(s * 8, 2 * 132);
  EXPECT_GE(131072 / s, 256);
  EXPECT_EQ(gpu_num_splits(100, 8, 132), 1);         // too few keys to split
  EXPECT_EQ(gpu_num_splits(1 << 20, 4096, 132), 1);  // the grid is already full
  EXPECT_EQ(gpu_num_splits(0, 8, 132), 1);
  EXPECT_LE(gpu_num_splits(1 << 24, 1, 132), 128);
  for (std::int64_t keys = 1; keys < 100000; keys = keys * 3 + 1)
    for (std::int64_t blocks : {1, 8, 64, 1000}) {
      const std::int64_t n = gpu_num_splits(keys, blocks, 132);
      EXPECT_GE(n, 1);
      if (n > 1) EXPECT_GE(keys / n, 256);
    }
}

TEST(CudaIndex, PackedRowsEnumerateTheGroup) {
  const std::int64_t group = 4, sq = 3, kvh = 2;
  std::set<std::pair<std::int64_t, std::int64_t>> seen;
  for (std::int64_t r = 0; r < group * sq; ++r) {
    const PackedRow p = unpack_row(r, kvh, group, sq);
    EXPECT_EQ(p.head / group, kvh);  // the query head reads this kv head
    seen.insert({p.head, p.query});
  }
  EXPECT_EQ(seen.size(), std::size_t(group * sq));
}

TEST(CudaIndex, VarlenOffsets) {
  const std::int32_t cu[] = {0, 5, 5, 12};
  EXPECT_EQ(varlen_row(cu, 0, 4), 4);
  EXPECT_EQ(varlen_row(cu, 2, 0), 5);
  EXPECT_EQ(varlen_row(cu, 2, 6), 11);
}

}  // namespace
}  // namespace attn::cuda_detail
