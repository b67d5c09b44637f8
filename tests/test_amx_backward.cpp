// The backward on AMX tiles (backward/amx_backward.cpp), through the public attention_backward and
// attention_varlen_backward with ATTN_AMX set: on every machine on the tile emulator (ATTN_AMX=emulate),
// and where the CPU's tiles are usable on them too, where the gradients must equal the emulated run's bit
// for bit. Accuracy is flash-attn's rule for a path that rounds P (and dS) to bf16: each gradient's error
// against the f64 oracle at most three times that of PyTorch's bf16 math backward
// (math_reference_backward_bf16). Cases force each part of the kernel: head dims that are not multiples
// of 32, d_v != d, tails and odd forced tile sizes, GQA, causal and windowed masks (skipped blocks, rows
// that see nothing), soft-cap, ALiBi, sinks, dropout, the chunked split of the query tiles.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "attn/varlen.hpp"
#include "amx/amx.hpp"
#include "amx_cases.hpp"
#include "amx_reference.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::max_error;
using test::random_tensor;
using test::ScopedAmxEnv;
using test::Tensor;

using Case = test::AmxCase;
using test::amx_modes;
using test::in_f16;
using test::with_dropout;

// bf16 inputs with the forward's out (rounded to bf16) and lse (f32) from the f64 oracle.
template <class T>
struct Inputs {
  Tensor<T> q, k, v, dout, out;
  std::vector<float> lse, slopes, sinks;
  AttentionOptions o;
  TileOptions tiles;
};

template <class T = bf16_t>
Inputs<T> inputs_of(const Case& c) {
  Inputs<T> in{random_tensor<T>(c.b, c.sq, c.h, c.d, 61, 2.0),
               random_tensor<T>(c.b, c.sk, c.hk, c.d, 62, 2.0),
               random_tensor<T>(c.b, c.sk, c.hk, c.dv, 63),
               random_tensor<T>(c.b, c.sq, c.h, c.dv, 64),
               Tensor<T>(c.b, c.sq, c.h, c.dv),
               {},
               {},
               {},
               {},
               {}};
  test::set_case_options(c, in.slopes, in.sinks, in.o, in.tiles);
  std::vector<double> lse;
  const std::vector<double> out = test::oracle_forward(in.q, in.k, in.v, in.o, &lse);
  for (std::size_t e = 0; e < out.size(); ++e) in.out.data[e] = detail::store<T>(out[e]);
  in.lse.assign(lse.begin(), lse.end());
  return in;
}

template <class T = bf16_t>
struct Grads {
  Tensor<T> dq, dk, dv;
};

template <class T>
Grads<T> backward_with(const Inputs<T>& in, const char* amx_mode, int threads = 0) {
  const ScopedAmxEnv env{std::string(amx_mode)};
  Grads<T> g{Tensor<T>(in.q.b, in.q.s, in.q.h, in.q.d), Tensor<T>(in.k.b, in.k.s, in.k.h, in.k.d),
             Tensor<T>(in.v.b, in.v.s, in.v.h, in.v.d)};
  AttentionOptions o = in.o;
  if (threads) o.num_threads = threads;
  const TensorView lse = TensorView::contiguous(in.lse.data(), in.q.b, in.q.h, in.q.s);
  attention_backward(in.q.view(), in.k.view(), in.v.view(), in.out.view(), in.dout.view(), lse, g.dq.view(),
                     g.dk.view(), g.dv.view(), o, in.tiles);
  return g;
}

// The f64 oracle's gradients on the same inputs (out and lse from the f64 forward).
template <class T>
std::vector<std::vector<double>> oracle_grads(const Inputs<T>& in) {
  const Tensor<double> q = test::to_f64(in.q), k = test::to_f64(in.k), v = test::to_f64(in.v);
  const Tensor<double> dout = test::to_f64(in.dout);
  Tensor<double> out(in.q.b, in.q.s, in.q.h, in.v.d);
  std::vector<double> lse(static_cast<std::size_t>(in.q.b * in.q.h * in.q.s));
  const TensorView lv = TensorView::contiguous(lse.data(), in.q.b, in.q.h, in.q.s);
  attention_reference(q.view(), k.view(), v.view(), out.view(), in.o, &lv);
  Tensor<double> dq(q.b, q.s, q.h, q.d), dk(k.b, k.s, k.h, k.d), dv(v.b, v.s, v.h, v.d);
  attention_backward_reference(q.view(), k.view(), v.view(), out.view(), dout.view(), lv, dq.view(), dk.view(),
                               dv.view(), in.o);
  return {dq.data, dk.data, dv.data};
}

