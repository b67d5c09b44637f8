// Ring attention's per-rank arithmetic (src/distributed/ring_block.hpp) without MPI: every rank of a
// ring of R driven in one process, each folding the chunks in the order the ring delivers them, and
// the rows each rank writes compared with attention_tiled on the whole sequence. The MPI transport is
// tested under mpirun (tests/mpi/test_distributed.cpp); this runs in every build, sanitizers included.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "validate/problem.hpp"
#include "distributed/ring_block.hpp"
#include "distributed_support.hpp"

namespace attn::test {
namespace {

struct RingCase {
  int ranks;
  bool zigzag, uneven;
  std::int64_t sq, sk;  // the whole sequences
  Shape shape;          // b, h, hk, d and the mask options (its sq, sk unused)
  std::int64_t dv;
};

struct RankResult {
  std::vector<double> out, lse;
  std::vector<detail::Segment> segs;
  detail::BlockCounts counts;
};

// Every rank's out and lse, each rank folding chunks r, r - 1, ... as the ring delivers them.
template <class T>
std::vector<RankResult> run_ring(const RingCase& c, const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                 const AttentionOptions& opts) {
  const std::int64_t unit = c.zigzag ? 2 : 1;
  const auto rows_q = split_rows(c.sq, c.ranks, c.uneven, unit), rows_k = split_rows(c.sk, c.ranks, c.uneven, unit);
  std::vector<Tensor<T>> ks, vs;
  for (int r = 0; r < c.ranks; ++r) {
    const auto segs = detail::ring_segments(c.zigzag, rows_k, r);
    ks.push_back(rank_rows(k, segs));
    vs.push_back(rank_rows(v, segs));
  }
  std::vector<RankResult> res(static_cast<std::size_t>(c.ranks));
  for (int r = 0; r < c.ranks; ++r) {
    RankResult& rr = res[static_cast<std::size_t>(r)];
    rr.segs = detail::ring_segments(c.zigzag, rows_q, r);
    const Tensor<T> qr = rank_rows(q, rr.segs);
    Tensor<T> out(q.b, qr.s, q.h, c.dv);
    using L = detail::Acc<T>;
    std::vector<L> lse(static_cast<std::size_t>(q.b * q.h * qr.s));
    const TensorView lv = TensorView::contiguous(lse.data(), q.b, q.h, qr.s);
    const TensorView ov = out.view();
    const detail::Problem p = detail::validate("test", qr.view(), ks[static_cast<std::size_t>(r)].view(),
                                               vs[static_cast<std::size_t>(r)].view(), &ov, opts, &lv);
    detail::RingAccumulator acc(p, rr.segs, c.sq, c.sk);
    for (int s = 0; s < c.ranks; ++s) {
      const int owner = (r - s + c.ranks) % c.ranks;
      const auto k_segs = detail::ring_segments(c.zigzag, rows_k, owner);
      acc.fold_chunk(ks[static_cast<std::size_t>(owner)].view(), vs[static_cast<std::size_t>(owner)].view(), k_segs,
                     rr.counts);
    }
    acc.finish();
    for (const T& x : out.data) rr.out.push_back(detail::load<double>(x));
    for (const L& x : lse) rr.lse.push_back(x);
  }
  return res;
}

class RingF64 : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingF64, EveryRankMatchesTheWholeSequence) {
  const RingCase& c = GetParam();
  const Shape& s = c.shape;
  const ShapeOptions options(s, 0.3f);
  const AttentionOptions& opts = options.opts;
  const auto q = random_tensor<double>(s.b, c.sq, s.h, s.d, 1), k = random_tensor<double>(s.b, c.sk, s.hk, s.d, 2);
  const auto v = random_tensor<double>(s.b, c.sk, s.hk, c.dv, 3);
  Tensor<double> whole(s.b, c.sq, s.h, c.dv);
  std::vector<double> whole_lse(static_cast<std::size_t>(s.b * s.h * c.sq));
  const TensorView wl = TensorView::contiguous(whole_lse.data(), s.b, s.h, c.sq);
  attention_tiled(q.view(), k.view(), v.view(), whole.view(), opts, {}, &wl);

