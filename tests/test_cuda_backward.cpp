// The CUDA backward (src/cuda/backward_kernel.cuh) against the f64 oracle (label `gpu`; also built against
// the CPU emulation of CUDA as part of test_cuda_emulated). The kernels round P and dS to 16 bits before
// their products, so the rule is flash-attn's: each gradient's error against the f64 oracle at most three
// times that of PyTorch's math backward in the same dtype (math_reference_backward). out and lse come
// from the f64 oracle (out rounded to the dtype), so the forward's error does not enter. Outputs are
// poisoned with NaN first: an element never written fails.
#include "amx_reference.hpp"
#include "attn/backward.hpp"
#include "cuda_checks.hpp"

namespace attn {
namespace {

using namespace test;

class GpuBackward : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  }
};

// Random q, k, v, dout of a Shape, with the forward's out (rounded to T) and lse (f32) from the oracle.
template <class T>
struct BackwardInputs {
  Qkv<T> qkv;
  Tensor<T> dout, out;
  std::vector<float> lse;
  BackwardInputs(const Shape& c, const AttentionOptions& o, std::uint64_t seed)
      : qkv(random_qkv<T>(c.b, c.sq, c.sk, c.h, c.hk, c.d, seed)),
        dout(random_tensor<T>(c.b, c.sq, c.h, c.d, seed + 7)),
        out(c.b, c.sq, c.h, c.d) {
    std::vector<double> lse64;
    const std::vector<double> o64 = oracle_forward(qkv.q, qkv.k, qkv.v, o, &lse64);
    for (std::size_t e = 0; e < o64.size(); ++e) out.data[e] = detail::store<T>(o64[e]);
    lse.assign(lse64.begin(), lse64.end());
  }
};

// dq, dk, dv and (with sinks) dsink in f64 from the f64 forward.
template <class T>
std::vector<std::vector<double>> oracle_backward(const BackwardInputs<T>& in, const AttentionOptions& o) {
  const Tensor<double> q = to_f64(in.qkv.q), k = to_f64(in.qkv.k), v = to_f64(in.qkv.v), dout = to_f64(in.dout);
  Tensor<double> out(q.b, q.s, q.h, v.d), dq(q.b, q.s, q.h, q.d), dk(k.b, k.s, k.h, k.d), dv(v.b, v.s, v.h, v.d);
  std::vector<double> lse(static_cast<std::size_t>(q.b * q.h * q.s)), dsink(static_cast<std::size_t>(q.h));
  const TensorView lv = TensorView::contiguous(lse.data(), q.b, q.h, q.s);
  const TensorView sv = TensorView::contiguous(dsink.data(), 1, q.h, 1);
  attention_reference(q.view(), k.view(), v.view(), out.view(), o, &lv);
  attention_backward_reference(q.view(), k.view(), v.view(), out.view(), dout.view(), lv, dq.view(), dk.view(),
                               dv.view(), o, o.sinks ? &sv : nullptr);
  return {dq.data, dk.data, dv.data, dsink};
}

// The textbook backward's dsink at T's precision (f32 accumulation), the bar for the kernel's.
template <class T>
std::vector<float> textbook_dsink(const BackwardInputs<T>& in, const AttentionOptions& o) {
  const Tensor<T>& q = in.qkv.q;
  Tensor<T> dq(q.b, q.s, q.h, q.d), dk = in.qkv.k, dv = in.qkv.v;
  std::vector<float> lse = in.lse, dsink(static_cast<std::size_t>(q.h));
  const TensorView lv = TensorView::contiguous(lse.data(), q.b, q.h, q.s);
  const TensorView sv = TensorView::contiguous(dsink.data(), 1, q.h, 1);
  attention_backward_reference(q.view(), in.qkv.k.view(), in.qkv.v.view(), in.out.view(), in.dout.view(), lv, dq.view(),
                               dk.view(), dv.view(), o, &sv);
  return dsink;
}

constexpr const char* kGrad[3] = {"dq", "dk", "dv"};

