// merge_states (include/attn/merge.hpp): per (row, head), the states of the parts folded together by
// the online softmax's merge, in part order, and finalized.
#include "attn/merge.hpp"

#include <string>
#include <utility>
#include <vector>

#include "attn/online_softmax.hpp"
#include "core/element.hpp"
#include "merge/merge_output.hpp"
#include "validate/problem.hpp"
#include "validate/validate.hpp"

namespace attn {
namespace {

constexpr const char* kWho = "attn::merge_states";

void validate(const TensorView& parts, const TensorView& parts_lse, const TensorView& out, const TensorView* lse) {
  using detail::fail;
  const detail::Span sp = detail::check_view(kWho, "parts", parts, 4, true),
                     sl = detail::check_view(kWho, "parts_lse", parts_lse, 3, true),
                     so = detail::check_view(kWho, "out", out, 4, false);
  const DType lse_type = parts.dtype == DType::f64 ? DType::f64 : DType::f32;
  if (parts_lse.dtype != lse_type)
    fail(kWho, "parts_lse",
         "dtype must be " + std::string(dtype_name(lse_type)) + " for parts of dtype " +
             std::string(dtype_name(parts.dtype)));
  if (out.dtype != parts.dtype) fail(kWho, "out", "dtype must match parts'");
  const char* dims[] = {"rows", "states", "heads", "head_dim"};
  for (int i : {0, 1, 2})
    detail::require_equal(kWho, "parts_lse", dims[i], parts_lse.shape[i], "parts", parts.shape[i]);
  for (int i : {0, 2, 3}) detail::require_equal(kWho, "out", dims[i], out.shape[i], "parts", parts.shape[i]);
  if (out.shape[1] != 1) fail(kWho, "out", "states must be 1, got " + std::to_string(out.shape[1]));
  detail::check_no_self_alias(kWho, "out", out);
  if (detail::overlaps(so, sp) || detail::overlaps(so, sl)) fail(kWho, "out", "overlaps an input");
  if (!lse) return;
  const detail::Span s = detail::check_view(kWho, "lse", *lse, 3, false);
  if (lse->dtype != lse_type) fail(kWho, "lse", "dtype must be " + std::string(dtype_name(lse_type)));
  for (int i : {0, 2}) detail::require_equal(kWho, "lse", dims[i], lse->shape[i], "parts", parts.shape[i]);
  if (lse->shape[1] != 1) fail(kWho, "lse", "states must be 1, got " + std::to_string(lse->shape[1]));
  detail::check_no_self_alias(kWho, "lse", *lse);
  if (detail::overlaps(s, sp) || detail::overlaps(s, sl) || detail::overlaps(s, so))
    fail(kWho, "lse", "overlaps an input or out");
}

template <class T>
void run(const TensorView& parts, const TensorView& parts_lse, const TensorView& out, const TensorView* lse) {
  using A = detail::Acc<T>;
  const std::int64_t rows = parts.shape[0], states = parts.shape[1], heads = parts.shape[2], d = parts.shape[3];
  PartialState<A> acc(d), part(d);
  std::vector<A> result(static_cast<std::size_t>(d));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t h = 0; h < heads; ++h) {
      reset(acc.view());
      for (std::int64_t s = 0; s < states; ++s) {
        const A m = static_cast<const A*>(
            parts_lse.data)[r * parts_lse.strides[0] + s * parts_lse.strides[1] + h * parts_lse.strides[2]];
        detail::merge_output(acc.view(), part, m, detail::row_ptr<const T>(parts, r, s, h), parts.strides[3]);
      }
      const A merged_lse = finalize(acc.view(), result.data());
      T* dst = detail::row_ptr<T>(out, r, 0, h);
      for (std::int64_t c = 0; c < d; ++c)
        dst[c * out.strides[3]] = detail::store<T>(result[static_cast<std::size_t>(c)]);
      if (lse) static_cast<A*>(lse->data)[r * lse->strides[0] + h * lse->strides[2]] = merged_lse;
    }
}

void validate_in_place(const TensorView& out, const TensorView& lse, const TensorView& other,
                       const TensorView& other_lse) {
  using detail::fail;
  constexpr const char* who = "attn::merge_state_in_place";
  const detail::Span so = detail::check_view(who, "out", out, 4, false),
                     sl = detail::check_view(who, "lse", lse, 3, false),
                     sb = detail::check_view(who, "other", other, 4, false),
                     sbl = detail::check_view(who, "other_lse", other_lse, 3, false);
  const DType lse_type = out.dtype == DType::f64 ? DType::f64 : DType::f32;
  if (other.dtype != out.dtype) fail(who, "other", "dtype must match out's");
  for (const auto& [name, t] : {std::pair{"lse", &lse}, std::pair{"other_lse", &other_lse}})
    if (t->dtype != lse_type)
      fail(who, name,
           "dtype must be " + std::string(dtype_name(lse_type)) + " for out of dtype " +
               std::string(dtype_name(out.dtype)));
  const char* dims[] = {"rows", "states", "heads", "head_dim"};
  for (int i : {0, 1, 2, 3}) detail::require_equal(who, "other", dims[i], other.shape[i], "out", out.shape[i]);
  for (int i : {0, 1, 2}) {
    detail::require_equal(who, "lse", dims[i], lse.shape[i], "out", out.shape[i]);
    detail::require_equal(who, "other_lse", dims[i], other_lse.shape[i], "out", out.shape[i]);
  }
  if (out.shape[1] != 1) fail(who, "out", "states must be 1, got " + std::to_string(out.shape[1]));
  detail::check_no_self_alias(who, "out", out);
  detail::check_no_self_alias(who, "lse", lse);
  if (detail::overlaps(so, sl)) fail(who, "lse", "overlaps out");
  for (const auto& [name, s] : {std::pair{"other", sb}, std::pair{"other_lse", sbl}})
    if (detail::overlaps(s, so) || detail::overlaps(s, sl)) fail(who, name, "overlaps out or lse");
}

}  // namespace

void merge_state_in_place(const TensorView& out, const TensorView& lse, const TensorView& other,
                          const TensorView& other_lse) {
  validate_in_place(out, lse, other, other_lse);
  detail::dispatch_dtype(out.dtype, [&]<class T>() {
    using A = detail::Acc<T>;
    const std::int64_t rows = out.shape[0], heads = out.shape[2], d = out.shape[3];
    PartialState<A> acc(d), part(d);
    std::vector<A> result(static_cast<std::size_t>(d));
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t h = 0; h < heads; ++h) {
        A* l = static_cast<A*>(lse.data) + r * lse.strides[0] + h * lse.strides[2];
        const A other_l = static_cast<const A*>(other_lse.data)[r * other_lse.strides[0] + h * other_lse.strides[2]];
        T* o = detail::row_ptr<T>(out, r, 0, h);
        reset(acc.view());
        detail::merge_output(acc.view(), part, *l, o, out.strides[3]);
        detail::merge_output(acc.view(), part, other_l, detail::row_ptr<const T>(other, r, 0, h), other.strides[3]);
        *l = finalize(acc.view(), result.data());
        for (std::int64_t c = 0; c < d; ++c)
          o[c * out.strides[3]] = detail::store<T>(result[static_cast<std::size_t>(c)]);
      }
  });
}

void merge_states(const TensorView& parts, const TensorView& parts_lse, const TensorView& out, const TensorView* lse) {
  validate(parts, parts_lse, out, lse);
  detail::dispatch_dtype(parts.dtype, [&]<class T>() { run<T>(parts, parts_lse, out, lse); });
}

}  // namespace attn
