// The rules of a block table (a paged KV cache: key position p of sequence b lives in page
// block_table[b * stride + p / page_size] at slot p % page_size, PageTable in core/cache_index.hpp), shared by decode
// and the paged varlen forward, CPU and CUDA alike.
#pragma once

#include <cstdint>
#include <string_view>

#include "validate/validate.hpp"

namespace attn::detail {

// The byte span of `count` int32 values at p (empty for none): an input outputs must not overlap.
Span int32_span(const std::int32_t* p, std::int64_t count);

struct BlockTableShape {
  std::int64_t stride;    // elements between rows (a stride of 0 resolved to max_pages)
  std::int64_t capacity;  // max_pages x page_size: the keys a sequence can hold
  Span span;
};

// The table itself: max_pages >= 1, stride >= max_pages or 0, and batch rows of it, and the capacity,
// within int64. `arg` names the table ("cache.block_table", "pages.block_table").
BlockTableShape check_block_table(std::string_view who, std::string_view arg, const std::int32_t* table,
                                  std::int64_t max_pages, std::int64_t stride, std::int64_t batch,
                                  std::int64_t page_size);

// Row b's entries for the pages that hold keys [0, keys) (keys <= capacity): each in [0, num_pages).
// Later entries are never read and may hold anything.
void check_block_table_entries(std::string_view who, std::string_view arg, const std::int32_t* table,
                               std::int64_t stride, std::int64_t b, std::int64_t keys, std::int64_t page_size,
                               std::int64_t num_pages);

}  // namespace attn::detail
