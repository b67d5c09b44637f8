// Bad input to attention_decode: every rule throws std::invalid_argument naming the argument, and
// neither out, lse nor the cache is touched.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "attn/decode.hpp"
#include "support.hpp"

namespace attn {
namespace {

// A valid paged problem (batch 2, seqlen_q 1, 4 heads, 2 kv heads, d 8, 6 pages of 4 slots, 3 pages per
// sequence) with an append of 1 token, that each case breaks in one way.
struct Valid {
  std::vector<float> q = std::vector<float>(2 * 4 * 8, 0.5f), out = std::vector<float>(2 * 4 * 8, 7.0f),
                     lse = std::vector<float>(2 * 4, 7.0f), kc = std::vector<float>(6 * 4 * 2 * 8, 1.0f),
                     vc = std::vector<float>(6 * 4 * 2 * 8, 2.0f), kn = std::vector<float>(2 * 2 * 8, 3.0f),
                     vn = std::vector<float>(2 * 2 * 8, 4.0f);
  std::vector<std::int32_t> seqlens{5, 0}, table{4, 1, 0, 2, 3, 5};
  TensorView qv = TensorView::contiguous(q.data(), 2, 1, 4, 8), ov = TensorView::contiguous(out.data(), 2, 1, 4, 8),
             lv = TensorView::contiguous(lse.data(), 2, 4, 1), knv = TensorView::contiguous(kn.data(), 2, 1, 2, 8),
             vnv = TensorView::contiguous(vn.data(), 2, 1, 2, 8);
  KVCache cache;
  AttentionOptions opts;
  DecodeOptions dec;
  const TensorView* lse_arg = &lv;
  Valid() {
    cache.k = TensorView::contiguous(kc.data(), 6, 4, 2, 8);
    cache.v = TensorView::contiguous(vc.data(), 6, 4, 2, 8);
    cache.seqlens = seqlens.data();
    cache.block_table = table.data();
    cache.max_pages = 3;
    dec.k_new = &knv;
    dec.v_new = &vnv;
  }
  void call() { attention_decode(qv, cache, ov, opts, dec, lse_arg); }
  // The same buffers as a contiguous cache of `batch` rows of `rows` keys each, without a block table.
  void contiguous_cache(std::int64_t batch, std::int64_t rows) {
    cache.block_table = nullptr;
    cache.k = TensorView::contiguous(kc.data(), batch, rows, 2, 8);
    cache.v = TensorView::contiguous(vc.data(), batch, rows, 2, 8);
  }
};

struct BadCase {
  const char* what;
  std::function<void(Valid&)> breaks;
  const char* message;  // must appear in the exception's text
};

TEST(DecodeValidation, TheValidProblemRuns) {
  Valid v;
  EXPECT_NO_THROW(v.call());
  EXPECT_EQ(v.kc[5 * 16], 3.0f);  // sequence 0 appends key 5: page table[0][1] = 1, slot 1 = row 5
}

TEST(DecodeValidation, EveryRuleThrowsNamesTheArgumentAndWritesNothing) {
  static std::vector<std::int32_t> bad_table{4, 9, 0, 2, 3, 5}, neg{-1, 0}, big{12, 0}, shared{4, 1, 0, 4, 3, 5};
  static std::vector<std::int32_t> zero_seq{0, 0};
  static std::vector<std::uint16_t> bf(6 * 4 * 2 * 8);
  static std::vector<double> d64(2 * 4 * 8);
  const BadCase cases[] = {
      {"null q", [](Valid& v) { v.qv.data = nullptr; }, "q: data pointer is null"},
      {"q rank", [](Valid& v) { v.qv.rank = 3; }, "q: rank must be 4"},
      {"negative stride", [](Valid& v) { v.cache.k.strides[0] = -1; }, "cache.k: stride[0] must be >= 0"},
      {"overflow",
       [](Valid& v) {
         v.cache.k.shape[0] = std::int64_t{1} << 62;
         v.cache.k.strides[0] = 1 << 20;
       },
       "cache.k: sizes overflow"},
      {"cache dtype",
       [](Valid& v) { v.cache.v = TensorView::contiguous(reinterpret_cast<const bf16_t*>(bf.data()), 6, 4, 2, 8); },
       "cache.v: dtype must match cache.k's"},
      {"q dtype", [](Valid& v) { v.qv = TensorView::contiguous(d64.data(), 2, 1, 4, 8); },
       "q: dtype must be cache.k's (f32) or f32"},
      {"out dtype", [](Valid& v) { v.ov = TensorView::contiguous(d64.data(), 2, 1, 4, 8); },
       "out: dtype must match q's"},
      {"lse dtype",
       [](Valid& v) {
         static TensorView l = TensorView::contiguous(d64.data(), 2, 4, 1);
         v.lse_arg = &l;
       },
       "lse: dtype must be f32"},
      {"head_dim",
       [](Valid& v) {
         v.qv.shape[3] = 4;
         v.ov.shape[3] = 4;
       },
       "cache.k: head_dim must equal q's"},
      {"heads multiple",
       [](Valid& v) {
         v.qv.shape[2] = 3;
         v.ov.shape[2] = 3;
       },
       "must be a multiple of cache.k's kv_heads"},
      {"k/v shapes", [](Valid& v) { v.cache.v.shape[0] = 5; }, "cache.v: num_pages must equal cache.k's"},
      {"contiguous last dim",
       [](Valid& v) {
         v.cache.k.strides[3] = 2;
         v.cache.k.shape[2] = 1;
         v.cache.v.shape[2] = 1;
       },
       "cache.k: last dimension must be contiguous"},
      {"out shape", [](Valid& v) { v.ov.shape[1] = 2; }, "out: seqlen must equal q's"},
      {"lse shape", [](Valid& v) { v.lv.shape[1] = 3; }, "lse: heads must equal q's"},
      {"k_new alone", [](Valid& v) { v.dec.v_new = nullptr; }, "v_new: k_new and v_new must be given together"},
      {"k_new dtype",
       [](Valid& v) {
         static TensorView t = TensorView::contiguous(d64.data(), 2, 1, 2, 8);
         v.dec.k_new = &t;
       },
       "k_new: dtype must match cache.k's"},
      {"k_new heads", [](Valid& v) { v.knv.shape[2] = 1; }, "k_new: heads must equal cache.k's"},
      {"v_new shape", [](Valid& v) { v.vnv.shape[1] = 2; }, "v_new: seqlen must equal k_new's"},
      {"null seqlens", [](Valid& v) { v.cache.seqlens = nullptr; }, "cache.seqlens: data pointer is null"},
      {"negative seqlen", [](Valid& v) { v.cache.seqlens = neg.data(); }, "cache.seqlens: must be >= 0"},
      {"over capacity", [](Valid& v) { v.cache.seqlens = big.data(); },
       "exceeds the cache capacity (12 = block_table's max_pages x page_size)"},
      {"contiguous capacity", [](Valid& v) { v.contiguous_cache(2, 5); },
       "exceeds the cache capacity (5 = max_seqlen)"},
      {"contiguous batch", [](Valid& v) { v.contiguous_cache(3, 16); }, "cache.k: batch must equal q's"},
      {"max_pages", [](Valid& v) { v.cache.max_pages = 0; }, "cache.max_pages: must be >= 1"},
      {"table stride", [](Valid& v) { v.cache.block_table_stride = 2; },
       "cache.block_table_stride: must be >= max_pages"},
      {"table entry", [](Valid& v) { v.cache.block_table = bad_table.data(); },
       "cache.block_table: entry [0][1] = 9 must be in [0, num_pages = 6)"},
      {"shared append slot",
       [](Valid& v) {
         v.cache.block_table = shared.data();
         v.cache.seqlens = zero_seq.data();
       },
       "append into the same slot"},
      {"out overlaps q", [](Valid& v) { v.ov.data = v.q.data(); }, "out: overlaps input q"},
      {"out overlaps cache", [](Valid& v) { v.ov = TensorView::contiguous(v.kc.data(), 2, 1, 4, 8); },
       "out: overlaps input cache.k"},
      {"lse overlaps out", [](Valid& v) { v.lv.data = v.out.data(); }, "lse: overlaps out"},
      {"out aliases itself", [](Valid& v) { v.ov.strides[2] = 0; }, "out: strides make elements alias"},
      {"k_new overlaps cache", [](Valid& v) { v.knv.data = v.kc.data(); }, "cache.k: overlaps k_new"},
      {"k and v caches overlap",
       [](Valid& v) {
         v.cache.v.data = v.kc.data() + 8;
         v.cache.v.shape[0] = 5;
         v.cache.k.shape[0] = 5;
       },
       "cache.v: overlaps cache.k"},
      {"cache aliases itself", [](Valid& v) { v.cache.k.strides[2] = 0; }, "cache.k: strides make elements alias"},
      {"scale", [](Valid& v) { v.opts.softmax_scale = INFINITY; }, "softmax_scale: must be finite"},
      {"threads", [](Valid& v) { v.opts.num_threads = -1; }, "num_threads: must be >= 0"},
      {"window", [](Valid& v) { v.opts.window_left = -2; }, "window_left: must be >= 0"},
      {"softcap", [](Valid& v) { v.opts.softcap = -1; }, "softcap: must be finite and >= 0"},
      {"alibi stride",
       [](Valid& v) {
         static float s[8];
         v.opts.alibi_slopes = s;
         v.opts.alibi_batch_stride = -1;
       },
       "alibi_batch_stride: must be >= 0"},
      {"num_splits", [](Valid& v) { v.dec.num_splits = -1; }, "num_splits: must be >= 0"},
  };
  for (const BadCase& c : cases) {
    Valid v;
    c.breaks(v);
    const auto out0 = v.out, lse0 = v.lse, kc0 = v.kc, vc0 = v.vc;
    try {
      v.call();
      ADD_FAILURE() << c.what << ": no exception";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("attn::attention_decode: "), std::string::npos) << c.what << ": " << msg;
      EXPECT_NE(msg.find(c.message), std::string::npos) << c.what << ": " << msg;
    }
    EXPECT_EQ(v.out, out0) << c.what;
    EXPECT_EQ(v.lse, lse0) << c.what;
    EXPECT_EQ(std::memcmp(v.kc.data(), kc0.data(), kc0.size() * 4), 0) << c.what;
    EXPECT_EQ(std::memcmp(v.vc.data(), vc0.data(), vc0.size() * 4), 0) << c.what;
  }
}

TEST(DecodeValidation, UnusedBlockTableEntriesAreNotChecked) {
  Valid v;
  v.table[2] = -1;  // sequence 0 needs pages 0..1 (6 keys of 4 per page); entry 2 is never read
  v.table[4] = 99;  // sequence 1 needs page 0 only
  EXPECT_NO_THROW(v.call());
}

}  // namespace
}  // namespace attn
