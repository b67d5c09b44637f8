// The CUDA backend against the CPU f64 oracle (label `gpu`; the checks are in cuda_checks.hpp). Without
// a usable GPU every test reports SKIPPED. The same file is also built against the CPU emulation of
// CUDA (tests/cuda_emu/) as test_cuda_emulated, where every test runs.
#include "cuda_checks.hpp"

namespace attn {
namespace {

using namespace test;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports none)";
  }
};

class GpuForward : public Gpu, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuForward, Bf16MatchesTheOracle) { check_forward<bf16_t>(GetParam()); }
TEST_P(GpuForward, F16MatchesTheOracle) { check_forward<f16_t>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Shapes, GpuForward,
                         ::testing::Values(Case{2, 130, 257, 4, 2, 64, false}, Case{2, 130, 257, 4, 2, 64, true},
                                           Case{1, 257, 130, 4, 1, 128,
                                                true},  // seqlen_q > seqlen_k: fully masked rows
                                           Case{2, 200, 333, 8, 2, 128, false}, Case{1, 300, 300, 2, 2, 128, true},
                                           Case{1, 97, 161, 4, 4, 256, false}, Case{1, 161, 161, 4, 2, 256, true},
                                           Case{1, 1, 1000, 4, 1, 128, false},          // one query row
                                           Case{1, 1, 0, 2, 1, 64, false},              // no keys: out = 0, lse = -inf
                                           Case{2, 150, 180, 4, 2, 128, false, 40, 7},  // sliding window
                                           Case{1, 150, 180, 4, 2, 64, true, -1, -1, 5.0, true},  // softcap + ALiBi
                                           Case{2, 130, 257, 4, 2, 64, false, -1, -1, 0.0, false, true},   // sinks
                                           Case{1, 257, 130, 4, 1, 128, true, -1, -1, 0.0, false, true}),  // + no key
                         [](const ::testing::TestParamInfo<Case>& i) {
                           const Case& c = i.param;
                           return "b" + std::to_string(c.b) + "_q" + std::to_string(c.sq) + "_k" +
                                  std::to_string(c.sk) + "_h" + std::to_string(c.h) + "x" + std::to_string(c.hk) +
                                  "_d" + std::to_string(c.d) + (c.causal ? "_causal" : "") +
                                  (c.left >= 0 || c.right >= 0 ? "_window" : "") + (c.softcap > 0 ? "_softcap" : "") +
                                  (c.alibi ? "_alibi" : "") + (c.sinks ? "_sinks" : "");
                         });

TEST_F(Gpu, VarlenMatchesPerSequenceOracle) {
  const std::int64_t H = 4, HK = 2, D = 128;
  const std::vector<std::int32_t> lq = {17, 0, 200, 64}, lk = {50, 9, 200, 1}, cq = cu_seqlens(lq), ck = cu_seqlens(lk);
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto q = test::random_tensor<bf16_t>(1, cq.back(), H, D, seed, 2.0),
       k = test::random_tensor<bf16_t>(1, ck.back(), HK, D, seed + 1, 2.0),
       v = test::random_tensor<bf16_t>(1, ck.back(), HK, D, seed + 2);
  auto q64 = test::to_f64(q), k64 = test::to_f64(k), v64 = test::to_f64(v);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    Tensor<double> oracle(1, cq.back(), H, D);
    Tensor<bf16_t> textbook(1, cq.back(), H, D);
    std::vector<double> oracle_lse(static_cast<std::size_t>(H * cq.back()));
    for (std::size_t b = 0; b < lq.size(); ++b) {
      if (lq[b] == 0) continue;
      std::vector<double> l(static_cast<std::size_t>(H * lq[b]));
      TensorView lv = TensorView::contiguous(l.data(), 1, H, lq[b]);
      attention_reference(q64.rows(cq[b], lq[b]), k64.rows(ck[b], lk[b]), v64.rows(ck[b], lk[b]),
                          oracle.rows(cq[b], lq[b]), o, &lv);
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < lq[b]; ++i) oracle_lse[h * cq.back() + cq[b] + i] = l[h * lq[b] + i];
      attention_reference(q.rows(cq[b], lq[b]), k.rows(ck[b], lk[b]), v.rows(ck[b], lk[b]), textbook.rows(cq[b], lq[b]),
                          o);
    }
    const double base = max_error(textbook, oracle);
    Dev<bf16_t> dq(q), dk(k), dv(v), dout(poisoned<bf16_t>(1, cq.back(), H, D));
    Dev<float> dlse(poisoned<float>(oracle_lse.size()));
    Dev<std::int32_t> dcq(cq), dck(ck);
    TensorView lv = TensorView::contiguous(dlse.ptr, 1, H, cq.back());
    cuda::VarlenBatch vb;
    vb.cu_seqlens_q = dcq.ptr;
    vb.cu_seqlens_k = dck.ptr;
    vb.batch = static_cast<std::int64_t>(lq.size());
    cuda::attention_varlen(dq.packed(), dk.packed(), dv.packed(), dout.packed(), vb, o, &lv);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<bf16_t> out = dout.get();
    EXPECT_TRUE(meets_textbook_rule(max_error(out, oracle.data), base, kForwardFactor, textbook_floor<bf16_t>()))
        << "causal " << causal;
    EXPECT_EQ(count_nan(out), 0);
    EXPECT_LE(max_error(dlse.get(), oracle_lse), 2e-3);
  }
}

