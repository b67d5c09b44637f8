// The argument rules of attention_varlen (CPU and CUDA) and attention_varlen_backward: packed rank-3
// views, batch + 1 offsets per cu_seqlens array (0 first, non-decreasing, the last equal to the
// packed length), lse as [1, heads, total_q].
#pragma once

#include <cstdint>
#include <string_view>

#include "attn/tensor.hpp"
#include "attn/varlen.hpp"
#include "validate/backward_problem.hpp"
#include "validate/problem.hpp"

namespace attn::detail {

// A packed [total, heads, head_dim] view as the batch of one [1, total, heads, head_dim] that
// validate() checks; anything but rank 3 is rejected naming `arg`.
TensorView packed_as_batch_of_one(std::string_view who, std::string_view arg, const TensorView& t);
// batch >= 1 and < 2^31 (an int32 offset per sequence).
void check_varlen_batch(std::string_view who, std::int64_t batch);
// `cu` (host memory) holds batch + 1 offsets: 0 first, non-decreasing, the last equal to `total`
// (any last value when total < 0: the paged keys, which are not packed).
void check_cu_seqlens(std::string_view who, std::string_view arg, const std::int32_t* cu, std::int64_t batch,
                      std::int64_t total);
// Both arrays of a varlen batch (host memory) against the packed lengths (total_k < 0: paged keys).
void check_varlen_offsets(std::string_view who, const VarlenBatch& varlen, std::int64_t total_q, std::int64_t total_k);
// lse, when given, is a rank-3 view [1, heads, total_q] (flash-attn's [heads, total_q] with a leading 1).
void check_varlen_lse(std::string_view who, const TensorView* lse);

// The checks every varlen forward starts with: batch, the rank-3 views of q, k, v and out (as one
// [1, total, heads, head_dim] problem, validated by `validate`) and lse. cu_seqlens are checked after,
// where they are readable (on the CUDA backend, once copied to the host).
Problem validate_packed(std::string_view who, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, std::int64_t batch, const AttentionOptions& opts, const TensorView* lse);
// The paged varlen forward's checks (attention_varlen_paged, CPU and CUDA): q, out, lse and the options as
// validate_packed checks them, with page 0 of k and v standing for the keys; then the cache views whole,
// cu_seqlens, the block table, each sequence's key count against the capacity, and no output overlapping
// the cache or the table. cu_seqlens and pages.block_table must be readable here (host copies on CUDA);
// table_address, when given, is where the table lives for the overlap rule (the device's copy). Returns
// the packed problem, whose k and v are page 0's views (with the cache's strides).
Problem validate_packed_paged(std::string_view who, const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const VarlenBatch& varlen, const VarlenPages& pages,
                              const AttentionOptions& opts, const TensorView* lse,
                              const std::int32_t* table_address = nullptr);
// The same for a varlen backward: batch, the rank-3 views of q, k, v, out, dout, dq, dk and dv (as one
// [1, total, heads, head_dim] problem, validated by `validate_backward`) and lse, which a backward needs.
// `lse` must outlive the result (the problem points at it).
BackwardProblem validate_packed_backward(std::string_view who, const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out, const TensorView& dout,
                                         const TensorView& lse, const TensorView& dq, const TensorView& dk,
                                         const TensorView& dv, std::int64_t batch, const AttentionOptions& opts,
                                         const TensorView* dsink = nullptr);

// t with dimension `dim` cut to the rows [first, first + count): a view into the same memory.
TensorView offset_rows(TensorView t, std::int64_t dim, std::int64_t first, std::int64_t count);

// Sequence b of a validated packed problem (cu_seqlens checked): its own lengths, q, k, v and out as
// views into the packed tensors, lse unset, the score rule with sequence b's ALiBi slopes, and the
// dropout rule of batch index b. With `pages` (the paged varlen forward), k and v stay the whole paged
// cache and the problem reads sequence b's row of the block table.
Problem sequence_problem(const Problem& packed, const VarlenBatch& varlen, std::int64_t b,
                         const VarlenPages* pages = nullptr);

}  // namespace attn::detail
