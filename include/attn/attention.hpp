// The attention entry points.
//
// All take q [batch, seqlen_q, heads, head_dim], k [batch, seqlen_k, kv_heads, head_dim] and v [batch,
// seqlen_k, kv_heads, head_dim_v] and write out [batch, seqlen_q, heads, head_dim_v] and, when `lse` is
// given, the natural-log log-sum-exp of each row's scaled scores into lse [batch, heads, seqlen_q] (f64
// for f64 inputs, else f32). head_dim_v is v's own (DeepSeek's prefill: q and k 192, v 128); any head
// dims >= 1 (docs/head-dims.md); the default scale is 1 / sqrt(head_dim), q's.
// heads must be a multiple of kv_heads (GQA; kv_heads = 1 is MQA): query head h reads kv head
// h / (heads / kv_heads).
//
// Every argument is validated before anything is written: a bad one throws std::invalid_argument whose
// message names the function, the argument and the rule, and leaves out and lse untouched.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/online_softmax.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Algorithm 0, "the obvious way": materialises S = q k^T * scale ([seqlen_q, seqlen_k] per head),
// then P = softmax(S) row by row, then out = P v. The oracle every other algorithm is tested against.
void attention_reference(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         const AttentionOptions& opts = {}, const TensorView* lse = nullptr);

// FlashAttention: the online softmax over key tiles; never allocates anything of size
// seqlen_q x seqlen_k. Its scratch is O(q_tile x (k_tile + head_dim)) per thread.
void attention_tiled(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                     const AttentionOptions& opts = {}, const TileOptions& tiles = {}, const TensorView* lse = nullptr);

// Split-K (Flash-Decoding): each query row's keys cut into num_splits slices whose partial states are
// merged. Built for decode (seqlen_q of 1 or a few over a long cache) but valid for any shape.
void attention_splitk(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionOptions& opts = {}, const SplitKOptions& split = {},
                      const TensorView* lse = nullptr);

// Slice w of split-K's cut of `keys` keys into `num_splits`: [begin, end), sizes differing by at most
// one, the larger first; with num_splits > keys the slices past the first `keys` are empty.
struct KeyRange {
  std::int64_t begin, end;
};
KeyRange splitk_slice(std::int64_t keys, std::int64_t num_splits, std::int64_t w);

// The per-slice partial states split-K computes for one query row (batch b, query i, head h), before
// the merge, in slice order; f64 accumulation whatever the input type. For tools and teaching.
std::vector<PartialState<double>> splitk_partials(const TensorView& q, const TensorView& k, const TensorView& v,
                                                  const AttentionOptions& opts, const SplitKOptions& split,
                                                  std::int64_t b, std::int64_t i, std::int64_t h);

// The tile sizes attention_tiled would use for this problem when `tiles` leaves them unset.
struct TilePlan {
  std::int64_t q_tile;
  std::int64_t k_tile;
};
TilePlan plan_tiles(std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t head_dim, DType dtype,
                    const TileOptions& tiles = {});

}  // namespace attn
