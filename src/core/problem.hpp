// A validated attention problem: the sizes resolved from the views, with element accessors.
// Every entry point validates into a Problem first, so nothing is written before all checks pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "core/mask.hpp"
#include "core/validate.hpp"

namespace attn::detail {

struct Problem : ResolvedOptions {  // scale, window, softcap, ALiBi, threads
  std::int64_t batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim;
  DType dtype;
  TensorView q, k, v, out;
  const TensorView* lse;  // nullptr when not requested

  std::int64_t group() const { return heads / kv_heads; }  // query heads per kv head
  std::int64_t kv_head_of(std::int64_t h) const { return h / group(); }

  // Masks and score transforms live in core/mask.hpp; Problem is one (seqlen_q, seqlen_k) pair.
  Mask mask() const { return {seqlen_q, seqlen_k, window_left, window_right, scale, softcap}; }
  std::int64_t diagonal(std::int64_t i) const { return mask().diagonal(i); }
  std::int64_t first_key(std::int64_t i) const { return mask().first_key(i); }
  std::int64_t end_key(std::int64_t i) const { return mask().end_key(i); }
  std::int64_t visible_count(std::int64_t i) const { return mask().visible_count(i); }

  float alibi_slope(std::int64_t b, std::int64_t h) const {
    return alibi_slopes ? alibi_slopes[b * alibi_batch_stride + h] : 0.0f;
  }
  template <class A>
  A score(A dot, std::int64_t i, std::int64_t j, A slope) const {
    return mask().score(dot, i, j, slope);
  }
};

// Validates q, k, v, out (and lse when non-null) against the rules in include/attn/attention.hpp.
// `who` prefixes every message, e.g. "attn::attention_tiled".
// `out` may be null for calls that only read (splitk_partials).
Problem validate(std::string_view who, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView* out, const AttentionOptions& opts, const TensorView* lse);

[[noreturn]] void fail(std::string_view who, std::string_view arg, const std::string& rule);

// Element pointer of a rank-4 view at (b, s, h, 0).
template <class T>
inline T* row_ptr(const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h) {
  return static_cast<T*>(t.data) + b * t.strides[0] + s * t.strides[1] + h * t.strides[2];
}

}  // namespace attn::detail