// The paged varlen forward reads each key row through the block table and is otherwise the varlen
// kernel: on the same keys scattered over shuffled pages of any size, it must give the packed call's
// out and lse bit for bit. Slots no sequence owns hold NaN and table entries past a sequence's pages
// hold an out-of-range page, so a row read from the wrong place shows.
TEST_F(Gpu, VarlenPagedEqualsVarlenOnTheSameKeysPacked) {
  const std::int64_t H = 4, HK = 2, D = 64;
  const std::vector<std::int32_t> lq = {17, 0, 130, 1, 40}, lk = {50, 9, 200, 77, 0}, cq = cu_seqlens(lq),
                                  ck = cu_seqlens(lk);
  const std::int64_t batch = static_cast<std::int64_t>(lq.size());
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto q = test::random_tensor<bf16_t>(1, cq.back(), H, D, seed, 2.0),
       k = test::random_tensor<bf16_t>(1, ck.back(), HK, D, seed + 1, 2.0),
       v = test::random_tensor<bf16_t>(1, ck.back(), HK, D, seed + 2);
  Dev<bf16_t> dq(q), dk(k), dv(v);
  Dev<std::int32_t> dcq(cq), dck(ck);
  cuda::VarlenBatch vb;
  vb.cu_seqlens_q = dcq.ptr;
  vb.cu_seqlens_k = dck.ptr;
  vb.batch = batch;
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  for (std::int64_t page : {1, 16, 48, 256})
    for (bool causal : {false, true}) {
      SCOPED_TRACE("page_size " + std::to_string(page) + (causal ? " causal" : ""));
      AttentionOptions o;
      o.causal = causal;
      Dev<bf16_t> want(poisoned<bf16_t>(1, cq.back(), H, D)), got(poisoned<bf16_t>(1, cq.back(), H, D));
      Dev<float> want_lse(poisoned<float>(static_cast<std::size_t>(H * cq.back()))),
          got_lse(poisoned<float>(static_cast<std::size_t>(H * cq.back())));
      TensorView want_lv = TensorView::contiguous(want_lse.ptr, 1, H, cq.back()),
                 got_lv = TensorView::contiguous(got_lse.ptr, 1, H, cq.back());
      cuda::attention_varlen(dq.packed(), dk.packed(), dv.packed(), want.packed(), vb, o, &want_lv);
      // Sequence b's keys in pages of its own, the pool shuffled, one spare page left unused.
      std::int64_t max_pages = 1, pages_used = 0;
      for (std::int32_t n : lk) max_pages = std::max<std::int64_t>(max_pages, (n + page - 1) / page);
      for (std::int32_t n : lk) pages_used += (n + page - 1) / page;
      const std::int64_t num_pages = pages_used + 1;
      std::vector<std::int32_t> pool(static_cast<std::size_t>(num_pages));
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), rng);
      std::vector<std::int32_t> table(static_cast<std::size_t>(batch * max_pages), 1 << 30);
      const std::size_t row = static_cast<std::size_t>(HK * D), slots = static_cast<std::size_t>(num_pages * page);
      std::vector<bf16_t> kc(slots * row, bf16_t{0x7FC0}), vc(kc);
      std::size_t next = 0;
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t j = 0; j < lk[b]; ++j) {
          if (j % page == 0) table[b * max_pages + j / page] = pool[next++];
          const std::size_t slot = static_cast<std::size_t>(table[b * max_pages + j / page] * page + j % page);
          const std::size_t src = static_cast<std::size_t>(ck[b] + j) * row;
          std::copy_n(k.data.begin() + src, row, kc.begin() + slot * row);
          std::copy_n(v.data.begin() + src, row, vc.begin() + slot * row);
        }
      Dev<bf16_t> dkc(kc), dvc(vc);
      Dev<std::int32_t> dtable(table);
      VarlenPages pages;
      pages.block_table = dtable.ptr;
      pages.max_pages = max_pages;
      cuda::attention_varlen_paged(dq.packed(), dview(dkc, num_pages, page, HK, D), dview(dvc, num_pages, page, HK, D),
                                   got.packed(), vb, pages, o, &got_lv);
      CUDA_OK(cudaDeviceSynchronize());
      const auto w = want.get(), g = got.get();
      for (std::size_t x = 0; x < w.size(); ++x) ASSERT_EQ(g[x].bits, w[x].bits) << "out element " << x;
      const auto wl = want_lse.get(), gl = got_lse.get();
      for (std::size_t x = 0; x < wl.size(); ++x)
        ASSERT_EQ(std::memcmp(&gl[x], &wl[x], sizeof(float)), 0) << "lse element " << x;
    }
}

