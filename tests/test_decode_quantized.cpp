// Quantized KV caches in attention_decode (i8 per token and kv head, i8 in blocks of 32 with f16 scales
// -- llama.cpp's q8_0 numerics --, fp8 e4m3 / e5m2 with one scale per kv head): the stored types'
// conversions on every code, the append's quantization, accuracy against the f64 oracle on the
// dequantized cache (within twice the f32 textbook's error), the quantization error itself against the
// unquantized cache (reported), bitwise results for any thread count, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "core/quant.hpp"
#include "decode/decode_internal.hpp"
#include "quant_cache.hpp"
#include "support.hpp"

namespace attn {
namespace {

using detail::quantize_value;
using detail::stored_value;
using test::decode;
using test::Format;
using test::kFormats;
using test::max_error;
using test::QuantCache;
using test::random_tensor;
using test::reference;

// ---- The stored types ----

// e5m2 from its definition: (-1)^s 2^(e - 15) (1 + m / 4), subnormals 2^-14 m / 4, e = 31 Inf/NaN.
double e5m2_by_definition(int b) {
  const int s = b >> 7, e = (b >> 2) & 31, m = b & 3;
  const double sign = s ? -1 : 1;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * (e == 0 ? std::ldexp(m / 4.0, -14) : std::ldexp(1 + m / 4.0, e - 15));
}
double e4m3_by_definition(int b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  return (s ? -1 : 1) * (e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1 + m / 8.0, e - 7));
}

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(QuantizedTypes, EveryCodeDecodesToItsDefinitionAndRoundTrips) {
  for (int b = 0; b < 256; ++b) {
    const double e4 = detail::fp8_e4m3_to_float(static_cast<std::uint8_t>(b));
    const double e5 = detail::fp8_e5m2_to_float(static_cast<std::uint8_t>(b));
    EXPECT_TRUE(same_value(e4, e4m3_by_definition(b))) << "e4m3 code " << b;
    EXPECT_TRUE(same_value(e5, e5m2_by_definition(b))) << "e5m2 code " << b;
    if (!std::isnan(e4) && b != 0x80)  // -0 encodes as 0x80 too, but 0x80 == 0 compares equal anyway
      EXPECT_EQ(detail::float_to_fp8_e4m3(static_cast<float>(e4)), b) << "e4m3 code " << b;
    if (!std::isnan(e5)) EXPECT_EQ(detail::float_to_fp8_e5m2(static_cast<float>(e5)), b) << "e5m2 code " << b;
  }
}

TEST(QuantizedTypes, RoundingIsToNearestEvenAndSaturates) {
  // Between consecutive positive codes: the midpoint goes to the even code, a hair either side to the nearer.
  for (int b = 0; b < 0x7e; ++b) {
    const float lo = detail::fp8_e4m3_to_float(static_cast<std::uint8_t>(b));
    const float hi = detail::fp8_e4m3_to_float(static_cast<std::uint8_t>(b + 1));
    const float mid = (lo + hi) / 2;
    EXPECT_EQ(detail::float_to_fp8_e4m3(mid), b % 2 == 0 ? b : b + 1) << "e4m3 midpoint after code " << b;
    EXPECT_EQ(detail::float_to_fp8_e4m3(std::nextafter(mid, 0.0f)), b);
    EXPECT_EQ(detail::float_to_fp8_e4m3(std::nextafter(mid, 1e9f)), b + 1);
  }
  EXPECT_EQ(detail::float_to_fp8_e4m3(1e6f), 0x7e);  // 448
  EXPECT_EQ(detail::float_to_fp8_e4m3(-470.0f), 0xfe);
  EXPECT_EQ(detail::float_to_fp8_e5m2(1e9f), 0x7b);  // 57344, not Inf
  EXPECT_EQ(detail::float_to_fp8_e5m2(INFINITY), 0x7c);
  EXPECT_EQ(detail::float_to_fp8_e4m3(INFINITY), 0x7f);  // no Inf in e4m3: NaN
  EXPECT_EQ(quantize_value(DType::i8, 300.0f, 1.0f), 127);
  EXPECT_EQ(static_cast<std::int8_t>(quantize_value(DType::i8, -300.0f, 1.0f)), -127);
  EXPECT_EQ(quantize_value(DType::i8, 2.5f, 1.0f), 2);  // ties to even
  EXPECT_EQ(quantize_value(DType::i8, 3.5f, 1.0f), 4);
}

// The SIMD dequantization (every target) gives stored_value x scale for every code, in every lane.
TEST(QuantizedTypes, SimdDequantizationMatchesTheScalarRuleOnEveryCode) {
  std::vector<std::uint8_t> codes(256 * 2);
  std::iota(codes.begin(), codes.begin() + 256, 0);
  std::iota(codes.begin() + 256, codes.end(), 0);
  const std::uint8_t* rows[4] = {codes.data(), codes.data() + 128, codes.data() + 256, codes.data() + 384};
  const float scales[8] = {1.0f, 0.37f, 3.0f, 1e-3f, 0.5f, 2.0f, -1.25f, 7.0f};
  for (DType t : {DType::i8, DType::fp8_e4m3, DType::fp8_e5m2})
    test::for_each_simd_target("dequantize", nullptr, [&](std::int64_t) {
      std::vector<float> out(4 * 128);
      detail::dequantize_rows(detail::QuantRows{4, 128, 2, rows, scales, out.data()}, t);
      for (int c = 0; c < 4; ++c)
        for (int e = 0; e < 128; ++e) {
          const float want = stored_value(t, rows[c][e]) * scales[c * 2 + e / 64];
          const float got = out[static_cast<std::size_t>(c * 128 + e)];
          EXPECT_TRUE(same_value(got, want)) << dtype_name(t) << " code " << int(rows[c][e]) << " got " << got;
        }
    });
}

// ---- Decode on a quantized cache ----

// The AVX512-BF16 decode kernel's bf16 form of every code of each type is the code's value (bits
// equal, or both NaN), on every SIMD target where that kernel runs.
TEST(QuantizedTypes, TheBf16KernelsConversionIsExactOnEveryCode) {
  std::vector<std::uint8_t> codes(256);
  std::iota(codes.begin(), codes.end(), 0);
  for (DType t : {DType::i8, DType::fp8_e4m3, DType::fp8_e5m2}) {
    bool ran = false;
    test::for_each_simd_target("decode", test::decode_dispatched, [&](std::int64_t) {
      std::vector<std::uint16_t> out(256, 0xdead);
      if (!detail::decode_codes_to_bf16(t, codes.data(), 256, out.data())) return;
      ran = true;
      for (int c = 0; c < 256; ++c) {
        const float want = stored_value(t, static_cast<std::uint8_t>(c));
        const float got = detail::bf16_to_float(bf16_t{out[static_cast<std::size_t>(c)]});
        EXPECT_TRUE(same_value(got, want)) << "code " << c << ": " << got << ", want " << want;
      }
    });
    if (!ran) GTEST_SKIP() << "no SIMD target here runs the AVX512-BF16 kernel";
  }
}

// Against the f64 oracle on the dequantized cache: within twice the f32 textbook's error there, on
// every SIMD target; and the error the quantization itself adds, against the unquantized keys and
// values, printed and bounded by what the type's precision allows.
TEST(DecodeQuantized, WithinTwiceTheTextbookErrorOnTheDequantizedCache) {
  const std::int64_t n = test::full_or_sanitized(700, 250);
  for (const Format& f : kFormats)
    for (std::int64_t page : {0, 16}) {
      QuantCache c(f, {n, 129}, page, 7);
      const auto q = random_tensor<float>(c.B, 2, 8, QuantCache::D, 3, 2.0);
      const auto Kd = c.dequantized(true), Vd = c.dequantized(false);
      for (bool causal : {false, true}) {
        AttentionOptions o;
        o.causal = causal;
        const auto oracle = reference<double>(q, Kd, Vd, o);
        const auto textbook = reference<float>(q, Kd, Vd, o);
        const double base = max_error(textbook, oracle);
        test::for_each_simd_target("decode", test::decode_dispatched, [&](std::int64_t) {
          EXPECT_TRUE(test::meets_textbook_rule(max_error(decode(c, q, o), oracle), base, test::kForwardFactor, 1e-6))
              << f.name << " page " << page << " causal " << causal;
        });
        const double quant_err = max_error(decode(c, q, o), reference<double>(q, c.K, c.V, o));
        const double bound = f.type == DType::i8         ? 0.01
                             : f.type == DType::fp8_e4m3 ? 0.06
                                                         : 0.12;  // 2.5x what was measured
        std::printf("%-32s page %2lld causal %d: |out - unquantized oracle| %.4f (f32 textbook %.2e)\n", f.name,
                    static_cast<long long>(page), causal, quant_err, base);
        EXPECT_LE(quant_err, bound) << f.name;
      }
    }
}

// bf16 q and out over a quantized cache (the serving case; on AVX512-BF16 CPUs the dot-product kernel,
// which may round p to bf16 for P V): within twice the textbook's error against the f64 oracle on the
// dequantized cache, where the textbook computes in f32 and rounds its output to bf16, with no slack,
// on every SIMD target, over logit spreads from nearly flat to nearly one-hot.
TEST(DecodeQuantized, Bf16ActivationsWithinTwiceTheTextbookErrorWithoutSlack) {
  const std::int64_t n = test::full_or_sanitized(700, 250);
  double worst = 0;
  for (const Format& f : kFormats)
    for (std::int64_t page : {0, 16}) {
      QuantCache c(f, {n, 129, 2}, page, 11);
      // 3 query heads per kv head in the paged case: a block of fewer than 4 rows in the key walks
      const std::int64_t H = page ? 6 : 8;
      auto q = random_tensor<float>(c.B, 1, H, QuantCache::D, 6, 2.0);
      std::vector<bf16_t> qb(q.data.size());
      for (std::size_t i = 0; i < qb.size(); ++i) {
        qb[i] = detail::float_to_bf16(q.data[i]);
        q.data[i] = detail::bf16_to_float(qb[i]);  // the oracle sees the bf16 values themselves
      }
      const auto Kd = c.dequantized(true), Vd = c.dequantized(false);
      for (double scale : {0.01, 0.09, 1.0}) {
        AttentionOptions o;
        o.softmax_scale = scale;
        const auto oracle = reference<double>(q, Kd, Vd, o);
        std::vector<float> textbook = reference<float>(q, Kd, Vd, o);
        for (float& x : textbook) x = detail::bf16_to_float(detail::float_to_bf16(x));
        const double base = max_error(textbook, oracle);
        test::for_each_simd_target("decode", test::decode_dispatched, [&](std::int64_t) {
          std::vector<bf16_t> out(qb.size(), detail::float_to_bf16(42.0f));
          attention_decode(TensorView::contiguous(qb.data(), c.B, 1, H, QuantCache::D), c.cache(),
                           TensorView::contiguous(out.data(), c.B, 1, H, QuantCache::D), o);
          std::vector<float> got(out.size());
          for (std::size_t i = 0; i < out.size(); ++i) got[i] = detail::bf16_to_float(out[i]);
          const double err = max_error(got, oracle);
          if (base > 0) worst = std::max(worst, err / base);
          EXPECT_TRUE(test::meets_textbook_rule(err, base, test::kForwardFactor))
              << f.name << " page " << page << " scale " << scale;
        });
      }
    }
  std::printf("worst err / textbook err: %.2f\n", worst);
}

TEST(DecodeQuantized, BitwiseIdenticalForAnyThreadCount) {
  QuantCache c(kFormats[1], {test::full_or_sanitized(1500, 400), 300, 9}, 16, 5);
  const auto q = random_tensor<float>(c.B, 1, 8, QuantCache::D, 4, 2.0);
  AttentionOptions o;
  o.num_threads = 1;
  const auto one = decode(c, q, o);
  for (int t : {2, 3}) {
    o.num_threads = t;
    EXPECT_EQ(decode(c, q, o), one) << t << " threads";
  }
}

// Appending through attention_decode writes exactly what the rule of core/quant.hpp gives (bytes and
// scales), for owned scales (computed) and shared ones (read), and the result attends over them.
TEST(DecodeQuantized, TheAppendQuantizesByTheRule) {
  for (const Format& f : kFormats)
    for (std::int64_t page : {0, 5}) {
      QuantCache want(f, {40, 17}, page, 11);  // quantized on the host, keys 0 .. len - 1
      QuantCache got(f, {40, 17}, page, 11);
      const std::int64_t tail = 6, HK = QuantCache::HK, D = QuantCache::D;
      test::Tensor<float> kn(2, tail, HK, D), vn(2, tail, HK, D);
      for (std::int64_t b = 0; b < 2; ++b) {
        got.seqlens[static_cast<std::size_t>(b)] -= static_cast<std::int32_t>(tail);
        for (std::int64_t j = got.lens[b] - tail; j < got.lens[b]; ++j)
          for (std::int64_t g = 0; g < HK; ++g)
            for (std::int64_t e = 0; e < D; ++e) {
              kn.at(b, j - (got.lens[b] - tail), g, e) = got.K[b].at(0, j, g, e);
              vn.at(b, j - (got.lens[b] - tail), g, e) = got.V[b].at(0, j, g, e);
              for (auto* v : {&got.kc, &got.vc})
                (*v)[static_cast<std::size_t>(got.row_of(b, j) * HK * D + g * D + e)] = 0x55;
              if (f.groups && e % (D / f.groups) == 0)  // computed scales: poisoned, so they must be rewritten
                for (const TensorView& s : {got.k_scale(), got.v_scale()})
                  detail::write_scale(s, got.scale_at(s, b, j, g, e / (D / f.groups)), 123.0f);
            }
      }
      const auto q = random_tensor<float>(2, 1, 4, D, 5);
      std::vector<float> out(q.data.size());
      const TensorView knv = kn.view(), vnv = vn.view();
      DecodeOptions dec;
      dec.k_new = &knv;
      dec.v_new = &vnv;
      attention_decode(q.view(), got.cache(), TensorView::contiguous(out.data(), 2, 1, 4, D), {}, dec);
      EXPECT_EQ(got.kc, want.kc) << f.name << " page " << page;
      EXPECT_EQ(got.vc, want.vc) << f.name << " page " << page;
      EXPECT_EQ(got.ks32, want.ks32) << f.name;
      EXPECT_EQ(std::memcmp(got.ks16.data(), want.ks16.data(), 2 * got.ks16.size()), 0) << f.name;
      EXPECT_EQ(out, decode(want, q, {})) << f.name << " page " << page;
    }
}

// A NaN appended under computed scales makes its group's scale NaN: the rows that see the key get NaN,
// as with an unquantized cache.
TEST(DecodeQuantized, ANonFiniteAppendedValuePoisonsTheRowsThatSeeIt) {
  QuantCache c(kFormats[0], {8, 8}, 0, 3);
  const std::int64_t HK = QuantCache::HK, D = QuantCache::D;
  test::Tensor<float> kn(2, 1, HK, D), vn(2, 1, HK, D);
  kn.at(0, 0, 1, 7) = std::numeric_limits<float>::quiet_NaN();
  const TensorView knv = kn.view(), vnv = vn.view();
  DecodeOptions dec;
  dec.k_new = &knv;
  dec.v_new = &vnv;
  const auto q = random_tensor<float>(2, 1, 4, D, 5);
  std::vector<float> out(q.data.size());
  attention_decode(q.view(), c.cache(), TensorView::contiguous(out.data(), 2, 1, 4, D), {}, dec);
  for (std::int64_t h = 0; h < 4; ++h)
    for (std::int64_t b = 0; b < 2; ++b)
      EXPECT_EQ(std::isnan(out[static_cast<std::size_t>((b * 4 + h) * D)]), b == 0 && h >= 2)
          << "sequence " << b << " head " << h;
}

// A NaN appended to v_new with bf16 q and out: the row's weights times the key's NaN scale must reach the
// output on every SIMD target (on AVX512-BF16 CPUs an i8 cache's P V runs on fixed-point weights, which
// cannot hold NaN, and hands such rows to its bf16 weights, which can); the other rows stay finite.
TEST(DecodeQuantized, ANonFiniteAppendedValueReachesBf16Outputs) {
  const std::int64_t HK = QuantCache::HK, D = QuantCache::D;
  const auto q = random_tensor<float>(2, 1, 4, D, 5);
  std::vector<bf16_t> qb(q.data.size());
  for (std::size_t i = 0; i < qb.size(); ++i) qb[i] = detail::float_to_bf16(q.data[i]);
  for (const Format& f : {kFormats[0], kFormats[1]})
    test::for_each_simd_target("decode", test::decode_dispatched, [&](std::int64_t) {
      QuantCache c(f, {70, 8}, 0, 3);  // 70 keys: a full chunk, then a short one
      test::Tensor<float> kn(2, 1, HK, D), vn(2, 1, HK, D);
      vn.at(0, 0, 1, 7) = std::numeric_limits<float>::quiet_NaN();
      const TensorView knv = kn.view(), vnv = vn.view();
      DecodeOptions dec;
      dec.k_new = &knv;
      dec.v_new = &vnv;
      std::vector<bf16_t> out(qb.size());
      attention_decode(TensorView::contiguous(qb.data(), 2, 1, 4, D), c.cache(),
                       TensorView::contiguous(out.data(), 2, 1, 4, D), {}, dec);
      for (std::int64_t h = 0; h < 4; ++h)
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t x : {std::int64_t{0}, std::int64_t{7}})
            EXPECT_EQ(std::isnan(detail::bf16_to_float(out[static_cast<std::size_t>((b * 4 + h) * D + x)])),
                      b == 0 && h >= 2)
                << f.name << " sequence " << b << " head " << h << " element " << x;
    });
}

