// Variable-length batches (flash-attn's flash_attn_varlen_func): sequences of different lengths packed
// back to back, without padding.
//
//   q   [total_q, heads, head_dim]      sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]
//   k,v [total_k, kv_heads, head_dim]   its keys and values rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]
//                                       (v's head dim may differ: head_dim_v, as in attention.hpp)
//   out [total_q, heads, head_dim_v]
//   lse [1, heads, total_q] (optional; flash-attn's [heads, total_q] with a leading 1), f32 or f64
// cu_seqlens_q and cu_seqlens_k hold batch + 1 int32 offsets: 0 first, non-decreasing, the last equal
// to total_q (total_k). Each sequence is its own attention problem with the options of
// AttentionOptions (causal and windows aligned to each sequence's own bottom-right corner; ALiBi slopes
// of sequence b at alibi_slopes[b * alibi_batch_stride + h]). A sequence with no keys gets out = 0,
// lse = -inf; one with no queries writes nothing.
//
// Everything is validated before anything is written (std::invalid_argument naming the argument).
// The work of all sequences is scheduled together over the threads (attention_tiled's kernel).
#pragma once

#include <cstdint>

#include "attn/attention.hpp"

namespace attn {

// The batch of a varlen call, the same object for the CPU and the CUDA backend (attn/cuda.hpp): the two
// offset arrays and the number of sequences. On the CPU the arrays are host memory; on CUDA they are
// device memory, and the optional host copies let validation read them without a copy and a sync (the
// CPU backend reads the arrays themselves and never the copies).
struct VarlenBatch {
  const std::int32_t* cu_seqlens_q = nullptr;  // [batch + 1]
  const std::int32_t* cu_seqlens_k = nullptr;  // [batch + 1]
  std::int64_t batch = 0;
  const std::int32_t* host_cu_seqlens_q = nullptr;  // CUDA only: optional host copies of the same arrays
  const std::int32_t* host_cu_seqlens_k = nullptr;
};

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const VarlenBatch& varlen, const AttentionOptions& opts = {}, const TileOptions& tiles = {},
                      const TensorView* lse = nullptr);
// The same call with the batch's arrays passed one by one (flash-attn's argument order).
inline void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                             const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k, std::int64_t batch,
                             const AttentionOptions& opts = {}, const TileOptions& tiles = {},
                             const TensorView* lse = nullptr) {
  attention_varlen(q, k, v, out, VarlenBatch{cu_seqlens_q, cu_seqlens_k, batch}, opts, tiles, lse);
}

// Paged keys and values (flash-attn's block_table argument of flash_attn_varlen_func; chunked prefill
// over a paged KV cache, as in vLLM): the queries are packed as above, the keys and values of sequence
// b live in a paged cache, the layout decode reads (include/attn/decode.hpp):
//   k, v [num_pages, page_size, kv_heads, head_dim], any page_size >= 1: key j of sequence b is in page
//        block_table[b * block_table_stride + j / page_size] at slot j % page_size
//   cu_seqlens_k: batch + 1 offsets, 0 first and non-decreasing, whose differences are the sequences'
//        key counts (there is no packed key tensor for the last to match); each count must fit
//        max_pages x page_size, and the entries of the pages holding a sequence's keys must be in
//        [0, num_pages) (later entries are never read)
// Everything else (masks per sequence, lse, dtypes, tiles, threads, validation before any write, out
// and lse not overlapping the cache or the table) is attention_varlen's, and so is the arithmetic: the
// result is bitwise that of attention_varlen on the same keys packed, dropout's keep mask included
// (tests/test_varlen_paged.cpp). There is no backward for the paged layout: train on the packed form.
struct VarlenPages {
  const std::int32_t* block_table = nullptr;  // [batch, max_pages]
  std::int64_t max_pages = 0;                 // columns of block_table
  std::int64_t block_table_stride = 0;        // elements between rows; 0 = max_pages
};

void attention_varlen_paged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            const VarlenBatch& varlen, const VarlenPages& pages, const AttentionOptions& opts = {},
                            const TileOptions& tiles = {}, const TensorView* lse = nullptr);
inline void attention_varlen_paged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                   const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k,
                                   std::int64_t batch, const VarlenPages& pages, const AttentionOptions& opts = {},
                                   const TileOptions& tiles = {}, const TensorView* lse = nullptr) {
  attention_varlen_paged(q, k, v, out, VarlenBatch{cu_seqlens_q, cu_seqlens_k, batch}, pages, opts, tiles, lse);
}

}  // namespace attn
