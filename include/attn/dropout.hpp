// The dropout keep mask that attention_reference, attention_tiled, attention_varlen and
// attention_backward_reference draw for the given options (AttentionOptions::dropout_p, dropout_seed,
// dropout_offset; docs/dropout.md), written out for tests and for tools that reproduce a training step.
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

}  // namespace attn
