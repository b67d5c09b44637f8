// The dropout keep mask that attention_reference, attention_tiled, attention_varlen and
// attention_backward_reference draw for the given options (AttentionOptions::dropout_p, dropout_seed,
// dropout_offset; docs/dropout.md), and the softmax weights it multiplies, written out for tests and for
// tools that reproduce a training step.
#pragma once

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Writes mask[b, h, i, j] = the factor the forward multiplies softmax weight P_ij of batch b (for
// attention_varlen: sequence b), head h, query i, key j by: 1 / (1 - dropout_p) where kept, 0 where
// dropped; 1 everywhere when dropout_p = 0. The shape of `mask` is the problem's: [batch, heads,
// seqlen_q, seqlen_k] (seqlen_k may be 0), any strides, f64 or f32. The factor does not depend on the
// causal mask or the window (a masked P_ij is 0 whatever its factor), nor on the head dim or the scale.
// Validated like every entry point: the options by the forward's rules, then the view; a bad argument
// throws std::invalid_argument ("attn::dropout_mask: <arg>: <rule>") and leaves mask untouched.
void dropout_mask(const TensorView& mask, const AttentionOptions& opts);

// Writes weights[b, h, i, j] = exp(s_ij - m_i): the softmax weight of key j for query i before the
// normalisation, s_ij the score rule's logit (scale, soft-cap, ALiBi) and m_i the largest logit query i
// sees; 0 for a key query i does not see (causal mask, window) and for every key of a row that sees
// none. This is what flash-attn's S_dmask holds for a single key block (flash-attn's tests rebuild P
// from it: the Python package's return_attn_probs). q [batch, seqlen_q, heads, d] and k [batch,
// seqlen_k, kv_heads, d] of any dtype, as for attention_reference (sinks and dropout are not applied);
// weights [batch, heads, seqlen_q, seqlen_k], f64 or f32, any strides. A bad argument throws
// std::invalid_argument ("attn::softmax_weights: <arg>: <rule>") and leaves weights untouched.
void softmax_weights(const TensorView& q, const TensorView& k, const TensorView& weights, const AttentionOptions& opts);

}  // namespace attn
