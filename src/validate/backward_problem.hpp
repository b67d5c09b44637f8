// A validated backward problem: the forward's Problem (q, k, v, out, lse) plus dout and the gradients.
#pragma once

#include <string_view>
#include <vector>

#include "validate/problem.hpp"

namespace attn::detail {

struct BackwardProblem : Problem {
  TensorView dout, dq, dk, dv;
  const TensorView* dsink = nullptr;  // [1, heads, 1] in lse's dtype, when requested
};

// Validates the arguments of attention_backward (include/attn/backward.hpp): q, k, v, out and lse by
// the forward's rules (`validate`), then
//   dout: dtype must match q's; <dim> must equal out's
//   dq / dk / dv: dtype must match q's; <dim> must equal q's / k's / v's
//   dq / dk / dv: strides make elements alias
//   dq / dk / dv: overlaps input <q, k, v, out, dout, lse>;  dk: overlaps dq;  dv: overlaps dq / dk
//   dsink (optional): needs opts.sinks; rank 3 [1, heads, 1]; dtype lse's; no self-aliasing; overlaps
//       no input and no other gradient
// Nothing is written; `lse` and `dsink` must outlive the result (the problem points at them).
BackwardProblem validate_backward(std::string_view who, const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& dout, const TensorView& lse,
                                  const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                  const AttentionOptions& opts, const TensorView* dsink = nullptr);

// dsink[h] = d loss / d sinks[h] = -sum over the problems (in order), their batch and rows i of head h of
// exp(sinks[h] - lse_i) (the sink's softmax weight) times D_i = dout_i . out_i, accumulated in f64 in that
// fixed order: the same for any thread count (src/backward/sink_gradient.cpp). Every problem has the
// same heads and dtype; rows with lse = -inf (no key, no sink) add nothing.
void sink_gradient(const std::vector<BackwardProblem>& problems, const TensorView& dsink);

}  // namespace attn::detail
