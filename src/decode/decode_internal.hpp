// Decode internals on the CPU: the append and the chunk kernel's interface (the validated problem is
// validate/decode_problem.hpp).
//
// Work is cut into items (sequence b, key slice w). An item walks its keys in chunks of kChunk keys;
// for each chunk and each kv head it scores the chunk against every query row of that kv head (all
// query heads of the group times seqlen_q, so each K and V row is read from memory once) and folds the
// chunk into those rows' states. The chunk kernel is the only hot code: decode_simd.cpp (Highway, f32
// accumulation for f32/bf16/f16 caches) and decode.cpp (portable, f64).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "validate/decode_problem.hpp"

namespace attn::detail {

// Copies k_new/v_new into the cache at seqlens[b] ... (validated problem only).
void append_kv(const DecodeProblem& p);

constexpr std::int64_t kChunk = 64;  // keys per chunk: a multiple of every SIMD width (16 f32 lanes)

// One chunk of keys [j0, j0 + n) of one sequence, all kv heads. Query rows of kv head g are
// r = hh * seqlen_q + i for the group's query heads hh and queries i; their q rows, slopes and states
// are contiguous per kv head.
template <class A>
struct ChunkArgs {
  std::int64_t n, j0;
  const void* const* k_rows;  // n pointers to each key's row for kv head 0
  const void* const* v_rows;
  // The K rows of the item's next chunk (next_n of them, 0 at its last chunk), prefetched during this
  // chunk's P V pass so that memory keeps streaming while the pass works from cache.
  const void* const* next_k_rows = nullptr;
  std::int64_t next_n = 0;
  std::int64_t k_head_stride, v_head_stride;                     // elements from kv head g to g + 1
  std::int64_t kv_heads, group, seqlen_q, head_dim, head_dim_v;  // q and K rows' length; V rows' and o's
  const std::int64_t* first_key;  // [seqlen_q]: query i sees keys [first_key[i], end_key[i])
  const std::int64_t* end_key;
  const Mask* mask;
  const A* q;       // [kv_heads][group * seqlen_q][head_dim]
  const A* slopes;  // [kv_heads * group] ALiBi slope per query head, 0 = none
  A* states;        // [kv_heads][group * seqlen_q][state_stride]: o[head_dim_v], then m, l
  std::int64_t state_stride;
  A* scratch;  // chunk_scratch_size(kv_heads, group * seqlen_q, head_dim, head_dim_v) values (below)
  // q rounded to bf16 (q_hi) and the bf16 rounding of the remainder (q_lo, nullptr when q_hi is exact),
  // same layout as q: the bf16 dot-product path of decode_simd.cpp uses them when the CPU has it.
  const std::uint16_t* q_hi = nullptr;
  const std::uint16_t* q_lo = nullptr;
  // DecodeOptions::quantized_query with an int8 cache: each query row as int8 codes (same layout as q)
  // and its f32 scale ([kv_heads][group * seqlen_q]); q = codes x scale (decode_query_codes-inl.h).
  const std::int8_t* q_codes = nullptr;
  const float* q_code_scales = nullptr;
  // The output is bf16: that path may also round p to bf16 for P V (flash-attn's rule; l stays the
  // sum of the f32 p, so the LSE keeps f32 accuracy).
  bool bf16_out = false;
  // Quantized caches: the chunk's keys' scales, K's [kChunk][kv_heads][k_groups] (a key's scales together
  // for its dots) and V's [kv_heads][v_groups][kChunk] (a group's keys together for its weights), both
  // [kv_heads][kChunk] when there is one per row (groups of head_dim / k_groups and head_dim_v / v_groups
  // dims). The kernel dots q with the codes and multiplies by the scales (q . (s k) = s (q . k), per
  // group), and weights the codes of V with p * v_scales (l stays the sum of p). nullptr: unquantized.
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  std::int64_t k_groups = 1, v_groups = 1;
};

// The cache types whose every value bf16 holds exactly, so the bf16 dot-product kernel can take them
// (q is then packed as q_hi + q_lo: decode.cpp).
constexpr bool dots_in_bf16(DType t) { return t == DType::bf16 || is_quantized(t); }

inline std::int64_t state_stride_for(std::int64_t head_dim_v) { return (head_dim_v + 15) / 16 * 16 + 16; }

// A chunk kernel's scratch, for R = group x seqlen_q query rows per kv head, in values. The SIMD kernels:
// scores [kv_heads][R][kChunk], probabilities [R][kChunk], kChunk x width unused, from
// chunk_dots4_offset the key walk's dots [kv_heads][ceil(R / 4)][kChunk][4], then the weights. The f64 kernel (one kv
// head at a time) keeps its scores and probabilities in the first 2 R kChunk values and its packed V after. width =
// max(head_dim, head_dim_v).
inline std::int64_t chunk_dots4_offset(std::int64_t kv_heads, std::int64_t R, std::int64_t head_dim,
                                       std::int64_t head_dim_v) {
  return (kv_heads + 1) * R * kChunk + kChunk * std::max(head_dim, head_dim_v);
}
// After the dots, 4 x kChunk weights: P V's p times a block's scales, for up to 4 rows at a time.
inline std::int64_t chunk_weights_offset(std::int64_t kv_heads, std::int64_t R, std::int64_t head_dim,
                                         std::int64_t head_dim_v) {
  return chunk_dots4_offset(kv_heads, R, head_dim, head_dim_v) + kv_heads * ((R + 3) / 4 * 4) * kChunk;
}
inline std::int64_t chunk_scratch_size(std::int64_t kv_heads, std::int64_t R, std::int64_t head_dim,
                                       std::int64_t head_dim_v) {
  return chunk_weights_offset(kv_heads, R, head_dim, head_dim_v) + 4 * kChunk;
}

// f32/bf16/f16 caches (Highway, runtime dispatch to the best ISA). A kernel may keep o in its own lane
// order between chunks; decode_finish_simd puts it back in order once an item's last chunk is done.
void decode_chunk_simd(const ChunkArgs<float>& a, DType cache_dtype);
void decode_finish_simd(const ChunkArgs<float>& a, DType cache_dtype);
// The bf16 dot-product kernel's conversion of n (a multiple of 32) codes of a quantized cache to bf16
// bits, for the tests; false (nothing written) where that kernel does not run on the dispatched target.
bool decode_codes_to_bf16(DType t, const std::uint8_t* codes, std::int64_t n, std::uint16_t* out);
// Whether DecodeOptions::quantized_query runs its kernel on the dispatched target, for an int8 cache of
// head dim head_dim whose K has k_groups scales per row (else decode runs the exact kernel).
bool decode_query_codes_run(std::int64_t head_dim, std::int64_t k_groups);

// Quantized caches (i8, fp8): n rows dequantized to out[c][head_dim] with the scales scales[c][groups]
// (core/quant.hpp's rule, the kernel's SIMD conversions; decode_dequant.cpp).
// dst[i] = the f16 value of bits src[i], i < n (a quantized cache's f16 scales, in vectors).
void decode_widen_f16(const std::uint16_t* src, std::int64_t n, float* dst);

struct QuantRows {
  std::int64_t n, head_dim, groups;
  const std::uint8_t* const* rows;
  const float* scales;
  float* out;
};
void dequantize_rows(const QuantRows& r, DType cache_dtype);

}  // namespace attn::detail