template <class T>
void check_backward(const Case& c) {
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const ShapeOptions cpu(c, 0.3f);
  const BackwardInputs<T> in(c, cpu.opts, seed);
  const std::vector<std::vector<double>> oracle = oracle_backward(in, cpu.opts);
  const MathGrads<T> math = math_reference_backward<T>(in.qkv.q, in.qkv.k, in.qkv.v, in.dout, cpu.opts);

  Dev<float> d_slopes(cpu.slopes), d_sinks(cpu.sinks);
  AttentionOptions o = cpu.opts;
  if (c.alibi) o.alibi_slopes = {d_slopes.ptr, static_cast<std::int64_t>(d_slopes.n)};
  if (c.sinks) o.sinks = {d_sinks.ptr, static_cast<std::int64_t>(d_sinks.n)};
  Dev<T> q(in.qkv.q), k(in.qkv.k), v(in.qkv.v), out(in.out), dout(in.dout);
  Dev<float> lse(in.lse), dsink(poisoned<float>(static_cast<std::size_t>(c.h)));
  Dev<T> dq(poisoned<T>(c.b, c.sq, c.h, c.d)), dk(poisoned<T>(c.b, c.sk, c.hk, c.d)),
      dv(poisoned<T>(c.b, c.sk, c.hk, c.d));
  const TensorView lv = TensorView::contiguous(lse.ptr, c.b, c.h, c.sq);
  const TensorView sv = TensorView::contiguous(dsink.ptr, 1, c.h, 1);
  cuda::attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lv, dq.view(), dk.view(), dv.view(),
                           o, c.sinks ? &sv : nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<T> got[3] = {dq.get(), dk.get(), dv.get()};
  const std::vector<T>* base[3] = {&math.dq, &math.dk, &math.dv};
  for (int g = 0; g < 3; ++g) {
    EXPECT_EQ(count_nan(got[g]), 0) << kGrad[g] << " elements never written";
    EXPECT_TRUE(meets_textbook_rule(max_error(got[g], oracle[g]), max_error(*base[g], oracle[g]), kGradientFactor,
                                    textbook_floor<T>()))
        << kGrad[g] << " against the math backward's error";
  }
  if (c.sinks) {
    const double base_err = max_error(textbook_dsink(in, cpu.opts), oracle[3]);
    EXPECT_TRUE(meets_textbook_rule(max_error(dsink.get(), oracle[3]), base_err, kGradientFactor, 1e-5)) << "dsink";
  }
}

class GpuBackwardShapes : public GpuBackward, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuBackwardShapes, Bf16WithinThriceTheMathBackwardError) { check_backward<bf16_t>(GetParam()); }
TEST_P(GpuBackwardShapes, F16WithinThriceTheMathBackwardError) { check_backward<f16_t>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuBackwardShapes,
    ::testing::Values(Case{2, 70, 97, 4, 2, 64, false}, Case{1, 97, 70, 4, 1, 64, true},  // masked rows
                      Case{1, 80, 80, 2, 2, 128, true}, Case{1, 33, 65, 2, 1, 256, false},
                      Case{1, 1, 90, 4, 2, 128, false},                             // one query row
                      Case{1, 5, 0, 2, 1, 64, false},                               // no keys: dq = 0
                      Case{1, 90, 100, 4, 2, 64, false, 20, 5},                     // sliding window
                      Case{1, 70, 90, 2, 1, 64, true, -1, -1, 5.0, true},           // softcap + ALiBi
                      Case{2, 60, 75, 6, 2, 64, false, -1, -1, 0.0, false, true},   // sinks
                      Case{1, 75, 50, 3, 3, 128, true, -1, -1, 0.0, false, true}),  // sinks, no key
    [](const ::testing::TestParamInfo<Case>& i) {
      const Case& c = i.param;
      return "b" + std::to_string(c.b) + "_q" + std::to_string(c.sq) + "_k" + std::to_string(c.sk) + "_h" +
             std::to_string(c.h) + "x" + std::to_string(c.hk) + "_d" + std::to_string(c.d) +
             (c.causal ? "_causal" : "") + (c.left >= 0 || c.right >= 0 ? "_window" : "") +
             (c.softcap > 0 ? "_softcap" : "") + (c.alibi ? "_alibi" : "") + (c.sinks ? "_sinks" : "");
    });

