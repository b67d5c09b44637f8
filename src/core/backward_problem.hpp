// A validated backward problem: the forward's Problem (q, k, v, out, lse) plus dout and the gradients.
#pragma once

#include <string_view>

#include "core/problem.hpp"

namespace attn::detail {

struct BackwardProblem : Problem {
  TensorView dout, dq, dk, dv;
};

// Validates the arguments of attention_backward (include/attn/backward.hpp): q, k, v, out and lse by
// the forward's rules (`validate`), then
//   dout: dtype must match q's; <dim> must equal out's
//   dq / dk / dv: dtype must match q's; <dim> must equal q's / k's / k's
//   dq / dk / dv: strides make elements alias
//   dq / dk / dv: overlaps input <q, k, v, out, dout, lse>;  dk: overlaps dq;  dv: overlaps dq / dk
// Nothing is written; `lse` must outlive the result (the problem points at it).
BackwardProblem validate_backward(std::string_view who, const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& dout, const TensorView& lse,
                                  const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                  const AttentionOptions& opts);

}  // namespace attn::detail
