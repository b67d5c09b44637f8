// Philox 4x32-10 on SIMD lanes and the dropout factor it gives, a Highway per-target header for the
// kernels that drop a tile of P with one counter per lane (DropTile, used by the tiled forward and the
// tiled backward inside their foreach_target). The rounds re-express philox4x32_10
// (core/philox.hpp), the rule's element mapping is DropoutRule's (core/dropout.hpp): lane r of a call
// for key group g holds the counter {g, i_r, head word_r, offset}. tests/test_dropout.cpp holds every
// kernel's mask to the rule's.
#if defined(ATTN_PHILOX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_PHILOX_INL_H_
#undef ATTN_PHILOX_INL_H_
#else
#define ATTN_PHILOX_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

#include "core/dropout.hpp"
#include "core/philox.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::philox_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR
// One round on u32 lanes: MulEven gives the 32x32 -> 64-bit products of the even lanes, and of the odd
// lanes after a 32-bit shift; OddEven regroups their halves into lane order.
template <class DU, class V = hn::Vec<DU>>
HWY_INLINE void PhiloxRound(DU du, V (&c)[4], std::uint32_t k0, std::uint32_t k1) {
  const hn::RepartitionToWide<DU> dw;
  V hi[2], lo[2];
  const std::uint32_t mul[2] = {kPhiloxM0, kPhiloxM1};
  const V in[2] = {c[0], c[2]};
#pragma GCC unroll 2  // arrays of vectors stay in registers only when their loops are unrolled
  for (int t = 0; t < 2; ++t) {
    const V m = hn::Set(du, mul[t]);
    const auto even = hn::MulEven(in[t], m);
    const auto odd = hn::MulEven(hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(dw, in[t]))), m);
    lo[t] = hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(odd)), hn::BitCast(du, even));
    hi[t] = hn::OddEven(hn::BitCast(du, odd), hn::BitCast(du, hn::ShiftRight<32>(even)));
  }
  const V c1 = c[1], c3 = c[3];
  c[0] = hn::Xor(hn::Xor(hi[1], c1), hn::Set(du, k0));
  c[1] = lo[1];
  c[2] = hn::Xor(hn::Xor(hi[0], c3), hn::Set(du, k1));
  c[3] = lo[0];
}

// The four words of key group g for each lane's row (i and head word per lane): c[t] lane r decides key
// 4g + t of row r. One vector Philox call.
template <class DU, class V = hn::Vec<DU>>
HWY_INLINE void Keep4Words(DU du, const DropoutRule& rule, std::int64_t g, V i, V head_word, V (&c)[4]) {
  c[0] = hn::Set(du, static_cast<std::uint32_t>(g));
  c[1] = i;
  c[2] = head_word;
  c[3] = hn::Set(du, rule.offset);
  std::uint32_t k0 = rule.key0(), k1 = rule.key1();
  for (int round = 0; round < kPhiloxRounds; ++round, k0 += kPhiloxW0, k1 += kPhiloxW1) PhiloxRound(du, c, k0, k1);
}

// The factor of one word vector in the accumulator's lanes (D has DU's lane count): 1 / (1 - p) where the
// word is below the threshold, else +0. The all-ones compare lanes are the factor's bit mask: as they
// are for f32, sign-extended from 32 to 64 bits for f64.
template <class D, class DU>
HWY_INLINE hn::Vec<D> DropFactor(D d, DU du, hn::Vec<DU> word, const DropoutRule& rule) {
  const auto keep = hn::VecFromMask(du, hn::Lt(word, hn::Set(du, rule.threshold)));
  const auto scale = hn::Set(d, static_cast<hn::TFromD<D>>(rule.scale));
  if constexpr (sizeof(hn::TFromD<D>) == 4) {
    return hn::And(hn::BitCast(d, keep), scale);
  } else {
    const hn::Rebind<std::int32_t, D> di32;
    const hn::Rebind<std::int64_t, D> di64;
    return hn::And(hn::BitCast(d, hn::PromoteTo(di64, hn::BitCast(di32, keep))), scale);
  }
}
#endif  // HWY_TARGET != HWY_SCALAR

// A tile t [n][ld] with one row per lane (the kernels' S^T / P^T layout: column c of key j0 + c, lane r
// of query row r), scaled in place by the dropout factors of keys [j0, j0 + n) for rows [0, rows): row
// r's counter is {g, ctr_i[r], ctr_h[r], offset} (its query position and head word), so one SIMD Philox
// call gives four keys of N rows. Every column is scaled, masked keys included: a masked P is exactly
// 0, and 0 x factor is 0. rows is a multiple of the lane count. The forward drops P^T with it; the
// backward drops dP^T and the P of dV.
#if HWY_TARGET != HWY_SCALAR
template <class D, class A = hn::TFromD<D>>
HWY_NOINLINE void DropTile(D d, const DropoutRule& rule, const std::uint32_t* ctr_i, const std::uint32_t* ctr_h,
                           std::int64_t j0, std::int64_t n, A* t, std::size_t ld, std::size_t rows) {
  const hn::Rebind<std::uint32_t, D> du;
  const std::size_t N = hn::Lanes(d);
  for (std::size_t r = 0; r < rows; r += N) {
    const auto ci = hn::LoadU(du, ctr_i + r), ch = hn::LoadU(du, ctr_h + r);
    for (std::int64_t g = j0 >> 2; g <= (j0 + n - 1) >> 2; ++g) {
      hn::Vec<decltype(du)> c[4];
      Keep4Words(du, rule, g, ci, ch, c);
#pragma GCC unroll 4
      for (int w = 0; w < 4; ++w) {
        const std::int64_t col = g * 4 + w - j0;
        if (col < 0 || col >= n) continue;
        A* x = t + static_cast<std::size_t>(col) * ld + r;
        hn::Store(hn::Mul(hn::Load(d, x), DropFactor(d, du, c[w], rule)), d, x);
      }
    }
  }
}
#else
// One lane (HWY_SCALAR): philox4x32_10 itself, four keys of one row per call.
template <class D, class A = hn::TFromD<D>>
HWY_NOINLINE void DropTile(D, const DropoutRule& rule, const std::uint32_t* ctr_i, const std::uint32_t* ctr_h,
                           std::int64_t j0, std::int64_t n, A* t, std::size_t ld, std::size_t rows) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::int64_t g = j0 >> 2; g <= (j0 + n - 1) >> 2; ++g) {
      const PhiloxWords w =
          philox4x32_10(static_cast<std::uint32_t>(g), ctr_i[r], ctr_h[r], rule.offset, rule.key0(), rule.key1());
      for (int k = 0; k < 4; ++k) {
        const std::int64_t col = g * 4 + k - j0;
        if (col >= 0 && col < n)
          t[static_cast<std::size_t>(col) * ld + r] *= w.w[k] < rule.threshold ? A(rule.scale) : A(0);
      }
    }
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::philox_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_PHILOX_INL_H_
