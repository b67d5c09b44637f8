// The tiled forward on AMX tiles (tiled/amx_kernel.cpp), through the public attention_tiled and
// attention_varlen with ATTN_AMX set: on every machine on the tile emulator (ATTN_AMX=emulate), and where
// the CPU's tiles are usable on them too, where its output must equal the emulated run's bit for bit.
// Accuracy is flash-attn's rule for a path that rounds P to bf16: the error against the f64 oracle at
// most twice that of PyTorch's bf16 math reference (math_reference_bf16), the lse within twice the f32
// textbook's. Cases force each part of the kernel: head dims that are not multiples of 32 (zero
// padding of Q, K and V), d_v != d, tiles that leave tails and odd forced tile sizes, GQA stacking,
// causal and sliding windows (skipped blocks, rows that see nothing), soft-cap, ALiBi, sinks, the lse,
// dropout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/info.hpp"
#include "attn/varlen.hpp"
#include "amx/amx.hpp"
#include "amx_cases.hpp"
#include "amx_reference.hpp"
#include "validate/problem.hpp"
#include "support.hpp"

namespace attn {
namespace {

using detail::amx::TileBackend;
using test::max_error;
using test::random_tensor;
using test::ScopedAmxEnv;
using test::Tensor;

using Case = test::AmxCase;
using test::amx_modes;
using test::in_f16;
using test::with_dropout;

template <class T>
struct Inputs {
  Tensor<T> q, k, v;
  std::vector<float> slopes, sinks;
  AttentionOptions o;
  TileOptions tiles;
  std::size_t lse_size;
};

template <class T>
Inputs<T> inputs_of(const Case& c) {
  Inputs<T> in{random_tensor<T>(c.b, c.sq, c.h, c.d, 21, 2.0),
               random_tensor<T>(c.b, c.sk, c.hk, c.d, 22, 2.0),
               random_tensor<T>(c.b, c.sk, c.hk, c.dv, 23),
               {},
               {},
               {},
               {},
               0};
  test::set_case_options(c, in.slopes, in.sinks, in.o, in.tiles);
  in.lse_size = static_cast<std::size_t>(c.b * c.h * c.sq);
  return in;
}

template <class T>
struct AmxRun {
  std::vector<T> out;
  std::vector<float> lse;
};

template <class T>
AmxRun<T> run_tiled_with(const Inputs<T>& in, const char* amx_mode) {
  const ScopedAmxEnv env{std::string(amx_mode)};
  AmxRun<T> r{std::vector<T>(static_cast<std::size_t>(in.q.b * in.q.s * in.q.h * in.v.d)),
              std::vector<float>(in.lse_size, 42.0f)};
  TensorView lse = TensorView::contiguous(r.lse.data(), in.q.b, in.q.h, in.q.s);
  attention_tiled(in.q.view(), in.k.view(), in.v.view(),
                  TensorView::contiguous(r.out.data(), in.q.b, in.q.s, in.q.h, in.v.d), in.o, in.tiles, &lse);
  return r;
}

// flash-attn's rule against PyTorch's math attention in T (bf16 or f16), on every mode of amx_modes.
template <class T>
void check_against_math_reference(const Case& c) {
  const Inputs<T> in = inputs_of<T>(c);
  std::vector<double> oracle_lse;
  const std::vector<double> oracle = test::oracle_forward(in.q, in.k, in.v, in.o, &oracle_lse);
  const double base = max_error(test::math_reference<T>(in.q, in.k, in.v, in.o), oracle);
  // The lse's baseline: the f32 textbook's (the lse is not rounded to bf16 by any of them).
  std::vector<float> textbook_lse;
  test::textbook_forward(in.q, in.k, in.v, in.o, &textbook_lse);
  const double lse_base = max_error(textbook_lse, oracle_lse);

  std::vector<AmxRun<T>> runs;
  for (const char* mode : amx_modes(c.f16)) {
    SCOPED_TRACE(::testing::Message() << "ATTN_AMX=" << mode);
    runs.push_back(run_tiled_with(in, mode));
    const AmxRun<T>& r = runs.back();
    EXPECT_TRUE(
        test::meets_textbook_rule(max_error(r.out, oracle), base, test::kForwardFactor, test::textbook_floor<T>()))
        << "against the math reference's error";
    // A row that sees no key has lse -inf (and out 0), as the oracle's.
    EXPECT_TRUE(test::meets_textbook_rule(max_error(r.lse, oracle_lse), lse_base, test::kForwardFactor, 1e-5))
        << "lse, against the f32 textbook's error";
  }
  if (runs.size() == 2) {  // the tiles and the emulator: the same bits
    EXPECT_EQ(max_error(runs[0].out, runs[1].out), 0.0);
    EXPECT_EQ(max_error(runs[0].lse, runs[1].lse), 0.0);
  }
}

class AmxForward : public ::testing::TestWithParam<Case> {};

TEST_P(AmxForward, WithinTwiceTheMathReferenceError) {
  const Case& c = GetParam();
  SCOPED_TRACE(::testing::Message() << c);
  if (c.f16)
    check_against_math_reference<f16_t>(c);
  else
    check_against_math_reference<bf16_t>(c);
}

INSTANTIATE_TEST_SUITE_P(
    HeadDimsAndTiles, AmxForward,
    ::testing::Values(Case{1, 67, 131, 2, 1, 64, 64}, Case{1, 67, 131, 2, 2, 128, 128}, Case{1, 40, 75, 2, 1, 256, 256},
                      Case{1, 33, 45, 2, 2, 3, 3}, Case{1, 33, 45, 2, 2, 40, 40}, Case{1, 33, 45, 2, 1, 100, 72},
                      Case{1, 30, 50, 2, 1, 192, 128},  // DeepSeek's prefill dims
                      Case{2, 150, 150, 2, 2, 64, 64, false, -1, -1, 0, false, false, 0, 0, 1},  // 1 thread
                      Case{1, 90, 90, 2, 2, 32, 32, true, -1, -1, 0, false, false, 7, 9},        // tiny tiles, tails
                      Case{1, 90, 90, 8, 2, 32, 32, false, -1, -1, 0, false, false, 5, 33},      // GQA, odd tiles
                      Case{1, 1, 300, 4, 4, 64, 64, true}));                                     // one query row

INSTANTIATE_TEST_SUITE_P(Options, AmxForward,
                         ::testing::Values(Case{1, 150, 301, 4, 1, 64, 64, true},          // MQA, causal
                                           Case{1, 300, 5, 2, 1, 16, 16, true},            // first rows see nothing
                                           Case{1, 200, 200, 2, 2, 64, 64, false, 20, 0},  // sliding window
                                           Case{1, 100, 160, 2, 2, 64, 64, false, 7, 30},  // window both sides
                                           Case{1, 120, 120, 2, 1, 64, 64, true, -1, -1, 30.0},             // soft-cap
                                           Case{2, 120, 140, 4, 2, 64, 64, true, -1, -1, 0, true},          // ALiBi
                                           Case{1, 120, 140, 3, 1, 64, 64, false, -1, -1, 0, false, true},  // sinks
                                           Case{1, 64, 64, 2, 2, 128, 128, false, 5, 5, 20.0, true, true, 16, 40}));

// Dropout on the tiles: P times the rule's Z / (1 - p) before its rounding to bf16. Window starts that
// are not multiples of the lane count, GQA rows of several heads, a batch of two (the counter's head
// word), heavy and light rates.
INSTANTIATE_TEST_SUITE_P(
    Dropout, AmxForward,
    ::testing::Values(with_dropout(Case{1, 67, 131, 2, 1, 64, 64}, 0.2),
                      with_dropout(Case{1, 33, 45, 2, 2, 40, 40}, 0.1),
                      with_dropout(Case{2, 120, 140, 4, 2, 64, 64, true}, 0.9),
                      with_dropout(Case{1, 90, 90, 8, 2, 32, 32, true, -1, -1, 0, false, false, 5, 33}, 0.5),
                      with_dropout(Case{1, 100, 160, 2, 2, 64, 64, false, 7, 30}, 0.3),
                      with_dropout(Case{1, 64, 64, 2, 2, 128, 128, false, 5, 5, 20.0, true, true, 16, 40}, 0.4)));

// f16 inputs on TDPFP16PS (the emulator here; the tiles on a CPU with AMX-FP16), P rounded to f16.
INSTANTIATE_TEST_SUITE_P(
    F16, AmxForward,
    ::testing::Values(in_f16(Case{1, 67, 131, 2, 1, 64, 64}), in_f16(Case{1, 33, 45, 2, 1, 100, 72}),
                      in_f16(Case{1, 90, 90, 8, 2, 32, 32, true, -1, -1, 0, false, false, 5, 33}),
                      in_f16(Case{1, 200, 200, 2, 2, 64, 64, false, 20, 0}),
                      in_f16(Case{2, 120, 140, 4, 2, 64, 64, true, -1, -1, 0, true}),
                      in_f16(with_dropout(Case{1, 64, 64, 2, 2, 128, 128, false, 5, 5, 20.0, true, true, 16, 40},
                                          0.4))));

// A value row with Inf that some rows of a tile must not see (it lies past their causal diagonal): those
// rows stay finite, as the textbook's do; the rows that see it get Inf or NaN like the textbook's.
TEST(AmxForwardEdges, NonFiniteValuesReachOnlyTheRowsThatSeeThem) {
  const std::int64_t S = 64, D = 64;
  auto q = random_tensor<bf16_t>(1, S, 1, D, 31), k = random_tensor<bf16_t>(1, S, 1, D, 32),
       v = random_tensor<bf16_t>(1, S, 1, D, 33);
  const std::int64_t poisoned = 40;
  for (std::int64_t x = 0; x < D; ++x) v.at(0, poisoned, 0, x) = detail::store<bf16_t>(INFINITY);
  AttentionOptions o;
  o.causal = true;
  for (const char* mode : amx_modes()) {
    SCOPED_TRACE(mode);
    const ScopedAmxEnv env{std::string(mode)};
    std::vector<bf16_t> out(static_cast<std::size_t>(S * D));
    attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, S, 1, D), o);
    for (std::int64_t i = 0; i < S; ++i) {
      bool finite = true;
      for (std::int64_t x = 0; x < D; ++x) finite &= std::isfinite(detail::load<float>(out[i * D + x]));
      EXPECT_EQ(finite, i < poisoned) << "row " << i;
    }
  }
}

