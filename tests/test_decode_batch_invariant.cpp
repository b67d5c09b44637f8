// Batch-invariant decode (DecodeOptions::keys_per_split): a sequence's output and lse are bitwise the
// same decoded alone, in a batch of 64 sequences of other lengths, or in another batch, at any thread
// count, on every SIMD target, for contiguous and paged caches; and exact in f64.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;

constexpr std::int64_t B = 64, MAX = test::full_or_sanitized(1200, 500), H = 8, HK = 2, D = 64;

template <class T>
struct Batch {
  test::Tensor<T> q, k, v;
  std::vector<std::int32_t> seqlens;
  Batch()
      : q(random_tensor<T>(B, 1, H, D, 1, 2.0)),
        k(random_tensor<T>(B, MAX, HK, D, 2, 2.0)),
        v(random_tensor<T>(B, MAX, HK, D, 3)) {
    std::mt19937 rng(9);
    for (std::int64_t b = 0; b < B; ++b)
      seqlens.push_back(std::uniform_int_distribution<std::int32_t>(b % 5 == 0 ? 0 : 1, MAX)(rng));
  }
};

// Decodes sequences [b0, b0 + n) of the batch (views into its tensors) and returns out and lse.
template <class T>
std::pair<std::vector<T>, std::vector<float>> decode(const Batch<T>& x, std::int64_t b0, std::int64_t n, int threads,
                                                     std::int64_t keys_per_split, bool paged) {
  const std::size_t row = static_cast<std::size_t>(H * D);
  std::vector<T> out(static_cast<std::size_t>(n) * row);
  std::vector<float> lse(static_cast<std::size_t>(n * H));
  AttentionOptions o;
  o.num_threads = threads;
  DecodeOptions dec;
  dec.keys_per_split = keys_per_split;
  KVCache cache;
  std::vector<std::int32_t> table;
  const std::size_t seq = static_cast<std::size_t>(MAX * HK * D);
  if (paged) {  // the same rows as pages of 100 slots: sequence b's page j is page b * kPages + j of the pool
    constexpr std::int64_t kPage = 100, kPages = MAX / kPage;
    cache.k = TensorView::contiguous(x.k.data.data(), B * kPages, kPage, HK, D);
    cache.v = TensorView::contiguous(x.v.data.data(), B * kPages, kPage, HK, D);
    for (std::int64_t b = b0; b < b0 + n; ++b)
      for (std::int64_t j = 0; j < kPages; ++j) table.push_back(static_cast<std::int32_t>(b * kPages + j));
    cache.block_table = table.data();
    cache.max_pages = kPages;
  } else {
    cache.k = TensorView::contiguous(x.k.data.data() + static_cast<std::size_t>(b0) * seq, n, MAX, HK, D);
    cache.v = TensorView::contiguous(x.v.data.data() + static_cast<std::size_t>(b0) * seq, n, MAX, HK, D);
  }
  cache.seqlens = x.seqlens.data() + b0;
  TensorView lv = TensorView::contiguous(lse.data(), n, H, 1);
  attention_decode(TensorView::contiguous(x.q.data.data() + static_cast<std::size_t>(b0) * row, n, 1, H, D), cache,
                   TensorView::contiguous(out.data(), n, 1, H, D), o, dec, &lv);
  return {out, lse};
}

template <class T>
void check_invariance(bool paged) {
  const Batch<T> x;
  const std::size_t row = static_cast<std::size_t>(H * D);
  test::for_each_simd_target("decode", test::decode_dispatched, [&](std::int64_t) {
    const auto [all_out, all_lse] = decode(x, 0, B, 2, 256, paged);
    const auto [part_out, part_lse] = decode(x, 40, 9, 3, 256, paged);  // another batch: sequences 40..48
    for (std::int64_t b : {0, 1, 7, 40, 44, 48, 63}) {
      for (int threads : {1, 3}) {
        const auto [one_out, one_lse] = decode(x, b, 1, threads, 256, paged);
        EXPECT_EQ(std::memcmp(one_out.data(), all_out.data() + b * row, row * sizeof(T)), 0)
            << "sequence " << b << " (" << x.seqlens[b] << " keys) alone vs in the batch, " << threads << " threads";
        EXPECT_EQ(std::memcmp(one_lse.data(), all_lse.data() + b * H, H * sizeof(float)), 0) << "lse, sequence " << b;
        if (b >= 40 && b < 49)
          EXPECT_EQ(std::memcmp(one_out.data(), part_out.data() + (b - 40) * row, row * sizeof(T)), 0)
              << "sequence " << b << " in the batch 40..48";
      }
    }
  });
}

TEST(DecodeBatchInvariance, F32ContiguousCache) { check_invariance<float>(false); }
TEST(DecodeBatchInvariance, Bf16PagedCache) { check_invariance<bf16_t>(true); }

TEST(DecodeBatchInvariance, F64IsExactAtAnySliceSize) {
  const auto q = random_tensor<double>(2, 3, 4, 16, 4, 2.0), k = random_tensor<double>(2, 333, 2, 16, 5, 2.0),
             v = random_tensor<double>(2, 333, 2, 16, 6);
  const std::vector<std::int32_t> seqlens{333, 200};
  AttentionOptions o;
  o.causal = true;
  for (std::int64_t per : {1, 7, 64, 1000}) {
    KVCache cache;
    cache.k = k.view();
    cache.v = v.view();
    cache.seqlens = seqlens.data();
    DecodeOptions dec;
    dec.keys_per_split = per;
    std::vector<double> out(q.data.size());
    attention_decode(q.view(), cache, TensorView::contiguous(out.data(), 2, 3, 4, 16), o, dec);
    for (std::int64_t b = 0; b < 2; ++b) {
      std::vector<double> want(static_cast<std::size_t>(3 * 4 * 16));
      attention_reference(TensorView::contiguous(q.data.data() + b * 3 * 4 * 16, 1, 3, 4, 16),
                          TensorView::contiguous(k.data.data() + b * 333 * 2 * 16, 1, seqlens[b], 2, 16),
                          TensorView::contiguous(v.data.data() + b * 333 * 2 * 16, 1, seqlens[b], 2, 16),
                          TensorView::contiguous(want.data(), 1, 3, 4, 16), o);
      const std::vector<double> got(out.begin() + b * 3 * 4 * 16, out.begin() + (b + 1) * 3 * 4 * 16);
      EXPECT_LE(test::max_error(got, want), test::kF64Tolerance) << per << " keys per split, sequence " << b;
    }
  }
  KVCache cache;
  cache.k = k.view();
  cache.v = v.view();
  cache.seqlens = seqlens.data();
  DecodeOptions bad;
  bad.keys_per_split = -1;
  std::vector<double> out(q.data.size(), -3);
  try {
    attention_decode(q.view(), cache, TensorView::contiguous(out.data(), 2, 3, 4, 16), o, bad);
    ADD_FAILURE() << "accepted keys_per_split = -1";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("keys_per_split: must be >= 0"), std::string::npos) << e.what();
  }
  for (double x : out) ASSERT_EQ(x, -3);
}

}  // namespace
}  // namespace attn
