// The planning figures of io_model.hpp: the break-even SRAM size and the bytes of a decode step.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>

#include "attn/io_model.hpp"

namespace attn::io {
namespace {

// break_even is the step itself: one element less and tiling no longer wins.
void expect_step(std::int64_t n, std::int64_t d, bool fa2) {
  const std::int64_t m = break_even_sram_elements(n, d, fa2);
  ASSERT_GT(m, 0);
  const auto tiled = [&](std::int64_t x) { return fa2 ? fa2_elements(n, d, x) : tiled_elements(n, d, x); };
  EXPECT_LT(tiled(m), standard_elements(n, d)) << "n=" << n << " d=" << d << " fa2=" << fa2;
  if (m > 1) {
    EXPECT_GE(tiled(m - 1), standard_elements(n, d)) << "n=" << n << " d=" << d << " fa2=" << fa2;
  }
}

TEST(BreakEven, IsTheStepOfTheClosedForms) {
  for (std::int64_t n : {1, 2, 7, 100, 1000, 4096})
    for (std::int64_t d : {1, 16, 64, 128, 256})
      for (bool fa2 : {false, true})
        if (break_even_sram_elements(n, d, fa2) > 0) expect_step(n, d, fa2);
}

TEST(BreakEven, MatchesTheDocumentedFigures) {
  // docs/io-model.md, 16-bit elements at N = 4096: d = 64 just over 24.0 KiB (Algorithm 1) and 15.5 KiB
  // (FA2); d = 256 B_c >= 196 (just over 390 KiB) and T_r <= 32 (just over 254 KiB).
  const auto kib = [](std::int64_t elements) { return static_cast<double>(elements) * 2 / 1024; };
  EXPECT_GT(kib(break_even_sram_elements(4096, 64, false)), 24.0);
  EXPECT_LT(kib(break_even_sram_elements(4096, 64, false)), 24.1);
  EXPECT_GT(kib(break_even_sram_elements(4096, 64, true)), 15.5);
  EXPECT_LT(kib(break_even_sram_elements(4096, 64, true)), 15.6);
  EXPECT_EQ(break_even_sram_elements(4096, 256, false), 4 * 256 * 195 + 1);  // smallest M with B_c = 196
  EXPECT_GT(kib(break_even_sram_elements(4096, 256, true)), 254.0);
  EXPECT_LT(kib(break_even_sram_elements(4096, 256, true)), 254.1);
}

TEST(BreakEven, ZeroWhenTilingNeverWins) {
  // One query: standard moves 4d + 4, one Algorithm 1 pass 5d + 4 (FA2 order: 4d + 1, so it wins).
  EXPECT_EQ(break_even_sram_elements(1, 64, false), 0);
  EXPECT_EQ(break_even_sram_elements(1, 64, true), 1);
  EXPECT_THROW(break_even_sram_elements(0, 64, false), std::invalid_argument);
  EXPECT_THROW(break_even_sram_elements(64, 0, true), std::invalid_argument);
}

TEST(DecodeTraffic, CountsTheCacheQueryAndOutput) {
  DecodeParams p;  // 4096 tokens, 32 heads over 8 kv heads, d = 128, 16-bit, 3.35 TB/s x 0.8
  const DecodeTraffic t = decode_traffic(p);
  EXPECT_DOUBLE_EQ(t.kv_bytes, 2.0 * 4096 * 8 * 128 * 2);  // 16 MiB
  EXPECT_DOUBLE_EQ(t.read_bytes, t.kv_bytes + 32 * 128 * 2);
  EXPECT_DOUBLE_EQ(t.write_bytes, 32 * 128 * 2);
  EXPECT_DOUBLE_EQ(t.bytes, t.read_bytes + t.write_bytes);
  EXPECT_DOUBLE_EQ(t.seconds, t.bytes / (3.35e12 * 0.8));
}

TEST(DecodeTraffic, RejectsBadParameters) {
  DecodeParams p;
  p.kv_heads = 5;  // 32 heads do not split into 5 groups
  EXPECT_THROW(decode_traffic(p), std::invalid_argument);
  p = {};
  p.cache_len = 0;
  EXPECT_THROW(decode_traffic(p), std::invalid_argument);
  p = {};
  p.derate = 1.5;
  EXPECT_THROW(decode_traffic(p), std::invalid_argument);
  p = {};
  p.bandwidth = 0;
  EXPECT_THROW(decode_traffic(p), std::invalid_argument);
}

}  // namespace
}  // namespace attn::io
