// Variable-length batches (flash-attn's flash_attn_varlen_func): sequences of different lengths packed
// back to back, without padding.
//
//   q   [total_q, heads, head_dim]      sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]
//   k,v [total_k, kv_heads, head_dim]   its keys and values rows cu_seqlens_k[b] .. cu_seqlens_k[b+1]
//   out [total_q, heads, head_dim]
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

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k, std::int64_t batch,
                      const AttentionOptions& opts = {}, const TileOptions& tiles = {},
                      const TensorView* lse = nullptr);

}  // namespace attn
