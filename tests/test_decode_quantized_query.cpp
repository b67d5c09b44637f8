// DecodeOptions::quantized_query (llama.cpp's fast mode, opt-in): on an int8 cache, each query row is
// rounded to int8 codes with one scale and q . k runs on the codes. Where its kernel runs (AVX-512
// targets on CPUs with AVX512-VNNI/BF16/VBMI, head dims 64..256 in steps of 64, K's scales per row or
// per block of 32 or of a multiple of 64 dims), the result is within twice the f32 textbook's error of
// the f64 oracle run on the rounded q; elsewhere the exact kernel runs and the result is within twice
// the textbook's of the oracle on q itself. The error the rounding adds is printed and bounded; results
// are bitwise the same for any thread count; a zero or NaN row stays in its row; other caches are
// rejected by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "core/quant.hpp"
#include "decode/decode_internal.hpp"
#include "common/query_codes.hpp"
#include "quant_cache.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::decode;
using test::Format;
using test::max_error;
using test::QuantCacheT;
using test::random_tensor;
using test::reference;

// The int8 formats at head dim D: per token, q8_0, blocks of 64 f32-scaled dims, and blocks of 16 (which
// the quantized-query kernel does not take: the exact kernel runs).
std::vector<Format> int8_formats(std::int64_t D) {
  return {{"int8 per token", DType::i8, 1, DType::f32},
          {"q8_0", DType::i8, D / 32, DType::f16},
          {"int8 in blocks of 64", DType::i8, D / 64, DType::f32},
          {"int8 in blocks of 16", DType::i8, D / 16, DType::f32}};
}

// q with every row rounded as the mode rounds it (common/query_codes.hpp).
test::Tensor<float> rounded_queries(const test::Tensor<float>& q) {
  test::Tensor<float> r = q;
  for (std::size_t at = 0; at < r.data.size(); at += static_cast<std::size_t>(q.d))
    test::round_query_row(r.data.data() + at, q.d);
  return r;
}

// Whether the quantized-query kernel runs now (on the pinned target) for format f at head dim D.
bool codes_kernel_runs(const Format& f, std::int64_t D) { return detail::decode_query_codes_run(D, f.groups); }

DecodeOptions quantized_query() {
  DecodeOptions dec;
  dec.quantized_query = true;
  return dec;
}

template <std::int64_t D>
void check_head_dim(double& worst_extra) {
  const std::int64_t n = test::full_or_sanitized(700, 250);
  for (const Format& f : int8_formats(D))
    for (std::int64_t page : {0, 16}) {
      QuantCacheT<D> c(f, {n, 129}, page, 21);
      // 3 query heads per kv head with 2 queries: blocks of 4 and 2 rows; a zero row in the middle
      const std::int64_t H = page ? 6 : 8;
      auto q = random_tensor<float>(c.B, 2, H, D, 23, 2.0);
      std::fill(q.data.begin() + 3 * D, q.data.begin() + 4 * D, 0.0f);
      const auto qr = rounded_queries(q);
      const auto Kd = c.dequantized(true), Vd = c.dequantized(false);
      for (bool causal : {false, true}) {
        AttentionOptions o;
        o.causal = causal;
        const auto exact = reference<double>(q, Kd, Vd, o), rounded = reference<double>(qr, Kd, Vd, o);
        const double base_exact = max_error(reference<float>(q, Kd, Vd, o), exact);
        const double base_rounded = max_error(reference<float>(qr, Kd, Vd, o), rounded);
        test::for_each_simd_target("decode", test::decode_dispatched, [&](std::int64_t) {
          const auto got = decode(c, q, o, quantized_query());
          const bool codes = codes_kernel_runs(f, D);
          const double err = max_error(got, codes ? rounded : exact);
          EXPECT_TRUE(test::meets_textbook_rule(err, codes ? base_rounded : base_exact, test::kForwardFactor, 1e-6))
              << f.name << " d " << D << " page " << page << " causal " << causal << " codes kernel " << codes;
          if (!codes) return;
          const double extra = max_error(got, exact);
          worst_extra = std::max(worst_extra, extra);
          EXPECT_LE(extra, 0.02) << f.name << " d " << D;  // about 2.5x what was measured
        });
      }
    }
}

// The rounding's error, printed: |out - oracle on q itself| over head dims, formats, page layouts.
TEST(DecodeQuantizedQuery, WithinTwiceTheTextbookErrorOfTheOracleOnTheRoundedQueries) {
  double worst_extra = 0;
  check_head_dim<64>(worst_extra);
  check_head_dim<192>(worst_extra);
  if (!test::kSanitizedBuild) {  // sanitizers and qemu: the smallest head dim and the odd one
    check_head_dim<128>(worst_extra);
    check_head_dim<256>(worst_extra);
  }
  std::printf("quantized_query: worst |out - oracle on unrounded q| %.4f\n", worst_extra);
}

