// The HBM traffic model: the seed widget's figures, and the closed forms checked against the
// schedules run for real through a counting memory (src/io/counted.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include "attn/io_model.hpp"

namespace {

using attn::io::ModelParams;
using std::int64_t;

// The seed prints one decimal ("136.3 MB", "7.3×"); compare the way it rounds.
std::string one_decimal(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

TEST(IoModel, SeedWidgetFigures) {
  const attn::io::Report r = attn::io::model(ModelParams{});
  EXPECT_EQ(r.sram_elements, 98304);  // 192 KiB of 16-bit elements

  EXPECT_EQ(r.standard.elements, 68157440);
  EXPECT_EQ(one_decimal(r.standard.bytes / 1e6), "136.3");
  EXPECT_EQ(one_decimal(r.standard.seconds * 1e6), "50.9");

  EXPECT_EQ(r.tiled.elements, 9355264);
  EXPECT_EQ(one_decimal(r.tiled.bytes / 1e6), "18.7");
  EXPECT_EQ(one_decimal(r.tiled.seconds * 1e6), "7.0");
  EXPECT_EQ(r.tiled.block_cols, 384);
  EXPECT_EQ(r.tiled.block_rows, 64);
  EXPECT_EQ(r.tiled.passes, 11);

  EXPECT_EQ(one_decimal(r.reduction), "7.3");
  EXPECT_EQ(one_decimal(r.score_matrix_bytes / 1e6), "33.6");

  EXPECT_EQ(r.fa2.elements, 2 * 4096 * 64 + 4096 + 2 * 4096 * 64 * 11);
  EXPECT_EQ(r.fa2.block_rows, 384);
  EXPECT_EQ(r.fa2.passes, 11);
  EXPECT_DOUBLE_EQ(r.standard.seconds, r.standard.bytes / (3.35e12 * 0.8));
}

TEST(IoModel, ClosedFormsMatchTheirDefinitions) {
  for (int64_t n : {1, 5, 4096, 100000})
    for (int64_t d : {1, 64, 256})
      for (int64_t m : {1, 1000, 98304}) {
        const int64_t b = ceil_div(m, 4 * d);
        EXPECT_EQ(attn::io::standard_elements(n, d), 4 * n * d + 4 * n * n);
        EXPECT_EQ(attn::io::tiled_elements(n, d, m), 2 * n * d + ceil_div(n, b) * (3 * n * d + 4 * n));
        EXPECT_EQ(attn::io::fa2_elements(n, d, m), 2 * n * d + n + 2 * n * d * ceil_div(n, b));
      }
}

// The seed's remark: with a large head dim and little SRAM, tiling moves more than the textbook way.
TEST(IoModel, TilingLosesWithLargeHeadDimAndLittleSram) {
  ModelParams p;
  p.head_dim = 256;
  p.sram_bytes = 16 * 1024;
  const auto r = attn::io::model(p);
  EXPECT_GT(r.tiled.bytes, r.standard.bytes);
  EXPECT_LT(r.reduction, 1);
  p.head_dim = 64;
  p.sram_bytes = 192 * 1024;
  EXPECT_GT(attn::io::model(p).reduction, 1);
}

struct Case {
  int64_t n, d, m;
};

void PrintTo(const Case& c, std::ostream* os) { *os << "N=" << c.n << " d=" << c.d << " M=" << c.m; }

class Counted : public testing::TestWithParam<Case> {};

TEST_P(Counted, Algorithm1MatchesClosedForm) {
  const auto [n, d, m] = GetParam();
  const auto c = attn::io::count_algorithm1(n, d, m);
  const int64_t bc = ceil_div(m, 4 * d), br = std::min(bc, d), tc = ceil_div(n, bc);
  EXPECT_EQ(c.elements, attn::io::tiled_elements(n, d, m));
  EXPECT_EQ(c.reads + c.writes, c.elements);
  EXPECT_EQ(c.reads, 2 * n * d + tc * (2 * n * d + 2 * n));  // K, V once; Q, O, l, m per pass
  EXPECT_EQ(c.writes, tc * (n * d + 2 * n));                 // O, l, m per pass
  // K_j, V_j, Q_i, O_i, S_ij, l_i, m_i with full (or, for N below a tile, whole-sequence) tiles.
  const int64_t kb = std::min(bc, n), qb = std::min(br, n);
  EXPECT_EQ(c.sram_peak_elements, 2 * kb * d + 2 * qb * d + qb * kb + 2 * qb);
  EXPECT_LE(c.max_abs_diff, 1e-12);
}

TEST_P(Counted, Fa2OrderMatchesClosedForm) {
  const auto [n, d, m] = GetParam();
  const auto c = attn::io::count_fa2(n, d, m);
  const int64_t b = ceil_div(m, 4 * d), tr = ceil_div(n, b);
  EXPECT_EQ(c.elements, attn::io::fa2_elements(n, d, m));
  EXPECT_EQ(c.reads, n * d + 2 * n * d * tr);  // Q once, K and V per query tile
  EXPECT_EQ(c.writes, n * d + n);              // O and the LSE once
  const int64_t t = std::min(b, n);
  EXPECT_EQ(c.sram_peak_elements, 4 * t * d + t * t + 2 * t);
  EXPECT_LE(c.max_abs_diff, 1e-12);
}

// B = ceil(M / 4d) is noted for each case; "partial" = N not a multiple of the tile.
INSTANTIATE_TEST_SUITE_P(Grid, Counted,
                         testing::Values(Case{1, 1, 1},             // one token, B = 1
                                         Case{13, 1, 1},            // B_c = B_r = 1
                                         Case{100, 1, 10},          // B = 3, partial
                                         Case{1000, 1, 50},         // B = 13, partial, d = 1 so B_r = 1
                                         Case{1, 16, 5000},         // N far below a tile
                                         Case{37, 16, 1},           // B = 1
                                         Case{100, 16, 1000},       // B = 16, partial
                                         Case{1000, 16, 1},         // B = 1: a thousand passes
                                         Case{5, 64, 98304},        // N below the default tile (B = 384)
                                         Case{129, 64, 1},          // B = 1
                                         Case{300, 64, 1792},       // B = 7, partial
                                         Case{1000, 64, 98304},     // the default SRAM: B = 384, partial
                                         Case{64, 128, 1},          // B = 1
                                         Case{1000, 128, 98304},    // B = 192, partial
                                         Case{200, 128, 4608},      // B = 9, partial
                                         Case{50, 256, 1},          // B = 1
                                         Case{300, 256, 7169},      // B = 8, partial
                                         Case{1000, 256, 102400}),  // B = 100, exact
                         [](const testing::TestParamInfo<Case>& i) {
                           return "N" + std::to_string(i.param.n) + "_d" + std::to_string(i.param.d) + "_M" +
                                  std::to_string(i.param.m);
                         });

TEST(IoCounted, SeedDoesNotChangeTheCounts) {
  const auto a = attn::io::count_algorithm1(77, 8, 100, 1), b = attn::io::count_algorithm1(77, 8, 100, 42);
  EXPECT_EQ(a.elements, b.elements);
  EXPECT_LE(b.max_abs_diff, 1e-12);
}

// A bad parameter throws std::invalid_argument whose message names it.
void expect_invalid(const std::function<void()>& f, const std::string& name) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one naming " << name;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(IoModel, BadParametersThrowNamingThem) {
  auto with = [](const std::function<void(ModelParams&)>& set) {
    return [set] {
      ModelParams p;
      set(p);
      attn::io::model(p);
    };
  };
  expect_invalid(with([](ModelParams& p) { p.seqlen = 0; }), "seqlen");
  expect_invalid(with([](ModelParams& p) { p.head_dim = -3; }), "head_dim");
  expect_invalid(with([](ModelParams& p) { p.sram_bytes = 1; }), "sram_bytes");  // < one 2-byte element
  expect_invalid(with([](ModelParams& p) { p.sram_bytes = std::nan(""); }), "sram_bytes");
  expect_invalid(with([](ModelParams& p) { p.element_bytes = 0; }), "element_bytes");
  expect_invalid(with([](ModelParams& p) { p.bandwidth = -1; }), "bandwidth");
  expect_invalid(with([](ModelParams& p) { p.bandwidth = std::numeric_limits<double>::infinity(); }), "bandwidth");
  expect_invalid(with([](ModelParams& p) { p.derate = 0; }), "derate");
  expect_invalid(with([](ModelParams& p) { p.derate = 1.5; }), "derate");

  expect_invalid([] { attn::io::standard_elements(0, 64); }, "seqlen");
  expect_invalid([] { attn::io::tiled_elements(10, 0, 100); }, "head_dim");
  expect_invalid([] { attn::io::fa2_elements(10, 8, 0); }, "sram_elements");
  expect_invalid([] { attn::io::count_algorithm1(0, 8, 100); }, "seqlen");
  expect_invalid([] { attn::io::count_fa2(10, 8, -1); }, "sram_elements");
  // Counts that do not fit in int64 are refused rather than wrapped.
  expect_invalid([] { attn::io::standard_elements(std::int64_t{1} << 40, 64); }, "overflow");
  expect_invalid([] { attn::io::tiled_elements(std::int64_t{1} << 40, 1 << 20, 1); }, "overflow");
}

}  // namespace
