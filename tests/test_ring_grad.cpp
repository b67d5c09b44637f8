// Ring attention's per-rank backward (src/distributed/ring_grad.hpp) without MPI: every rank of a ring
// of R in one process adds its blocks to its dq and to each chunk's travelling dk, dv, and the
// gradients each rank ends with are compared with attention_backward on the whole sequence.
#include <gtest/gtest.h>

#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "validate/backward_problem.hpp"
#include "distributed/ring_grad.hpp"
#include "distributed_support.hpp"

namespace attn::test {
namespace {

struct GradCase {
  int ranks;
  bool zigzag, uneven;
  std::int64_t sq, sk;
  Shape shape;
};

// Whole-sequence inputs and the forward's out and lse.
template <class T>
struct Whole {
  Tensor<T> q, k, v, out, dout;
  std::vector<detail::Acc<T>> lse;
  Whole(const GradCase& c, const AttentionOptions& opts)
      : q(random_tensor<T>(c.shape.b, c.sq, c.shape.h, c.shape.d, 1)),
        k(random_tensor<T>(c.shape.b, c.sk, c.shape.hk, c.shape.d, 2)),
        v(random_tensor<T>(c.shape.b, c.sk, c.shape.hk, c.shape.d, 3)),
        out(c.shape.b, c.sq, c.shape.h, c.shape.d),
        dout(random_tensor<T>(c.shape.b, c.sq, c.shape.h, c.shape.d, 4)),
        lse(static_cast<std::size_t>(c.shape.b * c.shape.h * c.sq)) {
    const TensorView lv = lse_view();
    attention_tiled(q.view(), k.view(), v.view(), out.view(), opts, {}, &lv);
  }
  TensorView lse_view() const { return TensorView::contiguous(lse.data(), q.b, q.h, q.s); }
};

struct RankGrads {
  std::vector<detail::Segment> q_segs, k_segs;
  Tensor<double> dq{1, 1, 1, 1}, dk{1, 1, 1, 1}, dv{1, 1, 1, 1};
};

template <class T>
std::vector<RankGrads> run_ring_backward(const GradCase& c, const Whole<T>& w, const AttentionOptions& opts) {
  const std::int64_t unit = c.zigzag ? 2 : 1;
  const auto rows_q = split_rows(c.sq, c.ranks, c.uneven, unit), rows_k = split_rows(c.sk, c.ranks, c.uneven, unit);
  const Shape& s = c.shape;
  std::vector<Tensor<T>> ks, vs;
  std::vector<detail::DenseCopy> dk_acc, dv_acc;  // each chunk's travelling gradients
  const DType acc = std::is_same_v<T, double> ? DType::f64 : DType::f32;
  for (int r = 0; r < c.ranks; ++r) {
    const auto segs = detail::ring_segments(c.zigzag, rows_k, r);
    ks.push_back(rank_rows(w.k, segs));
    vs.push_back(rank_rows(w.v, segs));
    dk_acc.push_back(detail::dense_zeros({s.b, ks.back().s, s.hk, s.d}, acc));
    dv_acc.push_back(detail::dense_zeros({s.b, ks.back().s, s.hk, s.d}, acc));
  }
  std::vector<RankGrads> res(static_cast<std::size_t>(c.ranks));
  for (int r = 0; r < c.ranks; ++r) {
    RankGrads& g = res[static_cast<std::size_t>(r)];
    g.q_segs = detail::ring_segments(c.zigzag, rows_q, r);
    g.k_segs = detail::ring_segments(c.zigzag, rows_k, r);
    const Tensor<T> q = rank_rows(w.q, g.q_segs), out = rank_rows(w.out, g.q_segs), dout = rank_rows(w.dout, g.q_segs);
    std::vector<double> lse64(w.lse.begin(), w.lse.end());
    const std::vector<double> mine = rank_lse(lse64, s.b, s.h, c.sq, g.q_segs);
    std::vector<detail::Acc<T>> lse(mine.begin(), mine.end());
    const TensorView lv = TensorView::contiguous(lse.data(), s.b, s.h, q.s);
    Tensor<T> dq(s.b, q.s, s.h, s.d), dk(s.b, ks[static_cast<std::size_t>(r)].s, s.hk, s.d), dv = dk;
    const detail::BackwardProblem p = detail::validate_backward(
        "test", q.view(), ks[static_cast<std::size_t>(r)].view(), vs[static_cast<std::size_t>(r)].view(), out.view(),
        dout.view(), lv, dq.view(), dk.view(), dv.view(), opts);
    detail::RingGradAccumulator acc(p, g.q_segs, c.sq, c.sk);
    detail::BlockCounts counts;
    for (int step = 0; step < c.ranks; ++step) {
      const auto owner = static_cast<std::size_t>((r - step + c.ranks) % c.ranks);
      acc.add_chunk(ks[owner].view(), vs[owner].view(), dk_acc[owner].view, dv_acc[owner].view,
                    detail::ring_segments(c.zigzag, rows_k, static_cast<int>(owner)), counts);
    }
    acc.store_dq();
    g.dq = to_f64(dq);
  }
  for (int r = 0; r < c.ranks; ++r) {
    RankGrads& g = res[static_cast<std::size_t>(r)];
    g.dk = Tensor<double>(s.b, ks[static_cast<std::size_t>(r)].s, s.hk, s.d);
    g.dv = g.dk;
    detail::convert_into(dk_acc[static_cast<std::size_t>(r)].view, g.dk.view());
    detail::convert_into(dv_acc[static_cast<std::size_t>(r)].view, g.dv.view());
  }
  return res;
}

class RingGradF64 : public ::testing::TestWithParam<GradCase> {};

TEST_P(RingGradF64, EveryRankMatchesTheWholeBackward) {
  const GradCase& c = GetParam();
  const Shape& s = c.shape;
  const ShapeOptions options(s, 0.3f);
  const AttentionOptions& opts = options.opts;
  const Whole<double> w(c, opts);
  Tensor<double> dq(s.b, c.sq, s.h, s.d), dk(s.b, c.sk, s.hk, s.d), dv(s.b, c.sk, s.hk, s.d);
  attention_backward(w.q.view(), w.k.view(), w.v.view(), w.out.view(), w.dout.view(), w.lse_view(), dq.view(),
                     dk.view(), dv.view(), opts);
  for (const RankGrads& g : run_ring_backward(c, w, opts)) {
    EXPECT_LE(max_error(g.dq.data, rank_rows(dq, g.q_segs).data), test::kF64Tolerance);
    EXPECT_LE(max_error(g.dk.data, rank_rows(dk, g.k_segs).data), test::kF64Tolerance);
    EXPECT_LE(max_error(g.dv.data, rank_rows(dv, g.k_segs).data), test::kF64Tolerance);
  }
}

std::vector<GradCase> grad_cases() {
  const std::vector<Shape> shapes = {
      {2, 0, 0, 4, 2, 8, false},
      {1, 0, 0, 4, 2, 8, true},
      {1, 0, 0, 2, 1, 5, false, 7, 3},
      {1, 0, 0, 4, 4, 8, true, -1, -1, 2.0, true, true},  // causal + softcap + ALiBi + sinks
  };
  std::vector<GradCase> cases;
  for (int R : {1, 2, 3, 4})
    for (bool zig : {false, true})
      for (const Shape& s : shapes) {
        cases.push_back({R, zig, !zig, 48, 48, s});
        if (!zig) cases.push_back({R, false, true, 30, 52, s});
      }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingGradF64, ::testing::ValuesIn(grad_cases()));

// bf16: within three times the textbook backward's error at bf16 (flash-attn's rule for gradients).
TEST(RingGrad, Bf16WithinThriceTheTextbookError) {
  const GradCase c{3, true, false, 96, 96, {1, 0, 0, 4, 2, 16, true}};
  std::vector<float> slopes;
  const AttentionOptions opts = options_of(c.shape, 0, slopes);
  const Whole<bf16_t> w(c, opts);
  Tensor<double> q = to_f64(w.q), k = to_f64(w.k), v = to_f64(w.v), out(1, 96, 4, 16), dout = to_f64(w.dout);
  std::vector<double> lse(static_cast<std::size_t>(4 * 96));
  const TensorView lv = TensorView::contiguous(lse.data(), 1, 4, 96);
  attention_reference(q.view(), k.view(), v.view(), out.view(), opts, &lv);
  Tensor<double> dq(1, 96, 4, 16), dk(1, 96, 2, 16), dv(1, 96, 2, 16);
  attention_backward_reference(q.view(), k.view(), v.view(), out.view(), dout.view(), lv, dq.view(), dk.view(),
                               dv.view(), opts);
  Tensor<bf16_t> tq(1, 96, 4, 16), tk(1, 96, 2, 16), tv(1, 96, 2, 16);
  attention_backward_reference(w.q.view(), w.k.view(), w.v.view(), w.out.view(), w.dout.view(), w.lse_view(), tq.view(),
                               tk.view(), tv.view(), opts);
  const auto grads = run_ring_backward(c, w, opts);
  for (const RankGrads& g : grads) {
    EXPECT_TRUE(meets_textbook_rule(max_error(g.dq.data, rank_rows(dq, g.q_segs).data), max_error(tq.data, dq.data),
                                    kGradientFactor))
        << "dq";
    EXPECT_TRUE(meets_textbook_rule(max_error(g.dk.data, rank_rows(dk, g.k_segs).data), max_error(tk.data, dk.data),
                                    kGradientFactor))
        << "dk";
    EXPECT_TRUE(meets_textbook_rule(max_error(g.dv.data, rank_rows(dv, g.k_segs).data), max_error(tv.data, dv.data),
                                    kGradientFactor))
        << "dv";
  }
}

}  // namespace
}  // namespace attn::test