TEST_F(Gpu, VarlenPagedRejectsBadTablesWithoutWriting) {
  const std::int64_t H = 2, D = 64, page = 4, num_pages = 3;
  const std::vector<std::int32_t> cq = {0, 3}, ck = {0, 6};
  auto q = test::random_tensor<bf16_t>(1, 3, H, D, 1), kv = test::random_tensor<bf16_t>(num_pages, page, H, D, 2);
  Dev<bf16_t> dq(q), dkv(kv), dout(poisoned<bf16_t>(1, 3, H, D));
  Dev<std::int32_t> dcq(cq), dck(ck);
  cuda::VarlenBatch vb;
  vb.cu_seqlens_q = dcq.ptr;
  vb.cu_seqlens_k = dck.ptr;
  vb.batch = 1;
  auto call = [&](const std::vector<std::int32_t>& table, std::int64_t max_pages, const std::int32_t* host = nullptr) {
    Dev<std::int32_t> dt(table);
    VarlenPages pages;
    pages.block_table = host ? host : dt.ptr;
    pages.max_pages = max_pages;
    cuda::attention_varlen_paged(dq.packed(), dkv.view(), dkv.view(), dout.packed(), vb, pages);
  };
  expect_invalid_argument([&] { call({0, 3}, 2); }, "pages.block_table");       // page 3 of a 3-page cache
  expect_invalid_argument([&] { call({0}, 1); }, "more than the cache holds");  // 6 keys, one page of 4
  const std::vector<std::int32_t> host_table = {0, 1};
  expect_invalid_argument([&] { call(host_table, 2, host_table.data()); }, "device memory");
  for (auto x : dout.get()) ASSERT_EQ(x.bits, 0xFFFF) << "out was written by a rejected call";
  call({2, 0}, 2);  // the valid call writes every row
  for (auto x : dout.get()) ASSERT_NE(x.bits, 0xFFFF);
}