// Varlen runs each sequence as its own problem on the same tiles: the packed batch equals one
// attention_tiled call per sequence, bit for bit.
TEST(AmxForwardEdges, VarlenEqualsOneCallPerSequence) {
  const std::int64_t H = 2, D = 64;
  const std::vector<std::int32_t> lens_q{5, 70, 33}, lens_k{9, 70, 100};
  const std::vector<std::int32_t> cu_q = test::cu_seqlens(lens_q), cu_k = test::cu_seqlens(lens_k);
  auto q = random_tensor<bf16_t>(1, cu_q.back(), H, D, 41), k = random_tensor<bf16_t>(1, cu_k.back(), H, D, 42),
       v = random_tensor<bf16_t>(1, cu_k.back(), H, D, 43);
  AttentionOptions o;
  o.causal = true;
  for (const char* mode : amx_modes()) {
    SCOPED_TRACE(mode);
    const ScopedAmxEnv env{std::string(mode)};
    std::vector<bf16_t> packed(q.data.size());
    const TensorView q3 = TensorView::contiguous(q.data.data(), cu_q.back(), H, D);
    const TensorView k3 = TensorView::contiguous(k.data.data(), cu_k.back(), H, D);
    const TensorView v3 = TensorView::contiguous(v.data.data(), cu_k.back(), H, D);
    attention_varlen(q3, k3, v3, TensorView::contiguous(packed.data(), cu_q.back(), H, D),
                     VarlenBatch{cu_q.data(), cu_k.data(), 3}, o);
    for (std::size_t s = 0; s < lens_q.size(); ++s) {
      std::vector<bf16_t> one(static_cast<std::size_t>(lens_q[s] * H * D));
      attention_tiled(TensorView::contiguous(q.data.data() + cu_q[s] * H * D, 1, lens_q[s], H, D),
                      TensorView::contiguous(k.data.data() + cu_k[s] * H * D, 1, lens_k[s], H, D),
                      TensorView::contiguous(v.data.data() + cu_k[s] * H * D, 1, lens_k[s], H, D),
                      TensorView::contiguous(one.data(), 1, lens_q[s], H, D), o);
      for (std::size_t e = 0; e < one.size(); ++e)
        ASSERT_EQ(one[e].bits, packed[cu_q[s] * H * D + e].bits) << "sequence " << s << " element " << e;
    }
  }
}

