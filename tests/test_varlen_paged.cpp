// attention_varlen_paged: packed queries over keys and values in a paged cache (flash-attn's block_table
// in flash_attn_varlen_func) give bitwise what attention_varlen gives on the same keys packed, for
// every page size, page order, dtype, mask and SIMD target; bad tables and cache views are rejected
// with the argument named and nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "attn/varlen.hpp"
#include "support.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

using test::random_tensor;

// Sequences' keys scattered over shuffled pages of a cache with spare pages full of garbage; the table
// has a row stride wider than max_pages and -1 in every entry no sequence uses.
template <class T>
struct PagedCase {
  test::CuSeqlens seqs;
  std::vector<std::int32_t> table;
  std::int64_t page_size, max_pages = 1, stride, num_pages;
  test::Tensor<T> k, v, kp, vp;  // packed [1, total_k, HK, D] and paged [num_pages, page_size, HK, D]

  PagedCase(const std::vector<std::pair<int, int>>& lens, std::int64_t ps, std::int64_t HK, std::int64_t D)
      : seqs(lens), page_size(ps), k(1, 1, 1, 1), v(1, 1, 1, 1), kp(1, 1, 1, 1), vp(1, 1, 1, 1) {
    for (const auto& [nq, nk] : lens) max_pages = std::max<std::int64_t>(max_pages, (nk + ps - 1) / ps);
    const std::int64_t B = seqs.batch(), TK = seqs.total_k();
    stride = max_pages + 2;
    std::int64_t used = 0;
    for (std::int64_t b = 0; b < B; ++b) used += (seqs.cu_k[b + 1] - seqs.cu_k[b] + ps - 1) / ps;
    num_pages = used + 3;
    k = random_tensor<T>(1, TK, HK, D, 6, 2.0);
    v = random_tensor<T>(1, TK, HK, D, 7);
    kp = random_tensor<T>(num_pages, ps, HK, D, 8, 50.0);  // garbage where no key is copied
    vp = random_tensor<T>(num_pages, ps, HK, D, 9, 50.0);
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(ps)));
    table.assign(static_cast<std::size_t>(B * stride), -1);
    std::size_t next = 0;
    const std::size_t row = static_cast<std::size_t>(HK * D);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < seqs.cu_k[b + 1] - seqs.cu_k[b]; ++j) {
        if (j % ps == 0) table[static_cast<std::size_t>(b * stride + j / ps)] = order[next++];
        const std::size_t dst =
            static_cast<std::size_t>(table[static_cast<std::size_t>(b * stride + j / ps)] * ps + j % ps) * row;
        const std::size_t src = static_cast<std::size_t>(seqs.cu_k[b] + j) * row;
        std::copy_n(k.data.begin() + static_cast<std::ptrdiff_t>(src), row,
                    kp.data.begin() + static_cast<std::ptrdiff_t>(dst));
        std::copy_n(v.data.begin() + static_cast<std::ptrdiff_t>(src), row,
                    vp.data.begin() + static_cast<std::ptrdiff_t>(dst));
      }
  }
  VarlenPages pages() const { return {table.data(), max_pages, stride}; }
};

template <class T>
void check_bitwise(const std::vector<std::pair<int, int>>& lens, std::int64_t ps, std::int64_t H, std::int64_t HK,
                   std::int64_t D, const AttentionOptions& o) {
  using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const PagedCase<T> c(lens, ps, HK, D);
  const std::int64_t B = c.seqs.batch(), TQ = c.seqs.total_q();
  const auto q = random_tensor<T>(1, TQ, H, D, 5, 2.0);
  const TensorView qv = q.packed();
  test::for_each_simd_target("tiled", detail::tiled_target, [&](std::int64_t) {
    std::vector<T> want(q.data.size()), got(q.data.size());
    std::vector<L> want_lse(static_cast<std::size_t>(H * TQ)), got_lse(want_lse.size(), L(42));
    TensorView wl = TensorView::contiguous(want_lse.data(), 1, H, TQ),
               gl = TensorView::contiguous(got_lse.data(), 1, H, TQ);
    attention_varlen(qv, c.k.packed(), c.v.packed(), TensorView::contiguous(want.data(), TQ, H, D), c.seqs.cu_q.data(),
                     c.seqs.cu_k.data(), B, o, {}, &wl);
    attention_varlen_paged(qv, c.kp.view(), c.vp.view(), TensorView::contiguous(got.data(), TQ, H, D),
                           c.seqs.cu_q.data(), c.seqs.cu_k.data(), B, c.pages(), o, {}, &gl);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(T)), 0) << "page_size " << ps;
    EXPECT_EQ(std::memcmp(got_lse.data(), want_lse.data(), got_lse.size() * sizeof(L)), 0) << "page_size " << ps;
  });
}

const std::vector<std::pair<int, int>> kLens = {{5, 9}, {1, 1}, {17, 40}, {0, 3}, {9, 0}, {33, 70}, {64, 64}};

