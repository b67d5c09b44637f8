// The backward pass: the textbook backward against central finite differences of the forward, the
// tiled backward against the textbook one (f64 to 1e-12 for every tiling, reduced precision against
// the textbook error), and bitwise determinism across thread counts.
#include <gtest/gtest.h>

#include <cstring>

#include "attn/backward.hpp"
#include "backward/backward_kernel.hpp"
#include "support.hpp"

namespace attn {
namespace test {
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "b" << s.b << " sq" << s.sq << " sk" << s.sk << " h" << s.h << " hk" << s.hk << " d" << s.d
      << (s.causal ? " causal" : "") << " window(" << s.left << "," << s.right << ") softcap " << s.softcap
      << (s.alibi ? " alibi" : "");
}
}  // namespace test
namespace {

using test::random_tensor;
using test::relative_error;
using test::Shape;
using test::Tensor;

// The forward's out and lse, and the three gradients, of one problem in storage type T.
template <class T>
struct Problem {
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;  // lse type
  Shape s;
  Tensor<T> q, k, v, dout, out;
  std::vector<L> lse;
  std::vector<float> slopes;
  AttentionOptions opts;

  Problem(const Shape& shape, std::uint64_t seed, double amplitude = 1.0)
      : s(shape),
        q(random_tensor<T>(s.b, s.sq, s.h, s.d, seed, amplitude)),
        k(random_tensor<T>(s.b, s.sk, s.hk, s.d, seed + 1, amplitude)),
        v(random_tensor<T>(s.b, s.sk, s.hk, s.d, seed + 2)),
        dout(random_tensor<T>(s.b, s.sq, s.h, s.d, seed + 3)),
        out(s.b, s.sq, s.h, s.d),
        lse(static_cast<std::size_t>(s.b * s.h * s.sq)) {
    opts = test::options_of(s, 0.3f, slopes);
    forward();
  }
  TensorView lse_view() const { return TensorView::contiguous(lse.data(), s.b, s.h, s.sq); }
  void forward() {
    const TensorView l = lse_view();
    attention_reference(q.view(), k.view(), v.view(), out.view(), opts, &l);
  }
};

template <class T>
struct Grads {
  Tensor<T> dq, dk, dv;
  explicit Grads(const Shape& s) : dq(s.b, s.sq, s.h, s.d), dk(s.b, s.sk, s.hk, s.d), dv(s.b, s.sk, s.hk, s.d) {}
  const Tensor<T>& operator[](int g) const { return g == 0 ? dq : g == 1 ? dk : dv; }
};
const char* const kGradName[] = {"dq", "dk", "dv"};

template <class T>
Grads<T> reference_grads(const Problem<T>& p) {
  Grads<T> g(p.s);
  attention_backward_reference(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse_view(),
                               g.dq.view(), g.dk.view(), g.dv.view(), p.opts);
  return g;
}

template <class T>
Grads<T> tiled_grads(const Problem<T>& p, std::int64_t q_tile, std::int64_t k_tile, int threads = 0) {
  Grads<T> g(p.s);
  TileOptions t;
  t.q_tile = q_tile;
  t.k_tile = k_tile;
  AttentionOptions o = p.opts;
  o.num_threads = threads;
  attention_backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse_view(), g.dq.view(),
                     g.dk.view(), g.dv.view(), o, t);
  return g;
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// ---- The textbook backward against central finite differences of attention_reference (f64) ----

// d loss / d x for every element x of q, k and v, with loss = sum(out * W), W = dout.
Grads<double> finite_differences(Problem<double>& p) {
  Grads<double> g(p.s);
  AttentionOptions o = p.opts;
  o.num_threads = 1;
  Tensor<double> out(p.s.b, p.s.sq, p.s.h, p.s.d);
  auto loss = [&] {
    attention_reference(p.q.view(), p.k.view(), p.v.view(), out.view(), o);
    double sum = 0;
    for (std::size_t e = 0; e < out.data.size(); ++e) sum += out.data[e] * p.dout.data[e];
    return sum;
  };
  const double step = 1e-5;
  Tensor<double>* inputs[] = {&p.q, &p.k, &p.v};
  Tensor<double>* grads[] = {&g.dq, &g.dk, &g.dv};
  for (int t = 0; t < 3; ++t)
    for (std::size_t e = 0; e < inputs[t]->data.size(); ++e) {
      double& x = inputs[t]->data[e];
      const double x0 = x;
      x = x0 + step;
      const double up = loss();
      x = x0 - step;
      const double down = loss();
      x = x0;
      grads[t]->data[e] = (up - down) / (2 * step);
    }
  return g;
}

struct FdCase {
  const char* name;
  Shape s;
};
void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

class FiniteDifferences : public ::testing::TestWithParam<FdCase> {};

TEST_P(FiniteDifferences, TextbookBackwardMatchesTheForward) {
  Problem<double> p(GetParam().s, 7, 2.0);
  const Grads<double> want = finite_differences(p);
  const Grads<double> got = reference_grads(p);
  const Grads<double> tiled = tiled_grads(p, 2, 3);
  for (int g = 0; g < 3; ++g) {
    const double err = relative_error(got[g].data, want[g].data);
    EXPECT_LE(err, 1e-6) << kGradName[g];
    EXPECT_LE(relative_error(tiled[g].data, want[g].data), 1e-6) << kGradName[g] << " (tiled)";
    std::printf("[  FD     ] %-12s %s relative error %.2e\n", GetParam().name, kGradName[g], err);
  }
}

// b 2, sq 5, sk 7, h 4, hk 2, d 6 unless the case says otherwise.
INSTANTIATE_TEST_SUITE_P(Cases, FiniteDifferences,
                         ::testing::Values(FdCase{"no_mask", {2, 5, 7, 4, 2, 6, false}},
                                           FdCase{"causal", {2, 5, 7, 4, 2, 6, true}},
                                           FdCase{"window", {2, 5, 7, 4, 2, 6, false, 2, 1}},
                                           FdCase{"softcap", {2, 5, 7, 4, 2, 6, false, -1, -1, 1.0}},
                                           FdCase{"alibi", {2, 5, 7, 4, 2, 6, true, -1, -1, 0, true}},
                                           FdCase{"gqa4", {2, 5, 7, 4, 1, 6, false}},
                                           FdCase{"sq_gt_sk", {2, 7, 5, 4, 2, 6, true}}),  // rows 0 and 1 see no key
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Backward, RowsThatSeeNoKeyGetZeroGradients) {
  // seqlen_q 6 > seqlen_k 3, causal: rows 0..2 see nothing; seqlen_k 0: no row sees anything.
  for (const Shape s : {Shape{1, 6, 3, 2, 1, 4, true}, Shape{1, 4, 0, 2, 1, 4, false}}) {
    Problem<double> p(s, 3);
    for (const Grads<double>& g : {reference_grads(p), tiled_grads(p, 2, 2)}) {
      for (std::int64_t h = 0; h < s.h; ++h)
        for (std::int64_t i = 0; i < std::min(s.sq, s.sq - s.sk); ++i)
          for (std::int64_t x = 0; x < s.d; ++x) EXPECT_EQ(g.dq.data[((i * s.h) + h) * s.d + x], 0.0);
      for (int t = 0; t < 3; ++t)
        for (double x : g[t].data) EXPECT_TRUE(std::isfinite(x));
    }
  }
}

TEST(Backward, ANanKeyRowOnlyReachesTheRowsThatSeeIt) {
  // Square causal: key 7 is seen by row 7 only. A NaN in k[0, 7, 0, 1] makes row 7's scores, lse, out
  // and gradients NaN; the dq of rows 0..6 of batch 0, and all of batch 1, keep the bits of the run
  // without it (dQ skips the masked pairs rather than weighting K by dX = 0).
  const Shape s{2, 8, 8, 2, 1, 4, true};
  Problem<double> clean(s, 13), bad(s, 13);
  bad.k.at(0, 7, 0, 1) = NAN;
  bad.forward();
  const Grads<double> want = tiled_grads(clean, 3, 3), got = tiled_grads(bad, 3, 3);
  const std::size_t batch_q = static_cast<std::size_t>(s.sq * s.h * s.d), row = static_cast<std::size_t>(s.h * s.d);
  for (std::size_t e = 0; e < 2 * batch_q; ++e)
    if (e < 7 * row || e >= batch_q) EXPECT_EQ(got.dq.data[e], want.dq.data[e]) << "dq element " << e;
  const std::size_t batch_k = static_cast<std::size_t>(s.sk * s.hk * s.d);
  for (std::size_t e = batch_k; e < 2 * batch_k; ++e) EXPECT_EQ(got.dk.data[e], want.dk.data[e]) << "dk element " << e;
}

TEST(Backward, ANanValueRowOnlyReachesTheRowsThatSeeIt) {
  // Square causal: key 7 is seen by row 7 only. A NaN in v[0, 7, 0, 1] makes out[0, 7, h, 1] NaN, hence
  // D and dq of row 7 and the dk rows it reaches; every other row of batch 0 and all of batch 1 keep the
  // bits of the run without it (masked keys are skipped, not weighted by 0). dv does not read v.
  const Shape s{2, 8, 8, 2, 1, 4, true};
  Problem<double> clean(s, 13), bad(s, 13);
  bad.v.at(0, 7, 0, 1) = NAN;
  bad.forward();
  const Grads<double> want[] = {reference_grads(clean), tiled_grads(clean, 3, 3)};
  const Grads<double> got[] = {reference_grads(bad), tiled_grads(bad, 3, 3)};
  for (int a = 0; a < 2; ++a) {
    const auto& w = want[a];
    const auto& g = got[a];
    const std::size_t batch_q = static_cast<std::size_t>(s.sq * s.h * s.d), row = static_cast<std::size_t>(s.h * s.d);
    const std::size_t batch_k = static_cast<std::size_t>(s.sk * s.hk * s.d);
    for (std::size_t e = 0; e < 2 * batch_q; ++e)
      if (e < 7 * row || e >= batch_q) EXPECT_EQ(g.dq.data[e], w.dq.data[e]) << "dq element " << e;
    EXPECT_TRUE(std::isnan(g.dq.data[7 * row])) << "dq of the row that sees the NaN";
    for (std::size_t e = batch_k; e < 2 * batch_k; ++e) EXPECT_EQ(g.dk.data[e], w.dk.data[e]) << "dk element " << e;
    EXPECT_TRUE(same_bytes(g.dv.data, w.dv.data));
  }
}

// ---- The tiled backward against the textbook one ----

class Exactness : public ::testing::TestWithParam<Shape> {};

TEST_P(Exactness, F64TiledMatchesTheTextbookForEveryTiling) {
  const Shape s = GetParam();
  Problem<double> p(s, 11, 2.0);
  const Grads<double> want = reference_grads(p);
  double worst = 0;
  test::for_each_simd_target("backward", detail::backward_target, [&](std::int64_t) {
    for (std::int64_t bq : {std::int64_t{1}, std::int64_t{3}, std::int64_t{7}, s.sq})
      for (std::int64_t bk : {std::int64_t{1}, std::int64_t{3}, std::int64_t{7}, std::max<std::int64_t>(s.sk, 1)}) {
        const Grads<double> got = tiled_grads(p, bq, bk);
        for (int g = 0; g < 3; ++g) {
          const double err = relative_error(got[g].data, want[g].data);
          worst = std::max(worst, err);
          EXPECT_LE(err, test::kF64Tolerance) << kGradName[g] << " q_tile " << bq << " k_tile " << bk;
        }
      }
  });
  std::printf("[  EXACT  ] worst relative error %.2e\n", worst);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Exactness,
                         ::testing::Values(Shape{2, 9, 11, 4, 2, 5, true},          // causal, GQA 2
                                           Shape{1, 11, 6, 2, 2, 5, true},          // seqlen_q > seqlen_k: masked rows
                                           Shape{1, 6, 13, 2, 1, 5, true},          // seqlen_q < seqlen_k
                                           Shape{1, 10, 10, 4, 4, 1, false, 3, 2},  // window (3, 2), head_dim 1
                                           Shape{1, 9, 12, 4, 1, 33, false, 2, 0},  // window (2, 0), GQA 4, head_dim 33
                                           Shape{1, 13, 8, 2, 1, 5, false, 0, 4},  // window (0, 4), seqlen_q > seqlen_k
                                           Shape{1, 8, 9, 2, 1, 5, false, -1, -1, 1.5},     // softcap
                                           Shape{2, 7, 9, 4, 2, 6, true, -1, -1, 0, true},  // ALiBi
                                           Shape{1, 12, 12, 2, 2, 5, false, 4, -1, 2.0,
                                                 true},  // window + softcap + ALiBi
                                           // A cap of 1e-30 under ALiBi: tanh saturates, dq = dk = 0 (recovering
                                           // tanh from the biased logit once cancelled to garbage).
                                           Shape{2, 3, 15, 2, 2, 14, true, -1, -1, 1e-30, true},
                                           Shape{1, 5, 0, 2, 1, 3, false}));  // no keys

// ---- Reduced precision ----
// Baseline: the textbook backward run on the same low-precision inputs (q, k, v, dout, and the forward's
// out and lse computed at that precision by attention_reference), accumulating in f32, its gradients
// rounded to the dtype. Oracle: the textbook backward in f64 on the same inputs converted exactly to
// f64, with out and lse from the f64 forward. The tiled backward gets the baseline's inputs; its error
// against the oracle must be at most 3x the baseline's (plus a small absolute slack for a baseline
// error that happens to be ~0).
template <class T>
void check_precision(double slack) {
  for (bool causal : {false, true}) {
    const Shape s{1, 65, 97, 4, 2, 32, causal};
    Problem<T> low(s, 21, 2.0);
    Problem<double> exact(s, 21, 2.0);
    exact.q = test::to_f64(low.q);
    exact.k = test::to_f64(low.k);
    exact.v = test::to_f64(low.v);
    exact.dout = test::to_f64(low.dout);
    exact.forward();
    const Grads<double> oracle = reference_grads(exact);
    const Grads<T> base = reference_grads(low);
    test::for_each_simd_target("backward", detail::backward_target, [&](std::int64_t) {
      const Grads<T> got = tiled_grads(low, 13, 29);
      for (int g = 0; g < 3; ++g) {
        const double e_base = test::max_error(base[g].data, oracle[g].data);
        const double e_got = test::max_error(got[g].data, oracle[g].data);
        EXPECT_TRUE(test::meets_textbook_rule(e_got, e_base, test::kGradientFactor, slack))
            << kGradName[g] << " causal " << causal;
        std::printf("[  PREC   ] %-4s causal %d %s: tiled %.3e, textbook %.3e\n", dtype_name(dtype_of<T>()).data(),
                    causal, kGradName[g], e_got, e_base);
      }
    });
  }
}

TEST(Precision, F32WithinThreeTimesTheTextbookError) { check_precision<float>(1e-6); }
TEST(Precision, Bf16WithinThreeTimesTheTextbookError) { check_precision<bf16_t>(1e-3); }
TEST(Precision, F16WithinThreeTimesTheTextbookError) { check_precision<f16_t>(1e-4); }

// ---- Determinism and strides ----

template <class T>
void check_threads() {
  Problem<T> p(Shape{2, 23, 31, 4, 2, 9, true, 12, -1, 3.0, true}, 5, 2.0);
  const Grads<T> one = tiled_grads(p, 5, 7, 1);
  for (int threads : {2, 3}) {
    const Grads<T> many = tiled_grads(p, 5, 7, threads);
    for (int g = 0; g < 3; ++g) EXPECT_TRUE(same_bytes(many[g].data, one[g].data)) << kGradName[g] << " " << threads;
  }
}

TEST(Determinism, AnyThreadCountGivesBitwiseEqualGradients) {
  check_threads<double>();
  check_threads<float>();
  check_threads<bf16_t>();
}

// One (batch, kv head) and 16 query tiles: the plan splits the query tiles into chunks whose dK/dV
// partials are merged in chunk order; still bitwise equal for 1, 2 and 3 threads, and exact in f64.
TEST(Determinism, ChunkedSplitIsBitwiseEqualAndExact) {
  Problem<double> p(Shape{1, 64, 40, 2, 1, 8, true}, 17, 2.0);
  const Grads<double> want = reference_grads(p);
  const Grads<double> one = tiled_grads(p, 4, 8, 1);
  for (int g = 0; g < 3; ++g) EXPECT_LE(relative_error(one[g].data, want[g].data), test::kF64Tolerance) << kGradName[g];
  for (int threads : {2, 3}) {
    const Grads<double> many = tiled_grads(p, 4, 8, threads);
    for (int g = 0; g < 3; ++g) EXPECT_TRUE(same_bytes(many[g].data, one[g].data)) << kGradName[g] << " " << threads;
  }
}

// run_backward over several problems in one job (as the varlen backward calls it, one problem per
// sequence) gives each problem the bits it gets alone.
TEST(Determinism, ProblemsInOneJobGetTheirOwnBits) {
  Problem<float> a(Shape{1, 37, 29, 4, 2, 16, true}, 31), b(Shape{2, 11, 50, 4, 1, 16, false, 8, 3}, 37);
  Grads<float> ga(a.s), gb(b.s);
  // The problems point at their lse views, which must outlive them.
  const TensorView lse_a = a.lse_view(), lse_b = b.lse_view();
  auto problem = [](const Problem<float>& p, const TensorView& lse, Grads<float>& g) {
    return detail::validate_backward("test", p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), lse,
                                     g.dq.view(), g.dk.view(), g.dv.view(), p.opts);
  };
  const std::vector<detail::BackwardProblem> both{problem(a, lse_a, ga), problem(b, lse_b, gb)};
  TileOptions t;
  t.q_tile = 8;
  t.k_tile = 12;
  detail::run_backward(both, t, 2);
  const Grads<float> alone_a = tiled_grads(a, 8, 12), alone_b = tiled_grads(b, 8, 12);
  for (int g = 0; g < 3; ++g) {
    EXPECT_TRUE(same_bytes(ga[g].data, alone_a[g].data)) << kGradName[g];
    EXPECT_TRUE(same_bytes(gb[g].data, alone_b[g].data)) << kGradName[g];
  }
}

