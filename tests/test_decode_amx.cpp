// Decode on the AMX tiles (decode/decode_amx.cpp), through the public attention_decode with ATTN_AMX set:
// on every machine on the tile emulator, and where the CPU's tiles are usable on them too, with the same
// bits. Shapes whose query rows per kv head fill a tile: MLA (128 heads over one kv head, d 576 / 512,
// the values a view of the keys' rows), GQA with several query tokens (speculative decode), over
// contiguous caches (with leftpad and batch_idx) and paged ones, with every option of the score rule.
// Accuracy is flash-attn's rule for a path that rounds P to bf16: per sequence, the error against the
// f64 oracle at most twice that of PyTorch's bf16 math reference, the lse within twice the f32
// textbook's. The result is the same bits for 1 and 2 threads, and for a sequence alone or in a batch
// (keys_per_split).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <cstring>
#include <vector>

#include "amx/amx.hpp"
#include "amx_reference.hpp"
#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "decode/run_decode.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;
using test::ScopedAmxEnv;
using test::Tensor;

struct Case {
  const char* name;
  std::int64_t b, sq, h, hk, d, dv;
  std::vector<std::int32_t> seqlens;  // keys per sequence
  bool mla = false;                   // v = the first dv dims of k's rows
  std::int64_t page = 0;              // > 0: a paged cache of pages of this many slots
  bool leftpad = false, batch_idx = false;
  bool causal = false;
  std::int64_t left = -1;
  double softcap = 0;
  bool alibi = false, sinks = false;
  std::int64_t keys_per_split = 0;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

// The cache, the queries and the options of a case. Sequence b's keys are rows keys[b] (dense [1, n, hk,
// d] tensors, n = seqlens[b]), stored into a contiguous cache (rows permuted by batch_idx, after leftpad
// slots) or into shuffled pages.
struct Decode {
  Case c;
  Tensor<bf16_t> q;
  std::vector<Tensor<bf16_t>> keys, values;
  std::int64_t cap = 0;
  Tensor<bf16_t> kc{1, 1, 1, 1}, vc{1, 1, 1, 1};
  std::vector<std::int32_t> seqlens, leftpad, batch_idx, table;
  std::vector<float> slopes, sinks;
  AttentionOptions o;

  explicit Decode(const Case& cs) : c(cs), q(random_tensor<bf16_t>(cs.b, cs.sq, cs.h, cs.d, 31, 2.0)) {
    for (std::int64_t b = 0; b < c.b; ++b) {
      const std::int64_t n = c.seqlens[static_cast<std::size_t>(b)];
      keys.push_back(random_tensor<bf16_t>(1, n, c.hk, c.d, 40 + b, 2.0));
      values.push_back(random_tensor<bf16_t>(1, n, c.hk, c.dv, 60 + b));
      if (c.mla)  // the values are the keys' first dv dims
        for (std::int64_t j = 0; j < n; ++j)
          for (std::int64_t x = 0; x < c.dv; ++x) values.back().at(0, j, 0, x) = keys.back().at(0, j, 0, x);
    }
    o = test::options_of({c.b, c.sq, 0, c.h, c.hk, c.d, c.causal, c.left, -1, c.softcap, c.alibi}, 0.5f, slopes);
    if (c.sinks) {
      sinks = test::sinks_for(c.h);
      o.sinks = sinks;
    }
    c.page > 0 ? store_paged() : store_contiguous();
  }
  std::int64_t max_keys() const { return *std::max_element(c.seqlens.begin(), c.seqlens.end()); }
  void copy_row(std::int64_t b, std::int64_t j, Tensor<bf16_t>& kd, Tensor<bf16_t>& vd, std::int64_t r,
                std::int64_t slot) {
    for (std::int64_t g = 0; g < c.hk; ++g) {
      for (std::int64_t x = 0; x < c.d; ++x) kd.at(r, slot, g, x) = keys[b].at(0, j, g, x);
      if (!c.mla)
        for (std::int64_t x = 0; x < c.dv; ++x) vd.at(r, slot, g, x) = values[b].at(0, j, g, x);
    }
  }
  void store_contiguous() {
    cap = max_keys() + (c.leftpad ? 3 : 0) + 1;
    kc = random_tensor<bf16_t>(c.b, cap, c.hk, c.d, 7);
    vc = random_tensor<bf16_t>(c.b, cap, c.hk, c.mla ? 1 : c.dv, 8);
    for (std::int64_t b = 0; b < c.b; ++b) {
      const std::int64_t row = c.batch_idx ? c.b - 1 - b : b, pad = c.leftpad ? 1 + b % 3 : 0;
      if (c.batch_idx) batch_idx.push_back(static_cast<std::int32_t>(row));
      if (c.leftpad) leftpad.push_back(static_cast<std::int32_t>(pad));
      seqlens.push_back(static_cast<std::int32_t>(pad + c.seqlens[static_cast<std::size_t>(b)]));
      for (std::int64_t j = 0; j < c.seqlens[static_cast<std::size_t>(b)]; ++j) copy_row(b, j, kc, vc, row, pad + j);
    }
  }
  void store_paged() {
    cap = (max_keys() + c.page - 1) / c.page;  // pages per table row
    const std::int64_t pages = c.b * cap;
    kc = random_tensor<bf16_t>(pages, c.page, c.hk, c.d, 7);
    vc = random_tensor<bf16_t>(pages, c.page, c.hk, c.mla ? 1 : c.dv, 8);
    std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(5));
    table = order;
    for (std::int64_t b = 0; b < c.b; ++b) {
      seqlens.push_back(c.seqlens[static_cast<std::size_t>(b)]);
      for (std::int64_t j = 0; j < c.seqlens[static_cast<std::size_t>(b)]; ++j)
        copy_row(b, j, kc, vc, table[static_cast<std::size_t>(b * cap + j / c.page)], j % c.page);
    }
  }
  KVCache cache() const {
    KVCache k;
    k.k = kc.view();
    k.v = vc.view();
    if (c.mla) {  // the first dv dims of the keys' rows
      k.v = k.k;
      k.v.shape[3] = c.dv;
    }
    k.seqlens = seqlens.data();
    if (!leftpad.empty()) k.leftpad = leftpad.data();
    if (!batch_idx.empty()) k.batch_idx = batch_idx.data();
    if (c.page > 0) {
      k.block_table = table.data();
      k.max_pages = cap;
    }
    return k;
  }