// The varlen backward gives each sequence what attention_backward gives it alone, bit for bit: a
// sequence without queries gets dk = dv = 0, one without keys dq = 0, and nothing of one sequence reaches
// another's rows. With sinks, its dsink is the sum of the sequences' own (a different order of the f64
// sums: to 1e-6).
TEST_F(GpuBackward, VarlenEqualsEachSequenceAlone) {
  const std::int64_t H = 4, HK = 2, D = 64;
  const std::vector<std::int32_t> lq = {17, 0, 70, 30, 9}, lk = {40, 9, 70, 0, 1}, cq = cu_seqlens(lq),
                                  ck = cu_seqlens(lk);
  const std::int64_t batch = static_cast<std::int64_t>(lq.size());
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto q = random_tensor<bf16_t>(1, cq.back(), H, D, seed, 2.0),
       k = random_tensor<bf16_t>(1, ck.back(), HK, D, seed + 1, 2.0),
       v = random_tensor<bf16_t>(1, ck.back(), HK, D, seed + 2),
       out = random_tensor<bf16_t>(1, cq.back(), H, D, seed + 3),
       dout = random_tensor<bf16_t>(1, cq.back(), H, D, seed + 4);
  std::vector<float> lse(static_cast<std::size_t>(H * cq.back()));
  for (std::size_t e = 0; e < lse.size(); ++e) lse[e] = 2.0f + 0.01f * static_cast<float>(e % 97);
  Dev<bf16_t> dq_(q), dk_(k), dv_(v), dout_(out), ddo(dout);
  Dev<float> dlse(lse);
  Dev<std::int32_t> dcq(cq), dck(ck);
  Dev<float> d_sinks(sinks_for(H));
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal, sinks" : "full");
    AttentionOptions o;
    o.causal = causal;
    if (causal) o.sinks = {d_sinks.ptr, H};
    Dev<bf16_t> gq(poisoned<bf16_t>(1, cq.back(), H, D)), gk(poisoned<bf16_t>(1, ck.back(), HK, D)),
        gv(poisoned<bf16_t>(1, ck.back(), HK, D));
    Dev<float> dsink(poisoned<float>(static_cast<std::size_t>(H)));
    const TensorView dsink_view = TensorView::contiguous(dsink.ptr, 1, H, 1);
    std::vector<double> dsink_sum(static_cast<std::size_t>(H), 0.0);
    cuda::VarlenBatch vb;
    vb.cu_seqlens_q = dcq.ptr;
    vb.cu_seqlens_k = dck.ptr;
    vb.batch = batch;
    cuda::attention_varlen_backward(dq_.packed(), dk_.packed(), dv_.packed(), dout_.packed(), ddo.packed(),
                                    TensorView::contiguous(dlse.ptr, 1, H, cq.back()), gq.packed(), gk.packed(),
                                    gv.packed(), vb, o, causal ? &dsink_view : nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<bf16_t> all[3] = {gq.get(), gk.get(), gv.get()};
    for (std::int64_t b = 0; b < batch; ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      const std::int64_t nq = lq[b], nk = lk[b];
      const std::int64_t q_rows = H * D, k_rows = HK * D;
      std::vector<bf16_t> want[3] = {std::vector<bf16_t>(nq * q_rows), std::vector<bf16_t>(nk * k_rows),
                                     std::vector<bf16_t>(nk * k_rows)};
      if (nq > 0) {  // else dk = dv = 0 (want's zero bits), and there is no call without queries
        // The sequence alone: its rows as a batch of one, its lse [1, H, nq] gathered from the packed one.
        std::vector<float> l(static_cast<std::size_t>(H * nq));
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < nq; ++i) l[h * nq + i] = lse[h * cq.back() + cq[b] + i];
        Dev<float> dl(l);
        Dev<bf16_t> sq(poisoned<bf16_t>(1, nq, H, D)), sk(poisoned<bf16_t>(1, nk, HK, D)),
            sv(poisoned<bf16_t>(1, nk, HK, D));
        Dev<float> own(poisoned<float>(static_cast<std::size_t>(H)));
        const TensorView own_view = TensorView::contiguous(own.ptr, 1, H, 1);
        auto rows = [](const Dev<bf16_t>& t, std::int64_t first, std::int64_t n, std::int64_t heads) {
          return TensorView::contiguous(t.ptr + first * heads * D, 1, n, heads, D);
        };
        cuda::attention_backward(rows(dq_, cq[b], nq, H), rows(dk_, ck[b], nk, HK), rows(dv_, ck[b], nk, HK),
                                 rows(dout_, cq[b], nq, H), rows(ddo, cq[b], nq, H),
                                 TensorView::contiguous(dl.ptr, 1, H, nq), rows(sq, 0, nq, H), rows(sk, 0, nk, HK),
                                 rows(sv, 0, nk, HK), o, causal ? &own_view : nullptr);
        CUDA_OK(cudaDeviceSynchronize());
        if (causal)
          for (std::int64_t h = 0; h < H; ++h) dsink_sum[h] += own.get()[h];
        want[0] = sq.get();
        want[1] = sk.get();
        want[2] = sv.get();
      }
      const std::int64_t first[3] = {cq[b] * q_rows, ck[b] * k_rows, ck[b] * k_rows};
      for (int g = 0; g < 3; ++g)
        for (std::size_t e = 0; e < want[g].size(); ++e)
          ASSERT_EQ(all[g][first[g] + e].bits, want[g][e].bits) << kGrad[g] << " element " << e;
    }
    if (causal) {
      const std::vector<float> got = dsink.get();
      for (std::int64_t h = 0; h < H; ++h)
        EXPECT_NEAR(got[h], dsink_sum[h], 1e-6 * std::max(1.0, std::abs(dsink_sum[h]))) << "dsink, head " << h;
    }
  }
}

