// Context parallelism under mpirun (ctest runs this binary on 1, 2, 3 and 4 ranks): ring attention
// and sharded decode against attention_tiled / attention_decode on the whole sequence, the merge
// operation's laws, and bad input on one rank failing on every rank. Every rank builds the same whole
// tensors from the same seeds and takes its own rows.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "attn/decode.hpp"
#include "attn/distributed.hpp"
#include "distributed/shard_merge.hpp"
#include "distributed_support.hpp"

namespace attn::test {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Whether every rank's bytes equal rank 0's.
bool same_on_every_rank(const void* data, std::size_t bytes) {
  std::vector<char> root(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  MPI_Bcast(root.data(), static_cast<int>(bytes), MPI_CHAR, 0, MPI_COMM_WORLD);
  int same = std::memcmp(root.data(), data, bytes) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

class FailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::printf("[rank %d] %s:%d: Failure\n%s\n", world_rank(), r.file_name() ? r.file_name() : "?", r.line_number(),
                  r.summary());
  }
};

struct RingRun {
  std::vector<detail::Segment> segs;
  Tensor<double> out;
  std::vector<double> lse;
  RingStats stats;
};

// This rank's rows of q, k, v, through ring_attention.
template <class T>
RingRun ring(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, std::int64_t dv, const AttentionOptions& opts,
             RingLayout layout, bool uneven) {
  const bool zig = layout == RingLayout::zigzag;
  const int R = world_size(), r = world_rank();
  const auto rows_q = split_rows(q.s, R, uneven, zig ? 2 : 1), rows_k = split_rows(k.s, R, uneven, zig ? 2 : 1);
  RingRun run{detail::ring_segments(zig, rows_q, r), Tensor<double>(q.b, 1, 1, 1), {}, {}};
  const auto k_segs = detail::ring_segments(zig, rows_k, r);
  const Tensor<T> qr = rank_rows(q, run.segs), kr = rank_rows(k, k_segs), vr = rank_rows(v, k_segs);
  Tensor<T> out(q.b, qr.s, q.h, dv);
  std::vector<detail::Acc<T>> lse(static_cast<std::size_t>(q.b * q.h * qr.s));
  const TensorView lv = TensorView::contiguous(lse.data(), q.b, q.h, qr.s);
  ring_attention(MPI_COMM_WORLD, qr.view(), kr.view(), vr.view(), out.view(), opts, {layout}, &lv, &run.stats);
  run.out = to_f64(out);
  run.lse.assign(lse.begin(), lse.end());
  return run;
}

struct MaskCase {
  const char* name;
  Shape shape;
};

const MaskCase kMasks[] = {
    {"none", {2, 0, 0, 4, 2, 8, false}},
    {"causal", {1, 0, 0, 4, 2, 8, true}},
    {"window", {1, 0, 0, 2, 1, 5, false, 7, 3}},
    {"causal_softcap_alibi_sinks", {2, 0, 0, 4, 4, 8, true, -1, -1, 2.0, true, true}},
};

TEST(Ring, F64MatchesTheWholeSequenceOnEveryRank) {
  for (const MaskCase& m : kMasks)
    for (RingLayout layout : {RingLayout::contiguous, RingLayout::zigzag})
      for (bool uneven : {false, true})
        for (std::int64_t sq : {48, 30}) {
          if (layout == RingLayout::zigzag && sq != 48) continue;
          const Shape& s = m.shape;
          const std::int64_t sk = 48, dv = sq == 48 ? s.d : s.d + 3;
          const ShapeOptions options(s, 0.3f);
          const AttentionOptions& opts = options.opts;
          const auto q = random_tensor<double>(s.b, sq, s.h, s.d, 1), k = random_tensor<double>(s.b, sk, s.hk, s.d, 2),
                     v = random_tensor<double>(s.b, sk, s.hk, dv, 3);
          Tensor<double> whole(s.b, sq, s.h, dv);
          std::vector<double> whole_lse(static_cast<std::size_t>(s.b * s.h * sq));
          const TensorView wl = TensorView::contiguous(whole_lse.data(), s.b, s.h, sq);
          attention_tiled(q.view(), k.view(), v.view(), whole.view(), opts, {}, &wl);
          const RingRun run = ring(q, k, v, dv, opts, layout, uneven);
          const std::string what = std::string(m.name) + (layout == RingLayout::zigzag ? " zigzag" : " contiguous") +
                                   (uneven ? " uneven" : " even") + " sq " + std::to_string(sq);
          EXPECT_LE(max_error(run.out.data, rank_rows(whole, run.segs).data), test::kF64Tolerance) << what;
          EXPECT_LE(max_error(run.lse, rank_lse(whole_lse, s.b, s.h, sq, run.segs)), test::kF64Tolerance) << what;
        }
}

TEST(Ring, ZigzagGivesEveryRankTheSameCausalWork) {
  const Shape s{1, 0, 0, 2, 1, 4, true};
  std::vector<float> slopes;
  const AttentionOptions opts = options_of(s, 0, slopes);
  const std::int64_t S = 16 * world_size();
  const auto q = random_tensor<double>(1, S, 2, 4, 4), k = random_tensor<double>(1, S, 1, 4, 5),
             v = random_tensor<double>(1, S, 1, 4, 6);
  const RingRun run = ring(q, k, v, 4, opts, RingLayout::zigzag, false);
  EXPECT_TRUE(same_on_every_rank(&run.stats.blocks_computed, sizeof(std::int64_t)));
  EXPECT_EQ(run.stats.blocks_computed + run.stats.blocks_skipped, 4 * world_size());
  if (world_size() > 1) EXPECT_GT(run.stats.blocks_skipped, 0);
}

// The thread-count tests' problem (f32, causal, 4 heads over 2 kv heads, d 16, 24 rows per rank): what
// run(q, k, v, dout, opts) gives with 1 and with 2 threads.
template <class F>
auto with_one_and_two_threads(F&& run) {
  AttentionOptions opts;
  opts.causal = true;
  const std::int64_t S = 24 * world_size();
  const auto q = random_tensor<float>(1, S, 4, 16, 7), k = random_tensor<float>(1, S, 2, 16, 8),
             v = random_tensor<float>(1, S, 2, 16, 9), dout = random_tensor<float>(1, S, 4, 16, 10);
  opts.num_threads = 1;
  auto one = run(q, k, v, dout, opts);
  opts.num_threads = 2;
  return std::pair{std::move(one), run(q, k, v, dout, opts)};
}

TEST(Ring, ThreadCountsGiveTheSameBits) {
  const auto [one, two] = with_one_and_two_threads(
      [](auto& q, auto& k, auto& v, auto&, auto& opts) { return ring(q, k, v, 16, opts, RingLayout::zigzag, false); });
  EXPECT_EQ(one.out.data, two.out.data);
}

TEST(Ring, Bf16WithinTwiceTheTextbookError) {
  const Shape s{1, 0, 0, 4, 2, 16, true};
  std::vector<float> slopes;
  const AttentionOptions opts = options_of(s, 0, slopes);
  const std::int64_t S = 32 * world_size();
  const auto p = random_qkv<bf16_t>(1, S, S, 4, 2, 16, 7);
  Tensor<double> oracle(1, S, 4, 16);
  oracle.data = oracle_forward(p, opts);
  const RingRun run = ring(p.q, p.k, p.v, 16, opts, RingLayout::zigzag, false);
  EXPECT_TRUE(meets_textbook_rule(max_error(run.out.data, rank_rows(oracle, run.segs).data),
                                  max_error(textbook_forward(p, opts), oracle.data)));
}

TEST(Ring, BadInputOnOneRankFailsOnEveryRank) {
  const int R = world_size(), last = R - 1;
  const std::int64_t S = 8 * R;
  const auto q = random_tensor<double>(1, S, 4, 8, 1), k = random_tensor<double>(1, S, 2, 8, 2),
             v = random_tensor<double>(1, S, 2, 8, 3);
  const auto segs = detail::ring_segments(false, split_rows(S, R, false, 1), world_rank());
  const Tensor<double> qr = rank_rows(q, segs), kr = rank_rows(k, segs), vr = rank_rows(v, segs);
  Tensor<double> out(1, qr.s, 4, 8);
  for (double& x : out.data) x = 7;
  // The last rank's out has the wrong head_dim: its own validation fails.
  Tensor<double> bad_out(1, qr.s, 4, world_rank() == last ? 9 : 8);
  std::string msg = invalid_argument_message(
      [&] { ring_attention(MPI_COMM_WORLD, qr.view(), kr.view(), vr.view(), bad_out.view()); });
  EXPECT_NE(msg.find("attn::ring_attention: out"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(rank " + std::to_string(last) + ")"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_every_rank(msg.data(), msg.size())) << msg;
  // Valid on each rank, but the ranks disagree on the options.
  AttentionOptions opts;
  opts.causal = world_rank() == last;
  msg = invalid_argument_message(
      [&] { ring_attention(MPI_COMM_WORLD, qr.view(), kr.view(), vr.view(), out.view(), opts); });
  if (R > 1) {
    EXPECT_NE(msg.find("opts: window_right (causal, window) must be the same on every rank"), std::string::npos) << msg;
    EXPECT_TRUE(same_on_every_rank(msg.data(), msg.size())) << msg;
  } else {
    EXPECT_EQ(msg, "");
  }
  for (double& x : out.data) x = 7;
  // An odd chunk for the zigzag layout, on the last rank only.
  const Tensor<double> q_odd = random_tensor<double>(1, world_rank() == last ? 3 : 2, 4, 8, 4);
  Tensor<double> out_odd(1, q_odd.s, 4, 8);
  msg = invalid_argument_message([&] {
    ring_attention(MPI_COMM_WORLD, q_odd.view(), kr.view(), vr.view(), out_odd.view(), {}, {RingLayout::zigzag});
  });
  EXPECT_NE(msg.find("seqlen must be even with the zigzag layout"), std::string::npos) << msg;
  for (double x : out.data) EXPECT_EQ(x, 7);  // nothing written by the failed calls
}

// ---- ring backward ----

struct GradRun {
  std::vector<detail::Segment> q_segs, k_segs;
  Tensor<double> dq{1, 1, 1, 1}, dk{1, 1, 1, 1}, dv{1, 1, 1, 1};
  std::vector<double> dsink;
};

// The whole forward on every rank, then this rank's rows through ring_attention_backward.
template <class T>
GradRun ring_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& dout,
                      const AttentionOptions& opts, RingLayout layout, bool uneven) {
  const bool zig = layout == RingLayout::zigzag;
  const int R = world_size(), r = world_rank();
  Tensor<T> out(q.b, q.s, q.h, v.d);
  std::vector<detail::Acc<T>> lse(static_cast<std::size_t>(q.b * q.h * q.s));
  const TensorView lv = TensorView::contiguous(lse.data(), q.b, q.h, q.s);
  attention_tiled(q.view(), k.view(), v.view(), out.view(), opts, {}, &lv);
  GradRun g;
  g.q_segs = detail::ring_segments(zig, split_rows(q.s, R, uneven, zig ? 2 : 1), r);
  g.k_segs = detail::ring_segments(zig, split_rows(k.s, R, uneven, zig ? 2 : 1), r);
  const Tensor<T> qr = rank_rows(q, g.q_segs), kr = rank_rows(k, g.k_segs), vr = rank_rows(v, g.k_segs),
                  outr = rank_rows(out, g.q_segs), doutr = rank_rows(dout, g.q_segs);
  const std::vector<double> lse64(lse.begin(), lse.end());
  const std::vector<double> mine = rank_lse(lse64, q.b, q.h, q.s, g.q_segs);
  std::vector<detail::Acc<T>> lse_r(mine.begin(), mine.end());
  Tensor<T> dq(q.b, qr.s, q.h, q.d), dk(k.b, kr.s, k.h, k.d), dv(v.b, vr.s, v.h, v.d);
  std::vector<detail::Acc<T>> dsink(static_cast<std::size_t>(q.h));
  const TensorView dsv = TensorView::contiguous(dsink.data(), 1, q.h, 1);
  ring_attention_backward(MPI_COMM_WORLD, qr.view(), kr.view(), vr.view(), outr.view(), doutr.view(),
                          TensorView::contiguous(lse_r.data(), q.b, q.h, qr.s), dq.view(), dk.view(), dv.view(), opts,
                          {layout}, opts.sinks ? &dsv : nullptr);
  g.dq = to_f64(dq), g.dk = to_f64(dk), g.dv = to_f64(dv);
  g.dsink.assign(dsink.begin(), dsink.end());
  return g;
}

TEST(RingBackward, F64MatchesTheWholeBackwardOnEveryRank) {
  for (const MaskCase& m : kMasks)
    for (RingLayout layout : {RingLayout::contiguous, RingLayout::zigzag})
      for (bool uneven : {false, true}) {
        const Shape& s = m.shape;
        const ShapeOptions options(s, 0.3f);
        const AttentionOptions& opts = options.opts;
        const std::int64_t S = 48;
        const auto q = random_tensor<double>(s.b, S, s.h, s.d, 1), k = random_tensor<double>(s.b, S, s.hk, s.d, 2),
                   v = random_tensor<double>(s.b, S, s.hk, s.d, 3), dout = random_tensor<double>(s.b, S, s.h, s.d, 4);
        Tensor<double> out(s.b, S, s.h, s.d), dq(s.b, S, s.h, s.d), dk(s.b, S, s.hk, s.d), dv(s.b, S, s.hk, s.d);
        std::vector<double> lse(static_cast<std::size_t>(s.b * s.h * S)), dsink(static_cast<std::size_t>(s.h));
        const TensorView lv = TensorView::contiguous(lse.data(), s.b, s.h, S),
                         dsv = TensorView::contiguous(dsink.data(), 1, s.h, 1);
        attention_tiled(q.view(), k.view(), v.view(), out.view(), opts, {}, &lv);
        attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lv, dq.view(), dk.view(), dv.view(),
                           opts, {}, s.sinks ? &dsv : nullptr);
        const GradRun g = ring_backward(q, k, v, dout, opts, layout, uneven);
        const std::string what = std::string(m.name) + (layout == RingLayout::zigzag ? " zigzag" : " contiguous") +
                                 (uneven ? " uneven" : " even");
        EXPECT_LE(max_error(g.dq.data, rank_rows(dq, g.q_segs).data), test::kF64Tolerance) << what;
        EXPECT_LE(max_error(g.dk.data, rank_rows(dk, g.k_segs).data), test::kF64Tolerance) << what;
        EXPECT_LE(max_error(g.dv.data, rank_rows(dv, g.k_segs).data), test::kF64Tolerance) << what;
        if (s.sinks) EXPECT_LE(max_error(g.dsink, dsink), test::kF64Tolerance) << what;
      }
}

TEST(RingBackward, ThreadCountsGiveTheSameBits) {
  const auto [one, two] = with_one_and_two_threads([](auto& q, auto& k, auto& v, auto& dout, auto& opts) {
    return ring_backward(q, k, v, dout, opts, RingLayout::zigzag, false);
  });
  EXPECT_EQ(one.dq.data, two.dq.data);
  EXPECT_EQ(one.dk.data, two.dk.data);
  EXPECT_EQ(one.dv.data, two.dv.data);
}

TEST(RingBackward, BadInputOnOneRankFailsOnEveryRank) {
  const int last = world_size() - 1;
  const auto q = random_tensor<double>(1, 8, 4, 8, 1), k = random_tensor<double>(1, 8, 2, 8, 2),
             v = random_tensor<double>(1, 8, 2, 8, 3);
  Tensor<double> out(1, 8, 4, 8), dq(1, 8, 4, 8), dk(1, 8, 2, world_rank() == last ? 7 : 8), dv(1, 8, 2, 8);
  for (double& x : dq.data) x = 7;
  std::vector<double> lse(32);
  const std::string msg = invalid_argument_message([&] {
    ring_attention_backward(MPI_COMM_WORLD, q.view(), k.view(), v.view(), out.view(), out.view(),
                            TensorView::contiguous(lse.data(), 1, 4, 8), dq.view(), dk.view(), dv.view());
  });
  EXPECT_NE(msg.find("attn::ring_attention_backward: dk"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(rank " + std::to_string(last) + ")"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_every_rank(msg.data(), msg.size())) << msg;
  for (double x : dq.data) EXPECT_EQ(x, 7);
}

// ---- sharded decode ----

// A whole cache of `lengths[b]` keys per sequence, and this rank's slice of it: sequence b's keys are
// cut by slices[b] (one length per rank), rank r holding the r-th run.
struct ShardedCache {
  Tensor<double> k, v;  // this rank's slice, [batch, max slice, kv_heads, d]
  std::vector<std::int32_t> seqlens;
};

ShardedCache slice_of(const Tensor<double>& k, const Tensor<double>& v,
                      const std::vector<std::vector<std::int64_t>>& slices) {
  const int r = world_rank();
  std::int64_t longest = 1;
  for (const auto& s : slices) longest = std::max(longest, s[static_cast<std::size_t>(r)]);
  ShardedCache c{Tensor<double>(k.b, longest, k.h, k.d), Tensor<double>(v.b, longest, v.h, v.d), {}};
  for (std::int64_t b = 0; b < k.b; ++b) {
    std::int64_t start = 0;
    for (int x = 0; x < r; ++x) start += slices[static_cast<std::size_t>(b)][static_cast<std::size_t>(x)];
    const std::int64_t n = slices[static_cast<std::size_t>(b)][static_cast<std::size_t>(r)];
    c.seqlens.push_back(static_cast<std::int32_t>(n));
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t h = 0; h < k.h; ++h) {
        for (std::int64_t x = 0; x < k.d; ++x)
          c.k.at(b, j, h, x) = k.data[static_cast<std::size_t>(((b * k.s + start + j) * k.h + h) * k.d + x)];
        for (std::int64_t x = 0; x < v.d; ++x)
          c.v.at(b, j, h, x) = v.data[static_cast<std::size_t>(((b * v.s + start + j) * v.h + h) * v.d + x)];
      }
  }
  return c;
}

// The slice as a paged cache: pages of `page` slots, sequence b's pages in reverse order in the pool.
struct PagedSlice {
  Tensor<double> k, v;
  std::vector<std::int32_t> table;
  std::int64_t max_pages;
};
PagedSlice paged(const ShardedCache& c, std::int64_t page) {
  const std::int64_t per_seq = (c.k.s + page - 1) / page, pages = c.k.b * per_seq;
  PagedSlice p{Tensor<double>(pages, page, c.k.h, c.k.d), Tensor<double>(pages, page, c.v.h, c.v.d), {}, per_seq};
  for (std::int64_t b = 0; b < c.k.b; ++b)
    for (std::int64_t t = 0; t < per_seq; ++t) {
      const std::int64_t slot = pages - 1 - (b * per_seq + t);
      p.table.push_back(static_cast<std::int32_t>(slot));
      for (std::int64_t j = 0; j < page && t * page + j < c.k.s; ++j)
        for (std::int64_t h = 0; h < c.k.h; ++h) {
          for (std::int64_t x = 0; x < c.k.d; ++x)
            p.k.at(slot, j, h, x) =
                c.k.data[static_cast<std::size_t>(((b * c.k.s + t * page + j) * c.k.h + h) * c.k.d + x)];
          for (std::int64_t x = 0; x < c.v.d; ++x)
            p.v.at(slot, j, h, x) =
                c.v.data[static_cast<std::size_t>(((b * c.v.s + t * page + j) * c.v.h + h) * c.v.d + x)];
        }
    }
  return p;
}

TEST(ShardedDecode, F64MatchesTheWholeCacheOnEveryRank) {
  const int R = world_size();
  const std::vector<std::int64_t> lengths = {37, 50, 23};
  // Sequence 0 near-equal, 1 uneven, 2 all on the last rank (the others hold none of it).
  std::vector<std::vector<std::int64_t>> slices = {split_rows(37, R, false, 1), split_rows(50, R, true, 1),
                                                   std::vector<std::int64_t>(static_cast<std::size_t>(R), 0)};
  slices[2].back() = 23;
  const std::int64_t B = 3, H = 4, HK = 2, D = 8, DV = 6;
  const auto q = random_tensor<double>(B, 3, H, D, 11), k = random_tensor<double>(B, 50, HK, D, 12),
             v = random_tensor<double>(B, 50, HK, DV, 13);
  std::vector<std::int32_t> whole_lens(lengths.begin(), lengths.end());
  const ShardedCache mine = slice_of(k, v, slices);
  for (const MaskCase& m : kMasks)
    for (ShardMerge mode : {ShardMerge::rank_order, ShardMerge::allreduce}) {
      Shape s = m.shape;
      s.b = B, s.h = H, s.hk = HK, s.d = D;
      const ShapeOptions options(s, 0.3f);
      const AttentionOptions& opts = options.opts;
      KVCache whole;
      whole.k = k.view(), whole.v = v.view(), whole.seqlens = whole_lens.data();
      Tensor<double> expect(B, 3, H, DV), got(B, 3, H, DV);
      std::vector<double> expect_lse(static_cast<std::size_t>(B * H * 3)), got_lse(expect_lse.size());
      const TensorView el = TensorView::contiguous(expect_lse.data(), B, H, 3),
                       gl = TensorView::contiguous(got_lse.data(), B, H, 3);
      attention_decode(q.view(), whole, expect.view(), opts, {}, &el);
      for (bool is_paged : {false, true}) {
        KVCache slice;
        slice.k = mine.k.view(), slice.v = mine.v.view(), slice.seqlens = mine.seqlens.data();
        const PagedSlice pg = paged(mine, 4);
        if (is_paged) {
          slice.k = pg.k.view(), slice.v = pg.v.view();
          slice.block_table = pg.table.data(), slice.max_pages = pg.max_pages;
        }
        sharded_decode(MPI_COMM_WORLD, q.view(), slice, got.view(), opts, {}, mode, &gl);
        const std::string what = std::string(m.name) + (mode == ShardMerge::allreduce ? " allreduce" : " rank order") +
                                 (is_paged ? " paged" : " contiguous");
        EXPECT_LE(max_error(got.data, expect.data), test::kF64Tolerance) << what;
        EXPECT_LE(max_error(got_lse, expect_lse), test::kF64Tolerance) << what;
        if (mode == ShardMerge::rank_order)
          EXPECT_TRUE(same_on_every_rank(got.data.data(), got.data.size() * sizeof(double))) << what;
      }
    }
}

TEST(ShardedDecode, Bf16CacheWithinTwiceTheTextbookError) {
  const int R = world_size();
  const std::int64_t L = 64 * R;
  const auto p = random_qkv<bf16_t>(1, 1, L, 8, 2, 32, 21);
  const std::vector<double> oracle = oracle_forward(p, {});
  Tensor<bf16_t> got(1, 1, 8, 32);
  const auto segs = detail::ring_segments(false, split_rows(L, R, true, 1), world_rank());
  const Tensor<bf16_t> ks = rank_rows(p.k, segs), vs = rank_rows(p.v, segs);
  const std::vector<std::int32_t> len = {static_cast<std::int32_t>(ks.s)};
  KVCache slice;
  slice.k = ks.view(), slice.v = vs.view(), slice.seqlens = len.data();
  sharded_decode(MPI_COMM_WORLD, p.q.view(), slice, got.view());
  EXPECT_TRUE(meets_textbook_rule(max_error(got.data, oracle), max_error(textbook_forward(p, {}), oracle)));
}

TEST(ShardedDecode, BadInputOnOneRankFailsOnEveryRank) {
  const int R = world_size(), last = R - 1;
  const auto q = random_tensor<double>(1, 1, 4, 8, 1), k = random_tensor<double>(1, 8, 2, 8, 2),
             v = random_tensor<double>(1, 8, 2, 8, 3);
  const std::vector<std::int32_t> len = {world_rank() == last ? 9 : 8};  // more keys than the cache holds
  KVCache slice;
  slice.k = k.view(), slice.v = v.view(), slice.seqlens = len.data();
  Tensor<double> out(1, 1, 4, 8);
  for (double& x : out.data) x = 7;
  const std::string msg =
      invalid_argument_message([&] { sharded_decode(MPI_COMM_WORLD, q.view(), slice, out.view()); });
  EXPECT_NE(msg.find("attn::sharded_decode: cache.seqlens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(rank " + std::to_string(last) + ")"), std::string::npos) << msg;
  EXPECT_TRUE(same_on_every_rank(msg.data(), msg.size())) << msg;
  for (double x : out.data) EXPECT_EQ(x, 7);
}

// The allreduce's operation: commutative bitwise, associative within rounding, the neutral record
// (lse -inf) an identity.
TEST(ShardMergeOp, MergeLaws) {
  const std::int64_t W = 1 + 5;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-3, 3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> a(W), b(W), c(W), neutral(W, 0.0);
    for (auto* x : {&a, &b, &c})
      for (double& e : *x) e = u(rng);
    neutral[0] = -INFINITY;
    std::vector<double> ab = b, ba = a;
    detail::merge_records(a.data(), ab.data(), 1, W);  // ab = a (+) b
    detail::merge_records(b.data(), ba.data(), 1, W);
    EXPECT_EQ(ab, ba);
    std::vector<double> ab_c = c, bc = c;
    detail::merge_records(ab.data(), ab_c.data(), 1, W);  // (a (+) b) (+) c
    detail::merge_records(b.data(), bc.data(), 1, W);
    std::vector<double> a_bc = bc;
    detail::merge_records(a.data(), a_bc.data(), 1, W);  // a (+) (b (+) c)
    EXPECT_LE(max_error(ab_c, a_bc), test::kF64Tolerance);
    std::vector<double> an = a;
    detail::merge_records(neutral.data(), an.data(), 1, W);
    EXPECT_LE(max_error(an, a), 1e-15);
  }
}

}  // namespace
}  // namespace attn::test

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // Only rank 0 prints the progress; every other rank prints its own failures, prefixed by its rank.
  if (attn::test::world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new attn::test::FailurePrinter);
  }
  const int rc = RUN_ALL_TESTS();
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
