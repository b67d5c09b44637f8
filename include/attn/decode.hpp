// Decode: one or a few new queries per sequence against a long KV cache, at memory speed.
// Modelled on flash-attn's flash_attn_with_kvcache.
//
// Shapes (flash-attn's layout; strides in elements, any non-negative strides accepted):
//   q            [batch, seqlen_q, heads, head_dim]       seqlen_q 1, or a few (speculative decoding)
//   cache.k, .v  contiguous [batch, max_seqlen, kv_heads, head_dim] (cache.v: head_dim_v)
//                or paged   [num_pages, page_size, kv_heads, head_dim] with cache.block_table, any
//                page_size >= 1; key position p of sequence b lives in page block_table[b][p / page_size]
//                at slot p % page_size
//   cache.seqlens [batch] int32: keys already in each sequence's cache
//   k_new, v_new [batch, seqlen_new, kv_heads, head_dim] (optional; v_new: head_dim_v): written into the
//                cache in place at positions seqlens[b] .. seqlens[b] + seqlen_new - 1 before attending
//   out          [batch, seqlen_q, heads, head_dim_v]
//   lse          [batch, heads, seqlen_q] (optional): natural-log log-sum-exp of the scaled scores
//
// head_dim_v is cache.v's head dim, which may differ from head_dim. MLA (DeepSeek's latent cache, d_qk
// 576 and d_v 512 with one kv head): cache.v may view the first head_dim_v <= head_dim dims of cache.k's
// own rows -- the same data pointer and strides, shape[3] = head_dim_v -- and the values are then read
// from the key rows, not a copy; k_new alone appends (v_new must be null), rotary is not applied (it
// would rotate dims the values read) and a quantized cache takes no append. docs/head-dims.md.
//
// Sequence b attends over its first seqlen_k(b) = seqlens[b] + seqlen_new keys. With cache.leftpad
// (contiguous caches), over the keys at positions leftpad[b] .. seqlens[b] + seqlen_new - 1, so
// seqlen_k(b) = seqlens[b] + seqlen_new - leftpad[b] (0 <= leftpad[b] <= seqlens[b]); with
// cache.batch_idx, sequence b lives in cache row batch_idx[b] (in [0, max batch); distinct rows when
// appending). Every mask is that of
// attention_reference for the pair (seqlen_q, seqlen_k(b)): causal is aligned bottom-right, so with
// seqlen_q = 3 and causal the last query sees all seqlen_k(b) keys and the first seqlen_k(b) - 2; the
// window, softcap, ALiBi, scale and the fully-masked-row rule (out = 0, lse = -inf) are as in
// include/attn/options.hpp. Query head h reads kv head h / (heads / kv_heads).
//
// Element types: the cache (k, v, k_new, v_new) is f64, f32, bf16 or f16, or quantized (below). q and out are the
// cache's type or f32 (a bf16/f16 cache with f32 activations needs no conversion pass); out has q's type. lse is f64
// for an f64 cache, else f32. Accumulation is in f32 (f64 for f64). With a bf16 output on a CPU with AVX512-BF16, the
// softmax weights are rounded to bf16 for P V (as flash-attn does on GPUs; the LSE keeps f32 accuracy); the error stays
// within twice the textbook method's at bf16 (tested).
//
// Quantized caches: cache.k and cache.v of dtype i8, fp8_e4m3 or fp8_e5m2 with cache.k_scale and
// cache.v_scale; a stored q stands for float(q) * scale (one f32 multiply; src/core/quant.hpp). The
// conventions of the field are layouts of the scale views:
//   int8, one scale per (token, kv head) (vLLM's per-token int8): groups = 1, dense;
//   q8_0 numerics (llama.cpp: blocks of 32 dims, f16 scale): i8 with groups = head_dim / 32, f16;
//   fp8 with one scale per kv head (vLLM's and FA3's descale): strides [0, 0, 1, 0]; per tensor: all 0.
// (llama.cpp interleaves each block's scale with its 32 values; here values and scales are separate
// arrays.) q and out are f32, bf16 or f16; lse f32. k_new and v_new (f32, bf16 or f16) are quantized
// into the cache: round to nearest even, saturated at the type's largest finite value. When no two cache
// positions share a scale element, the appended positions' scales are computed (amax / 127, 448 or
// 57344 per group, rounded to the scale's type) and written; when the view shares elements (a 0
// stride), the given scales are used and must be finite and > 0. A NaN or infinite appended value
// makes its group's computed scale NaN, so it poisons the rows that see it; with given scales it is an
// error. Decode dequantizes each chunk of keys to f32 and runs the f32 kernel on it. CPU only.
//
// Every argument is validated before anything is written; a bad one throws std::invalid_argument whose
// message names the argument and the rule, and leaves the cache, out and lse untouched. The block_table
// entries checked are those of the pages holding keys [0, seqlen_k(b)) of each sequence; later entries
// are never read and may hold anything (e.g. -1).
//
// Determinism: the keys of each sequence are cut into num_splits slices (split boundaries depend only
// on the problem and num_splits) whose partial states are merged in slice order, so the output is
// bitwise identical for any num_threads.
#pragma once

