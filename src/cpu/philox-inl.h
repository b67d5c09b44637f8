// Philox 4x32-10 on SIMD lanes and the dropout factors it gives, a Highway per-target header for the
// kernels that drop P (and dP) inside their foreach_target. The rounds re-express philox4x32_10
// (core/philox.hpp), the rule's element mapping is DropoutRule's (core/dropout.hpp). Two lane layouts:
//   GroupFactors / DropTile   lanes along query rows, one key group per call: lane r holds the counter
//                             {g, i_r, head word_r, offset} (the tiled forward's and the backwards' P^T)
//   DropRowFactors            lanes along key groups of one row: lane l holds {g0 + l, i, head word,
//                             offset} (the AMX forward, whose P rows run along the keys)
// tests/test_dropout.cpp holds every kernel's mask to the rule's.
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

// The four words of each lane's counter {g, i, head word, offset}: c[t] lane l decides key 4 g_l + t of
// the row (i_l, head word_l). One vector Philox call.
template <class DU, class V = hn::Vec<DU>>
HWY_INLINE void Keep4Words(DU du, const DropoutRule& rule, V g, V i, V head_word, V (&c)[4]) {
  c[0] = g;
  c[1] = i;
  c[2] = head_word;
  c[3] = hn::Set(du, rule.offset);
  std::uint32_t k0 = rule.key0(), k1 = rule.key1();
  for (int round = 0; round < kPhiloxRounds; ++round, k0 += kPhiloxW0, k1 += kPhiloxW1) PhiloxRound(du, c, k0, k1);
}
#else
// One lane (HWY_SCALAR): philox4x32_10 itself.
template <class DU, class V = hn::Vec<DU>>
HWY_INLINE void Keep4Words(DU du, const DropoutRule& rule, V g, V i, V head_word, V (&c)[4]) {
  const PhiloxWords w =
      philox4x32_10(hn::GetLane(g), hn::GetLane(i), hn::GetLane(head_word), rule.offset, rule.key0(), rule.key1());
  for (int t = 0; t < 4; ++t) c[t] = hn::Set(du, w.w[t]);
}
#endif

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

// The factors of key group g for a vector of rows, query positions ci and head words ch: f[t] lane r is
// the factor of key 4g + t of row r. One vector Philox call.
template <class D, class DU = hn::Rebind<std::uint32_t, D>>
HWY_INLINE void GroupFactors(D d, const DropoutRule& rule, std::int64_t g, hn::Vec<DU> ci, hn::Vec<DU> ch,
                             hn::Vec<D> (&f)[4]) {
  const DU du;
  hn::Vec<DU> c[4];
  Keep4Words(du, rule, hn::Set(du, static_cast<std::uint32_t>(g)), ci, ch, c);
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) f[t] = DropFactor(d, du, c[t], rule);
}

// A tile t [n][ld] with one row per lane (the kernels' S^T / P^T layout: column c of key j0 + c, lane r
// of query row r), scaled in place by the dropout factors of keys [j0, j0 + n) for rows [0, rows): row
// r's counter is {g, ctr_i[r], ctr_h[r], offset} (its query position and head word), so one SIMD Philox
// call gives four keys of N rows. Every column is scaled, masked keys included: a masked P is exactly
// 0, and 0 x factor is 0. rows is a multiple of the lane count. The forward drops P^T with it; the
// backward drops dP^T and the P of dV.
template <class D, class A = hn::TFromD<D>>
HWY_NOINLINE void DropTile(D d, const DropoutRule& rule, const std::uint32_t* ctr_i, const std::uint32_t* ctr_h,
                           std::int64_t j0, std::int64_t n, A* t, std::size_t ld, std::size_t rows) {
  const hn::Rebind<std::uint32_t, D> du;
  const std::size_t N = hn::Lanes(d);
  for (std::size_t r = 0; r < rows; r += N) {
    const auto ci = hn::LoadU(du, ctr_i + r), ch = hn::LoadU(du, ctr_h + r);
    for (std::int64_t g = j0 >> 2; g <= (j0 + n - 1) >> 2; ++g) {
      hn::Vec<D> f[4];
      GroupFactors(d, rule, g, ci, ch, f);
#pragma GCC unroll 4
      for (int w = 0; w < 4; ++w) {
        const std::int64_t col = g * 4 + w - j0;
        if (col < 0 || col >= n) continue;
        A* x = t + static_cast<std::size_t>(col) * ld + r;
        hn::Store(hn::Mul(hn::Load(d, x), f[w]), d, x);
      }
    }
  }
}

// The f32 factors of keys 4 g0 .. 4 (g0 + groups) - 1 of one row (query position i, head word h), in key
// order: out[k] is key 4 g0 + k's. Lanes along key groups, and StoreInterleaved4 puts each lane's four
// words in key order. Writes `groups` rounded up to the lane count, times 4, floats.
template <class D>
HWY_NOINLINE void DropRowFactors(D d, const DropoutRule& rule, std::uint32_t i, std::uint32_t h, std::int64_t g0,
                                 std::size_t groups, float* out) {
  static_assert(sizeof(hn::TFromD<D>) == 4, "the factors are f32 lanes");
  const hn::RebindToUnsigned<D> du;
  const std::size_t N = hn::Lanes(d);
  const auto lanes = hn::Iota(du, 0u), row = hn::Set(du, i), head = hn::Set(du, h);
  for (std::size_t l = 0; l < groups; l += N, out += 4 * N) {
    const auto g = hn::Add(lanes, hn::Set(du, static_cast<std::uint32_t>(g0 + static_cast<std::int64_t>(l))));
    hn::Vec<decltype(du)> c[4];
    Keep4Words(du, rule, g, row, head, c);
    hn::StoreInterleaved4(DropFactor(d, du, c[0], rule), DropFactor(d, du, c[1], rule), DropFactor(d, du, c[2], rule),
                          DropFactor(d, du, c[3], rule), d, out);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::philox_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_PHILOX_INL_H_