// ---- Bad input ----

struct BadQuant {
  const char* arg;
  std::function<void(KVCache&, TensorView& q, DecodeOptions&)> spoil;
  const char* rule;
};

TEST(DecodeQuantized, BadInputIsRejectedByNameAndNothingIsWritten) {
  QuantCache c(kFormats[1], {20, 10}, 0, 3);
  const std::int64_t HK = QuantCache::HK, D = QuantCache::D;
  auto q = random_tensor<float>(2, 1, 4, D, 5);
  test::Tensor<float> kn(2, 1, HK, D), vn(2, 1, HK, D);
  std::vector<std::int8_t> i8(2 * 4 * D);
  std::vector<double> f64(2 * 4 * D);
  static const float zero = 0.0f, nan = std::nanf("");
  const BadQuant cases[] = {
      {"cache.k_scale", [](KVCache& k, auto&, auto&) { k.k_scale = {}; }, "required for a quantized cache"},
      {"cache.v_scale", [](KVCache& k, auto&, auto&) { k.v_scale.dtype = DType::bf16; }, "dtype must be f32 or f16"},
      {"cache.k_scale", [](KVCache& k, auto&, auto&) { k.k_scale.shape[3] = 3; }, "must divide cache.k's head_dim"},
      {"cache.k_scale", [](KVCache& k, auto&, auto&) { k.k_scale.shape[2] = 1; }, "kv_heads"},
      {"cache.v_scale", [](KVCache& k, auto&, auto&) { k.v_scale.rank = 3; }, "rank must be 4"},
      {"q", [&](auto&, TensorView& qv, auto&) { qv = TensorView::contiguous(i8.data(), 2, 1, 4, D); },
       "dtype must be f32, bf16 or f16 for a quantized cache (cache.k is i8), got i8"},
      {"q", [&](auto&, TensorView& qv, auto&) { qv = TensorView::contiguous(f64.data(), 2, 1, 4, D); },
       "f32, bf16 or f16 for a quantized cache"},
      {"cache.v", [](KVCache& k, auto&, auto&) { k.v.dtype = DType::fp8_e4m3; }, "must match cache.k's"},
      {"k_new",
       [&](auto&, auto&, DecodeOptions& d) {
         static TensorView bad;
         bad = TensorView::contiguous(i8.data(), 2, 1, HK, D);
         d.k_new = &bad;
       },
       "dtype must be f32, bf16 or f16 (it is quantized into the i8 cache), got i8"},
      {"cache.k_scale",
       [](KVCache& k, auto&, DecodeOptions&) {
         k.k_scale = TensorView::strided(&zero, {k.k.shape[0], k.k.shape[1], 2, 1}, {0, 0, 0, 0});
       },
       "must be finite and > 0"},
      {"cache.v_scale",
       [](KVCache& k, auto&, DecodeOptions&) {
         k.v_scale = TensorView::strided(&nan, {k.k.shape[0], k.k.shape[1], 2, 1}, {0, 0, 0, 0});
       },
       "must be finite and > 0"},
  };
  for (const BadQuant& bad : cases) {
    KVCache cache = c.cache();
    TensorView qv = q.view();
    const TensorView knv = kn.view(), vnv = vn.view();
    DecodeOptions dec;
    dec.k_new = &knv;
    dec.v_new = &vnv;
    for (auto& s : c.seqlens) --s;  // room for the append
    bad.spoil(cache, qv, dec);
    const auto kc = c.kc, vc = c.vc;
    const auto ks = c.ks16;
    std::vector<float> out(q.data.size(), 7.0f);
    try {
      attention_decode(qv, cache, TensorView::contiguous(out.data(), 2, 1, 4, D), {}, dec);
      ADD_FAILURE() << bad.arg << ": accepted";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string(bad.arg) + ":"), std::string::npos) << msg;
      EXPECT_NE(msg.find(bad.rule), std::string::npos) << msg;
    }
    for (auto& s : c.seqlens) ++s;
    EXPECT_EQ(c.kc, kc) << bad.arg;
    EXPECT_EQ(c.vc, vc) << bad.arg;
    EXPECT_EQ(std::memcmp(c.ks16.data(), ks.data(), 2 * ks.size()), 0) << bad.arg;
    for (float x : out) ASSERT_EQ(x, 7.0f) << bad.arg;
  }
}

