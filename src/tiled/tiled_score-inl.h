// The score half of the tiled kernel (tiled_kernel.cpp), a Highway per-target header: the register
// budget, the per-row tile facts, S^T = K Q^T for one register block (f32/f64 FMAs, or VDPBF16PS on
// bf16 pairs) with the score transform and the mask applied in registers, and the bf16 pair packing.
// Included by tiled_kernel.cpp inside foreach_target, once per target.
#if defined(ATTN_TILED_SCORE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_TILED_SCORE_INL_H_
#undef ATTN_TILED_SCORE_INL_H_
#else
#define ATTN_TILED_SCORE_INL_H_
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/dpbf16.hpp"
#include "core/element.hpp"
#include "validate/problem.hpp"
#include "core/score_rule.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::tiled_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Register budget of the target: 32 vector registers on AVX-512 and NEON, 16 on SSE/AVX2.
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_ARCH_ARM
constexpr int kRegs = 32;
#else
constexpr int kRegs = 16;
#endif
// Scores: RK keys x QV query vectors of accumulators, plus QV loads and one broadcast: 6 x 4 + 4 + 1
// of 32 registers, 3 x 3 + 3 + 1 of 16 (3 x 4 + 4 + 1 would be 17, and GCC then reads three of the four
// q vectors from memory for every key: 13 loads per 12 FMAs; 4 x 3 + 3 + 1 = 16 spills an accumulator).
// o-update: kPvRows query rows x up to kMaxCv vectors of d.
constexpr int kRK = kRegs == 32 ? 6 : 3;
constexpr int kQV = kRegs == 32 ? 4 : 3;
constexpr int kPvRows = 4;
constexpr int kMaxCv = kRegs == 32 ? 6 : 3;

// The score functions of AVX-512 targets may hold VDPBF16PS (cpu/dpbf16.hpp; used only for bf16 inputs
// on CPUs that have it); every other instruction they contain is the target's own.
#undef ATTN_SCORE_ATTR
#if ATTN_DPBF16_TARGET
#define ATTN_SCORE_ATTR ATTN_DPBF16_ATTR
#else
#define ATTN_SCORE_ATTR
#endif

// The register blocks below are arrays of vectors: every loop over them must be unrolled, or GCC
// keeps the accumulators in memory.
#ifndef ATTN_UNROLL
#define ATTN_UNROLL _Pragma("GCC unroll 32")
#endif

// Makes the compiler hold v in a register from here on. On 16-register x86 targets GCC otherwise
// folds the query loads of the score block into the FMAs as memory operands and reads each q vector
// once per key of the block: 13 loads per 12 FMAs, more than two 256-bit loads a cycle can feed.
template <class V>
HWY_INLINE V KeepInRegister(V v) {
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4)
  auto raw = v.raw;
  asm("" : "+x"(raw));
  v.raw = raw;
#endif
  return v;
}