bool same_bits(const std::vector<bf16_t>& a, const std::vector<bf16_t>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t e = 0; e < a.size(); ++e)
    if (a[e].bits != b[e].bits) return false;
  return true;
}

constexpr const char* kGradName[3] = {"dq", "dk", "dv"};

// flash-attn's rule against PyTorch's math backward in T (bf16 or f16), on every mode of amx_modes.
template <class T>
void check_against_math_reference(const Case& c) {
  const Inputs<T> in = inputs_of<T>(c);
  const std::vector<std::vector<double>> oracle = oracle_grads(in);
  const test::MathGrads<T> math = test::math_reference_backward<T>(in.q, in.k, in.v, in.dout, in.o);
  const std::vector<T>* base[3] = {&math.dq, &math.dk, &math.dv};
  std::vector<Grads<T>> runs;
  for (const char* mode : amx_modes(c.f16)) {
    SCOPED_TRACE(::testing::Message() << "ATTN_AMX=" << mode);
    runs.push_back(backward_with(in, mode));
    const Tensor<T>* got[3] = {&runs.back().dq, &runs.back().dk, &runs.back().dv};
    for (int g = 0; g < 3; ++g) {
      const double e_base = max_error(*base[g], oracle[g]), e_got = max_error(got[g]->data, oracle[g]);
      EXPECT_TRUE(test::meets_textbook_rule(e_got, e_base, test::kGradientFactor, test::textbook_floor<T>()))
          << kGradName[g] << " against the math backward's error";
    }
  }
  if (runs.size() == 2) {  // the tiles and the emulator: the same bits
    EXPECT_EQ(max_error(runs[0].dq.data, runs[1].dq.data), 0.0);
    EXPECT_EQ(max_error(runs[0].dk.data, runs[1].dk.data), 0.0);
    EXPECT_EQ(max_error(runs[0].dv.data, runs[1].dv.data), 0.0);
  }
}

class AmxBackward : public ::testing::TestWithParam<Case> {};

TEST_P(AmxBackward, WithinThriceTheMathReferenceError) {
  const Case& c = GetParam();
  SCOPED_TRACE(::testing::Message() << c);
  if (c.f16)
    check_against_math_reference<f16_t>(c);
  else
    check_against_math_reference<bf16_t>(c);
}

INSTANTIATE_TEST_SUITE_P(
    HeadDimsAndTiles, AmxBackward,
    ::testing::Values(Case{1, 67, 131, 2, 1, 64, 64}, Case{1, 67, 131, 2, 2, 128, 128}, Case{1, 33, 45, 2, 2, 3, 3},
                      Case{1, 33, 45, 2, 1, 100, 72}, Case{1, 30, 50, 2, 1, 192, 128},  // DeepSeek's prefill dims
                      Case{2, 100, 100, 2, 2, 64, 64, false, -1, -1, 0, false, false, 0, 0, 1},  // 1 thread
                      Case{1, 90, 90, 2, 2, 32, 32, true, -1, -1, 0, false, false, 7, 9},        // tiny tiles, tails
                      Case{1, 90, 90, 8, 2, 32, 32, false, -1, -1, 0, false, false, 5, 33},      // GQA, odd tiles
                      Case{1, 1, 200, 4, 4, 64, 64, true}));                                     // one query row

INSTANTIATE_TEST_SUITE_P(Options, AmxBackward,
                         ::testing::Values(Case{1, 150, 201, 4, 1, 64, 64, true},          // MQA, causal
                                           Case{1, 200, 5, 2, 1, 16, 16, true},            // first rows see nothing
                                           Case{1, 160, 160, 2, 2, 64, 64, false, 20, 0},  // sliding window
                                           Case{1, 100, 160, 2, 2, 64, 64, false, 7, 30},  // window both sides
                                           Case{1, 120, 120, 2, 1, 64, 64, true, -1, -1, 30.0},             // soft-cap
                                           Case{2, 100, 120, 4, 2, 64, 64, true, -1, -1, 0, true},          // ALiBi
                                           Case{1, 100, 120, 3, 1, 64, 64, false, -1, -1, 0, false, true},  // sinks
                                           Case{1, 64, 64, 2, 2, 128, 128, false, 5, 5, 20.0, true, true, 16, 40}));