// With dropout, sequence b of a varlen batch draws batch index b's mask on the tiles too: it equals
// attention_tiled at batch index b of a batch of b + 1 copies of that sequence, bit for bit.
TEST(AmxForwardEdges, VarlenDropoutSequenceBIsBatchIndexB) {
  const std::int64_t H = 4, HK = 2, D = 32;
  const std::vector<std::int32_t> lens_q{5, 40, 17}, lens_k{9, 40, 50};
  const std::vector<std::int32_t> cu_q = test::cu_seqlens(lens_q), cu_k = test::cu_seqlens(lens_k);
  auto q = random_tensor<bf16_t>(1, cu_q.back(), H, D, 44), k = random_tensor<bf16_t>(1, cu_k.back(), HK, D, 45),
       v = random_tensor<bf16_t>(1, cu_k.back(), HK, D, 46);
  AttentionOptions o;
  o.causal = true;
  o.dropout_p = 0.5;
  o.dropout_seed = 77;
  o.dropout_offset = 3;
  for (const char* mode : amx_modes()) {
    SCOPED_TRACE(mode);
    const ScopedAmxEnv env{std::string(mode)};
    Tensor<bf16_t> packed(1, cu_q.back(), H, D);
    attention_varlen(q.packed(), k.packed(), v.packed(), packed.packed(), VarlenBatch{cu_q.data(), cu_k.data(), 3}, o);
    for (std::int64_t b = 0; b < 3; ++b) {
      const std::int64_t nq = lens_q[b], nk = lens_k[b];
      Tensor<bf16_t> qb(b + 1, nq, H, D), kb(b + 1, nk, HK, D), vb(b + 1, nk, HK, D), ob(b + 1, nq, H, D);
      for (std::int64_t c = 0; c <= b; ++c) {
        std::copy_n(&q.at(0, cu_q[b], 0, 0), nq * H * D, &qb.at(c, 0, 0, 0));
        std::copy_n(&k.at(0, cu_k[b], 0, 0), nk * HK * D, &kb.at(c, 0, 0, 0));
        std::copy_n(&v.at(0, cu_k[b], 0, 0), nk * HK * D, &vb.at(c, 0, 0, 0));
      }
      attention_tiled(qb.view(), kb.view(), vb.view(), ob.view(), o);
      for (std::int64_t e = 0; e < nq * H * D; ++e)
        ASSERT_EQ((&ob.at(b, 0, 0, 0))[e].bits, (&packed.at(0, cu_q[b], 0, 0))[e].bits) << "sequence " << b;
    }
  }
}

