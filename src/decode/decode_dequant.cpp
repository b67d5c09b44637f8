// Dequantizing rows of a quantized cache to f32 (Highway, every target, dispatched at run time): out =
// float(stored) * scale, the rule of core/quant.hpp, with the conversions of decode_quant-inl.h that the
// decode kernel uses in registers. The kernel never needs whole f32 rows; this is the conversions'
// test hook (tests/test_decode_quantized.cpp checks every code of every type on every SIMD target
// against the scalar rule) and a tool for callers that want the cache's values.
#include <cmath>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "decode/decode_dequant.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "core/element.hpp"
#include "core/quant.hpp"
#include "decode/decode_internal.hpp"
#include "decode/decode_quant-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

template <DType kType>
void DequantizeRows(const QuantRows& r) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df)), size = r.head_dim / r.groups;
  for (std::int64_t c = 0; c < r.n; ++c) {
    const std::uint8_t* row = r.rows[c];
    float* out = r.out + c * r.head_dim;
    for (std::int64_t x = 0; x < r.groups; ++x) {
      const float s = r.scales[c * r.groups + x];
      const VF vs = hn::Set(df, s * stored_unit(kType));
      std::int64_t e = x * size;
      const std::int64_t end = e + size;
      for (; e + N <= end; e += N) hn::StoreU(hn::Mul(LoadStored<kType>(df, row + e), vs), df, out + e);
      for (; e < end; ++e) out[e] = stored_value(kType, row[e]) * s;
    }
  }
}

// F16C's conversion where Highway has it (AVX2 and later); elsewhere Highway emulates it and reads exponent
// 31 as a number, so the scalar conversion runs (a NaN scale must stay NaN).
void WidenF16(const std::uint16_t* src, std::int64_t n, float* dst) {
  std::int64_t i = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> df16;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  for (; i + N <= n; i += N)
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(src) + i)), df, dst + i);
#endif
  for (; i < n; ++i) dst[i] = f16_to_float(f16_t{src[i]});
}

void DequantizeDispatch(const QuantRows& r, DType t) {
  switch (t) {
    case DType::i8:
      return DequantizeRows<DType::i8>(r);
    case DType::fp8_e4m3:
      return DequantizeRows<DType::fp8_e4m3>(r);
    default:
      return DequantizeRows<DType::fp8_e5m2>(r);
  }
}

}  // namespace attn::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
HWY_EXPORT(DequantizeDispatch);
HWY_EXPORT(WidenF16);
void decode_widen_f16(const std::uint16_t* src, std::int64_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(WidenF16)(src, n, dst);
}
void dequantize_rows(const QuantRows& r, DType cache_dtype) {
  HWY_DYNAMIC_DISPATCH(DequantizeDispatch)(r, cache_dtype);
}
}  // namespace attn::detail
#endif
