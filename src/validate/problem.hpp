// A validated attention problem: the sizes resolved from the views, with element accessors.
// Every entry point validates into a Problem first, so nothing is written before all checks pass.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "core/cache_index.hpp"
#include "core/score_rule.hpp"
#include "validate/validate.hpp"

namespace attn::detail {

struct Problem : ResolvedOptions {  // the score rule and the thread count
  std::int64_t batch, seqlen_q, seqlen_k, heads, kv_heads;
  std::int64_t head_dim;    // q's and k's: the length of the dot products
  std::int64_t head_dim_v;  // v's and out's (DeepSeek's prefill: 192 and 128); head_dim unless they differ
  DType dtype;
  TensorView q, k, v, out;
  const TensorView* lse;  // nullptr when not requested
  // Where k's and v's rows live: the views' own rows, or (the paged varlen forward) this sequence's row
  // of a block table over a [num_pages, page_size, kv_heads, d] cache, read through key_row_ptr.
  PageTable pages;

  std::int64_t group() const { return heads / kv_heads; }  // query heads per kv head
  std::int64_t kv_head_of(std::int64_t h) const { return h / group(); }

  // The score rule applied to this problem's one (seqlen_q, seqlen_k) pair (core/score_rule.hpp).
  Mask mask() const { return rule.mask(seqlen_q, seqlen_k); }
  std::int64_t first_key(std::int64_t i) const { return mask().first_key(i); }
  std::int64_t end_key(std::int64_t i) const { return mask().end_key(i); }
  std::int64_t visible_count(std::int64_t i) const { return mask().visible_count(i); }
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

// Element pointer of key (or value) row s, kv head h of problem batch b, paged or not.
template <class T>
inline T* key_row_ptr(const TensorView& t, const PageTable& pages, std::int64_t b, std::int64_t s, std::int64_t h) {
  if (!pages.paged()) return row_ptr<T>(t, b, s, h);
  return static_cast<T*>(t.data) + pages.offset(0, s, t.strides[0], t.strides[1]) + h * t.strides[2];
}

}  // namespace attn::detail