TEST(DecodeQuantized, ScalesOnAnUnquantizedCacheAndQuantizedViewsElsewhereAreRejected) {
  auto q = random_tensor<float>(1, 1, 2, 8, 1), k = random_tensor<float>(1, 4, 1, 8, 2);
  std::vector<float> out(q.data.size(), 7.0f), s(4, 1.0f);
  std::vector<std::int32_t> seqlens{4};
  KVCache cache;
  cache.k = cache.v = k.view();
  cache.seqlens = seqlens.data();
  cache.k_scale = TensorView::contiguous(s.data(), 1, 4, 1, 1);
  EXPECT_THROW(
      {
        try {
          attention_decode(q.view(), cache, TensorView::contiguous(out.data(), 1, 1, 2, 8));
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("cache.k_scale: only for quantized caches"), std::string::npos)
              << e.what();
          throw;
        }
      },
      std::invalid_argument);
  std::vector<std::int8_t> i8(32);
  TensorView kq = TensorView::contiguous(i8.data(), 1, 4, 1, 8);
  try {
    attention_tiled(q.view(), kq, kq, TensorView::contiguous(out.data(), 1, 1, 2, 8));
    ADD_FAILURE() << "attention_tiled accepted an i8 k";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("k: dtype must be f64, f32, bf16 or f16, got i8"), std::string::npos)
        << e.what();
  }
  for (float x : out) ASSERT_EQ(x, 7.0f);
}

}  // namespace
}  // namespace attn
