// The in-place append of k_new/v_new into the cache, after validation (CPU; the CUDA backend appends
// in its decode launch), quantizing them for an i8 / fp8 cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "validate/problem.hpp"
#include "core/quant.hpp"
#include "cpu/rotary.hpp"
#include "decode/decode_internal.hpp"

namespace attn::detail {
namespace {

// The rotary case: each k_new row through the accumulator type, rotated at its cache position, stored
// in the cache's type (v_new is copied as is by append_kv).
template <class T>
void append_rotated_keys(const DecodeProblem& p) {
  using A = Acc<T>;
  const TensorView& src = *p.k_new;
  std::vector<A> row(static_cast<std::size_t>(p.head_dim));
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t t = 0; t < p.index.seqlen_new; ++t) {
      const std::int64_t pos = p.index.append_position(b, t), at = p.row_offset(p.k, b, pos);
      for (std::int64_t g = 0; g < p.kv_heads; ++g) {
        const T* from = row_ptr<const T>(src, b, t, g);
        for (std::int64_t c = 0; c < p.head_dim; ++c)
          row[static_cast<std::size_t>(c)] = load<A>(from[c * src.strides[3]]);
        rotate_row(row.data(), p.rotary, pos);
        T* to = static_cast<T*>(p.k.data) + at + g * p.k.strides[2];
        for (std::int64_t c = 0; c < p.head_dim; ++c) to[c] = store<T>(row[static_cast<std::size_t>(c)]);
      }
    }
}

// One appended row of one kv head, as floats (rotated keys when rotary is on), quantized into the
// cache by core/quant.hpp's rule: per group, its scale computed from the group's largest magnitude and
// written (an owned scale view) or read (a shared one).
void quantize_row(const DecodeProblem& p, const float* row, std::int64_t dim, std::uint8_t* to, const TensorView& scale,
                  bool owned, std::int64_t scale_at) {
  const std::int64_t groups = scale.shape[3], size = dim / groups;
  for (std::int64_t x = 0; x < groups; ++x) {
    const float* in = row + x * size;
    const std::int64_t at = scale_at + x * scale.strides[3];
    float s = 0;
    if (owned) {
      float amax = 0;
      bool finite = true;
      for (std::int64_t c = 0; c < size; ++c) {
        finite = finite && std::isfinite(in[c]);
        amax = std::max(amax, std::fabs(in[c]));
      }
      s = scale_for(p.cache_dtype, finite ? amax : std::numeric_limits<float>::infinity(), scale.dtype);
      write_scale(scale, at, s);
    } else {
      s = read_scale(scale, at);  // validated finite and > 0
    }
    for (std::int64_t c = 0; c < size; ++c) to[x * size + c] = quantize_value(p.cache_dtype, in[c], s);
  }
}

void append_quantized(const DecodeProblem& p) {
  std::vector<float> row(static_cast<std::size_t>(std::max(p.head_dim, p.head_dim_v)));
  const bool k_side[] = {true, false};
  for (bool keys : k_side) {
    const TensorView& src = keys ? *p.k_new : *p.v_new;  // both given: validation rejects k_new alone here
    const std::int64_t dim = keys ? p.head_dim : p.head_dim_v;
    const TensorView& dst = keys ? p.k : p.v;
    const TensorView& scale = keys ? p.k_scale : p.v_scale;
    const bool owned = keys ? p.k_scale_owned : p.v_scale_owned;
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t t = 0; t < p.index.seqlen_new; ++t) {
        const std::int64_t pos = p.index.append_position(b, t), at = p.row_offset(dst, b, pos),
                           sat = p.row_offset(scale, b, pos);
        for (std::int64_t g = 0; g < p.kv_heads; ++g) {
          dispatch_dtype(src.dtype, [&]<class T>() {
            const T* from = row_ptr<const T>(src, b, t, g);
            for (std::int64_t c = 0; c < dim; ++c)
              row[static_cast<std::size_t>(c)] = load<float>(from[c * src.strides[3]]);
          });
          if (keys && p.rotary.enabled()) rotate_row(row.data(), p.rotary, pos);
          quantize_row(p, row.data(), dim, static_cast<std::uint8_t*>(dst.data) + at + g * dst.strides[2], scale, owned,
                       sat + g * scale.strides[2]);
        }
      }
  }
}

}  // namespace

void append_kv(const DecodeProblem& p) {
  if (!p.k_new || p.index.seqlen_new == 0) return;
  if (p.quantized()) return append_quantized(p);
  const std::size_t es = dtype_size(p.cache_dtype);
  if (p.rotary.enabled()) dispatch_dtype(p.cache_dtype, [&]<class T>() { append_rotated_keys<T>(p); });
  // With cache.v inside cache.k's rows (MLA) there is no v_new: the values are the keys just written.
  for (auto [src, dst] : {std::pair{p.k_new, &p.k}, {p.v_new, &p.v}}) {
    if (src == nullptr || (p.rotary.enabled() && dst == &p.k)) continue;  // the keys: written rotated above
    auto* base = static_cast<unsigned char*>(dst->data);
    const auto* from = static_cast<const unsigned char*>(src->data);
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t t = 0; t < p.index.seqlen_new; ++t) {
        const std::int64_t row = p.row_offset(*dst, b, p.index.append_position(b, t));
        for (std::int64_t g = 0; g < p.kv_heads; ++g) {
          unsigned char* to = base + (row + g * dst->strides[2]) * static_cast<std::int64_t>(es);
          const std::int64_t s0 = b * src->strides[0] + t * src->strides[1] + g * src->strides[2];
          for (std::int64_t c = 0; c < src->shape[3]; ++c)
            std::memcpy(to + c * static_cast<std::int64_t>(es),
                        from + (s0 + c * src->strides[3]) * static_cast<std::int64_t>(es), es);
        }
      }
  }
}

}  // namespace attn::detail
