// f32 to bf16 on SIMD lanes for the AMX kernels (forward, backward), a Highway per-target header: the
// rounding that turns P (and the backward's dS) into the tiles' bf16 operands. Included inside
// foreach_target.
#if defined(ATTN_AMX_ROUND_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_AMX_ROUND_INL_H_
#undef ATTN_AMX_ROUND_INL_H_
#else
#define ATTN_AMX_ROUND_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

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

// Stores the high halves of x's lanes (bf16 patterns from RoundToBf16) as N 16-bit values.
template <class D>
HWY_INLINE void StoreBf16(D /*d*/, hn::Vec<D> x, std::uint16_t* dst) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const hn::Rebind<std::uint16_t, D> d16;  // the values are < 2^16: the saturating demotion keeps them
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, x)))), d16, dst);
}

// Two rows' bf16 patterns (RoundToBf16) as pairs, the tiles' VNNI layout along those rows: lane i holds
// (lo[i], hi[i]) as one 32-bit word.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> PairBf16(D /*d*/, hn::Vec<D> lo, hn::Vec<D> hi) {
  const hn::RebindToUnsigned<D> du;
  return hn::Or(hn::ShiftRight<16>(hn::BitCast(du, lo)), hn::BitCast(du, hi));
}

// RoundToBf16 and StoreBf16 in one instruction where the CPU's tiles run: VCVTNEPS2BF16 (AVX512-BF16,
// which every AMX CPU has) rounds to nearest even as RoundToBf16 does, except that it reads a subnormal
// p as zero, which TDPBF16PS then does with RoundToBf16's subnormal too: the products are the same bit
// for bit. Inline assembly, so that the kernel needs no avx512bf16 attribute (its emulated instance runs
// on CPUs without it).
template <bool kNative, class D>
HWY_INLINE void StoreRoundedBf16(D d, hn::Vec<D> x, std::uint16_t* dst) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (kNative) {
    __m256i packed;
    __asm__("vcvtneps2bf16 %1, %0" : "=v"(packed) : "v"(x.raw));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), packed);
    return;
  }
#endif
  StoreBf16(d, RoundToBf16(d, x), dst);
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::amx_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_AMX_ROUND_INL_H_