// cache_batch_idx and cache_leftpad only move where a sequence's keys are read and appended: the same
// keys compacted into cache rows 0 .. batch - 1 from position 0 must give the same out and lse bit for
// bit (the kernel's key order and slices are the same), and the append must land at batch_idx[b]'s row.
TEST_F(Gpu, DecodeBatchIdxAndLeftpadEqualTheCompactedCache) {
  const std::int64_t B = 3, rows_in_cache = 5, cap = 96, H = 4, HK = 2, D = 64, SQ = 2, NEW = 2;
  const std::vector<std::int32_t> seqlens = {40, 90, 7}, leftpad = {3, 0, 7}, batch_idx = {4, 0, 2};
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto big_k = test::random_tensor<bf16_t>(rows_in_cache, cap, HK, D, seed, 2.0),
       big_v = test::random_tensor<bf16_t>(rows_in_cache, cap, HK, D, seed + 1);
  auto q = test::random_tensor<bf16_t>(B, SQ, H, D, seed + 2, 2.0);
  auto kn = test::random_tensor<bf16_t>(B, NEW, HK, D, seed + 3, 2.0),
       vn = test::random_tensor<bf16_t>(B, NEW, HK, D, seed + 4);
  Tensor<bf16_t> small_k(B, cap, HK, D), small_v(B, cap, HK, D);
  std::vector<std::int32_t> small_seqlens(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) {
    small_seqlens[b] = seqlens[b] - leftpad[b];
    for (std::int64_t j = 0; j < small_seqlens[b]; ++j)
      for (std::int64_t g = 0; g < HK; ++g)
        for (std::int64_t x = 0; x < D; ++x) {
          small_k.at(b, j, g, x) = big_k.at(batch_idx[b], leftpad[b] + j, g, x);
          small_v.at(b, j, g, x) = big_v.at(batch_idx[b], leftpad[b] + j, g, x);
        }
  }
  Dev<bf16_t> dq(q), dkn(kn), dvn(vn);
  Dev<std::int32_t> dseq(seqlens), dsmall_seq(small_seqlens), dleft(leftpad), didx(batch_idx);
  TensorView knv = dkn.view(), vnv = dvn.view();
  for (bool causal : {false, true})
    for (std::int64_t splits : {1, 3}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "") + " splits " + std::to_string(splits));
      AttentionOptions o;
      o.causal = causal;
      DecodeOptions dec;
      dec.num_splits = splits;
      dec.k_new = &knv;
      dec.v_new = &vnv;
      auto run = [&](const Tensor<bf16_t>& k, const Tensor<bf16_t>& v, const Dev<std::int32_t>& seq,
                     const std::int32_t* idx, const std::int32_t* left, std::vector<bf16_t>* k_after) {
        Dev<bf16_t> dk(k), dv(v), dout(poisoned<bf16_t>(B, SQ, H, D));
        Dev<float> dlse(poisoned<float>(static_cast<std::size_t>(B * H * SQ)));
        KVCache cache;
        cache.k = dk.view();
        cache.v = dv.view();
        cache.seqlens = seq.ptr;
        cache.batch_idx = idx;
        cache.leftpad = left;
        TensorView lv = TensorView::contiguous(dlse.ptr, B, H, SQ);
        cuda::attention_decode(dq.view(), cache, dout.view(), o, dec, &lv);
        if (cudaDeviceSynchronize() != cudaSuccess) ADD_FAILURE() << "decode failed";
        *k_after = dk.get();
        return std::pair{dout.get(), dlse.get()};
      };
      std::vector<bf16_t> big_after, small_after;
      const auto [got, got_lse] = run(big_k, big_v, dseq, didx.ptr, dleft.ptr, &big_after);
      const auto [want, want_lse] = run(small_k, small_v, dsmall_seq, nullptr, nullptr, &small_after);
      for (std::size_t x = 0; x < want.size(); ++x) ASSERT_EQ(got[x].bits, want[x].bits) << "out element " << x;
      for (std::size_t x = 0; x < want_lse.size(); ++x)
        ASSERT_EQ(std::memcmp(&got_lse[x], &want_lse[x], sizeof(float)), 0) << "lse element " << x;
      for (std::int64_t b = 0; b < B; ++b)  // the appended rows, at seqlens[b] of cache row batch_idx[b]
        for (std::int64_t j = 0; j < NEW; ++j) {
          const std::size_t at = static_cast<std::size_t>(((batch_idx[b] * cap + seqlens[b] + j) * HK) * D);
          EXPECT_EQ(big_after[at].bits, kn.at(b, j, 0, 0).bits) << "sequence " << b << " new key " << j;
        }
    }
}

