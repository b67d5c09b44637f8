// Where a key lives, CPU and CUDA alike: the page table, the cache index of a decode call and the
// rotary rule, each one object whose accessors both backends call, so that "the CPU and the GPU read
// the same key row" holds by construction (as split.hpp does for the key slices).
//
// A KV cache is contiguous [rows, max_seqlen, kv_heads, d], or paged [num_pages, page_size, kv_heads, d]
// with key position pos of cache row b in page table[b * stride + pos / page_size], slot pos % page_size
// (include/attn/decode.hpp, include/attn/varlen.hpp). Offsets are in elements, of kv head 0, in a cache
// with strides s0 (row or page) and s1 (position or slot).
#pragma once

#include <cstdint>

#include "attn/host_device.hpp"
#include "attn/tensor.hpp"
#include "core/rotary_rule.hpp"

namespace attn::detail {

struct PageTable {
  const std::int32_t* table = nullptr;  // [rows][stride]; nullptr: a contiguous cache
  std::int64_t stride = 0;              // elements between rows of the table
  std::int64_t page_size = 1;           // slots per page

  ATTN_HOST_DEVICE constexpr bool paged() const { return table != nullptr; }
  // Element offset of key position pos of cache row b.
  ATTN_HOST_DEVICE constexpr std::int64_t offset(std::int64_t b, std::int64_t pos, std::int64_t s0,
                                                 std::int64_t s1) const {
    return table == nullptr ? b * s0 + pos * s1
                            : std::int64_t{table[b * stride + pos / page_size]} * s0 + (pos % page_size) * s1;
  }
  // Where the n consecutive key positions pos .. pos + n - 1 of cache row b are: offset(b, pos + c, s0,
  // s1) = row[c] * s0 + slot[c] * s1 for every view of the cache (K, V, their scales). One division for
  // the run: per key and view, a paged cache's lookups cost a 64-bit division each.
  ATTN_HOST_DEVICE constexpr void locate(std::int64_t b, std::int64_t pos, std::int64_t n, std::int64_t* row,
                                         std::int64_t* slot) const {
    if (table == nullptr) {
      for (std::int64_t c = 0; c < n; ++c) row[c] = b, slot[c] = pos + c;
      return;
    }
    std::int64_t page = pos / page_size, s = pos % page_size;
    for (std::int64_t c = 0; c < n; ++c) {
      row[c] = table[b * stride + page];
      slot[c] = s;
      if (++s == page_size) s = 0, ++page;
    }
  }
  // Row b alone, as the table of a one-row cache (a varlen sequence's own keys): offset(0, ...) then
  // reads row b. A contiguous cache is returned as it is.
  ATTN_HOST_DEVICE constexpr PageTable row(std::int64_t b) const {
    return table == nullptr ? *this : PageTable{table + b * stride, 0, page_size};
  }
};

// Which keys sequence b of a decode call attends over, and where each is: positions
// first_position(b) .. seqlens[b] + seqlen_new - 1 of cache row cache_row(b). Host or device pointers
// alike (the CUDA params hold the device's copy of the same index).
struct CacheIndex {
  const std::int32_t* seqlens = nullptr;    // [batch] keys in the cache before this call
  std::int64_t seqlen_new = 0;              // keys appended by this call (k_new's rows)
  const std::int32_t* batch_idx = nullptr;  // contiguous caches: sequence b's cache row; nullptr = b
  const std::int32_t* leftpad = nullptr;    // contiguous caches: sequence b's first key; nullptr = 0
  PageTable pages;

  ATTN_HOST_DEVICE constexpr std::int64_t cache_row(std::int64_t b) const {
    return batch_idx ? std::int64_t{batch_idx[b]} : b;
  }
  ATTN_HOST_DEVICE constexpr std::int64_t first_position(std::int64_t b) const {
    return leftpad ? std::int64_t{leftpad[b]} : 0;
  }
  // The keys sequence b attends over.
  ATTN_HOST_DEVICE constexpr std::int64_t seqlen_k(std::int64_t b) const {
    return std::int64_t{seqlens[b]} + seqlen_new - first_position(b);
  }
  // The position the t-th appended key of sequence b is written at.
  ATTN_HOST_DEVICE constexpr std::int64_t append_position(std::int64_t b, std::int64_t t) const {
    return std::int64_t{seqlens[b]} + t;
  }
  // Element offset of cache position pos of sequence b.
  ATTN_HOST_DEVICE constexpr std::int64_t position_offset(std::int64_t b, std::int64_t pos, std::int64_t s0,
                                                          std::int64_t s1) const {
    return pages.offset(cache_row(b), pos, s0, s1);
  }
  // Where keys j .. j + n - 1 of sequence b are (PageTable::locate).
  ATTN_HOST_DEVICE constexpr void locate_keys(std::int64_t b, std::int64_t j, std::int64_t n, std::int64_t* row,
                                              std::int64_t* slot) const {
    pages.locate(cache_row(b), first_position(b) + j, n, row, slot);
  }
  // Element offset of the j-th key sequence b attends over.
  ATTN_HOST_DEVICE constexpr std::int64_t key_offset(std::int64_t b, std::int64_t j, std::int64_t s0,
                                                     std::int64_t s1) const {
    return position_offset(b, first_position(b) + j, s0, s1);
  }
};

// Rotary position embedding as a decode call applies it (core/rotary_rule.hpp: which features a table
// column rotates): the appended keys at their own positions, query row i of sequence b at seqlens[b] + i
// when the mask is causal or windowed (q_per_row), else all at seqlens[b].
struct RotarySpec {
  const void* cos = nullptr;  // [positions][rotary_dim / 2] of dtype; nullptr: no rotary embedding
  const void* sin = nullptr;
  DType dtype = DType::f32;
  std::int64_t rotary_dim = 0;
  bool interleaved = false;
  bool q_per_row = false;

  ATTN_HOST_DEVICE constexpr bool enabled() const { return cos != nullptr; }
  ATTN_HOST_DEVICE constexpr std::int64_t half() const { return rotary_dim / 2; }
  ATTN_HOST_DEVICE constexpr std::int64_t query_position(const CacheIndex& index, std::int64_t b,
                                                         std::int64_t i) const {
    return std::int64_t{index.seqlens[b]} + (q_per_row ? i : 0);
  }
  ATTN_HOST_DEVICE constexpr RotaryPair pair(std::int64_t c) const { return rotary_pair(c, rotary_dim, interleaved); }
  ATTN_HOST_DEVICE constexpr std::int64_t column(std::int64_t x) const {
    return rotary_column(x, rotary_dim, interleaved);
  }
};

}  // namespace attn::detail