// Dropout on the tiles: dP and the P of dV times the rule's Z / (1 - p), regenerated as the forward drew it.
INSTANTIATE_TEST_SUITE_P(
    Dropout, AmxBackward,
    ::testing::Values(with_dropout(Case{1, 67, 131, 2, 1, 64, 64}, 0.2),
                      with_dropout(Case{1, 33, 45, 2, 2, 40, 40}, 0.1),
                      with_dropout(Case{2, 100, 120, 4, 2, 64, 64, true}, 0.9),
                      with_dropout(Case{1, 90, 90, 8, 2, 32, 32, true, -1, -1, 0, false, false, 5, 33}, 0.5),
                      with_dropout(Case{1, 100, 160, 2, 2, 64, 64, false, 7, 30}, 0.3),
                      with_dropout(Case{1, 64, 64, 2, 2, 128, 128, false, 5, 5, 20.0, true, true, 16, 40}, 0.4)));

// f16 inputs on TDPFP16PS (the emulator here; the tiles on a CPU with AMX-FP16), P and dS rounded to f16.
INSTANTIATE_TEST_SUITE_P(
    F16, AmxBackward,
    ::testing::Values(in_f16(Case{1, 67, 131, 2, 1, 64, 64}), in_f16(Case{1, 33, 45, 2, 1, 100, 72}),
                      in_f16(Case{1, 90, 90, 8, 2, 32, 32, true, -1, -1, 0, false, false, 5, 33}),
                      in_f16(Case{1, 160, 160, 2, 2, 64, 64, false, 20, 0}),
                      in_f16(Case{2, 100, 120, 4, 2, 64, 64, true, -1, -1, 0, true}),
                      in_f16(with_dropout(Case{1, 64, 64, 2, 2, 128, 128, false, 5, 5, 20.0, true, true, 16, 40},
                                          0.4))));

TEST(AmxBackwardEdges, AnyThreadCountGivesBitwiseEqualGradients) {
  for (const char* mode : amx_modes())
    for (double dropout : {0.0, 0.3}) {
      const Inputs in =
          inputs_of(with_dropout(Case{1, 150, 170, 4, 2, 64, 64, true, 40, -1, 0, true, false, 32, 64}, dropout));
      SCOPED_TRACE(::testing::Message() << mode << " dropout " << dropout);
      const Grads one = backward_with(in, mode, 1);
      for (int threads : {2, 3}) {
        const Grads many = backward_with(in, mode, threads);
        EXPECT_EQ(max_error(many.dq.data, one.dq.data), 0.0) << threads;
        EXPECT_EQ(max_error(many.dk.data, one.dk.data), 0.0) << threads;
        EXPECT_EQ(max_error(many.dv.data, one.dv.data), 0.0) << threads;
      }
    }
}

// With one key, O = v and dP = D exactly (both O's and V's rows times dO^T on the tiles): dS = 0, so dq and
// dk are exactly 0, not rounding noise; dv = dO.
TEST(AmxBackwardEdges, OneKeyGivesExactlyZeroScoreGradients) {
  Inputs in = inputs_of(Case{1, 40, 1, 2, 1, 64, 64});
  for (std::int64_t i = 0; i < 40; ++i)
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t x = 0; x < 64; ++x) in.out.at(0, i, h, x) = in.v.at(0, 0, 0, x);
  for (const char* mode : amx_modes()) {
    SCOPED_TRACE(mode);
    const Grads g = backward_with(in, mode);
    for (const bf16_t x : g.dq.data) ASSERT_EQ(detail::load<float>(x), 0.0f);
    for (const bf16_t x : g.dk.data) ASSERT_EQ(detail::load<float>(x), 0.0f);
  }
}