  const auto ranks = run_ring(c, q, k, v, opts);
  for (int r = 0; r < c.ranks; ++r) {
    const RankResult& rr = ranks[static_cast<std::size_t>(r)];
    EXPECT_LE(max_error(rr.out, rank_rows(whole, rr.segs).data), test::kF64Tolerance) << "rank " << r;
    EXPECT_LE(max_error(rr.lse, rank_lse(whole_lse, s.b, s.h, c.sq, rr.segs)), test::kF64Tolerance) << "rank " << r;
  }
}

std::vector<RingCase> ring_cases() {
  const std::vector<Shape> shapes = {
      {2, 0, 0, 4, 2, 8, false},
      {1, 0, 0, 4, 2, 8, true},
      {1, 0, 0, 2, 1, 5, false, 7, 3},                    // sliding window, odd head dim
      {2, 0, 0, 4, 4, 8, true, -1, -1, 2.0, true, true},  // causal + softcap + ALiBi + sinks
      {1, 0, 0, 3, 1, 6, false, 0, -1, 0, true, false},   // keys from the diagonal on only
  };
  std::vector<RingCase> cases;
  for (int R : {1, 2, 3, 4})
    for (bool zig : {false, true})
      for (bool uneven : {false, true})
        for (const Shape& s : shapes) {
          cases.push_back({R, zig, uneven, 48, 48, s, s.d});
          if (!zig) cases.push_back({R, zig, uneven, 30, 52, s, s.d + 3});  // seqlen_q != seqlen_k, d_v != d
        }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingF64, ::testing::ValuesIn(ring_cases()),
                         [](const ::testing::TestParamInfo<RingCase>& info) {
                           const RingCase& c = info.param;
                           return "R" + std::to_string(c.ranks) + (c.zigzag ? "_zigzag" : "_contiguous") +
                                  (c.uneven ? "_uneven_" : "_even_") + std::to_string(c.sq) + "x" +
                                  std::to_string(c.sk) + "_" + std::to_string(info.index);
                         });

// Causal zigzag: every rank computes the same number of blocks and skips the hidden ones; the
// contiguous layout gives rank 0 the least work.
TEST(RingBlocks, ZigzagBalancesCausalWork) {
  RingCase c{4, true, false, 64, 64, {1, 0, 0, 2, 1, 4, true}, 4};
  std::vector<float> slopes;
  const AttentionOptions opts = options_of(c.shape, 0, slopes);
  const auto q = random_tensor<double>(1, 64, 2, 4, 4), k = random_tensor<double>(1, 64, 1, 4, 5),
             v = random_tensor<double>(1, 64, 1, 4, 6);
  const auto zig = run_ring(c, q, k, v, opts);
  for (const RankResult& rr : zig) {
    EXPECT_EQ(rr.counts.computed, zig[0].counts.computed);
    EXPECT_EQ(rr.counts.computed + rr.counts.skipped, 4 * c.ranks);  // 2 x 2 segment pairs per step
    EXPECT_GT(rr.counts.skipped, 0);
  }
  c.zigzag = false;
  const auto flat = run_ring(c, q, k, v, opts);
  EXPECT_EQ(flat[0].counts.computed, 1);  // only its own chunk's diagonal block
  EXPECT_EQ(flat[3].counts.computed, 4);
}

// bf16: the blocks' partial outputs are kept in f32, so the ring's error against the f64
// oracle stays within twice the textbook method's at bf16.
TEST(RingBlocks, Bf16WithinTwiceTheTextbookError) {
  for (bool causal : {false, true}) {
    RingCase c{3, true, false, 96, 96, {1, 0, 0, 4, 2, 16, causal}, 16};
    std::vector<float> slopes;
    const AttentionOptions opts = options_of(c.shape, 0, slopes);
    const auto p = random_qkv<bf16_t>(1, 96, 96, 4, 2, 16, 7);
    Tensor<double> oracle(1, 96, 4, 16);
    oracle.data = oracle_forward(p, opts);
    const double base = max_error(textbook_forward(p, opts), oracle.data);
    for (const RankResult& rr : run_ring(c, p.q, p.k, p.v, opts))
      EXPECT_TRUE(meets_textbook_rule(max_error(rr.out, rank_rows(oracle, rr.segs).data), base)) << "causal " << causal;
  }
}

TEST(RingSegments, ZigzagChunksTileTheSequence) {
  const std::vector<std::int64_t> lengths = {4, 6, 2};  // chunks of 2, 3, 1, then 1, 3, 2 rows
  std::vector<int> owner(12, -1);
  for (int r = 0; r < 3; ++r)
    for (const auto& s : detail::ring_segments(true, lengths, r))
      for (std::int64_t i = 0; i < s.length; ++i) {
        EXPECT_EQ(owner[static_cast<std::size_t>(s.global_begin + i)], -1);
        owner[static_cast<std::size_t>(s.global_begin + i)] = r;
      }
  EXPECT_EQ(owner, (std::vector<int>{0, 0, 1, 1, 1, 2, 2, 1, 1, 1, 0, 0}));
}

}  // namespace
}  // namespace attn::test