// Head dims off and on the fast paths (multiples of the vector width and not), f32 against the f64
// textbook, on every SIMD target.
TEST(HeadDims, AnyHeadDimMatchesTheTextbook) {
  test::for_each_simd_target("backward", detail::backward_target, [&](std::int64_t) {
    for (std::int64_t d : {3, 8, 17, 64, 80, 128, 130}) {
      Problem<double> p(Shape{1, 21, 26, 2, 1, d, true}, 23);
      const Grads<double> want = reference_grads(p);
      const Grads<double> got = tiled_grads(p, 8, 12);
      for (int g = 0; g < 3; ++g)
        EXPECT_LE(relative_error(got[g].data, want[g].data), test::kF64Tolerance) << kGradName[g] << " d " << d;
    }
  });
}

TEST(Strides, StridedGradientsGetTheSameValuesAndGapsStayUntouched) {
  Problem<float> p(Shape{2, 9, 11, 4, 2, 6, true}, 9);
  const Grads<float> dense = tiled_grads(p, 4, 4);
  // Head-major [b, h, s, d] with every element 2 apart: the odd slots are gaps.
  Grads<float> g(p.s);
  for (int t = 0; t < 3; ++t) {
    const Tensor<float>& like = dense[t];
    std::vector<float> buf(like.data.size() * 2, -7.0f);
    const TensorView view = TensorView::strided(buf.data(), {like.b, like.s, like.h, like.d},
                                                {2 * like.h * like.s * like.d, 2 * like.d, 2 * like.s * like.d, 2});
    TensorView views[3] = {dense.dq.view(), dense.dk.view(), dense.dv.view()};
    std::vector<float> other[3];
    for (int u = 0; u < 3; ++u)
      if (u != t) {
        other[u].assign(dense[u].data.size(), 0.0f);
        views[u] = TensorView::contiguous(other[u].data(), dense[u].b, dense[u].s, dense[u].h, dense[u].d);
      }
    views[t] = view;
    TileOptions tiles;
    tiles.q_tile = 4;
    tiles.k_tile = 4;
    attention_backward(p.q.view(), p.k.view(), p.v.view(), p.out.view(), p.dout.view(), p.lse_view(), views[0],
                       views[1], views[2], p.opts, tiles);
    for (std::int64_t b = 0; b < like.b; ++b)
      for (std::int64_t s = 0; s < like.s; ++s)
        for (std::int64_t h = 0; h < like.h; ++h)
          for (std::int64_t x = 0; x < like.d; ++x) {
            const std::int64_t at = b * view.strides[0] + s * view.strides[1] + h * view.strides[2] + 2 * x;
            EXPECT_EQ(buf[at], like.data[((b * like.s + s) * like.h + h) * like.d + x]) << kGradName[t];
            EXPECT_EQ(buf[at + 1], -7.0f) << kGradName[t] << ": wrote a gap";
          }
  }
}

}  // namespace
}  // namespace attn