inline std::size_t RoundUp(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

// Per-tile facts about each stacked row, relative to the tile's first key j0, in the accumulator type
// (small integers, exact): row r sees tile keys c with lo[r] <= c < hi[r]; dist[r] = diagonal(i) - j0.
template <class A>
struct Rows {
  A *m, *l, *alpha, *mtile, *lo, *hi, *dist, *slope;
};

// The tile keys [lo, hi) that some row of [r_begin, r_end) sees (lo >= hi: none), leaving out the rows
// that see none of the tile: on a tile that cuts through windows, key blocks outside it need no work.
template <class A>
HWY_INLINE void KeysSomeRowSees(const Rows<A>& rows, std::size_t r_begin, std::size_t r_end, A n, A& lo, A& hi) {
  lo = n;
  hi = 0;
  for (std::size_t r = r_begin; r < r_end; ++r) {
    if (rows.lo[r] >= rows.hi[r]) continue;
    lo = std::min(lo, rows.lo[r]);
    hi = std::max(hi, rows.hi[r]);
  }
}

// The tile's score rule, and whether the tile cuts through some row's window.
struct Epilogue {
  const ScoreRule* rule;
  bool mask;
};

// The score rule's transform (ScoreRule::logit: scale, soft-cap, ALiBi) and the mask, applied in registers to
// the dot products acc[kk][v] of keys c0 + kk and query lanes r0 + v*N ..; stored to S^T, the row
// maxima of the tile tracked.
template <int RK_, int QV_, class D, class A = hn::TFromD<D>>
ATTN_SCORE_ATTR HWY_INLINE void ScoreEpilogue(D d, hn::Vec<D> (&acc)[RK_][QV_], std::size_t R, std::size_t c0,
                                              std::size_t r0, A* HWY_RESTRICT s, const Rows<A>& rows,
                                              const Epilogue& ep) {
  const std::size_t N = hn::Lanes(d);
  const double softcap = ep.rule->softcap;
  const bool alibi = ep.rule->alibi_slopes != nullptr;
  const auto scale = hn::Set(d, static_cast<A>(ep.rule->scale));
  const auto cap = hn::Set(d, static_cast<A>(softcap));
  const auto neg_inf = hn::Set(d, -std::numeric_limits<A>::infinity());
  ATTN_UNROLL
  for (int v = 0; v < QV_; ++v) {
    const std::size_t r = r0 + v * N;
    auto mx = hn::Load(d, rows.mtile + r);
    ATTN_UNROLL
    for (int kk = 0; kk < RK_; ++kk) {
      auto sc = hn::Mul(acc[kk][v], scale);
      if (softcap > 0) sc = hn::Mul(cap, hn::Tanh(d, hn::Div(sc, cap)));
      const auto c = hn::Set(d, static_cast<A>(c0 + kk));
      if (alibi) sc = hn::NegMulAdd(hn::Load(d, rows.slope + r), hn::Abs(hn::Sub(hn::Load(d, rows.dist + r), c)), sc);
      if (ep.mask) {
        const auto hidden = hn::Or(hn::Lt(c, hn::Load(d, rows.lo + r)), hn::Ge(c, hn::Load(d, rows.hi + r)));
        sc = hn::IfThenElse(hidden, neg_inf, sc);
      }
      mx = hn::Max(mx, sc);
      hn::Store(sc, d, s + (c0 + kk) * R + r);
    }
    hn::Store(mx, d, rows.mtile + r);
  }
}

// Where the packed operands of the scores live (packed by RunTask): Q^T [dim][R] and K [n][dim] in the
// accumulator type, or, on the bf16 dot-product path, Q^T as [dim/2][R] pairs and K as [n][dim/2] pairs
// of raw bf16 (one 32-bit lane = elements 2x and 2x + 1; Bf16Pair and PackKPairs below). The dots run
// over the first len <= dim elements (the backward packs rows of two head dims at the wider one).
template <class A>
struct ScoreOperands {
  const A* qt;
  const A* k;
  std::size_t R, dim, len;
};

// S^T[c0 + kk][r0 + v*N + lane] for kk < RK_, v < QV_: the d-long dot products (RK_ keys broadcast x
// QV_ query vectors, d innermost), then the epilogue.
template <int RK_, int QV_, bool Dp, class D, class A = hn::TFromD<D>>
ATTN_SCORE_ATTR HWY_INLINE void ScoreBlock(D d, const ScoreOperands<A>& op, std::size_t c0, std::size_t r0,
                                           A* HWY_RESTRICT s, const Rows<A>& rows, const Epilogue& ep) {
  const std::size_t N = hn::Lanes(d), R = op.R, dim = op.dim, len = op.len;
  hn::Vec<D> acc[RK_][QV_];
  ATTN_UNROLL
  for (int kk = 0; kk < RK_; ++kk) ATTN_UNROLL
  for (int v = 0; v < QV_; ++v) acc[kk][v] = hn::Zero(d);
  if constexpr (Dp) {
#if ATTN_DPBF16_TARGET
    // Pairs of bf16 along d: half the instructions of the f32 loop, and K needs no widening.
    const std::size_t dim2 = (dim + 1) / 2, len2 = (len + 1) / 2;
    const auto* qt = reinterpret_cast<const std::uint32_t*>(op.qt);
    const auto* krow = reinterpret_cast<const std::uint32_t*>(op.k) + c0 * dim2;
    __m512 raw[RK_][QV_];
    ATTN_UNROLL
    for (int kk = 0; kk < RK_; ++kk) ATTN_UNROLL
    for (int v = 0; v < QV_; ++v) raw[kk][v] = _mm512_setzero_ps();
    for (std::size_t x = 0; x < len2; ++x) {
      __m512i q[QV_];
      ATTN_UNROLL
      for (int v = 0; v < QV_; ++v) q[v] = _mm512_load_si512(qt + x * R + r0 + v * N);
      ATTN_UNROLL
      for (int kk = 0; kk < RK_; ++kk) {
        const __m512i kb = _mm512_set1_epi32(static_cast<int>(krow[kk * dim2 + x]));
        ATTN_UNROLL
        for (int v = 0; v < QV_; ++v) raw[kk][v] = _mm512_dpbf16_ps(raw[kk][v], (__m512bh)q[v], (__m512bh)kb);
      }
    }
    ATTN_UNROLL
    for (int kk = 0; kk < RK_; ++kk) ATTN_UNROLL
    for (int v = 0; v < QV_; ++v) acc[kk][v].raw = raw[kk][v];
#endif
  } else {
    const A* krow = op.k + c0 * dim;
    for (std::size_t x = 0; x < len; ++x) {
      hn::Vec<D> q[QV_];
      ATTN_UNROLL
      for (int v = 0; v < QV_; ++v) q[v] = KeepInRegister(hn::Load(d, op.qt + x * R + r0 + v * N));
      ATTN_UNROLL
      for (int kk = 0; kk < RK_; ++kk) {
        const auto kb = hn::Set(d, krow[kk * dim + x]);
        ATTN_UNROLL
        for (int v = 0; v < QV_; ++v) acc[kk][v] = hn::MulAdd(kb, q[v], acc[kk][v]);
      }
    }
  }
  ScoreEpilogue<RK_, QV_>(d, acc, R, c0, r0, s, rows, ep);
}

// Calls ScoreBlock with compile-time block sizes for the tails (rk <= kRK keys, qv <= kQV vectors).
template <int RK_, int QV_, bool Dp, class D, class A>
ATTN_SCORE_ATTR HWY_INLINE void ScoreDispatchQv(D d, int qv, const ScoreOperands<A>& op, std::size_t c0, std::size_t r0,
                                                A* s, const Rows<A>& rows, const Epilogue& ep) {
  if constexpr (QV_ >= 1) {
    if (qv == QV_) return ScoreBlock<RK_, QV_, Dp>(d, op, c0, r0, s, rows, ep);
    return ScoreDispatchQv<RK_, QV_ - 1, Dp>(d, qv, op, c0, r0, s, rows, ep);
  }
}
template <int RK_, bool Dp, class D, class A>
ATTN_SCORE_ATTR HWY_INLINE void ScoreDispatch(D d, int rk, int qv, const ScoreOperands<A>& op, std::size_t c0,
                                              std::size_t r0, A* s, const Rows<A>& rows, const Epilogue& ep) {
  if constexpr (RK_ >= 1) {
    if (rk == RK_) return ScoreDispatchQv<RK_, kQV, Dp>(d, qv, op, c0, r0, s, rows, ep);
    return ScoreDispatch<RK_ - 1, Dp>(d, rk, qv, op, c0, r0, s, rows, ep);
  }
}

// The bf16 dot-product path's operands (ScoreOperands): raw bf16 pairs along d, the odd dim's last
// pair padded with a zero. Q^T: dst[x * R + r] = (q[r][2x], q[r][2x + 1]) for r < real rows, zero
// for the padding rows. K: dst[c * dim2 + x] = (k[c][2x], k[c][2x + 1]).
inline std::uint32_t Bf16Pair(const bf16_t* src, std::size_t x, std::size_t dim, std::int64_t stride) {
  const std::uint32_t lo = src[2 * x * static_cast<std::size_t>(stride)].bits;
  const std::uint32_t hi = 2 * x + 1 < dim ? src[(2 * x + 1) * static_cast<std::size_t>(stride)].bits : 0u;
  return lo | hi << 16;
}
inline void PackKPairs(std::uint32_t* HWY_RESTRICT dst, const TensorView& t, std::int64_t b, std::int64_t s0,
                       std::int64_t n, std::int64_t h, std::size_t dim, const PageTable& pages) {
  const std::size_t dim2 = (dim + 1) / 2;
  for (std::int64_t r = 0; r < n; ++r) {
    const bf16_t* src = key_row_ptr<const bf16_t>(t, pages, b, s0 + r, h);
    std::uint32_t* out = dst + static_cast<std::size_t>(r) * dim2;
    if (t.strides[3] == 1 && dim % 2 == 0) {
      std::memcpy(out, src, dim * sizeof(bf16_t));
    } else {
      for (std::size_t x = 0; x < dim2; ++x) out[x] = Bf16Pair(src, x, dim, t.strides[3]);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::tiled_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_TILED_SCORE_INL_H_
