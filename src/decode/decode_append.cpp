// The in-place append of k_new/v_new into the cache, after validation (CPU; the CUDA backend appends
// in its decode launch).
#include <cstring>
#include <utility>
#include <vector>

#include "core/problem.hpp"
#include "core/rotary.hpp"
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
    for (std::int64_t t = 0; t < p.seqlen_new; ++t) {
      const std::int64_t pos = p.seqlens[b] + t, at = p.row_offset(p.k, b, pos);
      for (std::int64_t g = 0; g < p.kv_heads; ++g) {
        const T* from = row_ptr<const T>(src, b, t, g);
        for (std::int64_t c = 0; c < p.head_dim; ++c)
          row[static_cast<std::size_t>(c)] = load<A>(from[c * src.strides[3]]);
        rotate_row(row.data(), *p.rotary, pos);
        T* to = static_cast<T*>(p.k.data) + at + g * p.k.strides[2];
        for (std::int64_t c = 0; c < p.head_dim; ++c) to[c] = store<T>(row[static_cast<std::size_t>(c)]);
      }
    }
}

}  // namespace

void append_kv(const DecodeProblem& p) {
  if (!p.k_new || p.seqlen_new == 0) return;
  const std::size_t es = dtype_size(p.cache_dtype);
  if (p.rotary) dispatch_dtype(p.cache_dtype, [&]<class T>() { append_rotated_keys<T>(p); });
  for (auto [src, dst] : {std::pair{p.k_new, &p.k}, {p.v_new, &p.v}}) {
    if (p.rotary && dst == &p.k) continue;  // written rotated above
    auto* base = static_cast<unsigned char*>(dst->data);
    const auto* from = static_cast<const unsigned char*>(src->data);
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t t = 0; t < p.seqlen_new; ++t) {
        const std::int64_t row = p.row_offset(*dst, b, p.seqlens[b] + t);
        for (std::int64_t g = 0; g < p.kv_heads; ++g) {
          unsigned char* to = base + (row + g * dst->strides[2]) * static_cast<std::int64_t>(es);
          const std::int64_t s0 = b * src->strides[0] + t * src->strides[1] + g * src->strides[2];
          for (std::int64_t c = 0; c < p.head_dim; ++c)
            std::memcpy(to + c * static_cast<std::int64_t>(es),
                        from + (s0 + c * src->strides[3]) * static_cast<std::int64_t>(es), es);
        }
      }
  }
}

}  // namespace attn::detail