// keys_per_split: a sequence's out and lse are the same bits decoded alone as in a batch with sequences
// of other lengths (whose slice counts set the grid), for contiguous and paged caches.
TEST_F(Gpu, DecodeKeysPerSplitIsBatchInvariant) {
  const std::int64_t B = 5, cap = 1100, H = 8, HK = 2, D = 64, SQ = 2;
  const std::vector<std::int32_t> seqlens = {1000, 0, 37, 300, 129};
  const std::uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  auto k = test::random_tensor<bf16_t>(B, cap, HK, D, seed, 2.0),
       v = test::random_tensor<bf16_t>(B, cap, HK, D, seed + 1);
  auto q = test::random_tensor<bf16_t>(B, SQ, H, D, seed + 2, 2.0);
  Dev<bf16_t> dk(k), dv(v), dq(q);
  Dev<std::int32_t> dseq(seqlens);
  const std::size_t q_row = static_cast<std::size_t>(SQ * H * D), lse_row = static_cast<std::size_t>(H * SQ);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "");
    AttentionOptions o;
    o.causal = causal;
    DecodeOptions dec;
    dec.keys_per_split = 128;
    // Sequences [first, first + n) of the batch, as views into the same device arrays.
    auto decode = [&](std::int64_t first, std::int64_t n) {
      Dev<bf16_t> dout(poisoned<bf16_t>(n, SQ, H, D));
      Dev<float> dlse(poisoned<float>(n * lse_row));
      KVCache cache;
      cache.k = TensorView::contiguous(dk.ptr + first * cap * HK * D, n, cap, HK, D);
      cache.v = TensorView::contiguous(dv.ptr + first * cap * HK * D, n, cap, HK, D);
      cache.seqlens = dseq.ptr + first;
      TensorView lv = TensorView::contiguous(dlse.ptr, n, H, SQ);
      cuda::attention_decode(TensorView::contiguous(dq.ptr + first * q_row, n, SQ, H, D), cache, dout.view(), o, dec,
                             &lv);
      if (cudaDeviceSynchronize() != cudaSuccess) ADD_FAILURE() << "decode failed";
      return std::pair{dout.get(), dlse.get()};
    };
    const auto [all, all_lse] = decode(0, B);
    for (std::int64_t b = 0; b < B; ++b) {
      const auto [one, one_lse] = decode(b, 1);
      for (std::size_t x = 0; x < q_row; ++x)
        ASSERT_EQ(one[x].bits, all[b * q_row + x].bits) << "sequence " << b << " out element " << x;
      for (std::size_t x = 0; x < lse_row; ++x)
        ASSERT_EQ(std::memcmp(&one_lse[x], &all_lse[b * lse_row + x], sizeof(float)), 0) << "sequence " << b;
    }
  }
}

