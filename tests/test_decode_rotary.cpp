// attention_decode with DecodeOptions::rotary (flash_attn_with_kvcache's rotary_cos / rotary_sin): the
// appended keys land in the cache rotated at their positions, q is rotated at seqlens[b] (+ i when the
// mask is causal or windowed), and the output equals attention_reference on those rotated rows (f64,
// 1e-12). The rotation is computed here independently, as complex multiplication of feature pairs.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <stdexcept>
#include <string>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;

constexpr std::int64_t kB = 2, kMax = 24, kHK = 2, kH = 4, kD = 12, kRot = 8, kPositions = 30;

// x[0 .. kRot) rotated by angle[pos][c] for pair c.
void rotate(double* x, const std::vector<double>& angle, std::int64_t pos, bool interleaved) {
  for (std::int64_t c = 0; c < kRot / 2; ++c) {
    double& a = x[interleaved ? 2 * c : c];
    double& b = x[interleaved ? 2 * c + 1 : c + kRot / 2];
    const std::complex<double> z = std::complex<double>(a, b) * std::polar(1.0, angle[pos * kRot / 2 + c]);
    a = z.real();
    b = z.imag();
  }
}

void run_case(bool interleaved, bool causal, std::int64_t sq, std::int64_t appended) {
  std::vector<double> angle(kPositions * kRot / 2), cos(angle.size()), sin(angle.size());
  std::mt19937_64 rng(7);
  for (std::size_t i = 0; i < angle.size(); ++i) {
    angle[i] = std::uniform_real_distribution<double>(0, 6.3)(rng);
    cos[i] = std::cos(angle[i]);
    sin[i] = std::sin(angle[i]);
  }
  const std::vector<std::int32_t> seqlens = {5, 17};
  auto k = random_tensor<double>(kB, kMax, kHK, kD, 1), v = random_tensor<double>(kB, kMax, kHK, kD, 2);
  auto q = random_tensor<double>(kB, sq, kH, kD, 3), kn = random_tensor<double>(kB, appended, kHK, kD, 4),
       vn = random_tensor<double>(kB, appended, kHK, kD, 5);
  test::Tensor<double> out(kB, sq, kH, kD);
  RotaryTables rot{cos.data(), sin.data(), DType::f64, kPositions, kRot, interleaved};
  KVCache cache;
  cache.k = k.view();
  cache.v = v.view();
  cache.seqlens = seqlens.data();
  DecodeOptions dec;
  const TensorView knv = kn.view(), vnv = vn.view();
  dec.k_new = &knv;
  dec.v_new = &vnv;
  dec.rotary = &rot;
  AttentionOptions o;
  o.causal = causal;
  auto want_k = k, qr = q;
  attention_decode(q.view(), cache, out.view(), o, dec);
  for (std::int64_t b = 0; b < kB; ++b) {
    for (std::int64_t t = 0; t < appended; ++t)
      for (std::int64_t g = 0; g < kHK; ++g) {
        double* row = &want_k.at(b, seqlens[b] + t, g, 0);
        for (std::int64_t c = 0; c < kD; ++c) row[c] = kn.at(b, t, g, c);
        rotate(row, angle, seqlens[b] + t, interleaved);
      }
    for (std::int64_t i = 0; i < sq; ++i)
      for (std::int64_t h = 0; h < kH; ++h)
        rotate(&qr.at(b, i, h, 0), angle, seqlens[b] + (causal ? i : 0), interleaved);
  }
  for (std::size_t x = 0; x < k.data.size(); ++x)
    ASSERT_NEAR(k.data[x], want_k.data[x], 1e-15) << "cache element " << x;
  for (std::int64_t b = 0; b < kB; ++b) {
    const std::int64_t n = seqlens[b] + appended;
    std::vector<double> want(static_cast<std::size_t>(sq * kH * kD));
    attention_reference(TensorView::contiguous(&qr.at(b, 0, 0, 0), 1, sq, kH, kD),
                        TensorView::contiguous(&want_k.at(b, 0, 0, 0), 1, n, kHK, kD),
                        TensorView::contiguous(&v.at(b, 0, 0, 0), 1, n, kHK, kD),
                        TensorView::contiguous(want.data(), 1, sq, kH, kD), o);
    for (std::size_t x = 0; x < want.size(); ++x)
      EXPECT_NEAR(out.data[static_cast<std::size_t>(b * sq * kH * kD) + x], want[x], test::kF64Tolerance)
          << "sequence " << b;
  }
}

TEST(DecodeRotary, KeysAndQueriesRotatedAtTheirPositions) {
  for (bool interleaved : {false, true}) {
    run_case(interleaved, false, 1, 1);
    run_case(interleaved, true, 3, 3);
    run_case(interleaved, false, 2, 1);  // every query at seqlens[b]
  }
}

TEST(DecodeRotary, BadTablesAreNamed) {
  std::vector<float> cos(10 * 4, 1.0f), sin(10 * 4, 0.0f);
  auto k = random_tensor<float>(1, 8, 1, 8, 1), v = random_tensor<float>(1, 8, 1, 8, 2);
  auto q = random_tensor<float>(1, 1, 1, 8, 3), kn = random_tensor<float>(1, 1, 1, 8, 4);
  test::Tensor<float> out(1, 1, 1, 8);
  const std::vector<std::int32_t> seqlens = {7};
  auto expect = [&](RotaryTables r, bool append, const std::string& needle) {
    KVCache c;
    c.k = k.view();
    c.v = v.view();
    c.seqlens = seqlens.data();
    DecodeOptions dec;
    const TensorView knv = kn.view();
    if (append) dec.k_new = dec.v_new = &knv;
    dec.rotary = &r;
    const auto before = k.data;
    try {
      attention_decode(q.view(), c, out.view(), {}, dec);
      ADD_FAILURE() << "no exception for " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("attn::attention_decode: " + needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(before, k.data);
  };
  const RotaryTables ok{cos.data(), sin.data(), DType::f32, 10, 8, false};
  expect(ok, false, "rotary: needs k_new");
  RotaryTables r = ok;
  r.rotary_dim = 7;
  expect(r, true, "rotary.rotary_dim: must be even");
  r = ok;
  r.rotary_dim = 10;
  expect(r, true, "rotary.rotary_dim");
  r = ok;
  r.positions = 7;  // key position 7 needs 8 rows
  expect(r, true, "rotary.positions: must cover every position used (8");
  r = ok;
  r.sin = nullptr;
  expect(r, true, "rotary.sin: data pointer is null");
  r = ok;
  r.dtype = DType::bf16;
  expect(r, true, "rotary.dtype");
}

}  // namespace
}  // namespace attn