  struct Result {
    std::vector<bf16_t> out;
    std::vector<float> lse;
  };
  Result run(const char* amx_mode, int threads) const {
    const ScopedAmxEnv env{std::string(amx_mode)};
    Result r{std::vector<bf16_t>(static_cast<std::size_t>(c.b * c.sq * c.h * c.dv)),
             std::vector<float>(static_cast<std::size_t>(c.b * c.h * c.sq), 42.0f)};
    AttentionOptions opts = o;
    opts.num_threads = threads;
    DecodeOptions dec;
    dec.keys_per_split = c.keys_per_split;
    const TensorView lse = TensorView::contiguous(r.lse.data(), c.b, c.h, c.sq);
    attention_decode(q.view(), cache(), TensorView::contiguous(r.out.data(), c.b, c.sq, c.h, c.dv), opts, dec, &lse);
    return r;
  }
  // Sequence b alone, as a forward problem over its keys: its queries, its ALiBi slopes.
  AttentionOptions options_of(std::int64_t b) const {
    AttentionOptions ob = o;
    if (c.alibi) {
      ob.alibi_slopes = std::span<const float>(slopes).subspan(static_cast<std::size_t>(b * c.h), c.h);
      ob.alibi_batch_stride = 0;
    }
    return ob;
  }
  Tensor<bf16_t> query(std::int64_t b) const {
    Tensor<bf16_t> t(1, c.sq, c.h, c.d);
    std::copy_n(q.data.begin() + b * c.sq * c.h * c.d, t.data.size(), t.data.begin());
    return t;
  }
};

// The textbook method's output and lse of sequence b, in T.
template <class T>
void textbook(const Decode& dc, std::int64_t b, std::vector<T>& out, std::vector<T>& lse) {
  const Tensor<T> q = test::convert<T>(dc.query(b)), k = test::convert<T>(dc.keys[b]),
                  v = test::convert<T>(dc.values[b]);
  out.assign(static_cast<std::size_t>(dc.c.sq * dc.c.h * dc.c.dv), T(0));
  lse.assign(static_cast<std::size_t>(dc.c.h * dc.c.sq), T(0));
  const TensorView l = TensorView::contiguous(lse.data(), 1, dc.c.h, dc.c.sq);
  attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), 1, dc.c.sq, dc.c.h, dc.c.dv),
                      dc.options_of(b), &l);
}

void expect_flash_attn_rule(const Decode& dc, const Decode::Result& r) {
  const Case& c = dc.c;
  const auto rows = static_cast<std::ptrdiff_t>(c.sq * c.h), dv = static_cast<std::ptrdiff_t>(c.dv);
  for (std::int64_t b = 0; b < c.b; ++b) {
    std::vector<double> out64, lse64;
    std::vector<float> out32, lse32;
    textbook(dc, b, out64, lse64);
    textbook(dc, b, out32, lse32);
    const std::vector<bf16_t> math = test::math_reference_bf16(dc.query(b), dc.keys[b], dc.values[b], dc.options_of(b));
    const std::vector<bf16_t> out(r.out.begin() + b * rows * dv, r.out.begin() + (b + 1) * rows * dv);
    const std::vector<float> lse(r.lse.begin() + b * rows, r.lse.begin() + (b + 1) * rows);
    EXPECT_TRUE(test::meets_textbook_rule(test::max_error(out, out64), test::max_error(math, out64))) << "out of " << b;
    EXPECT_TRUE(test::meets_textbook_rule(test::max_error(lse, lse64), test::max_error(lse32, lse64), 2, 1e-6))
        << "lse of " << b;
  }
}