TEST(VarlenPaged, BitwiseThePackedResultForEveryPageSize) {
  AttentionOptions o;
  o.causal = true;
  for (std::int64_t ps : {1, 3, 16, 64, 256}) {
    check_bitwise<double>(kLens, ps, 4, 2, 16, o);
    check_bitwise<float>(kLens, ps, 4, 1, 64, o);
  }
}

TEST(VarlenPaged, BitwiseForEveryDtypeAndMask) {
  std::vector<float> slopes;
  for (int x = 0; x < 7 * 4; ++x) slopes.push_back(0.3f / float(1 + x));
  AttentionOptions window, softcap, alibi, dropout;
  window.window_left = 7, window.window_right = 2;
  softcap.softcap = 3.0;
  alibi.alibi_slopes = slopes, alibi.alibi_batch_stride = 4;
  dropout.dropout_p = 0.25, dropout.dropout_seed = 11;
  for (const AttentionOptions& o : {window, softcap, alibi, dropout}) {
    check_bitwise<float>(kLens, 5, 4, 2, 40, o);
    check_bitwise<bf16_t>(kLens, 8, 4, 2, 64, o);
    check_bitwise<f16_t>(kLens, 7, 4, 4, 24, o);
  }
}

struct BadPaged {
  std::string arg;
  std::function<void(std::vector<std::int32_t>&, std::vector<std::int32_t>&, VarlenPages&, TensorView&, TensorView&,
                     TensorView&)>
      spoil;
};

TEST(VarlenPaged, BadTablesAndCachesAreRejectedAndNothingIsWritten) {
  const std::int64_t H = 2, D = 4;
  const PagedCase<float> c({{4, 10}, {6, 5}}, 4, H, D);
  const auto q = random_tensor<float>(1, 10, H, D, 1);
  std::vector<float> scratch(64);
  const std::vector<BadPaged> cases = {
      {"", [](auto&, auto&, auto&, auto&, auto&, auto&) {}},  // valid, as a control
      {"pages.block_table", [](auto&, auto&, VarlenPages& p, auto&, auto&, auto&) { p.block_table = nullptr; }},
      {"pages.max_pages", [](auto&, auto&, VarlenPages& p, auto&, auto&, auto&) { p.max_pages = 0; }},
      {"pages.block_table_stride", [](auto&, auto&, VarlenPages& p, auto&, auto&, auto&) { p.block_table_stride = 1; }},
      {"pages.block_table", [](auto&, std::vector<std::int32_t>& t, auto&, auto&, auto&, auto&) { t[1] = -1; }},
      {"pages.block_table",
       [&](auto&, std::vector<std::int32_t>& t, auto&, auto&, auto&, auto&) {
         t[static_cast<std::size_t>(c.stride)] = static_cast<std::int32_t>(c.num_pages);
       }},
      {"cu_seqlens_k",
       [](std::vector<std::int32_t>& k, auto&, auto&, auto&, auto&, auto&) {
         k = {0, 10, 24};
       }},
      {"cu_seqlens_k",
       [](std::vector<std::int32_t>& k, auto&, auto&, auto&, auto&, auto&) {
         k = {0, 10, 9};
       }},
      {"cu_seqlens_k",
       [](std::vector<std::int32_t>& k, auto&, auto&, auto&, auto&, auto&) {
         k = {1, 10, 15};
       }},
      {"v", [](auto&, auto&, auto&, auto&, TensorView& v, auto&) { v.shape[1] = 3; }},
      {"k", [](auto&, auto&, auto&, TensorView& k, auto&, auto&) { k.rank = 3; }},
      {"out", [&](auto&, auto&, auto&, TensorView& k, auto&, TensorView& out) { out.data = k.data; }},
  };
  for (const BadPaged& bad : cases) {
    std::vector<std::int32_t> cu_k = c.seqs.cu_k, table = c.table;
    VarlenPages pages = c.pages();
    pages.block_table = table.data();
    TensorView kv = c.kp.view(), vv = c.vp.view();
    std::vector<float> out(q.data.size(), -3.0f), cache_k = c.kp.data;
    kv.data = cache_k.data();
    TensorView ov = TensorView::contiguous(out.data(), 10, H, D);
    bad.spoil(cu_k, table, pages, kv, vv, ov);
    auto call = [&] {
      attention_varlen_paged(TensorView::contiguous(q.data.data(), 10, H, D), kv, vv, ov, c.seqs.cu_q.data(),
                             cu_k.data(), 2, pages);
    };
    test::expect_invalid_argument(call, bad.arg.empty() ? "" : bad.arg + ":");
    if (bad.arg.empty()) continue;  // the valid control
    for (float x : out) ASSERT_EQ(x, -3.0f) << "wrote output for bad " << bad.arg;
    ASSERT_EQ(cache_k, c.kp.data) << "wrote the cache for bad " << bad.arg;
  }
}

}  // namespace
}  // namespace attn