// ---- Non-finite inputs: the CPU's rules (docs/robustness.md) ------------------------------------------
// A NaN or infinity in one entry of q, k, v or dout reaches only the gradients that read it; every other
// gradient element is bitwise what it is without it. Causal, B 2 x 70 x 70, 4 heads over 2 kv heads, d 64
// (query tiles of 64, key blocks of 64: the bad row shares its tiles with rows the mask hides it from).
struct Reach {
  std::function<bool(std::int64_t b, std::int64_t i, std::int64_t h)> dq, dkv;  // dkv: (b, j, kv head)
};
template <class T>
void expect_backward_confined(const char* what, const std::function<void(std::vector<Tensor<T>*>)>& poison,
                              const Reach& may_change) {
  const std::int64_t B = 2, S = 70, H = 4, HK = 2, D = 64;
  std::vector<Tensor<T>> in = {random_tensor<T>(B, S, H, D, 41), random_tensor<T>(B, S, HK, D, 42),
                               random_tensor<T>(B, S, HK, D, 43), random_tensor<T>(B, S, H, D, 44),
                               random_tensor<T>(B, S, H, D, 45)};  // q, k, v, dout, out
  std::vector<float> lse(static_cast<std::size_t>(B * H * S));
  for (std::size_t e = 0; e < lse.size(); ++e) lse[e] = 1.5f + 0.02f * static_cast<float>(e % 31);
  AttentionOptions o;
  o.causal = true;
  auto run = [&](const std::vector<Tensor<T>>& t) {
    Dev<T> q(t[0]), k(t[1]), v(t[2]), dout(t[3]), out(t[4]);
    Dev<float> l(lse);
    Dev<T> dq(poisoned<T>(B, S, H, D)), dk(poisoned<T>(B, S, HK, D)), dv(poisoned<T>(B, S, HK, D));
    cuda::attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(),
                             TensorView::contiguous(l.ptr, B, H, S), dq.view(), dk.view(), dv.view(), o);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return std::vector<std::vector<T>>{dq.get(), dk.get(), dv.get()};
  };
  const auto clean = run(in);
  auto bad = in;
  poison({&bad[0], &bad[1], &bad[2], &bad[3]});
  const auto got = run(bad);
  std::int64_t changed_elsewhere = 0, nonfinite_where_allowed = 0;
  for (int g = 0; g < 3; ++g) {
    const std::int64_t heads = g == 0 ? H : HK;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < S; ++i)
        for (std::int64_t h = 0; h < heads; ++h) {
          const bool may = g == 0 ? may_change.dq(b, i, h) : may_change.dkv(b, i, h);
          for (std::int64_t c = 0; c < D; ++c) {
            const auto at = static_cast<std::size_t>(((b * S + i) * heads + h) * D + c);
            if (may)
              nonfinite_where_allowed += !std::isfinite(detail::load<double>(got[g][at]));
            else
              changed_elsewhere += got[g][at].bits != clean[g][at].bits;
          }
        }
  }
  EXPECT_EQ(changed_elsewhere, 0) << what << " changed gradients that do not read it";
  EXPECT_GT(nonfinite_where_allowed, 0) << what << " did not reach the gradients that read it";
}

