// The CUDA backend (built when CMake's ATTN_CUDA is on; the macro ATTN_HAS_CUDA is then defined for
// every target that links attn). Same shapes, options and validation rules as the CPU entry points
// (include/attn/attention.hpp, include/attn/decode.hpp), with these differences:
//   * every TensorView's data, KVCache::seqlens / block_table / batch_idx / leftpad, cu_seqlens, alibi_slopes and
//     sinks point to device memory (cudaMalloc); a host pointer is rejected with std::invalid_argument;
//   * q, k, v, out (and the cache, k_new, v_new) are bf16 or f16 with head_dim 64, 128 or 256 (v's the
//     same as q's: unequal head dims and the MLA cache view are CPU-only), the last
//     dimension contiguous and every row 16-byte aligned (data and strides of dims 0..2 multiples of 8
//     elements); lse is f32; decode takes q of the cache's type;
//   * work is queued on `stream` (nullptr = the legacy default stream) and the call returns before it
//     finishes, except where noted: reading cu_seqlens and the cache's seqlens/block_table for
//     validation copies them to the host and synchronises the stream (pass host mirrors to avoid it);
//   * a CUDA error (launch failure, out of memory) throws std::runtime_error naming the call.
// Accumulation is f32 on tensor cores (mma.sync m16n8k16); see docs/cuda.md.
#pragma once

#include <cstdint>

#include "attn/decode.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "attn/varlen.hpp"

struct CUstream_st;

namespace attn::cuda {

using Stream = CUstream_st*;  // a cudaStream_t

// Number of CUDA devices usable now (0 with no driver or no device; never throws).
int device_count();

// Forward attention, FlashAttention-2 style: q [batch, seqlen_q, heads, d], k/v [batch, seqlen_k,
// kv_heads, d], out like q, lse [batch, heads, seqlen_q] f32. Causal is bottom-right aligned; windows,
// softcap and ALiBi as in options.hpp.
void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& opts = {}, const TensorView* lse = nullptr, Stream stream = nullptr);

// Variable-length batch, with the rules of the CPU's attention_varlen (include/attn/varlen.hpp):
// q [total_q, heads, d], k/v [total_k, kv_heads, d], out like q, lse [1, heads, total_q]. Sequence b
// owns rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q and out and rows [cu_seqlens_k[b],
// cu_seqlens_k[b+1]) of k and v; each array has batch + 1 non-decreasing entries, 0 first and the last
// equal to total_q / total_k. The VarlenBatch is the CPU's (attn/varlen.hpp), with cu_seqlens_q and
// cu_seqlens_k in device memory and the optional host copies that validation reads instead of copying
// (no sync).
using attn::VarlenBatch;
void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const VarlenBatch& varlen, const AttentionOptions& opts = {}, const TensorView* lse = nullptr,
                      Stream stream = nullptr);

// Variable-length queries over a paged cache (include/attn/varlen.hpp's attention_varlen_paged: chunked
// prefill as in vLLM): q and out packed as in attention_varlen, k and v [num_pages, page_size, kv_heads, d]
// with any page_size >= 1, key j of sequence b in page block_table[b * block_table_stride + j / page_size];
// cu_seqlens_k's differences are the key counts. pages.block_table points to device memory; validation
// reads it (every entry a sequence's keys use must be a page of the cache) from host_block_table when
// given, else from a copy (a stream sync, like cu_seqlens). The CPU's rules and named errors.
void attention_varlen_paged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            const VarlenBatch& varlen, const VarlenPages& pages, const AttentionOptions& opts = {},
                            const TensorView* lse = nullptr, Stream stream = nullptr,
                            const std::int32_t* host_block_table = nullptr);

// The backward of attention and of attention_varlen (include/attn/backward.hpp: the same shapes, rules
// and named errors), FlashAttention-2's algorithm on tensor cores: dq like q, dk like k, dv like v, dout
// like out, lse the forward's (required, f32); dsink (optional, needs opts.sinks) [1, heads, 1] f32. The
// CUDA rules above apply to every tensor; no dropout. Deterministic (no atomics: each gradient element
// is summed by one block in a fixed order). P and dS are rounded to 16 bits before their products, as
// in flash-attn: flash-attn's accuracy rule (at most 3x the error of the math backward in the same
// dtype). Scratch: 8 bytes per (head, query row), allocated on `stream`. Keys no query sees get dk = dv
// = 0; a query that sees no key gets dq = 0.
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& opts = {}, const TensorView* dsink = nullptr,
                        Stream stream = nullptr);
void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const TensorView& dout, const TensorView& lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const VarlenBatch& varlen,
                               const AttentionOptions& opts = {}, const TensorView* dsink = nullptr,
                               Stream stream = nullptr);

// Decode over a contiguous or paged cache (include/attn/decode.hpp), split-K over the keys with a
// merge kernel. DecodeOptions::num_splits = 0 picks the split count from the number of SMs
// (cuda::decode_num_splits, src/cuda/heuristics.hpp); any value >= 1 gives the same result up to rounding.
struct DecodeHostMirror {
  // Optional host copies of cache.seqlens [batch], cache.block_table [batch x stride], cache.batch_idx and
  // cache.leftpad: validation and planning read them instead of copying from the device (no stream sync).
  // They must equal the device contents.
  const std::int32_t* seqlens = nullptr;
  const std::int32_t* block_table = nullptr;
  const std::int32_t* batch_idx = nullptr;  // cache.batch_idx [batch]
  const std::int32_t* leftpad = nullptr;    // cache.leftpad [batch]
};
void attention_decode(const TensorView& q, const KVCache& cache, const TensorView& out,
                      const AttentionOptions& opts = {}, const DecodeOptions& decode = {},
                      const TensorView* lse = nullptr, Stream stream = nullptr, const DecodeHostMirror& host = {});

// The split count attention_decode uses when num_splits = 0, for the current device.
std::int64_t decode_num_splits(std::int64_t max_keys, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                               std::int64_t seqlen_q);

}  // namespace attn::cuda
