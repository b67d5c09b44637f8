// What the host side (cuda_api.cpp, validated arguments) hands the kernels (forward.cu, decode.cu).
// Plain C++: no CUDA headers, so the launchers' declarations are visible to host-only code.
#pragma once

#include <cstdint>

#include "attn/tensor.hpp"
#include "core/cache_index.hpp"
#include "core/score_rule.hpp"

struct CUstream_st;

namespace attn::cuda_detail {

struct FwdParams {
  const void *q, *k, *v;
  void* out;
  float* lse;                                      // nullptr: not requested
  std::int64_t qs[3], ks[3], vs[3], os[3], ls[3];  // strides of dims 0..2 (last dim contiguous)
  std::int64_t batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim;
  const std::int32_t* cu_q = nullptr;  // varlen (device, [batch + 1]): rows [cu[b], cu[b+1]) of dim 1
  const std::int32_t* cu_k = nullptr;  // with block_table: only each sequence's key count (differences)
  // Paged keys and values (varlen only): k, v [num_pages, page_size, kv_heads, d] with ks/vs[0] the page
  // stride and [1] the slot stride, key j of sequence b at pages.offset(b, j, ...) (core/cache_index.hpp).
  detail::PageTable pages;  // table in device memory; not paged: k, v packed like q
  detail::ScoreRule rule;   // alibi_slopes in device memory
};

struct DecodeParams {
  const void* q;
  const void *k, *v;  // cache
  void* out;
  float* lse;
  std::int64_t qs[3], ks[2], vs[2], os[3], ls[3];  // k/v: dims 0 (batch or page) and 1 (position or slot)
  std::int64_t k_head_stride, v_head_stride;
  std::int64_t batch, seqlen_q, heads, kv_heads, head_dim;
  detail::CacheIndex index;  // the CPU's (DecodeProblem::index) on the device's copies of the arrays
  detail::ScoreRule rule;    // alibi_slopes in device memory
  std::int64_t num_splits;   // >= 1: the grid's slices, and the partials' stride per row
  // > 0 (batch-invariant decode): sequence b's visible keys are cut into slices_for_keys_per_split of them
  // (core/split.hpp, as the CPU does) and always merged by merge_kernel, so its bits do not depend on
  // the batch; blocks past its slices exit.
  std::int64_t keys_per_split = 0;
  std::int64_t row_blocks;  // ceil(group * seqlen_q / 16)
  float* partial;           // [batch * heads * seqlen_q][num_splits][head_dim + 2] when num_splits > 1
  // Append (k_new/v_new), run first.
  const void *k_new = nullptr, *v_new = nullptr;
  std::int64_t kns[3], vns[3];
  // Rotary embedding (with k_new; core/cache_index.hpp): f32 tables on the device. The append rotates
  // k_new; q is rotated into q_rot (device scratch [batch, seqlen_q, heads, head_dim], contiguous), which
  // the decode kernel then reads as q.
  detail::RotarySpec rotary;
  void* q_rot = nullptr;
};

// The backward (backward_kernel.cuh): the forward's parameter block (q, k, v, out, lse -- required here,
// read --, shapes, varlen offsets, the score rule) plus dout and the gradients, and two device scratch
// arrays of one f32 per (query head, query row): row r of head h at [h * rows + r], with r = b * seqlen_q
// + i, or the packed row in a varlen batch.
struct BwdParams {
  FwdParams f;
  const void* dout;
  void *dq, *dk, *dv;
  std::int64_t dos[3], dqs[3], dks[3], dvs[3];
  float* dsink = nullptr;  // [heads], written when requested
  float* delta;            // scratch: D = dout . out per row
  float* lse2;             // scratch: the lse in base 2 (+inf for a row without weights: every P is 0)
  std::int64_t rows;       // batch * seqlen_q, or total_q (varlen)
};

// Launch on `stream`; return the cudaError_t of the launch (0 = success) as int.
int launch_backward(const BwdParams& p, DType t, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                    CUstream_st* stream);
int launch_forward(const FwdParams& p, DType t, std::int64_t max_seqlen_q, CUstream_st* stream);
int launch_decode(const DecodeParams& p, DType t, CUstream_st* stream);

// What the entry points (cuda_api.cpp) call after validation: the library's launchers above, unless
// a benchmark or test swaps in another configuration of the same kernels (bench/gpu/variants.hpp) to
// run it through the public API. Not thread-safe; not for library users.
struct Launchers {
  int (*forward)(const FwdParams&, DType, std::int64_t, CUstream_st*) = launch_forward;
  int (*decode)(const DecodeParams&, DType, CUstream_st*) = launch_decode;
};
Launchers& launchers();

}  // namespace attn::cuda_detail
