// The rules of quantized KV caches (include/attn/decode.hpp, "Quantized caches"), for validate_decode:
//   q: dtype must be f32, bf16 or f16 for a quantized cache; out: q's (checked by validate_decode)
//   k_new: dtype must be f32, bf16 or f16; v_new: k_new's
//   cache.k_scale / cache.v_scale: only for quantized caches; for them required, rank 4, dtype f32 or
//       f16, [cache rows, slots, kv_heads, groups] like cache.k, groups dividing cache.k's / cache.v's
//       head_dim
//   appending with given (shared) scales: each scale used finite and > 0, every appended value finite
#include <cmath>
#include <string>

#include "validate/decode_problem.hpp"
#include "core/element.hpp"
#include "validate/problem.hpp"
#include "core/quant.hpp"
#include "validate/validate.hpp"

namespace attn::detail {
namespace {

std::string name(DType t) { return std::string(dtype_name(t)); }

bool is_activation_type(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// `values` (cache.k or cache.v, named `values_name`) is the view whose rows the scales scale.
Span check_scale(std::string_view who, const char* arg, const TensorView& s, const KVCache& cache,
                 const TensorView& values, const char* values_name) {
  const std::int64_t d = values.shape[3];
  const bool quantized = is_quantized(cache.k.dtype);
  if (!quantized) {
    if (s.data || s.rank != 0) fail(who, arg, "only for quantized caches (cache.k is " + name(cache.k.dtype) + ")");
    return {};
  }
  if (s.rank == 0 && !s.data) fail(who, arg, "required for a quantized cache (cache.k is " + name(cache.k.dtype) + ")");
  const Span span = check_view(who, arg, s, 4, true);
  if (s.dtype != DType::f32 && s.dtype != DType::f16) fail(who, arg, "dtype must be f32 or f16, got " + name(s.dtype));
  static constexpr const char* kDims[] = {"rows", "slots", "kv_heads"};
  for (int i = 0; i < 3; ++i)
    if (s.shape[i] != cache.k.shape[i])
      fail(who, arg,
           std::string(kDims[i]) + " (shape[" + std::to_string(i) + "]) must equal cache.k's (" +
               std::to_string(cache.k.shape[i]) + "), got " + std::to_string(s.shape[i]));
  if (d % s.shape[3] != 0)
    fail(who, arg,
         "groups (shape[3] = " + std::to_string(s.shape[3]) + ") must divide " + values_name + "'s head_dim (" +
             std::to_string(d) + ")");
  return span;
}

}  // namespace

void check_quantized_types(std::string_view who, DType cache_dtype, const TensorView& q, const DecodeOptions& dec) {
  if (!is_activation_type(q.dtype))
    fail(who, "q",
         "dtype must be f32, bf16 or f16 for a quantized cache (cache.k is " + name(cache_dtype) + "), got " +
             name(q.dtype));
  if (!dec.k_new) return;
  if (!is_activation_type(dec.k_new->dtype))
    fail(who, "k_new",
         "dtype must be f32, bf16 or f16 (it is quantized into the " + name(cache_dtype) + " cache), got " +
             name(dec.k_new->dtype));
  if (dec.v_new && dec.v_new->dtype != dec.k_new->dtype)
    fail(who, "v_new", "dtype must match k_new's (" + name(dec.k_new->dtype) + "), got " + name(dec.v_new->dtype));
}

CacheScales check_cache_scales(std::string_view who, const KVCache& cache) {
  CacheScales s;
  s.k_span = check_scale(who, "cache.k_scale", cache.k_scale, cache, cache.k, "cache.k");
  s.v_span = check_scale(who, "cache.v_scale", cache.v_scale, cache, cache.v, "cache.v");
  if (!is_quantized(cache.k.dtype)) return s;
  s.k = cache.k_scale;
  s.v = cache.v_scale;
  s.k_owned = aliasing_dim(s.k) < 0;
  s.v_owned = aliasing_dim(s.v) < 0;
  return s;
}

void check_quantized_append(std::string_view who, const DecodeProblem& p) {
  if (!p.quantized() || p.index.seqlen_new == 0) return;
  struct Side {
    const char* scale_arg;
    const char* new_arg;
    const TensorView& scale;
    bool owned;
    const TensorView& values;
    std::int64_t dim;
  };
  const Side sides[] = {{"cache.k_scale", "k_new", p.k_scale, p.k_scale_owned, *p.k_new, p.head_dim},
                        {"cache.v_scale", "v_new", p.v_scale, p.v_scale_owned, *p.v_new, p.head_dim_v}};
  for (const Side& side : sides) {
    if (side.owned) continue;  // computed from the values
    const std::int64_t groups = side.scale.shape[3];
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t t = 0; t < p.index.seqlen_new; ++t) {
        const std::int64_t pos = p.index.append_position(b, t);
        for (std::int64_t g = 0; g < p.kv_heads; ++g) {
          for (std::int64_t x = 0; x < groups; ++x) {
            const float s = read_scale(
                side.scale, p.row_offset(side.scale, b, pos) + g * side.scale.strides[2] + x * side.scale.strides[3]);
            if (!(std::isfinite(s) && s > 0))
              fail(who, side.scale_arg,
                   "a given (shared) scale must be finite and > 0 to quantize the appended values, got " +
                       std::to_string(s) + " for sequence " + std::to_string(b) + ", position " + std::to_string(pos) +
                       ", kv head " + std::to_string(g));
          }
          dispatch_dtype(side.values.dtype, [&]<class T>() {
            const T* row = row_ptr<const T>(side.values, b, t, g);
            for (std::int64_t c = 0; c < side.dim; ++c)
              if (!std::isfinite(load<float>(row[c * side.values.strides[3]])))
                fail(who, side.new_arg,
                     "a non-finite value cannot be quantized with a given (shared) scale (sequence " +
                         std::to_string(b) + ", row " + std::to_string(t) + ", kv head " + std::to_string(g) +
                         ", element " + std::to_string(c) + ")");
          });
        }
      }
  }
}

}  // namespace attn::detail
