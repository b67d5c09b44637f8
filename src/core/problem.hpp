// A validated attention problem: the sizes resolved from the views, with element accessors.
// Every entry point validates into a Problem first, so nothing is written before all checks pass.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

struct Problem {
  std::int64_t batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim;
  DType dtype;
  double scale;
  bool causal;
  int num_threads;
  TensorView q, k, v, out;
  const TensorView* lse;  // nullptr when not requested

  std::int64_t group() const { return heads / kv_heads; }  // query heads per kv head
  std::int64_t kv_head_of(std::int64_t h) const { return h / group(); }

  // Keys [0, visible_keys(i)) are seen by query i. Causal is aligned to the bottom-right corner:
  // query i sees key j iff j <= i + seqlen_k - seqlen_q. Returns 0 for a fully masked row.
  std::int64_t visible_keys(std::int64_t i) const {
    if (!causal) return seqlen_k;
    return std::clamp<std::int64_t>(i + seqlen_k - seqlen_q + 1, 0, seqlen_k);
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
