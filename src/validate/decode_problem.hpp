// Decode's validated problem, shared by the CPU (src/decode/) and CUDA (src/cuda/cuda_api.cpp) entry
// points: the sizes, the resolved options and the cache's index arrays of one attention_decode call.
// validate_decode (validate/decode_validate.cpp) checks every argument against the rules of
// include/attn/decode.hpp before anything is written.
#pragma once

#include <cstdint>
#include <string_view>

#include "attn/decode.hpp"
#include "core/cache_index.hpp"
#include "core/score_rule.hpp"
#include "validate/validate.hpp"

namespace attn::detail {

struct DecodeProblem : ResolvedOptions {  // the score rule and the thread count
  std::int64_t batch, seqlen_q, heads, kv_heads;
  std::int64_t head_dim;    // q's and cache.k's
  std::int64_t head_dim_v;  // cache.v's and out's (MLA: 512 of the 576)
  // cache.v is the first head_dim_v dims of cache.k's rows (MLA's latent cache): the same data and row
  // strides, so appending writes k_new alone.
  bool v_in_k;
  DType cache_dtype, q_dtype;
  std::int64_t num_splits;      // 0 = automatic, per sequence
  std::int64_t keys_per_split;  // > 0: slices of at most this many keys, in place of num_splits
  bool quantized_query;         // DecodeOptions::quantized_query (an int8 cache)
  TensorView q, k, v, out;
  const TensorView* lse;
  const TensorView* k_new;  // nullptr when nothing is appended
  const TensorView* v_new;
  CacheIndex index;   // the sequences' keys and where they live (core/cache_index.hpp); host memory
  RotarySpec rotary;  // disabled: no rotary embedding
  // Quantized caches (cache_dtype i8 / fp8): the scale views; owned = no two positions share a scale
  // element, so the append computes and writes the appended positions' scales (else it reads them).
  TensorView k_scale, v_scale;
  bool k_scale_owned, v_scale_owned;
  // [batch] or nullptr: sequence b's keys in this cache are followed by key_shift[b] keys held elsewhere
  // (a rank's slice of a sharded cache, src/distributed/), which moves its queries' diagonal by as many.
  const std::int64_t* key_shift = nullptr;

  std::int64_t group() const { return heads / kv_heads; }
  std::int64_t seqlen_k(std::int64_t b) const { return index.seqlen_k(b); }
  Mask mask(std::int64_t b) const {
    ScoreRule r = rule.for_sequence(b);
    if (key_shift) r.diagonal_shift = key_shift[b];
    return r.mask(seqlen_q, seqlen_k(b));
  }
  // Element offset of cache position `pos` of sequence b, kv head 0, in a cache view with t's strides.
  std::int64_t row_offset(const TensorView& t, std::int64_t b, std::int64_t pos) const {
    return index.position_offset(b, pos, t.strides[0], t.strides[1]);
  }
  // Element offset of the j-th key sequence b attends over.
  std::int64_t key_offset(const TensorView& t, std::int64_t b, std::int64_t j) const {
    return index.key_offset(b, j, t.strides[0], t.strides[1]);
  }
  bool quantized() const { return is_quantized(cache_dtype); }
};

// The index of a validated cache (host arrays for the CPU, the device's for CUDA's params): seqlen_new
// keys appended, the block table's row stride resolved (check_block_table).
inline CacheIndex cache_index(const KVCache& cache, std::int64_t seqlen_new, std::int64_t block_table_stride) {
  return {cache.seqlens, seqlen_new, cache.batch_idx, cache.leftpad,
          PageTable{cache.block_table, block_table_stride, cache.block_table ? cache.k.shape[1] : 1}};
}

// cache.v is a view of the first cache.v.shape[3] dims of cache.k's rows: the same data pointer and
// strides (MLA's latent cache, where the values are a prefix of the keys).
bool values_in_keys(const KVCache& cache);

// Checks every argument (see include/attn/decode.hpp) and throws std::invalid_argument on the first
// bad one; writes nothing. Reads seqlens and block_table, so they must be host memory.
DecodeProblem validate_decode(std::string_view who, const TensorView& q, const KVCache& cache, const TensorView& out,
                              const AttentionOptions& opts, const DecodeOptions& dec, const TensorView* lse);

// Quantized caches' rules (validate/decode_quant_validate.cpp), parts of validate_decode.
struct CacheScales {
  TensorView k, v;
  bool k_owned = false, v_owned = false;
  Span k_span, v_span;
};
// q, out, k_new and v_new around a quantized cache: f32, bf16 or f16 (k_new and v_new alike).
void check_quantized_types(std::string_view who, DType cache_dtype, const TensorView& q, const DecodeOptions& dec);
// cache.k_scale and cache.v_scale: absent for other caches; for quantized ones rank 4, f32 or f16,
// [cache rows, slots, kv_heads, groups] with groups dividing the side's head dim (cache.k's, cache.v's).
CacheScales check_cache_scales(std::string_view who, const KVCache& cache);
// Appending into a quantized cache with given (shared) scales: each scale the appended positions use
// is finite and > 0, and every appended value is finite (it could not be represented otherwise).
void check_quantized_append(std::string_view who, const DecodeProblem& p);

}  // namespace attn::detail
