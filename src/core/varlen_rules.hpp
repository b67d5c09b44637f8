// The argument rules of attention_varlen, shared by the CPU and CUDA entry points: packed rank-3
// views, batch + 1 offsets per cu_seqlens array (0 first, non-decreasing, the last equal to the
// packed length), lse as [1, heads, total_q].
#pragma once

#include <cstdint>
#include <string_view>

#include "attn/tensor.hpp"

namespace attn::detail {

// A packed [total, heads, head_dim] view as the batch of one [1, total, heads, head_dim] that
// validate() checks; anything but rank 3 is rejected naming `arg`.
TensorView packed_as_batch_of_one(std::string_view who, std::string_view arg, const TensorView& t);
// batch >= 1 and < 2^31 (an int32 offset per sequence).
void check_varlen_batch(std::string_view who, std::int64_t batch);
// `cu` (host memory) holds batch + 1 offsets: 0 first, non-decreasing, the last equal to `total`.
void check_cu_seqlens(std::string_view who, std::string_view arg, const std::int32_t* cu, std::int64_t batch,
                      std::int64_t total);
// lse, when given, is a rank-3 view [1, heads, total_q] (flash-attn's [heads, total_q] with a leading 1).
void check_varlen_lse(std::string_view who, const TensorView* lse);

}  // namespace attn::detail