// TDPBF16PS reads subnormal bf16 as zero (DAZ): a subnormal value row gives 0, where the vector kernels
// keep it (test_numerical_edges.cpp, Denormals); 1e-39 against outputs of order 1 is far inside the
// accuracy rule. Subnormal q and k likewise give scores 0 (the mean of v).
TEST(AmxForwardEdges, SubnormalValuesReadAsZero) {
  auto q = random_tensor<bf16_t>(1, 4, 1, 32, 51), k = random_tensor<bf16_t>(1, 6, 1, 32, 52),
       v = random_tensor<bf16_t>(1, 6, 1, 32, 53);
  for (auto& x : v.data) x = detail::store<bf16_t>(1e-39);
  ASSERT_NE(detail::load<float>(v.data[0]), 0.0f);
  for (const char* mode : amx_modes()) {
    SCOPED_TRACE(mode);
    const ScopedAmxEnv env{std::string(mode)};
    std::vector<bf16_t> out(4 * 32, bf16_t{0x7fc0});
    attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, 4, 1, 32));
    for (const bf16_t x : out) EXPECT_EQ(detail::load<float>(x), 0.0f);
  }
}

// TDPFP16PS keeps subnormal f16 inputs (unlike TDPBF16PS's DAZ): a value row of f16 subnormals averages to
// itself on the tiles, as on the vector kernel. An f16 Inf in v reaches only the rows that see it.
TEST(AmxForwardEdges, F16SubnormalValuesKeepTheirValueAndInfReachesOnlyItsRows) {
  auto q = random_tensor<f16_t>(1, 64, 1, 32, 54), k = random_tensor<f16_t>(1, 64, 1, 32, 55);
  Tensor<f16_t> v(1, 64, 1, 32);
  for (auto& x : v.data) x = detail::store<f16_t>(std::ldexp(1.0f, -20));  // f16 subnormal: below 2^-14
  for (std::int64_t x = 0; x < 32; ++x) v.at(0, 50, 0, x) = detail::store<f16_t>(INFINITY);
  AttentionOptions o;
  o.causal = true;
  for (const char* mode : amx_modes(true)) {
    SCOPED_TRACE(mode);
    const ScopedAmxEnv env{std::string(mode)};
    std::vector<f16_t> out(64 * 32);
    attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, 64, 1, 32), o);
    for (std::int64_t i = 0; i < 64; ++i) {
      const float x = detail::load<float>(out[static_cast<std::size_t>(i * 32)]);
      if (i < 50)
        EXPECT_NEAR(x, std::ldexp(1.0f, -20), std::ldexp(1.0f, -26)) << "row " << i;
      else
        EXPECT_FALSE(std::isfinite(x)) << "row " << i;
    }
  }
}

