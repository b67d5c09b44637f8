// f32 to bf16 and f16 on SIMD lanes for the AMX kernels (forward, backward), a Highway per-target header:
// the rounding that turns P (and the backward's dS) into the tiles' 16-bit operands. Included inside
// foreach_target.
#if defined(ATTN_AMX_ROUND_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_AMX_ROUND_INL_H_
#undef ATTN_AMX_ROUND_INL_H_
#else
#define ATTN_AMX_ROUND_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/element.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::amx_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// f32 lanes rounded to bf16, to nearest even (NaN stays NaN), as the 32-bit patterns of the bf16 values
// (the low 16 bits zero).
template <class D>
HWY_INLINE hn::Vec<D> RoundToBf16(D /*d*/, hn::Vec<D> x) {
  const hn::RebindToUnsigned<D> du;
  const auto bits = hn::BitCast(du, x);
  const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto rounded = hn::And(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), odd)), hn::Set(du, 0xFFFF0000u));
  const auto quiet_nan = hn::Or(bits, hn::Set(du, 0x00400000u));
  return hn::BitCast(
      D(), hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), hn::And(quiet_nan, hn::Set(du, 0xFFFF0000u)), rounded));
}

// f32 lanes rounded to f16 (to nearest even, overflow to Inf, NaN quieted), as the f16 patterns in the low
// 16 bits of each lane: float_to_f16 (core/element.hpp) on lanes, operation for operation, so the two give
// the same bits.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> RoundToF16(D d, hn::Vec<D> x) {
  const hn::RebindToUnsigned<D> du;
  const auto w = hn::BitCast(du, x), mag = hn::ShiftLeft<1>(w), sign = hn::And(w, hn::Set(du, 0x80000000u));
  auto base = hn::Mul(hn::Mul(hn::BitCast(d, hn::And(w, hn::Set(du, 0x7fffffffu))), hn::Set(d, 0x1.0p+112f)),
                      hn::Set(d, 0x1.0p-110f));
  const auto bias = hn::Max(hn::And(mag, hn::Set(du, 0xFF000000u)), hn::Set(du, 0x71000000u));
  base = hn::Add(hn::BitCast(d, hn::Add(hn::ShiftRight<1>(bias), hn::Set(du, 0x07800000u))), base);
  const auto bits = hn::BitCast(du, base);
  const auto nonsign =
      hn::Add(hn::And(hn::ShiftRight<13>(bits), hn::Set(du, 0x7C00u)), hn::And(bits, hn::Set(du, 0x0FFFu)));
  const auto nan = hn::Gt(mag, hn::Set(du, 0xFF000000u));
  return hn::Or(hn::ShiftRight<16>(sign), hn::IfThenElse(nan, hn::Set(du, 0x7E00u), nonsign));
}

// x rounded to E (bf16_t or f16_t), as E's 16-bit patterns in the low halves of u32 lanes; Store16 and
// Pair16 take them. (RoundToBf16 keeps its patterns in the high halves, as f32 values.)
template <class E, class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> Rounded16(D d, hn::Vec<D> x) {
  if constexpr (std::is_same_v<E, bf16_t>)
    return hn::ShiftRight<16>(hn::BitCast(hn::RebindToUnsigned<D>(), RoundToBf16(d, x)));
  else
    return RoundToF16(d, x);
}

// Rounded16's patterns stored as N 16-bit values.
template <class D>
HWY_INLINE void Store16(D /*d*/, hn::Vec<hn::RebindToUnsigned<D>> bits, std::uint16_t* dst) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<std::uint16_t, D> d16;  // the values are < 2^16: the saturating demotion keeps them
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, bits)), d16, dst);
}

// Two rows' Rounded16 patterns as pairs, the tiles' VNNI layout along those rows: lane i holds
// (lo[i], hi[i]) as one 32-bit word.
template <class DU>
HWY_INLINE hn::Vec<DU> Pair16(DU /*du*/, hn::Vec<DU> lo, hn::Vec<DU> hi) {
  return hn::Or(lo, hn::ShiftLeft<16>(hi));
}

// P rounded to the tiles' element type E (bf16_t or f16_t) and stored as N 16-bit values: in one
// instruction where the CPU's tiles run (kNative), else Store16(Rounded16). VCVTNEPS2BF16 (AVX512-BF16,
// which every AMX CPU has) rounds to nearest even as RoundToBf16 does, except that it reads a subnormal p
// as zero, which TDPBF16PS then does with RoundToBf16's subnormal too: the products are the same bit for
// bit. VCVTPS2PH (F16C) rounds to nearest even as RoundToF16. Inline assembly, so that the kernels need no
// avx512bf16 attribute (their emulated instances run on CPUs without it).
template <class E, bool kNative, class D>
HWY_INLINE void StoreRounded(D d, hn::Vec<D> x, std::uint16_t* dst) {
  static_assert(std::is_same_v<E, bf16_t> || std::is_same_v<E, f16_t>, "the tiles take bf16 or f16");
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kNative) {
    __m256i packed;
    if constexpr (std::is_same_v<E, bf16_t>)
      __asm__("vcvtneps2bf16 %1, %0" : "=v"(packed) : "v"(x.raw));
    else
      __asm__("vcvtps2ph $0, %1, %0" : "=v"(packed) : "v"(x.raw));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), packed);
    return;
  }