class GpuDecode : public Gpu, public ::testing::WithParamInterface<DecodeCase> {};
TEST_P(GpuDecode, Bf16MatchesTheOracle) { check_decode<bf16_t>(GetParam()); }
TEST_P(GpuDecode, F16MatchesTheOracle) { check_decode<f16_t>(GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuDecode,
    ::testing::Values(DecodeCase{1, 1, 32, 8, 128, 5000, false, false, 0},  // the benchmark's shape, smaller
                      DecodeCase{3, 1, 32, 8, 128, 3000, false, false, 1},  // one split: no merge kernel
                      DecodeCase{3, 1, 32, 8, 128, 3000, false, false, 7},
                      DecodeCase{2, 3, 8, 2, 64, 2000, true, false, 5},                 // speculative, causal
                      DecodeCase{2, 1, 16, 1, 256, 1500, false, true, 0},               // MQA, 16 rows per slab, paged
                      DecodeCase{4, 2, 40, 8, 128, 1200, true, true, 3, 0, 16},         // 10 rows x 2 queries: 2 slabs
                      DecodeCase{2, 1, 8, 8, 128, 700, false, true, 0, 5, 64},          // append 5 new keys
                      DecodeCase{2, 1, 16, 4, 128, 900, false, false, 0, 0, 64, true},  // kv-head-major cache
                      DecodeCase{2, 3, 8, 2, 64, 2000, true, true, 5, 0, 64, false, true},        // sinks, 5 splits
                      DecodeCase{3, 1, 32, 8, 128, 3000, false, false, 1, 0, 64, false, true},    // sinks, 1 split
                      DecodeCase{2, 1, 8, 2, 128, 700, false, false, 3, 4, 64, false, false, 1},  // rotary, NeoX
                      DecodeCase{2, 3, 8, 2, 64, 500, true, true, 0, 3, 16, false, false, 2},     // GPT-J, half d
                      DecodeCase{3, 2, 16, 4, 128, 1500, true, false, 0, 0, 64, false, true, 0, 256}),  // invariant
    [](const ::testing::TestParamInfo<DecodeCase>& i) {
      const DecodeCase& c = i.param;
      return std::to_string(i.index) + "_b" + std::to_string(c.batch) + "_q" + std::to_string(c.sq) + "_h" +
             std::to_string(c.heads) + "x" + std::to_string(c.kv_heads) + "_d" + std::to_string(c.d) + "_n" +
             std::to_string(c.max_len) + (c.causal ? "_causal" : "") + (c.paged ? "_paged" : "_contiguous") +
             "_splits" + std::to_string(c.splits) + (c.seqlen_new ? "_append" : "") +
             (c.head_major ? "_headmajor" : "") + (c.sinks ? "_sinks" : "") +
             (c.rotary ? "_rotary" + std::to_string(c.rotary) : "") +
             (c.keys_per_split ? "_kps" + std::to_string(c.keys_per_split) : "");
    });

// ---- Non-finite inputs: the CPU's rules (docs/robustness.md) ------------------------------------------
// A NaN or infinity in one input row reaches only the output rows that read it; every other row is
// bitwise what it is without it. Forward, causal, B 2 x 70 x 70, 4 heads over 2 kv heads, d 64: key 3 of
// (batch 0, kv head 1) is seen only by rows i >= 3 of heads 2 and 3 in batch 0, and it lies in a tile
// the mask cuts, where the rows that may not see it share the tile's P V product.
template <class T>
void expect_forward_confined(const char* what, const std::function<void(Tensor<T>&, Tensor<T>&, Tensor<T>&)>& poison,
                             const std::function<bool(std::int64_t b, std::int64_t i, std::int64_t h)>& may_change) {
  const std::int64_t B = 2, S = 70, H = 4, HK = 2, D = 64;
  auto q = random_tensor<T>(B, S, H, D, 21), k = random_tensor<T>(B, S, HK, D, 22),
       v = random_tensor<T>(B, S, HK, D, 23);
  AttentionOptions o;
  o.causal = true;
  auto run = [&](const Tensor<T>& qq, const Tensor<T>& kk, const Tensor<T>& vv) {
    Dev<T> dq(qq), dk(kk), dv(vv), dout(poisoned<T>(B, S, H, D));
    Dev<float> dlse(poisoned<float>(static_cast<std::size_t>(B * H * S)));
    TensorView lv = TensorView::contiguous(dlse.ptr, B, H, S);
    cuda::attention(dq.view(), dk.view(), dv.view(), dout.view(), o, &lv);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return std::make_pair(dout.get(), dlse.get());
  };
  const auto [clean, clean_lse] = run(q, k, v);
  auto q2 = q, k2 = k, v2 = v;
  poison(q2, k2, v2);
  const auto [out, lse] = run(q2, k2, v2);
  std::int64_t changed_elsewhere = 0, nonfinite_where_allowed = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < S; ++i)
      for (std::int64_t h = 0; h < H; ++h) {
        const auto l = static_cast<std::size_t>((b * H + h) * S + i);
        for (std::int64_t c = 0; c < D; ++c) {
          const auto at = static_cast<std::size_t>(((b * S + i) * H + h) * D + c);
          if (may_change(b, i, h))
            nonfinite_where_allowed += !std::isfinite(detail::load<double>(out[at]));
          else
            changed_elsewhere += out[at].bits != clean[at].bits;
        }
        if (!may_change(b, i, h)) changed_elsewhere += std::memcmp(&lse[l], &clean_lse[l], sizeof(float)) != 0;
      }
  EXPECT_EQ(changed_elsewhere, 0) << what << " changed rows that do not read it";
  EXPECT_GT(nonfinite_where_allowed, 0) << what << " did not reach the rows that read it";
}

TEST_F(Gpu, NanOrInfInAQueryRowStaysInThatRow) {
  for (double bad : {double(NAN), double(INFINITY)})
    expect_forward_confined<bf16_t>(
        "a non-finite q entry", [bad](auto& q, auto&, auto&) { q.at(1, 2, 3, 1) = detail::store<bf16_t>(bad); },
        [](auto b, auto i, auto h) { return b == 1 && i == 2 && h == 3; });
}
TEST_F(Gpu, NanOrInfInAKeyRowStaysInTheRowsThatSeeIt) {
  for (double bad : {double(NAN), double(INFINITY)})
    expect_forward_confined<bf16_t>(
        "a non-finite k entry", [bad](auto&, auto& k, auto&) { k.at(0, 3, 1, 0) = detail::store<bf16_t>(bad); },
        [](auto b, auto i, auto h) { return b == 0 && i >= 3 && h >= 2; });
}
TEST_F(Gpu, NanOrInfInAValueRowStaysInTheRowsThatSeeIt) {
  for (double bad : {double(NAN), double(INFINITY)})
    expect_forward_confined<f16_t>(
        "a non-finite v entry", [bad](auto&, auto&, auto& v) { v.at(0, 3, 1, 0) = detail::store<f16_t>(bad); },
        [](auto b, auto i, auto h) { return b == 0 && i >= 3 && h >= 2; });
}

