// attention_decode with cache.batch_idx (sequence b in cache row batch_idx[b]) and cache.leftpad
// (sequence b's keys start at position leftpad[b]), flash-attn's cache_batch_idx and cache_leftpad:
// each sequence equals attention_reference over exactly its keys (f64, 1e-12), appends land in the
// mapped row after the left padding's keys, and bad maps are rejected naming the argument.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;

constexpr std::int64_t kRows = 5, kMax = 40, kHK = 2, kH = 4, kD = 8;

// Sequence b's keys [first, end) of cache row r, as a dense [1, n, kHK, kD] copy.
std::vector<double> keys_of(const test::Tensor<double>& cache, std::int64_t r, std::int64_t first, std::int64_t end) {
  const auto* at = cache.data.data() + (r * kMax + first) * kHK * kD;
  return {at, at + (end - first) * kHK * kD};
}

void run_case(std::int64_t sq, std::int64_t appended, bool causal) {
  const std::vector<std::int32_t> batch_idx = {3, 0, 4}, leftpad = {2, 0, 7}, seqlens = {10, 5, 30};
  const std::int64_t B = 3;
  auto k = random_tensor<double>(kRows, kMax, kHK, kD, 1), v = random_tensor<double>(kRows, kMax, kHK, kD, 2);
  auto q = random_tensor<double>(B, sq, kH, kD, 3), kn = random_tensor<double>(B, appended, kHK, kD, 4),
       vn = random_tensor<double>(B, appended, kHK, kD, 5);
  test::Tensor<double> out(B, sq, kH, kD);
  KVCache cache;
  cache.k = k.view();
  cache.v = v.view();
  cache.seqlens = seqlens.data();
  cache.batch_idx = batch_idx.data();
  cache.leftpad = leftpad.data();
  DecodeOptions dec;
  const TensorView knv = kn.view(), vnv = vn.view();
  if (appended) dec.k_new = &knv, dec.v_new = &vnv;
  dec.num_splits = 3;
  AttentionOptions o;
  o.causal = causal;
  const auto k_before = k.data;
  attention_decode(q.view(), cache, out.view(), o, dec);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t r = batch_idx[b], first = leftpad[b], end = seqlens[b] + appended;
    for (std::int64_t t = 0; t < appended; ++t)
      for (std::int64_t x = 0; x < kHK * kD; ++x)
        ASSERT_EQ(k.data[static_cast<std::size_t>((r * kMax + seqlens[b] + t) * kHK * kD + x)],
                  kn.data[static_cast<std::size_t>((b * appended + t) * kHK * kD + x)]);
    auto kb = keys_of(k, r, first, end), vb = keys_of(v, r, first, end);
    std::vector<double> want(static_cast<std::size_t>(sq * kH * kD));
    attention_reference(TensorView::contiguous(q.data.data() + b * sq * kH * kD, 1, sq, kH, kD),
                        TensorView::contiguous(kb.data(), 1, end - first, kHK, kD),
                        TensorView::contiguous(vb.data(), 1, end - first, kHK, kD),
                        TensorView::contiguous(want.data(), 1, sq, kH, kD), o);
    for (std::size_t x = 0; x < want.size(); ++x)
      EXPECT_NEAR(out.data[static_cast<std::size_t>(b * sq * kH * kD) + x], want[x], test::kF64Tolerance)
          << "sequence " << b;
  }
  // Rows no sequence maps to are never written.
  for (std::int64_t r : {1, 2})
    for (std::int64_t x = 0; x < kMax * kHK * kD; ++x)
      ASSERT_EQ(k.data[static_cast<std::size_t>(r * kMax * kHK * kD + x)],
                k_before[static_cast<std::size_t>(r * kMax * kHK * kD + x)]);
}

TEST(DecodeRowMaps, EachSequenceSeesExactlyItsKeys) {
  run_case(1, 0, false);
  run_case(1, 1, true);
  run_case(3, 2, true);
}

TEST(DecodeRowMaps, BadMapsAreNamed) {
  auto k = random_tensor<double>(kRows, kMax, kHK, kD, 1), v = random_tensor<double>(kRows, kMax, kHK, kD, 2);
  auto q = random_tensor<double>(2, 1, kH, kD, 3), kn = random_tensor<double>(2, 1, kHK, kD, 4);
  test::Tensor<double> out(2, 1, kH, kD);
  const std::vector<std::int32_t> seqlens = {4, 6};
  auto expect = [&](std::vector<std::int32_t> idx, std::vector<std::int32_t> pad, bool append, const std::string& arg,
                    const std::string& rule) {
    KVCache c;
    c.k = k.view();
    c.v = v.view();
    c.seqlens = seqlens.data();
    c.batch_idx = idx.empty() ? nullptr : idx.data();
    c.leftpad = pad.empty() ? nullptr : pad.data();
    DecodeOptions dec;
    const TensorView knv = kn.view();
    if (append) dec.k_new = dec.v_new = &knv;
    const auto before = k.data;
    try {
      attention_decode(q.view(), c, out.view(), {}, dec);
      ADD_FAILURE() << "no exception for " << arg;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("attn::attention_decode: " + arg + ": " + rule), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(before, k.data);
  };
  expect({0, 5}, {}, false, "cache.batch_idx", "entry [1] = 5 must be in [0, cache rows = 5)");
  expect({-1, 0}, {}, false, "cache.batch_idx", "entry [0] = -1");
  expect({2, 2}, {}, true, "cache.batch_idx", "sequences 0 and 1 append into cache row 2");
  expect({0, 1}, {0, 7}, false, "cache.leftpad", "entry [1] = 7 must be in [0, seqlens[b] = 6]");
  expect({0, 1}, {-1, 0}, false, "cache.leftpad", "entry [0] = -1");
  // Without batch_idx the cache's batch must be q's.
  expect({}, {}, false, "cache.k", "batch must equal q's");
}

}  // namespace
}  // namespace attn