bool same_bits(const Decode::Result& a, const Decode::Result& b) {
  return std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(bf16_t)) == 0 &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

// Whether attention_decode sends the case to the tiles (with the emulator as the tile unit).
bool takes_amx_path(const Decode& dc) {
  const ScopedAmxEnv env{std::string("emulate")};
  std::vector<bf16_t> out(static_cast<std::size_t>(dc.c.b * dc.c.sq * dc.c.h * dc.c.dv));
  const detail::DecodeProblem p =
      detail::validate_decode("test", dc.q.view(), dc.cache(),
                              TensorView::contiguous(out.data(), dc.c.b, dc.c.sq, dc.c.h, dc.c.dv), dc.o, {}, nullptr);
  return detail::amx_decode_takes(p);
}

class AmxDecode : public ::testing::TestWithParam<Case> {};

TEST_P(AmxDecode, FlashAttnRuleAndTheSameBitsOnEveryUnitAndThreadCount) {
  const Decode dc(GetParam());
  ASSERT_TRUE(takes_amx_path(dc));
  const Decode::Result emulated = dc.run("emulate", 2);
  expect_flash_attn_rule(dc, emulated);
  EXPECT_TRUE(same_bits(emulated, dc.run("emulate", 1))) << "1 thread";
  if (detail::amx_support().usable()) EXPECT_TRUE(same_bits(emulated, dc.run("on", 2))) << "the CPU's tiles";
}

// MLA's query heads: 128 (DeepSeek's) in the release suite; two tiles of rows under the sanitizers and
// qemu, where the tile emulator at -O0 made the MLA cases a fifth of the whole sanitized suite (support.hpp).
constexpr std::int64_t kMlaHeads = test::full_or_sanitized(128, 32);

const Case kCases[] = {
    {"mla_576_512", 1, 1, kMlaHeads, 1, 576, 512, {700}, true},
    {"mla_batch_paged", 2, 1, kMlaHeads, 1, 576, 512, {300, 1100}, true, 64},
    {"mla_split_sinks_softcap",
     1,
     1,
     kMlaHeads,
     1,
     576,
     512,
     {1500},
     true,
     0,
     false,
     false,
     false,
     -1,
     30.0,
     false,
     true,
     256},
    {"gqa_speculative_causal", 2, 4, 8, 2, 128, 128, {90, 257}, false, 0, true, true, true},
    {"gqa_window_alibi_paged", 2, 3, 16, 2, 64, 64, {500, 33}, false, 16, false, false, true, 40, 0, true},
    {"slices_causal_alibi_window",
     2,
     4,
     8,
     2,
     64,
     64,
     {300, 130},
     false,
     0,
     false,
     false,
     true,
     100,
     0,
     true,
     false,
     48},
    {"paged_slices_causal_leftover",
     1,
     2,
     16,
     1,
     64,
     64,
     {333},
     false,
     16,
     false,
     false,
     true,
     -1,
     5.0,
     true,
     true,
     40},
    {"odd_dims", 1, 2, 16, 1, 72, 40, {129}, false, 0, false, false, false, -1, 0, false, true},
};
INSTANTIATE_TEST_SUITE_P(Cases, AmxDecode, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// keys_per_split: a sequence decoded alone or beside others gives the same bits.
TEST(AmxDecodeBatch, KeysPerSplitKeepsASequenceBatchInvariant) {
  Case two{"two", 2, 1, kMlaHeads, 1, 576, 512, {900, 2000}, true};
  two.keys_per_split = 512;
  const Decode pair(two);
  // The same sequence 1 (its keys and queries come from the same seeds) beside another sequence 0.
  Case other = two;
  other.seqlens = {400, 2000};
  const Decode changed(other);
  const auto a = pair.run("emulate", 2), b = changed.run("emulate", 2);
  const auto rows = static_cast<std::size_t>(kMlaHeads), dv = std::size_t{512};
  EXPECT_EQ(0, std::memcmp(a.out.data() + rows * dv, b.out.data() + rows * dv, rows * dv * sizeof(bf16_t)));
  EXPECT_EQ(0, std::memcmp(a.lse.data() + rows, b.lse.data() + rows, rows * sizeof(float)));
}

// Fewer query rows per kv head than a tile: the vector decode runs.
TEST(AmxDecodeBatch, SmallGroupsStayOnTheVectorKernel) {
  EXPECT_FALSE(takes_amx_path(Decode(Case{"small", 1, 1, 8, 2, 64, 64, {100}})));
}

}  // namespace
}  // namespace attn
