// Options and helper arguments at the extremes (docs/robustness.md, "Huge and non-finite options"):
// a window wider than any sequence means "unbounded" in every entry point, a softcap or scale beyond
// the f32 range is a named error, extents at the int64 limit are rejected without overflow, and the
// public helpers validate their own arguments.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "attn/varlen.hpp"
#include "support.hpp"

namespace attn {
namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

using test::invalid_argument_message;

struct Outputs {
  std::vector<double> out, lse;
  bool operator==(const Outputs& o) const {
    return out.size() == o.out.size() && lse.size() == o.lse.size() &&
           std::memcmp(out.data(), o.out.data(), out.size() * sizeof(double)) == 0 &&
           std::memcmp(lse.data(), o.lse.data(), lse.size() * sizeof(double)) == 0;
  }
};

// Every entry point on one problem (b 2, sq 5, sk 9, 4/2 heads, d 8) with the given window.
std::vector<Outputs> run_all(std::int64_t left, std::int64_t right, bool causal) {
  const std::int64_t B = 2, SQ = 5, SK = 9, H = 4, HK = 2, D = 8;
  const auto q = test::random_tensor<double>(B, SQ, H, D, 1), k = test::random_tensor<double>(B, SK, HK, D, 2),
             v = test::random_tensor<double>(B, SK, HK, D, 3);
  AttentionOptions o;
  o.window_left = left;
  o.window_right = right;
  o.causal = causal;
  std::vector<Outputs> all;
  auto run = [&](auto&& call) {
    Outputs r{std::vector<double>(q.data.size()), std::vector<double>(static_cast<std::size_t>(B * H * SQ))};
    const TensorView out = TensorView::contiguous(r.out.data(), B, SQ, H, D);
    const TensorView lse = TensorView::contiguous(r.lse.data(), B, H, SQ);
    call(out, lse);
    all.push_back(r);
  };
  run([&](auto& out, auto& lse) { attention_reference(q.view(), k.view(), v.view(), out, o, &lse); });
  run([&](auto& out, auto& lse) { attention_tiled(q.view(), k.view(), v.view(), out, o, {3, 4}, &lse); });
  run([&](auto& out, auto& lse) { attention_splitk(q.view(), k.view(), v.view(), out, o, {3}, &lse); });
  // Decode: the same problem as a contiguous cache of exactly SK keys per sequence.
  run([&](auto& out, auto& lse) {
    const std::vector<std::int32_t> seqlens(B, static_cast<std::int32_t>(SK));
    KVCache cache{k.view(), v.view(), seqlens.data()};
    DecodeOptions dec;
    dec.num_splits = 2;
    attention_decode(q.view(), cache, out, o, dec, &lse);
  });
  // Varlen: sequence 1 of the batch packed alone (same mask for the one pair).
  Outputs packed{std::vector<double>(static_cast<std::size_t>(SQ * H * D)),
                 std::vector<double>(static_cast<std::size_t>(H * SQ))};
  const std::int32_t cq[] = {0, static_cast<std::int32_t>(SQ)}, ck[] = {0, static_cast<std::int32_t>(SK)};
  const TensorView lse1 = TensorView::contiguous(packed.lse.data(), 1, H, SQ);
  attention_varlen(TensorView::contiguous(q.data.data(), SQ, H, D), TensorView::contiguous(k.data.data(), SK, HK, D),
                   TensorView::contiguous(v.data.data(), SK, HK, D),
                   TensorView::contiguous(packed.out.data(), SQ, H, D), cq, ck, 1, o, {}, &lse1);
  all.push_back(packed);
  return all;
}

// Finding 1: windows near INT64_MAX overflowed the mask arithmetic and masked every row.
TEST(OptionExtremes, AHugeWindowMeansUnboundedInEveryEntryPoint) {
  for (bool causal : {false, true})
    for (std::int64_t huge : {kMax, kMax - 1, kMax / 2, std::int64_t{1} << 40}) {
      const auto unbounded = run_all(-1, causal ? 0 : -1, causal);
      const auto wide = run_all(huge, causal ? 0 : huge, causal);
      const auto wide_left = run_all(huge, causal ? 0 : -1, causal);
      ASSERT_EQ(unbounded.size(), wide.size());
      for (std::size_t e = 0; e < unbounded.size(); ++e) {
        EXPECT_TRUE(unbounded[e] == wide[e]) << "entry point " << e << " window " << huge << " causal " << causal;
        EXPECT_TRUE(unbounded[e] == wide_left[e]) << "entry point " << e << " left window " << huge;
      }
      for (double x : wide[0].lse) EXPECT_TRUE(std::isfinite(x));  // no row came back masked
    }
}

// Finding 2: an extent of exactly INT64_MAX elements overflowed (max offset + 1) before the check.
TEST(OptionExtremes, AnExtentAtTheInt64LimitIsRejectedNamingTheArgument) {
  std::vector<double> buf(64);
  const TensorView q = TensorView::contiguous(buf.data(), 1, 2, 1, 4);
  const TensorView k = TensorView::strided(buf.data() + 8, {1, 2, 1, 4}, {0, kMax, 0, 0});
  const TensorView v = TensorView::contiguous(buf.data() + 16, 1, 2, 1, 4);
  std::vector<double> o(8);
  const std::string msg =
      invalid_argument_message([&] { attention_tiled(q, k, v, TensorView::contiguous(o.data(), 1, 2, 1, 4)); });
  EXPECT_NE(msg.find("k: sizes overflow"), std::string::npos) << msg;
  for (double x : o) EXPECT_EQ(x, 0.0);
}

// Findings 4 and 5: a softcap or scale beyond the f32 maximum became inf in the f32 kernels (NaN
// outputs, even where every exact score is 0); both are rejected, in every entry point.
TEST(OptionExtremes, SoftcapAndScaleBeyondTheF32RangeAreNamedErrors) {
  const auto q = test::random_tensor<float>(1, 3, 2, 4, 1), k = test::random_tensor<float>(1, 3, 2, 4, 2),
             v = test::random_tensor<float>(1, 3, 2, 4, 3);
  std::vector<float> out(q.data.size(), 7.f);
  const TensorView ov = TensorView::contiguous(out.data(), 1, 3, 2, 4);
  const std::vector<std::int32_t> seqlens = {3};
  for (double bad : {1e39, 1e300, static_cast<double>(INFINITY)}) {
    AttentionOptions cap, scale, neg_scale;
    cap.softcap = bad;
    scale.softmax_scale = bad;
    neg_scale.softmax_scale = -bad;
    for (const auto& [o, arg] : {std::pair{cap, "softcap"}, {scale, "softmax_scale"}, {neg_scale, "softmax_scale"}}) {
      const std::string want = std::string(arg) + ": must be finite";
      EXPECT_NE(invalid_argument_message([&] { attention_tiled(q.view(), k.view(), v.view(), ov, o); }).find(want),
                std::string::npos);
      EXPECT_NE(invalid_argument_message([&] { attention_reference(q.view(), k.view(), v.view(), ov, o); }).find(want),
                std::string::npos);
      EXPECT_NE(invalid_argument_message([&] { attention_splitk(q.view(), k.view(), v.view(), ov, o); }).find(want),
                std::string::npos);
      EXPECT_NE(invalid_argument_message([&] {
                  attention_decode(q.view(), KVCache{k.view(), v.view(), seqlens.data()}, ov, o);
                }).find(want),
                std::string::npos);
    }
  }
  for (float x : out) EXPECT_EQ(x, 7.f);
  // The f32 maximum itself is a valid cap, and computes (a cap that large caps nothing).
  AttentionOptions edge;
  edge.softcap = 3.4028234663852886e38;
  EXPECT_NO_THROW(attention_tiled(q.view(), k.view(), v.view(), ov, edge));
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
}

// Finding 6: splitk_slice(10, 0, 0) died with SIGFPE; the helpers overflowed on huge arguments.
TEST(OptionExtremes, PublicHelpersValidateTheirArguments) {
  EXPECT_NE(invalid_argument_message([] { splitk_slice(10, 0, 0); }).find("num_splits: must be >= 1"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] { splitk_slice(-1, 2, 0); }).find("keys: must be >= 0"), std::string::npos);
  EXPECT_NE(invalid_argument_message([] { splitk_slice(10, 2, 2); }).find("w: must be in [0, num_splits)"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] { splitk_slice(10, 2, -1); }).find("w: must be in"), std::string::npos);
  const KeyRange last = splitk_slice(kMax, kMax, kMax - 1);
  EXPECT_EQ(last.begin, kMax - 1);
  EXPECT_EQ(last.end, kMax);

  EXPECT_NE(invalid_argument_message([] { decode_num_splits(100, 0, 8, 128, DType::f32); }).find("batch: must be >= 1"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] { decode_num_splits(100, 1, 0, 128, DType::f32); }).find("kv_heads"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] { decode_num_splits(100, 1, 8, 0, DType::f32); }).find("head_dim"),
            std::string::npos);
  for (std::int64_t keys : {std::int64_t{1}, std::int64_t{1} << 40, kMax})
    for (std::int64_t big : {std::int64_t{1}, kMax}) {
      const std::int64_t n = decode_num_splits(keys, big, big, big, DType::f64);
      EXPECT_GE(n, 1);
      EXPECT_LE(n, keys);
    }

  EXPECT_NE(invalid_argument_message([] { plan_tiles(-1, 4, 8, DType::f32); }).find("seqlen_q: must be >= 0"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([] { plan_tiles(4, -1, 8, DType::f32); }).find("seqlen_k: must be >= 0"),
            std::string::npos);
  for (std::int64_t d : {std::int64_t{1}, kMax / 2, kMax}) {
    const TilePlan p = plan_tiles(kMax, kMax, d, DType::f64);
    EXPECT_GE(p.q_tile, 1);
    EXPECT_GE(p.k_tile, 1);
    EXPECT_LE(p.q_tile, 512);
    EXPECT_LE(p.k_tile, 512);
  }
}

}  // namespace
}  // namespace attn