#endif
  Store16(d, Rounded16<E>(d, x), dst);
}

// f32 on bf16 tiles by parts (bf16x3, oneMKL's float_to_bf16x3): x as the sum of three bf16 values, each the
// nearest (to even) to what the earlier ones left, |x - sum| <= 2^-27 |x| for normal x. The tiles then sum
// six part products (a0 b0 ... a2 b0; the three smallest, a1 b2, a2 b1, a2 b2, are below f32's rounding).
// A non-finite x is its first part and zeros (x - x would be NaN); a first part that rounds past bf16's
// largest value is truncated instead. Scalar, for the packing of Q, K and V.
struct Bf16Parts {
  std::uint16_t part[3];
};
inline Bf16Parts SplitBf16x3(float x) {
  Bf16Parts out;
  float rest = x;
  for (std::uint16_t& part : out.part) {
    bf16_t b = float_to_bf16(rest);
    if (std::isfinite(rest) && !std::isfinite(bf16_to_float(b)))
      b.bits = static_cast<std::uint16_t>(float_bits(rest) >> 16);
    part = b.bits;
    rest = std::isfinite(rest) ? rest - bf16_to_float(b) : 0.0f;
  }
  return out;
}

// SplitBf16x3 on lanes, for any input (the packing of K and V): the three parts' bf16 patterns in the
// low halves of u32 lanes, bit for bit SplitBf16x3's (an Inf or NaN its first part and zeros, a first part
// past bf16's largest value truncated).
template <class D>
HWY_INLINE void SplitInputBf16x3(D d, hn::Vec<D> x, hn::Vec<hn::RebindToUnsigned<D>>* parts) {
  const hn::RebindToUnsigned<D> du;
  const auto finite = hn::IsFinite(x);
  const auto rounded = RoundToBf16(d, x);
  const auto truncated = hn::BitCast(d, hn::And(hn::BitCast(du, x), hn::Set(du, 0xFFFF0000u)));
  const auto first = hn::IfThenElse(hn::AndNot(hn::IsFinite(rounded), finite), truncated, rounded);
  auto rest = hn::IfThenElseZero(finite, hn::Sub(x, first));
  parts[0] = hn::ShiftRight<16>(hn::BitCast(du, first));
  const auto second = RoundToBf16(d, rest);
  parts[1] = hn::ShiftRight<16>(hn::BitCast(du, second));
  rest = hn::Sub(rest, second);
  parts[2] = hn::ShiftRight<16>(hn::BitCast(du, RoundToBf16(d, rest)));
}

// SplitInputBf16x3's three parts stored as N bf16 values each at dst[0], dst[plane], dst[2 plane].
template <class D>
HWY_INLINE void StoreSplitInput(D d, hn::Vec<D> x, std::uint16_t* dst, std::size_t plane) {
  hn::Vec<hn::RebindToUnsigned<D>> parts[3];
  SplitInputBf16x3(d, x, parts);
  for (std::size_t k = 0; k < 3; ++k) Store16(d, parts[k], dst + k * plane);
}

// P split into its three bf16 parts and stored as StoreSplitInput stores them, for P finite (at most
// 1 / (1 - dropout)) or NaN (a poisoned row: its first part NaN, the others NaN by the instruction and
// zero in software, the row NaN either way). Where the CPU's tiles run (kNative), each part is one
// VCVTNEPS2BF16 and its widening one shift, against about seven integer operations for RoundToBf16: the
// same bits but where a rest is subnormal (P below about 2^-100), which VCVTNEPS2BF16 reads as zero and
// TDPBF16PS reads RoundToBf16's subnormal as: the same products.
template <bool kNative, class D>
HWY_INLINE void StoreSplitBf16x3(D d, hn::Vec<D> x, std::uint16_t* dst, std::size_t plane) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kNative) {
    __m512 rest = x.raw;
    for (std::size_t k = 0; k < 3; ++k) {
      __m256i part;
      __asm__("vcvtneps2bf16 %1, %0" : "=v"(part) : "v"(rest));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + k * plane), part);
      rest = _mm512_sub_ps(rest, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(part), 16)));
    }
    return;
  }
#endif
  StoreSplitInput(d, x, dst, plane);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::amx_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_AMX_ROUND_INL_H_
