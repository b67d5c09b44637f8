// f32 inputs on the AMX forward's bf16 tiles by parts (ATTN_AMX_F32=bf16x3, tiled/amx_kernel.cpp): each f32
// split into three bf16 parts, six part products per block product. On every machine on the tile emulator,
// and where the CPU's tiles are usable on them too, with the same bits. It is held to the f32 rule: the
// error against the f64 oracle at most twice the f32 textbook's, out and lse. Cases force each part of the
// kernel as test_amx_forward.cpp's do (padded head dims, d_v != d, tails, GQA, masks, soft-cap, ALiBi,
// sinks, dropout); an Inf or NaN input gives the textbook's Inf and NaN pattern; without the switch f32
// stays on the vector kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/info.hpp"
#include "amx/amx.hpp"
#include "amx_cases.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::max_error;
using test::random_tensor;
using test::ScopedAmxEnv;
using test::ScopedEnv;
using test::Tensor;

using Case = test::AmxCase;
using test::amx_modes;
using test::with_dropout;

struct F32Inputs {
  Tensor<float> q, k, v;
  std::vector<float> slopes, sinks;
  AttentionOptions o;
  TileOptions tiles;
};

F32Inputs inputs_of(const Case& c) {
  F32Inputs in{random_tensor<float>(c.b, c.sq, c.h, c.d, 21, 2.0),
               random_tensor<float>(c.b, c.sk, c.hk, c.d, 22, 2.0),
               random_tensor<float>(c.b, c.sk, c.hk, c.dv, 23),
               {},
               {},
               {},
               {}};
  test::set_case_options(c, in.slopes, in.sinks, in.o, in.tiles);
  return in;
}

struct F32Run {
  std::vector<float> out, lse;
};

// attention_tiled with ATTN_AMX = amx_mode and ATTN_AMX_F32 = by_parts (nullopt: unset).
F32Run run_with(const F32Inputs& in, const char* amx_mode, const std::optional<std::string>& by_parts) {
  const ScopedAmxEnv amx{std::string(amx_mode)};
  const ScopedEnv f32{"ATTN_AMX_F32", by_parts};
  F32Run r{std::vector<float>(static_cast<std::size_t>(in.q.b * in.q.s * in.q.h * in.v.d)),
           std::vector<float>(static_cast<std::size_t>(in.q.b * in.q.h * in.q.s), 42.0f)};
  TensorView lse = TensorView::contiguous(r.lse.data(), in.q.b, in.q.h, in.q.s);
  attention_tiled(in.q.view(), in.k.view(), in.v.view(),
                  TensorView::contiguous(r.out.data(), in.q.b, in.q.s, in.q.h, in.v.d), in.o, in.tiles, &lse);
  return r;
}

class AmxF32Forward : public ::testing::TestWithParam<Case> {};

TEST_P(AmxF32Forward, WithinTwiceTheTextbookError) {
  const Case& c = GetParam();
  SCOPED_TRACE(::testing::Message() << c);
  const F32Inputs in = inputs_of(c);
  std::vector<double> oracle_lse;
  const std::vector<double> oracle = test::oracle_forward(in.q, in.k, in.v, in.o, &oracle_lse);
  std::vector<float> textbook_lse;
  const double base = max_error(test::textbook_forward(in.q, in.k, in.v, in.o, &textbook_lse), oracle);
  const double lse_base = max_error(textbook_lse, oracle_lse);
  std::vector<F32Run> runs;
  for (const char* mode : amx_modes()) {
    SCOPED_TRACE(::testing::Message() << "ATTN_AMX=" << mode);
    runs.push_back(run_with(in, mode, "bf16x3"));
    EXPECT_TRUE(test::meets_textbook_rule(max_error(runs.back().out, oracle), base, test::kForwardFactor,
                                          test::textbook_floor<float>()));
    EXPECT_TRUE(test::meets_textbook_rule(max_error(runs.back().lse, oracle_lse), lse_base, test::kForwardFactor,
                                          test::textbook_floor<float>()))
        << "lse";
  }
  if (runs.size() == 2) {  // the tiles and the emulator: the same bits
    EXPECT_EQ(max_error(runs[0].out, runs[1].out), 0.0);
    EXPECT_EQ(max_error(runs[0].lse, runs[1].lse), 0.0);
  }
}

