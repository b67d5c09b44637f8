// The ring's time model (include/attn/ring_model.hpp): its closed forms and their consequences.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "attn/ring_model.hpp"

namespace attn::io {
namespace {

TEST(RingModel, TransferHidesExactlyFromTheCrossoverChunk) {
  for (double gbps : {10.0, 100.0, 400.0})
    for (bool causal : {true, false}) {
      RingParams p;
      p.link_bandwidth = gbps * 1e9 / 8;
      p.causal = causal;
      p.ranks = 16;
      const double c = ring_model(p).hide_rows;
      // At c* rows per rank compute equals transfer; a little above it hides, a little below it does not.
      p.seqlen = static_cast<std::int64_t>(std::ceil(c * 1.02)) * p.ranks;
      EXPECT_TRUE(ring_model(p).hidden) << gbps;
      p.seqlen = static_cast<std::int64_t>(std::floor(c * 0.98)) * p.ranks;
      EXPECT_FALSE(ring_model(p).hidden) << gbps;
      const double alpha = 4.0 * p.heads * p.head_dim * (causal ? 0.5 : 1.0) / p.flop_rate;
      const double beta = 2.0 * p.kv_heads * p.head_dim * p.element_bytes / p.link_bandwidth;
      EXPECT_NEAR(alpha * c * c, p.latency + beta * c, 1e-12 * alpha * c * c);
    }
}

TEST(RingModel, HiddenTransfersGiveFullEfficiencyAndExposedOnesCostTheirTime) {
  RingParams p;  // 128k tokens over 8 ranks: 16k-row chunks, far above c*
  const RingReport hidden = ring_model(p);
  ASSERT_TRUE(hidden.hidden);
  EXPECT_NEAR(hidden.efficiency, 1.0, 1e-12);
  EXPECT_NEAR(hidden.ring_s, p.ranks * hidden.compute_s, 1e-12 * hidden.ring_s);
  p.seqlen = 4096, p.ranks = 256, p.link_bandwidth = 1.25e9;  // 16-row chunks over 10 Gb/s
  const RingReport exposed = ring_model(p);
  ASSERT_FALSE(exposed.hidden);
  EXPECT_NEAR(exposed.ring_s, exposed.compute_s + 255 * exposed.transfer_s, 1e-12 * exposed.ring_s);
  EXPECT_LT(exposed.efficiency, 1.0);
  p.ranks = 1;
  const RingReport one = ring_model(p);
  EXPECT_DOUBLE_EQ(one.ring_s, one.one_rank_s);
}

TEST(RingModel, BadParametersAreNamed) {
  auto message = [](RingParams p) {
    try {
      ring_model(p);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  RingParams p;
  p.ranks = 0;
  EXPECT_NE(message(p).find("ranks: must be > 0"), std::string::npos);
  p = {};
  p.link_bandwidth = -1;
  EXPECT_NE(message(p).find("link_bandwidth"), std::string::npos);
  p = {};
  p.latency = -1e-6;
  EXPECT_NE(message(p).find("latency: must be >= 0"), std::string::npos);
  p = {};
  p.kv_heads = 5;
  EXPECT_NE(message(p).find("kv_heads: must divide heads"), std::string::npos);
}

}  // namespace
}  // namespace attn::io
