// The cache's objects (core/cache_index.hpp) that the CPU and CUDA backends both read keys through:
// PageTable's lookup, CacheIndex's sequence rules (leftpad, batch_idx, appended keys), RotarySpec's
// positions, and the builders from the public KVCache and RotaryTables (validate/decode_problem.hpp).
#include <gtest/gtest.h>

#include <cstdint>

#include "core/cache_index.hpp"
#include "validate/decode_problem.hpp"
#include "cpu/rotary.hpp"

namespace attn::detail {
namespace {

TEST(PageTable, ContiguousIsRowTimesStrideAndPositionTimesStride) {
  const PageTable contiguous{};
  EXPECT_FALSE(contiguous.paged());
  EXPECT_EQ(contiguous.offset(2, 7, 1000, 10), 2070);
  EXPECT_EQ(contiguous.row(3).offset(2, 7, 1000, 10), 2070);  // a contiguous cache has no rows to pick
}

TEST(PageTable, PagedLooksThePageUpInTheRowOfTheTable) {
  // page_size 4, table rows of stride 3 (of which 2 or 3 used); pages of 400 elements, slots of 100
  const std::int32_t table[] = {5, 1, 9, 2, 0, 7};
  const PageTable pages{table, 3, 4};
  EXPECT_TRUE(pages.paged());
  for (std::int64_t pos = 0; pos < 12; ++pos) {
    EXPECT_EQ(pages.offset(0, pos, 400, 100), table[pos / 4] * 400 + (pos % 4) * 100);
    EXPECT_EQ(pages.offset(1, pos, 400, 100), table[3 + pos / 4] * 400 + (pos % 4) * 100);
    // row(b): sequence b's own row, read as row 0 (the varlen forward's per-sequence problem)
    EXPECT_EQ(pages.row(1).offset(0, pos, 400, 100), pages.offset(1, pos, 400, 100));
  }
}

// locate: every run of positions, starting anywhere in a page and crossing pages, gives the offsets that
// offset() gives key by key, paged (page sizes 1, 3, 4) and contiguous, and through CacheIndex with
// leftpad and batch_idx.
TEST(PageTable, LocateARunIsOffsetKeyByKey) {
  // two rows of 12 pages: positions up to 10 stay in a row even with pages of one slot
  const std::int32_t table[] = {5, 1, 9, 2, 0, 7, 3, 8, 6, 4, 11, 10, 17, 13, 21, 14, 12, 19, 15, 20, 18, 16, 23, 22};
  for (std::int64_t page_size : {0, 1, 3, 4})
    for (std::int64_t b : {0, 1})
      for (std::int64_t pos = 0; pos < 6; ++pos)
        for (std::int64_t n : {1, 2, 5, 6}) {
          const PageTable pages = page_size ? PageTable{table, 12, page_size} : PageTable{};
          std::int64_t row[8], slot[8];
          pages.locate(b, pos, n, row, slot);
          for (std::int64_t c = 0; c < n; ++c)
            EXPECT_EQ(row[c] * 400 + slot[c] * 100, pages.offset(b, pos + c, 400, 100))
                << "page size " << page_size << " row " << b << " from " << pos << " key " << c;
        }
  const std::int32_t seqlens[] = {6, 3}, batch_idx[] = {1, 0}, leftpad[] = {2, 0};
  const CacheIndex index{seqlens, 2, batch_idx, leftpad, PageTable{}};
  std::int64_t row[4], slot[4];
  index.locate_keys(0, 1, 4, row, slot);
  for (std::int64_t c = 0; c < 4; ++c) EXPECT_EQ(row[c] * 400 + slot[c] * 100, index.key_offset(0, 1 + c, 400, 100));
}

TEST(CacheIndex, LeftpadAndBatchIdxMoveTheKeysAndTheRow) {
  const std::int32_t seqlens[] = {6, 3}, batch_idx[] = {4, 1}, leftpad[] = {2, 0};
  CacheIndex index{seqlens, 2, batch_idx, leftpad, PageTable{}};
  EXPECT_EQ(index.cache_row(0), 4);
  EXPECT_EQ(index.cache_row(1), 1);
  EXPECT_EQ(index.first_position(0), 2);
  EXPECT_EQ(index.seqlen_k(0), 6 + 2 - 2);  // positions 2 .. 7
  EXPECT_EQ(index.seqlen_k(1), 3 + 2);
  EXPECT_EQ(index.append_position(0, 1), 7);
  // key j of sequence 0 is cache position 2 + j of row 4; strides (1000, 10)
  EXPECT_EQ(index.key_offset(0, 0, 1000, 10), 4 * 1000 + 2 * 10);
  EXPECT_EQ(index.key_offset(0, 5, 1000, 10), 4 * 1000 + 7 * 10);
  EXPECT_EQ(index.position_offset(1, 4, 1000, 10), 1 * 1000 + 4 * 10);
  index.batch_idx = index.leftpad = nullptr;
  EXPECT_EQ(index.cache_row(0), 0);
  EXPECT_EQ(index.seqlen_k(0), 8);
  EXPECT_EQ(index.key_offset(1, 3, 1000, 10), 1000 + 30);
}

TEST(CacheIndex, PagedKeysGoThroughTheTable) {
  const std::int32_t seqlens[] = {5, 2}, table[] = {3, 0, 2, 1};
  const CacheIndex index{seqlens, 1, nullptr, nullptr, PageTable{table, 2, 4}};
  EXPECT_EQ(index.seqlen_k(0), 6);
  for (std::int64_t j = 0; j < 6; ++j) EXPECT_EQ(index.key_offset(0, j, 400, 100), table[j / 4] * 400 + (j % 4) * 100);
  EXPECT_EQ(index.position_offset(1, index.append_position(1, 0), 400, 100), table[2] * 400 + 2 * 100);
}

TEST(CacheIndex, BuiltFromTheCacheWithTheResolvedStride) {
  const std::int32_t seqlens[] = {1, 2}, table[] = {0, 1, 2, 3};
  KVCache cache;
  cache.k.shape[1] = 16;  // page_size
  cache.seqlens = seqlens;
  cache.block_table = table;
  const CacheIndex index = cache_index(cache, 3, 2);
  EXPECT_EQ(index.seqlens, seqlens);
  EXPECT_EQ(index.seqlen_new, 3);
  EXPECT_EQ(index.pages.table, table);
  EXPECT_EQ(index.pages.stride, 2);
  EXPECT_EQ(index.pages.page_size, 16);
  cache.block_table = nullptr;
  EXPECT_FALSE(cache_index(cache, 0, 0).pages.paged());
}

TEST(RotarySpec, QueryPositionsPerRowOnlyWhenAsked) {
  const std::int32_t seqlens[] = {10, 4};
  const CacheIndex index{seqlens, 0, nullptr, nullptr, PageTable{}};
  const float cos[] = {1}, sin[] = {0};
  RotaryTables tables{cos, sin, DType::f32, 1, 6, true};
  RotarySpec per_row = rotary_spec(&tables, true), shared = rotary_spec(&tables, false);
  EXPECT_TRUE(per_row.enabled());
  EXPECT_EQ(per_row.query_position(index, 0, 3), 13);
  EXPECT_EQ(shared.query_position(index, 1, 3), 4);
  EXPECT_EQ(per_row.half(), 3);
  EXPECT_EQ(per_row.pair(1).first, 2);  // interleaved: (2c, 2c + 1)
  EXPECT_EQ(per_row.column(5), 2);
  EXPECT_FALSE(rotary_spec(nullptr, true).enabled());
}

}  // namespace
}  // namespace attn::detail