// f16 runs on the tiles only where they run TDPFP16PS: the emulator here, and its P rounded to f16 gives
// other bits than the vector kernel's f32 P.
TEST(AmxForwardEdges, F16RunsOnTheTilesWhereTheyTakeIt) {
  auto q = random_tensor<f16_t>(1, 40, 2, 64, 57), k = random_tensor<f16_t>(1, 70, 2, 64, 58),
       v = random_tensor<f16_t>(1, 70, 2, 64, 59);
  auto run = [&](const char* mode) {
    const ScopedAmxEnv env{std::string(mode)};
    std::vector<f16_t> out(40 * 2 * 64);
    attention_tiled(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, 40, 2, 64));
    return out;
  };
  {
    const ScopedAmxEnv env{std::string("emulate")};
    EXPECT_TRUE(kernel_info().f16_on_tiles);
  }
  const std::vector<f16_t> tiles = run("emulate"), vectors = run("off");
  EXPECT_GT(max_error(tiles, vectors), 0.0) << "the f16 forward did not run on the emulated tiles";
  if (detail::amx_support().usable()) {
    const ScopedAmxEnv env{std::string("on")};
    EXPECT_EQ(kernel_info().f16_on_tiles, detail::amx_support().cpu_fp16);
  }
}

TEST(AmxForwardEdges, BackendFollowsTheSwitch) {
  {
    const ScopedAmxEnv env{std::string("emulate")};
    EXPECT_EQ(detail::amx_backend(), TileBackend::emulated);
    EXPECT_FALSE(detail::amx_enabled());
  }
  {
    const ScopedAmxEnv env{std::string("off")};
    EXPECT_EQ(detail::amx_backend(), TileBackend::none);
  }
  const ScopedAmxEnv env{std::string("auto")};
  EXPECT_EQ(detail::amx_backend(), detail::amx_support().usable() ? TileBackend::hardware : TileBackend::none);
}

}  // namespace
}  // namespace attn