// Decode, causal with 3 queries per sequence (speculative decoding): the newest key is seen only by the
// last query, so a NaN in its value row must not reach the two earlier queries' rows.
TEST_F(Gpu, DecodeNanInAValueRowStaysInTheQueriesThatSeeIt) {
  const std::int64_t SQ = 3, H = 8, HK = 2, D = 128, N = 300;
  auto q = random_tensor<bf16_t>(1, SQ, H, D, 31), kc = random_tensor<bf16_t>(1, N, HK, D, 32),
       vc = random_tensor<bf16_t>(1, N, HK, D, 33);
  const std::vector<std::int32_t> seqlens = {static_cast<std::int32_t>(N)};
  auto run = [&](const Tensor<bf16_t>& v) {
    Dev<bf16_t> dq(q), dk(kc), dv(v), dout(poisoned<bf16_t>(1, SQ, H, D));
    Dev<std::int32_t> dseq(seqlens);
    KVCache cache;
    cache.k = dk.view();
    cache.v = dv.view();
    cache.seqlens = dseq.ptr;
    AttentionOptions o;
    o.causal = true;
    DecodeOptions dec;
    dec.num_splits = 2;
    cuda::attention_decode(dq.view(), cache, dout.view(), o, dec);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return dout.get();
  };
  const auto clean = run(vc);
  auto v2 = vc;
  v2.at(0, N - 1, 1, 5) = detail::store<bf16_t>(NAN);
  const auto out = run(v2);
  for (std::int64_t i = 0; i < SQ; ++i)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t c = 0; c < D; ++c) {
        const auto at = static_cast<std::size_t>((i * H + h) * D + c);
        if (i == SQ - 1 && h >= 4 && c == 5)
          EXPECT_TRUE(std::isnan(detail::load<double>(out[at]))) << "h " << h;
        else
          ASSERT_EQ(out[at].bits, clean[at].bits) << "query " << i << " head " << h << " column " << c;
      }
}

TEST_F(Gpu, RejectsHostPointersAndUnsupportedShapesWithoutWriting) {
  auto q = test::random_tensor<bf16_t>(1, 4, 2, 128, 1), k = test::random_tensor<bf16_t>(1, 8, 2, 128, 2);
  Dev<bf16_t> dq(q), dk(k), dv(k), dout(poisoned<bf16_t>(1, 4, 2, 128));
  // Host memory as an input.
  EXPECT_THROW(cuda::attention(q.view(), dk.view(), dv.view(), dout.view()), std::invalid_argument);
  // f32 is CPU-only; head_dim 96 has no kernel.
  std::vector<float> f(4 * 2 * 128);
  Dev<float> df(f);
  EXPECT_THROW(cuda::attention(dview(df, 1, 4, 2, 128), dview(df, 1, 4, 2, 128), dview(df, 1, 4, 2, 128), dout.view()),
               std::invalid_argument);
  EXPECT_THROW(
      cuda::attention(dview(dq, 1, 4, 2, 96), dview(dk, 1, 8, 2, 96), dview(dv, 1, 8, 2, 96), dview(dout, 1, 4, 2, 96)),
      std::invalid_argument);
  // The shared rules (here: heads not a multiple of kv_heads) come from validate/validate.cpp.
  EXPECT_THROW(cuda::attention(dq.view(), dview(dk, 1, 4, 4, 64), dview(dv, 1, 4, 4, 64), dout.view()),
               std::invalid_argument);
  // Dropout is for training: the CUDA entry points are inference paths and reject it.
  AttentionOptions dropout;
  dropout.dropout_p = 0.1;
  expect_invalid_argument([&] { cuda::attention(dq.view(), dk.view(), dv.view(), dout.view(), dropout); },
                          "dropout_p: must be 0");
  for (auto x : dout.get()) ASSERT_EQ(x.bits, 0xFFFF) << "out was written by a rejected call";
}

}  // namespace
}  // namespace attn