// The cases, marked as f32 ones (their names say f32).
std::vector<Case> f32_cases(std::vector<Case> cases) {
  for (Case& c : cases) c = test::in_f32(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(HeadDimsAndTiles, AmxF32Forward,
                         ::testing::ValuesIn(f32_cases(
                             {Case{1, 67, 131, 2, 1, 64, 64}, Case{1, 40, 75, 2, 2, 128, 128},
                              Case{1, 33, 45, 2, 2, 3, 3}, Case{1, 33, 45, 2, 1, 100, 72},
                              Case{1, 30, 50, 2, 1, 192, 128},
                              Case{1, 90, 90, 2, 2, 32, 32, true, -1, -1, 0, false, false, 7, 9},  // tiny tiles, tails
                              Case{1, 90, 90, 8, 2, 32, 32, false, -1, -1, 0, false, false, 5, 33},    // GQA, odd tiles
                              Case{2, 70, 70, 2, 2, 64, 64, false, -1, -1, 0, false, false, 0, 0, 1},  // 1 thread
                              Case{1, 1, 300, 4, 4, 64, 64, true}})));                                 // one query row

INSTANTIATE_TEST_SUITE_P(
    Options, AmxF32Forward,
    ::testing::ValuesIn(f32_cases({Case{1, 150, 201, 4, 1, 64, 64, true},                  // MQA, causal
                                   Case{1, 200, 5, 2, 1, 16, 16, true},                    // first rows see nothing
                                   Case{1, 160, 160, 2, 2, 64, 64, false, 20, 0},          // sliding window
                                   Case{1, 100, 160, 2, 2, 64, 64, false, 7, 30},          // window both sides
                                   Case{1, 120, 120, 2, 1, 64, 64, true, -1, -1, 30.0},    // soft-cap
                                   Case{2, 80, 100, 4, 2, 64, 64, true, -1, -1, 0, true},  // ALiBi
                                   Case{1, 120, 140, 3, 1, 64, 64, false, -1, -1, 0, false, true},  // sinks
                                   with_dropout(Case{1, 67, 131, 2, 1, 64, 64}, 0.2),
                                   with_dropout(Case{1, 64, 64, 2, 2, 128, 128, false, 5, 5, 20.0, true, true, 16, 40},
                                                0.4)})));

// Each element's class (finite, Inf, NaN) in `out`, as a string ("f", "i", "n"), for comparing patterns.
std::string classes(const std::vector<float>& out) {
  std::string s;
  for (const float x : out) s += std::isnan(x) ? 'n' : std::isinf(x) ? 'i' : 'f';
  return s;
}

// An Inf or NaN input reaches exactly the outputs it reaches in the f32 textbook, and as the same class
// (Inf or NaN): part products such as q1 k0 with an Inf would give NaN for Inf (0 x Inf), so such tasks
// take their scores, and such heads their P V, off the part products.
TEST(AmxF32ForwardEdges, NonFiniteInputsGiveTheTextbooksPattern) {
  const std::int64_t S = 64, D = 40;  // 64 keys: a non-causal tile is unmasked
  struct Poison {
    const char* name;
    char tensor;  // 'q', 'k' or 'v'
    std::int64_t row, col;
    float value;
    bool causal = true;
    // The keys' element at col below zero: an Inf query there gives every score of its row -Inf, so the
    // textbook's output stays finite (0), where a part product Inf x (a part of the other sign) is NaN.
    bool keys_below_zero = false;
  };
  for (const Poison& poison :
       {Poison{"Inf value row", 'v', 40, -1, INFINITY}, Poison{"one Inf in v", 'v', 33, 5, -INFINITY},
        Poison{"one Inf in v, every row sees it", 'v', 33, 5, INFINITY, false},
        Poison{"Inf key element", 'k', 20, 3, INFINITY}, Poison{"NaN query", 'q', 50, 7, NAN},
        Poison{"Inf query element", 'q', 45, 9, INFINITY}, Poison{"-Inf key row", 'k', 60, -1, -INFINITY},
        Poison{"Inf query element, the keys below zero there", 'q', 45, 9, INFINITY, true, true}}) {
    SCOPED_TRACE(poison.name);
    F32Inputs in{random_tensor<float>(1, S, 2, D, 61),
                 random_tensor<float>(1, S, 1, D, 62),
                 random_tensor<float>(1, S, 1, D, 63),
                 {},
                 {},
                 {},
                 {}};
    in.o.causal = poison.causal;
    Tensor<float>& t = poison.tensor == 'q' ? in.q : poison.tensor == 'k' ? in.k : in.v;
    for (std::int64_t x = 0; x < D; ++x)
      if (poison.col < 0 || x == poison.col)
        for (std::int64_t h = 0; h < t.h; ++h) t.at(0, poison.row, h, x) = poison.value;
    if (poison.keys_below_zero)
      for (std::int64_t j = 0; j < S; ++j) in.k.at(0, j, 0, poison.col) = -std::fabs(in.k.at(0, j, 0, poison.col));
    const std::string expected = classes(test::textbook_forward(in.q, in.k, in.v, in.o));
    if (poison.keys_below_zero) {
      ASSERT_EQ(expected.find_first_not_of('f'), std::string::npos) << "the textbook's output is not finite";
    } else {
      ASSERT_NE(expected.find_first_not_of('f'), std::string::npos) << "the poison reaches no output";
      ASSERT_NE(expected.find('f'), std::string::npos) << "the poison reaches every output";
    }
    for (const char* mode : amx_modes()) {
      SCOPED_TRACE(mode);
      EXPECT_EQ(classes(run_with(in, mode, "bf16x3").out), expected);
    }
  }
}

// Without ATTN_AMX_F32 (or with off) f32 runs on the vector kernel, bit for bit ATTN_AMX=off's; with
// bf16x3 on the tiles, whose sums differ; anything else is an error naming the variable.
TEST(AmxF32ForwardEdges, RunsOnTheTilesOnlyWhenAskedTo) {
  const F32Inputs in = inputs_of(Case{1, 50, 80, 2, 1, 64, 64, true});
  const F32Run vectors = run_with(in, "off", "bf16x3");
  EXPECT_EQ(max_error(run_with(in, "emulate", std::nullopt).out, vectors.out), 0.0);
  EXPECT_EQ(max_error(run_with(in, "emulate", "off").out, vectors.out), 0.0);
  EXPECT_GT(max_error(run_with(in, "emulate", "bf16x3").out, vectors.out), 0.0)
      << "the f32 forward did not run on the emulated tiles";
  try {
    run_with(in, "emulate", "bf16x2");
    ADD_FAILURE() << "ATTN_AMX_F32=bf16x2 was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ATTN_AMX_F32"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attn
