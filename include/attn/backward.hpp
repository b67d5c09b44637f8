// The attention backward pass: the gradients of a loss with respect to q, k and v, given the forward's
// out and lse and the gradient dout of the loss with respect to out (docs/backward.md).
//
// Shapes as in attention.hpp: q, dq [batch, seqlen_q, heads, head_dim]; k, v, dk, dv [batch, seqlen_k,
// kv_heads, head_dim]; out, dout like q; lse [batch, heads, seqlen_q], f64 for f64 inputs, else f32 (the
// forward's lse); v, dv, out and dout take v's head dim where it differs (head_dim_v). Any strides; every tensor
// in the inputs' dtype. Accumulation is in f64 for f64 and in f32 for every other dtype. With GQA, dk and dv of a kv
// head are summed over its group's query heads. `opts` must be the forward's options (masks, scale, softcap, ALiBi,
// dropout); the ALiBi slopes get no gradient. Dropout (docs/dropout.md): every backward regenerates the forward's mask
// from the options. A query row that sees no key contributes nothing and gets dq = 0.
//
// Sinks (AttentionOptions::sinks): the forward's lse includes the sink, so P = exp(S - lse) are the true
// weights and dq, dk, dv need nothing more. dsink (optional; needs sinks) receives d loss / d sinks[h]:
// -sum over the batch and rows of head h of exp(sinks[h] - lse) (dout . out), written (not added to),
// a rank-3 view [1, heads, 1] in lse's dtype (TensorView::contiguous(ptr, 1, heads, 1)); summed in a
// fixed order, so bitwise the same for any thread count. Varlen sums it over every sequence.
//
// Every argument is validated before anything is written: a bad one throws std::invalid_argument whose
// message names the function, the argument and the rule, and leaves dq, dk and dv untouched. out and
// lse follow the forward's output rules (distinct addresses, no overlap with q, k, v, or each other);
// dq, dk and dv must give every element its own address and overlap no input and no other gradient.
#pragma once

#include <cstdint>

#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "attn/varlen.hpp"  // VarlenBatch

namespace attn {

// FlashAttention-2's backward (Algorithm 2): recomputes P = exp(S - lse) tile by tile and never
// allocates anything of size seqlen_q x seqlen_k. Bitwise identical results for any thread count.
// Tiles unset: plan_tiles' choice for the forward (attention.hpp).
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& opts = {}, const TileOptions& tiles = {},
                        const TensorView* dsink = nullptr);

// The backward of attention_varlen (varlen.hpp): q, out, dout, dq [total_q, heads, head_dim]; k, v, dk,
// dv [total_k, kv_heads, head_dim]; lse [1, heads, total_q] (required: the forward's). cu_seqlens_q and
// cu_seqlens_k as in attention_varlen, and every sequence's gradients as attention_backward would give
// them for that sequence alone (opts as in the forward: masks aligned to each sequence's own corner,
// ALiBi slopes of sequence b at alibi_slopes[b * alibi_batch_stride + h]). The keys of a sequence
// without queries get dk = dv = 0. All sequences share the threads.
void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const TensorView& dout, const TensorView& lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const VarlenBatch& varlen,
                               const AttentionOptions& opts = {}, const TileOptions& tiles = {},
                               const TensorView* dsink = nullptr);
inline void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& dout, const TensorView& lse,
                                      const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                      const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k,
                                      std::int64_t batch, const AttentionOptions& opts = {},
                                      const TileOptions& tiles = {}, const TensorView* dsink = nullptr) {
  attention_varlen_backward(q, k, v, out, dout, lse, dq, dk, dv, VarlenBatch{cu_seqlens_q, cu_seqlens_k, batch}, opts,
                            tiles, dsink);
}

// The textbook backward, the oracle: per (batch, head) it materialises P = exp(S - lse), dP = dO V^T and
// dS = P * (dP - rowsum(dO * O)) (seqlen_q x seqlen_k each), then dV = P^T dO, dQ = dS K, dK = dS^T Q
// through the score transforms. Like attention_reference it accumulates in the inputs' accumulator type
// (f64 for f64: the oracle; f32 otherwise: the textbook method at that precision).
void attention_backward_reference(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                  const TensorView& dout, const TensorView& lse, const TensorView& dq,
                                  const TensorView& dk, const TensorView& dv, const AttentionOptions& opts = {},
                                  const TensorView* dsink = nullptr);

}  // namespace attn
