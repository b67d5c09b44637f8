// Where key `pos` of sequence b lives in a KV cache, CPU and CUDA alike (include/attn/decode.hpp):
// contiguous [batch, max_seqlen, kv_heads, d], or paged [num_pages, page_size, kv_heads, d] with
// key pos of sequence b in page block_table[b * bt_stride + pos / page_size], slot pos % page_size.
#pragma once

#include <cstdint>

#include "attn/online_softmax.hpp"  // ATTN_HOST_DEVICE

namespace attn::detail {

// Element offset of the row of kv head 0, in a cache with strides s0 (batch or page) and s1
// (position or slot). block_table == nullptr: contiguous.
ATTN_HOST_DEVICE constexpr std::int64_t cache_row_offset(std::int64_t b, std::int64_t pos, std::int64_t s0,
                                                         std::int64_t s1, const std::int32_t* block_table,
                                                         std::int64_t bt_stride, std::int64_t page_size) {
  return block_table == nullptr
             ? b * s0 + pos * s1
             : std::int64_t{block_table[b * bt_stride + pos / page_size]} * s0 + (pos % page_size) * s1;
}

}  // namespace attn::detail