// Query row i = 2 of (batch 1, head 3) is read by its own dq and, through S and dS, by dk and dv of the
// keys it sees (j <= 2 of kv head 1); so is its dout row.
const Reach kQueryRow{[](auto b, auto i, auto h) { return b == 1 && i == 2 && h == 3; },
                      [](auto b, auto j, auto kh) { return b == 1 && j <= 2 && kh == 1; }};
// Key row j = 3 of (batch 0, kv head 1) is read by dq of the rows that see it (i >= 3, heads 2 and 3)
// and by its own dk and dv; its value row the same.
const Reach kKeyRow{[](auto b, auto i, auto h) { return b == 0 && i >= 3 && h >= 2; },
                    [](auto b, auto j, auto kh) { return b == 0 && j == 3 && kh == 1; }};

TEST_F(GpuBackward, NanOrInfInAQueryRowStaysInTheGradientsThatReadIt) {
  for (double bad : {double(NAN), double(INFINITY)})
    expect_backward_confined<bf16_t>(
        "a non-finite q entry", [bad](auto t) { t[0]->at(1, 2, 3, 1) = detail::store<bf16_t>(bad); }, kQueryRow);
}
TEST_F(GpuBackward, NanOrInfInADoutRowStaysInTheGradientsThatReadIt) {
  for (double bad : {double(NAN), double(INFINITY)})
    expect_backward_confined<bf16_t>(
        "a non-finite dout entry", [bad](auto t) { t[3]->at(1, 2, 3, 1) = detail::store<bf16_t>(bad); }, kQueryRow);
}
TEST_F(GpuBackward, NanOrInfInAKeyRowStaysInTheGradientsThatReadIt) {
  for (double bad : {double(NAN), double(INFINITY)})
    expect_backward_confined<f16_t>(
        "a non-finite k entry", [bad](auto t) { t[1]->at(0, 3, 1, 0) = detail::store<f16_t>(bad); }, kKeyRow);
}
TEST_F(GpuBackward, NanOrInfInAValueRowStaysInTheGradientsThatReadIt) {
  for (double bad : {double(NAN), double(INFINITY)})
    expect_backward_confined<bf16_t>(
        "a non-finite v entry", [bad](auto t) { t[2]->at(0, 3, 1, 0) = detail::store<bf16_t>(bad); }, kKeyRow);
}

// Bad input: the CPU backward's named errors, and the backend's own (dropout, host memory), before any
// write (the gradients keep their poison).
TEST_F(GpuBackward, RejectsBadInputBeforeWriting) {
  const std::int64_t B = 1, S = 40, H = 2, D = 64;
  auto q = random_tensor<bf16_t>(B, S, H, D, 5);
  Dev<bf16_t> dq_(q), dk_(q), dv_(q), dout_(q), ddo(q), gq(poisoned<bf16_t>(B, S, H, D)),
      gk(poisoned<bf16_t>(B, S, H, D)), gv(poisoned<bf16_t>(B, S, H, D));
  Dev<float> dlse(std::vector<float>(static_cast<std::size_t>(B * H * S), 1.0f));
  const TensorView lv = TensorView::contiguous(dlse.ptr, B, H, S);
  auto call = [&](const AttentionOptions& o, const TensorView& dq) {
    cuda::attention_backward(dq_.view(), dk_.view(), dv_.view(), dout_.view(), ddo.view(), lv, dq, gk.view(), gv.view(),
                             o);
  };
  AttentionOptions dropout;
  dropout.dropout_p = 0.1;
  expect_invalid_argument([&] { call(dropout, gq.view()); }, "dropout_p");
  std::vector<bf16_t> host(static_cast<std::size_t>(B * S * H * D));
  expect_invalid_argument([&] { call({}, TensorView::contiguous(host.data(), B, S, H, D)); }, "dq");
  expect_invalid_argument([&] { call({}, dk_.view()); }, "dq");  // dq overlaps the input k
  EXPECT_EQ(count_nan(gq.get()), B * S * H * D);
  EXPECT_EQ(count_nan(gk.get()), B * S * H * D);
}

}  // namespace
}  // namespace attn
