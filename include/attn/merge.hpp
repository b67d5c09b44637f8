// Merging attention states computed over disjoint key sets (FlashInfer's merge_states; the merge of
// split-K, cascade attention and context parallelism): given, for each query row, the outputs and
// log-sum-exps of attention over key sets K_0 .. K_{n-1}, write the output and log-sum-exp of attention
// over their union, exactly as the online softmax's merge does (online_softmax.hpp): state i is
// (m = lse_i, l = 1, o = out_i), the states are merged in order 0 .. n-1 and finalized.
//
//   parts      [rows, states, heads, head_dim]   each state's attention output (f64, f32, bf16, f16)
//   parts_lse  [rows, states, heads]             its natural-log log-sum-exp (f64 for f64, else f32);
//                                                -inf: the state saw no key and contributes nothing
//   out        [rows, 1, heads, head_dim]        parts' dtype
//   lse        [rows, 1, heads] (optional)       the merged log-sum-exp; -inf when no state saw a key
//
// Any strides. Accumulation in f64 for f64, else f32. A NaN in a state reaches only its own row. Every
// argument is validated before anything is written (std::invalid_argument naming it).
#pragma once

#include "attn/tensor.hpp"

namespace attn {

void merge_states(const TensorView& parts, const TensorView& parts_lse, const TensorView& out,
                  const TensorView* lse = nullptr);

// FlashInfer's merge_state_in_place: (out, lse) <- their merge with (other, other_lse), row by row, as
// merge_states would merge the two states in that order. out, other [rows, 1, heads, head_dim] (one
// dtype); lse, other_lse [rows, 1, heads] (f64 for f64, else f32). out and lse are read and written;
// other and other_lse only read and must not overlap them.
void merge_state_in_place(const TensorView& out, const TensorView& lse, const TensorView& other,
                          const TensorView& other_lse);

}  // namespace attn