#include <cstdint>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct KVCache {
  TensorView k, v;                            // written only where k_new/v_new are appended
  const std::int32_t* seqlens = nullptr;      // [batch]
  const std::int32_t* block_table = nullptr;  // nullptr: contiguous cache; else [batch, max_pages]
  std::int64_t max_pages = 0;                 // columns of block_table
  std::int64_t block_table_stride = 0;        // elements between rows of block_table; 0 = max_pages
  // Contiguous caches only (flash-attn's cache_batch_idx and cache_leftpad); nullptr = off.
  const std::int32_t* batch_idx = nullptr;  // [batch]: sequence b reads and appends cache row batch_idx[b]
  const std::int32_t* leftpad = nullptr;    // [batch]: sequence b's keys start at position leftpad[b]
  // Quantized caches only (k, v of dtype i8, fp8_e4m3 or fp8_e5m2): the scales, rank-4 views
  // [batch or num_pages, max_seqlen or page_size, kv_heads, groups] of f32 or f16, indexed like the
  // cache's rows (the same block table), `groups` dividing the head dim of the cache it scales (k's or
  // v's): the scale of element c of a row is that of group c / (dim / groups). Strides may be 0 to share
  // a scale. See "Quantized caches" above.
  TensorView k_scale, v_scale;
};

// Rotary position embedding tables (flash-attn's rotary_cos, rotary_sin, rotary_interleaved): cos and
// sin are dense row-major [positions, rotary_dim / 2] arrays of `dtype` (f32, or f64 for an f64
// cache). Applied only with k_new/v_new: each appended key at cache position p = seqlens[b] + t has
// its first rotary_dim features rotated by row p before it is written, and q row i is rotated by row
// seqlens[b] + i when the mask is causal or windowed, else by row seqlens[b] (every query at that
// position), as flash-attn does; v is not rotated. Pairs are (c, c + rotary_dim / 2), or (2c, 2c + 1)
// when interleaved. rotary_dim is even, 2..head_dim; every position used must be < positions.
struct RotaryTables {
  const void* cos = nullptr;
  const void* sin = nullptr;
  DType dtype = DType::f32;
  std::int64_t positions = 0;
  std::int64_t rotary_dim = 0;
  bool interleaved = false;
};

struct DecodeOptions {
  // Key slices per sequence; 0 = automatic (decode_num_splits). Any value >= 1 is valid and gives the
  // same result up to rounding; more slices than keys leaves some empty.
  std::int64_t num_splits = 0;
  // New keys and values appended to the cache before attending (both or neither).
  const TensorView* k_new = nullptr;
  const TensorView* v_new = nullptr;
  // Rotary embedding of k_new and q before attending (see RotaryTables); nullptr = none.
  const RotaryTables* rotary = nullptr;
  // Batch-invariant decode (vLLM's and SGLang's deterministic modes): when > 0, each sequence's keys are
  // cut into ceil(keys / keys_per_split) slices by the split rule (core/split.hpp; slices of at most
  // keys_per_split keys), in place of num_splits. The slices then depend only on the sequence's own
  // key count, so its output and lse are bitwise the same whether it is decoded alone or in any batch,
  // with any thread count. 0 = off (num_splits decides). CPU only: the CUDA backend rejects it.
  std::int64_t keys_per_split = 0;
  // An int8 cache only (else an error): llama.cpp's fast mode, opt-in. Each query row is quantized to
  // int8 with one scale (max |q| / 127, round to nearest) and q . k runs on the integer codes (VPDPBUSD),
  // which costs the scores q's rounding: |error of q . k| <= (max |q| / 254) x sum |k| per key, where the
  // default is within twice the f32 textbook method's. Taken on CPUs with AVX512-VNNI (and AVX512-BF16
  // and VBMI: Zen 4, Sapphire Rapids and later) for head dims 64, 128, 192 and 256; elsewhere the exact
  // kernel runs. Results stay bitwise the same for any thread count. docs/decode.md "quantized_query".
  bool quantized_query = false;
};

void attention_decode(const TensorView& q, const KVCache& cache, const TensorView& out,
                      const AttentionOptions& opts = {}, const DecodeOptions& decode = {},
                      const TensorView* lse = nullptr);

// The automatic split count for a sequence of `keys` keys: slices of about 2 MiB of K and V (all kv
// heads together), and at least enough slices for 32 work items over the batch as long as each keeps
// >= 128 keys. A function of the problem only -- never of the thread count -- so results do not
// depend on the number of threads. See docs/decode.md.
std::int64_t decode_num_splits(std::int64_t keys, std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim,
                               DType cache_dtype);

}  // namespace attn