// A non-finite q, k or dout would meet the zero weights of hidden pairs in a tile product (0 x Inf): such a
// call runs on the vector kernel, whose gradients it then equals bit for bit.
TEST(AmxBackwardEdges, NonFiniteInputsRunOnTheVectorKernel) {
  for (int which = 0; which < 3; ++which) {
    Inputs in = inputs_of(Case{1, 64, 64, 2, 1, 32, 32, true});
    Tensor<bf16_t>& t = which == 0 ? in.q : which == 1 ? in.k : in.dout;
    t.at(0, 40, 0, 3) = detail::store<bf16_t>(INFINITY);
    const Grads vector_kernel = backward_with(in, "off");
    for (const char* mode : amx_modes()) {
      SCOPED_TRACE(::testing::Message() << mode << " input " << which);
      const Grads g = backward_with(in, mode);
      EXPECT_TRUE(same_bits(g.dq.data, vector_kernel.dq.data));
      EXPECT_TRUE(same_bits(g.dk.data, vector_kernel.dk.data));
      EXPECT_TRUE(same_bits(g.dv.data, vector_kernel.dv.data));
    }
  }
}

// Varlen runs each sequence as its own problem in one job on the same tiles: the packed batch equals one
// attention_backward call per sequence, bit for bit.
TEST(AmxBackwardEdges, VarlenEqualsOneCallPerSequence) {
  const std::int64_t H = 2, D = 64;
  const std::vector<std::int32_t> lens_q{5, 70, 33}, lens_k{9, 70, 100};
  const std::vector<std::int32_t> cu_q = test::cu_seqlens(lens_q), cu_k = test::cu_seqlens(lens_k);
  const std::int64_t tq = cu_q.back(), tk = cu_k.back();
  auto q = random_tensor<bf16_t>(1, tq, H, D, 71), k = random_tensor<bf16_t>(1, tk, H, D, 72),
       v = random_tensor<bf16_t>(1, tk, H, D, 73), dout = random_tensor<bf16_t>(1, tq, H, D, 74);
  AttentionOptions o;
  o.causal = true;
  Tensor<bf16_t> out(1, tq, H, D);
  std::vector<float> lse(static_cast<std::size_t>(H * tq));
  const TensorView lse_v = TensorView::contiguous(lse.data(), 1, H, tq);
  attention_varlen(q.packed(), k.packed(), v.packed(), out.packed(), VarlenBatch{cu_q.data(), cu_k.data(), 3}, o, {},
                   &lse_v);
  for (const char* mode : amx_modes()) {
    SCOPED_TRACE(mode);
    const ScopedAmxEnv env{std::string(mode)};
    Tensor<bf16_t> dq(1, tq, H, D), dk(1, tk, H, D), dv(1, tk, H, D);
    attention_varlen_backward(q.packed(), k.packed(), v.packed(), out.packed(), dout.packed(), lse_v, dq.packed(),
                              dk.packed(), dv.packed(), VarlenBatch{cu_q.data(), cu_k.data(), 3}, o);
    for (std::size_t s = 0; s < lens_q.size(); ++s) {
      const std::int64_t nq = lens_q[s], nk = lens_k[s];
      std::vector<float> lse_s(static_cast<std::size_t>(H * nq));
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < nq; ++i) lse_s[h * nq + i] = lse[h * tq + cu_q[s] + i];
      Tensor<bf16_t> dq1(1, nq, H, D), dk1(1, nk, H, D), dv1(1, nk, H, D);
      attention_backward(q.rows(cu_q[s], nq), k.rows(cu_k[s], nk), v.rows(cu_k[s], nk), out.rows(cu_q[s], nq),
                         dout.rows(cu_q[s], nq), TensorView::contiguous(lse_s.data(), 1, H, nq), dq1.view(), dk1.view(),
                         dv1.view(), o);
      for (std::size_t e = 0; e < dq1.data.size(); ++e)
        ASSERT_EQ(dq1.data[e].bits, dq.data[cu_q[s] * H * D + e].bits) << "dq, sequence " << s;
      for (std::size_t e = 0; e < dk1.data.size(); ++e) {
        ASSERT_EQ(dk1.data[e].bits, dk.data[cu_k[s] * H * D + e].bits) << "dk, sequence " << s;
        ASSERT_EQ(dv1.data[e].bits, dv.data[cu_k[s] * H * D + e].bits) << "dv, sequence " << s;
      }
    }
  }
}

}  // namespace
}  // namespace attn