// bf16 q and out (the serving case), where P V may round p to bf16: within twice the error of the
// textbook on the rounded q, its output rounded to bf16, with no slack; 1 and 3 query heads per kv head
// (blocks of 1 and 3 rows).
TEST(DecodeQuantizedQuery, Bf16ActivationsWithinTwiceTheTextbookErrorWithoutSlack) {
  constexpr std::int64_t D = 128;
  const std::int64_t n = test::full_or_sanitized(700, 250);
  for (const Format& f : int8_formats(D))
    for (std::int64_t H : {2, 6}) {
      QuantCacheT<D> c(f, {n, 129, 2}, 16, 25);
      auto q = random_tensor<float>(c.B, 1, H, D, 26, 2.0);
      std::vector<bf16_t> qb(q.data.size());
      for (std::size_t i = 0; i < qb.size(); ++i) {
        qb[i] = detail::float_to_bf16(q.data[i]);
        q.data[i] = detail::bf16_to_float(qb[i]);
      }
      const auto Kd = c.dequantized(true), Vd = c.dequantized(false);
      for (double scale : {0.01, 0.09, 1.0}) {
        AttentionOptions o;
        o.softmax_scale = scale;
        test::for_each_simd_target("decode", test::decode_dispatched, [&](std::int64_t) {
          const auto qs = codes_kernel_runs(f, D) ? rounded_queries(q) : q;
          const auto oracle = reference<double>(qs, Kd, Vd, o);
          std::vector<float> textbook = reference<float>(qs, Kd, Vd, o);
          for (float& x : textbook) x = detail::bf16_to_float(detail::float_to_bf16(x));
          std::vector<bf16_t> out(qb.size(), detail::float_to_bf16(42.0f));
          attention_decode(TensorView::contiguous(qb.data(), c.B, 1, H, D), c.cache(),
                           TensorView::contiguous(out.data(), c.B, 1, H, D), o, quantized_query());
          std::vector<float> got(out.size());
          for (std::size_t i = 0; i < out.size(); ++i) got[i] = detail::bf16_to_float(out[i]);
          EXPECT_TRUE(
              test::meets_textbook_rule(max_error(got, oracle), max_error(textbook, oracle), test::kForwardFactor))
              << f.name << " heads " << H << " scale " << scale;
        });
      }
    }
}

TEST(DecodeQuantizedQuery, BitwiseIdenticalForAnyThreadCount) {
  for (std::int64_t fi : {0, 1}) {
    QuantCacheT<128> c(int8_formats(128)[static_cast<std::size_t>(fi)], {test::full_or_sanitized(1500, 400), 300, 9},
                       16, 5);
    const auto q = random_tensor<float>(c.B, 1, 8, 128, 4, 2.0);
    AttentionOptions o;
    o.num_threads = 1;
    const auto one = decode(c, q, o, quantized_query());
    for (int t : {2, 3}) {
      o.num_threads = t;
      EXPECT_EQ(decode(c, q, o, quantized_query()), one) << t << " threads";
    }
  }
}

// A NaN in one query row makes that row's output NaN and leaves the other rows of its block of 4 as
// they were without it.
TEST(DecodeQuantizedQuery, ANanQueryRowStaysInItsRow) {
  QuantCacheT<128> c(int8_formats(128)[0], {200}, 0, 3);
  auto q = random_tensor<float>(1, 1, 8, 128, 8, 2.0);
  AttentionOptions o;
  const auto clean = decode(c, q, o, quantized_query());
  q.data[2 * 128 + 5] = std::numeric_limits<float>::quiet_NaN();
  const auto got = decode(c, q, o, quantized_query());
  for (std::int64_t h = 0; h < 8; ++h)
    for (std::int64_t x = 0; x < 128; ++x) {
      const auto i = static_cast<std::size_t>(h * 128 + x);
      if (h == 2)
        EXPECT_TRUE(std::isnan(got[i])) << "row 2 element " << x;
      else
        EXPECT_EQ(got[i], clean[i]) << "row " << h << " element " << x;
    }
}

// quantized_query names itself when the cache is not int8, and nothing is written.
TEST(DecodeQuantizedQuery, OtherCachesAreRejectedByName) {
  QuantCacheT<128> c(test::kFormats[4], {40}, 0, 3);  // fp8 e4m3
  const auto q = random_tensor<float>(1, 1, 8, 128, 8, 2.0);
  std::vector<float> out(q.data.size(), 42.0f);
  try {
    attention_decode(q.view(), c.cache(), TensorView::contiguous(out.data(), 1, 1, 8, 128), {}, quantized_query());
    ADD_FAILURE() << "an fp8 cache with quantized_query was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("quantized_query"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("int8"), std::string::npos) << e.what();
  }
  std::vector<float> k(40 * 8 * 128, 0.5f), v = k;
  std::vector<std::int32_t> lens{40};
  KVCache bf;
  bf.k = TensorView::contiguous(k.data(), 1, 40, 8, 128);
  bf.v = TensorView::contiguous(v.data(), 1, 40, 8, 128);
  bf.seqlens = lens.data();
  EXPECT_THROW(attention_decode(q.view(), bf, TensorView::contiguous(out.data(), 1, 1, 8, 128), {}, quantized_query()),
               std::invalid_argument);
  for (float x : out) ASSERT_EQ(x, 42.0f);
}

}  // namespace
}  // namespace attn
