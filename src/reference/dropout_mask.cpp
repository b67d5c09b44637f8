// attn::dropout_mask: the dropout rule (core/dropout.hpp) evaluated for every element of a problem,
// with the same scale_row call the kernels make, so the mask is the forward's by construction.
#include "attn/dropout.hpp"

#include <cstdint>
#include <string>

#include "core/dropout.hpp"
#include "core/element.hpp"
#include "validate/problem.hpp"  // fail
#include "validate/validate.hpp"

namespace attn {
namespace {

constexpr const char* kDims[] = {"batch", "heads", "seqlen_q", "seqlen_k"};

template <class A>
void write_mask(const TensorView& m, const detail::DropoutRule& rule) {
  const std::int64_t sk = m.shape[3];
  auto* base = static_cast<A*>(m.data);
  for (std::int64_t b = 0; b < m.shape[0]; ++b)
    for (std::int64_t h = 0; h < m.shape[1]; ++h)
      for (std::int64_t i = 0; i < m.shape[2]; ++i) {
        A* row = base + b * m.strides[0] + h * m.strides[1] + i * m.strides[2];
        for (std::int64_t j = 0; j < sk; ++j) row[j * m.strides[3]] = A(1);
        if (rule.enabled()) rule.scale_row(b, h, i, 0, sk, row, m.strides[3]);
      }
}

}  // namespace

void dropout_mask(const TensorView& mask, const AttentionOptions& opts) {
  const char* who = "attn::dropout_mask";
  detail::DropoutRule rule = detail::resolve_options(who, opts, 1).dropout;
  if (mask.rank != 4) detail::fail(who, "mask", "rank must be 4, got " + std::to_string(mask.rank));
  if (mask.dtype != DType::f64 && mask.dtype != DType::f32)
    detail::fail(who, "mask", "dtype must be f64 or f32, got " + std::string(dtype_name(mask.dtype)));
  for (int i = 0; i < 4; ++i)
    if (mask.shape[i] < (i == 3 ? 0 : 1))
      detail::fail(
          who, "mask",
          std::string(kDims[i]) + " must be >= " + (i == 3 ? "0" : "1") + ", got " + std::to_string(mask.shape[i]));
  for (int i = 0; i < 4; ++i)
    if (mask.strides[i] < 0)
      detail::fail(who, "mask",
                   "stride[" + std::to_string(i) + "] must be >= 0, got " + std::to_string(mask.strides[i]));
  rule.heads = mask.shape[1];
  detail::check_dropout_extent(who, rule, mask.shape[0], mask.shape[1], mask.shape[2], mask.shape[3]);
  if (mask.shape[3] == 0) return;  // nothing to write (check_view would want seqlen_k >= 1)
  // The shared view rules (overflow, null data) and distinct addresses, as for any output.
  detail::check_view(who, "mask", mask, 4, false);
  detail::check_no_self_alias(who, "mask", mask);
  if (mask.dtype == DType::f64)
    write_mask<double>(mask, rule);
  else
    write_mask<float>(mask, rule);
}

}  // namespace attn
