#include "core/varlen_rules.hpp"

#include <string>

#include "core/problem.hpp"

namespace attn::detail {

TensorView packed_as_batch_of_one(std::string_view who, std::string_view arg, const TensorView& t) {
  if (t.rank != 3) fail(who, arg, "rank must be 3 ([total, heads, head_dim]), got " + std::to_string(t.rank));
  TensorView r = t;
  r.rank = 4;
  r.shape = {1, t.shape[0], t.shape[1], t.shape[2]};
  r.strides = {0, t.strides[0], t.strides[1], t.strides[2]};
  return r;
}

void check_varlen_batch(std::string_view who, std::int64_t batch) {
  if (batch < 1) fail(who, "batch", "must be >= 1, got " + std::to_string(batch));
  if (batch > (std::int64_t{1} << 31)) fail(who, "batch", "must be < 2^31, got " + std::to_string(batch));
}

void check_cu_seqlens(std::string_view who, std::string_view arg, const std::int32_t* cu, std::int64_t batch,
                      std::int64_t total) {
  if (cu == nullptr) fail(who, arg, "pointer is null");
  if (cu[0] != 0) fail(who, arg, "[0] must be 0, got " + std::to_string(cu[0]));
  for (std::int64_t b = 0; b < batch; ++b)
    if (cu[b + 1] < cu[b])
      fail(who, arg,
           "must be non-decreasing, but [" + std::to_string(b + 1) + "] = " + std::to_string(cu[b + 1]) + " < [" +
               std::to_string(b) + "] = " + std::to_string(cu[b]));
  if (cu[batch] != total)
    fail(who, arg,
         "[batch] must equal the packed length " + std::to_string(total) + ", got " + std::to_string(cu[batch]));
}

void check_varlen_lse(std::string_view who, const TensorView* lse) {
  if (lse && (lse->rank != 3 || lse->shape[0] != 1)) fail(who, "lse", "must be a rank-3 view [1, heads, total_q]");
}

}  // namespace attn::detail
