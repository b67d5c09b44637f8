// Packing strided tensor rows into contiguous accumulator-typed tiles with SIMD, a Highway per-target
// header shared by the tiled forward (tiled_kernel.cpp) and the tiled backward
// (backward/backward_kernel.cpp). Included inside foreach_target, once per target.
#if defined(ATTN_TILED_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_TILED_PACK_INL_H_
#undef ATTN_TILED_PACK_INL_H_
#else
#define ATTN_TILED_PACK_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "validate/problem.hpp"
#include "core/element.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::tiled_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// dst[r * ld + c] = t[b, s0 + r, h, c] as accumulator values, r < n, c < dim (row s0 + r found through
// `pages` when they are paged key or value rows). Contiguous rows of f32/f64 are copied, bf16/f16 rows
// widened with SIMD (F16C on x86); other strides go element-wise.
template <class T, class D, class A = hn::TFromD<D>>
HWY_INLINE void PackRows(D d, A* HWY_RESTRICT dst, std::size_t ld, const TensorView& t, std::int64_t b, std::int64_t s0,
                         std::int64_t n, std::int64_t h, std::size_t dim, const PageTable& pages = PageTable{}) {
  const std::size_t N = hn::Lanes(d);
  for (std::int64_t r = 0; r < n; ++r) {
    const T* src = key_row_ptr<const T>(t, pages, b, s0 + r, h);
    A* out = dst + static_cast<std::size_t>(r) * ld;
    if (t.strides[3] != 1) {
      for (std::size_t c = 0; c < dim; ++c) out[c] = load<A>(src[c * t.strides[3]]);
    } else if constexpr (std::is_same_v<T, A>) {
      std::size_t c = 0;
      for (; c + N <= dim; c += N) hn::StoreU(hn::LoadU(d, src + c), d, out + c);
      for (; c < dim; ++c) out[c] = src[c];
    } else if constexpr (std::is_same_v<A, float> && (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>)) {
      using H = std::conditional_t<std::is_same_v<T, bf16_t>, hwy::bfloat16_t, hwy::float16_t>;
      const hn::Rebind<H, D> dh;
      std::size_t c = 0;
      for (; c + N <= dim; c += N)
        hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const H*>(src) + c)), d, out + c);
      for (; c < dim; ++c) out[c] = load<A>(src[c]);
    } else {
      for (std::size_t c = 0; c < dim; ++c) out[c] = load<A>(src[c]);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::tiled_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_TILED_PACK_INL_H_
