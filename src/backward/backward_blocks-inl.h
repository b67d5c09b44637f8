// The backward kernel's own micro-kernels (backward_kernel.cpp has the loop nest), a Highway per-target
// header: the gradient step that turns the recomputed S^T and dP^T tiles into P^T and dX^T in place,
// and the register block of the three gradient products. Queries run along the SIMD lanes of every
// [n][R] tile, as in the forward's S^T (tiled_score-inl.h). Included inside foreach_target.
#if defined(ATTN_BACKWARD_BLOCKS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_BACKWARD_BLOCKS_INL_H_
#undef ATTN_BACKWARD_BLOCKS_INL_H_
#else
#define ATTN_BACKWARD_BLOCKS_INL_H_
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cstddef>

#include "cpu/exp_simd-inl.h"
#include "core/score_rule.hpp"
#include "tiled/tiled_score-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::backward_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using tiled_simd::HWY_NAMESPACE::Rows;

// Gradient products: kGradRows output rows x up to kGradCv vectors of d in registers (12 of 16 on
// SSE/AVX2, 24 of 32 on AVX-512 and NEON), plus kGradCv loads and one broadcast.
constexpr int kGradRows = 4;
constexpr int kGradCv = tiled_simd::HWY_NAMESPACE::kRegs == 32 ? 6 : 3;

// Per query row of a tile (lanes r): the forward's lse, D = rowsum(dO * O).
template <class A>
struct RowGrads {
  const A *lse, *D;
};

// The soft-capped logit cap tanh(u) of x = dot * scale, u = x / cap, as the forward's epilogue makes it
// (tiled_score-inl.h), and its derivative by the dot into `grad`: scale 4e / (1 + e)^2 with
// e = exp(-2|u|) (ScoreRule::softcap_slope), exact at saturation. It needs u itself: recovering tanh(u)
// from a logit (ALiBi-biased, or rounded) would cancel.
template <class D, class V = hn::Vec<D>>
HWY_INLINE V SoftcapLogit(D d, V x, V cap, V scale, V& grad) {
  using A = hn::TFromD<D>;
  const V u = hn::Div(x, cap);
  const V e = hn::Exp(d, hn::Mul(hn::Set(d, A(-2)), hn::Abs(u)));
  const V one_e = hn::Add(hn::Set(d, A(1)), e);
  grad = hn::Mul(scale, hn::Div(hn::Mul(hn::Set(d, A(4)), e), hn::Mul(one_e, one_e)));
  return hn::Mul(cap, hn::Tanh(d, u));
}

// In place over one (key tile, query tile) pair, lane-wise over queries:
//   s[c][r]  = S^T (the logit from the score epilogue; soft-capped, its argument: below)  ->  P^T  = exp(S - lse)
//   dp[c][r] = dP^T = (V dO^T)                          ->  dX^T = P (dP - D) d logit / d dot
// Masked entries (outside a row's [lo, hi), or padding rows) become exactly 0 by selection, never by a
// product with 0, so a NaN in a hidden key or value does not reach them.
template <class D, class A = hn::TFromD<D>>
HWY_INLINE void GradStep(D d, A* HWY_RESTRICT s, A* HWY_RESTRICT dp, std::size_t R, std::size_t n, const RowGrads<A>& g,
                         const Rows<A>& rows, const ScoreRule& rule, bool masked, std::size_t r_begin,
                         std::size_t r_end) {
  const std::size_t N = hn::Lanes(d);
  const bool softcap = rule.softcap > 0, alibi = rule.alibi_slopes != nullptr;
  const auto scale = hn::Set(d, static_cast<A>(rule.scale));
  const auto cap = hn::Set(d, static_cast<A>(rule.softcap));
  for (std::size_t r = r_begin; r < r_end; r += N) {
    const auto lse = hn::Load(d, g.lse + r), dsum = hn::Load(d, g.D + r);
    const auto lo = hn::Load(d, rows.lo + r), hi = hn::Load(d, rows.hi + r);
    const auto dist = hn::Load(d, rows.dist + r), slope = hn::Load(d, rows.slope + r);
    for (std::size_t c = 0; c < n; ++c) {
      A* sc = s + c * R + r;
      A* dc = dp + c * R + r;
      auto logit = hn::Load(d, sc);
      auto dpv = hn::Load(d, dc);
      auto grad = scale;
      if (softcap) {
        // With the cap, the score block holds x = dot * scale (Pair's rule leaves the cap and ALiBi out).
        logit = SoftcapLogit(d, logit, cap, scale, grad);
        if (alibi) logit = hn::NegMulAdd(slope, hn::Abs(hn::Sub(dist, hn::Set(d, static_cast<A>(c)))), logit);
      }
      // A NaN score (also -inf - -inf, a row that sees no key) gives p = NaN: it must poison its row.
      auto p = exp_simd::HWY_NAMESPACE::ExpDiff(d, logit, lse);
      // With dropout dpv arrives dropped (Z dP / (1 - p_drop)) and the P stored for dV is dropped after
      // this step (Pair, backward_kernel.cpp): dX keeps the undropped p, dS = P (Z dP / (1 - p_drop) - D).
      const auto p_for_dv = p;
      auto dx = hn::Mul(hn::Mul(p, hn::Sub(dpv, dsum)), grad);
      auto pv = p_for_dv;
      if (masked) {
        const auto c_v = hn::Set(d, static_cast<A>(c));
        const auto hidden = hn::Or(hn::Lt(c_v, lo), hn::Ge(c_v, hi));
        pv = hn::IfThenZeroElse(hidden, pv);
        dx = hn::IfThenZeroElse(hidden, dx);
      }
      hn::Store(pv, d, sc);
      hn::Store(dx, d, dc);
    }
  }
}

// out[m0 + i][x0 + v N ..] += sum_k a(m0 + i, k) b[k][x0 + v N ..], i < RB_, v < CV_, k_begin <= k < K, with
// a(., .) read from an [n][R] tile t (queries along the rows' lanes):
//   KeyRows:  output rows are keys c, k runs over queries r:  a(c, r) = t[c R + r]   dV += P^T dO, dK += dX^T Q
//   !KeyRows: output rows are queries r, k runs over keys c:  a(r, c) = t[c R + r]   dQ += dX K
// Masked: the (query, key) pairs outside the query's [lo, hi) are skipped, not weighted by 0 (0 x NaN).
template <int RB_, int CV_, bool KeyRows, bool Masked, class D, class A = hn::TFromD<D>>
HWY_INLINE void GradBlock(D d, const A* HWY_RESTRICT t, std::size_t R, std::size_t k_begin, std::size_t K,
                          const A* HWY_RESTRICT b, std::size_t ldb, A* HWY_RESTRICT out, std::size_t ldo,
                          const Rows<A>& rows, std::size_t m0, std::size_t x0) {
  const std::size_t N = hn::Lanes(d);
  hn::Vec<D> acc[RB_][CV_];
  ATTN_UNROLL
  for (int i = 0; i < RB_; ++i) ATTN_UNROLL
  for (int v = 0; v < CV_; ++v) acc[i][v] = hn::Load(d, out + (m0 + i) * ldo + x0 + v * N);
  // Keys every output row's query sees (!KeyRows) need no per-entry check.
  A all_lo = 0, all_hi = static_cast<A>(K);
  if constexpr (Masked && !KeyRows) {
    ATTN_UNROLL
    for (int i = 0; i < RB_; ++i) {
      all_lo = std::max(all_lo, rows.lo[m0 + i]);
      all_hi = std::min(all_hi, rows.hi[m0 + i]);
    }
  }
  const A first = static_cast<A>(m0), last = static_cast<A>(m0 + RB_);
  for (std::size_t k = k_begin; k < K; ++k) {
    bool check = false;
    if constexpr (Masked && KeyRows) {
      if (rows.hi[k] <= first || rows.lo[k] >= last) continue;  // query k sees none of these keys
      check = rows.lo[k] > first || rows.hi[k] < last;
    } else if constexpr (Masked) {
      const A key = static_cast<A>(k);
      check = key < all_lo || key >= all_hi;
    }
    hn::Vec<D> bv[CV_];
    ATTN_UNROLL
    for (int v = 0; v < CV_; ++v) bv[v] = hn::Load(d, b + k * ldb + x0 + v * N);
    ATTN_UNROLL
    for (int i = 0; i < RB_; ++i) {
      const std::size_t query = KeyRows ? k : m0 + i, key = KeyRows ? m0 + i : k;
      if (check) {
        const A kf = static_cast<A>(key);
        if (kf < rows.lo[query] || kf >= rows.hi[query]) continue;
      }
      const auto ab = hn::Set(d, t[key * R + query]);
      ATTN_UNROLL
      for (int v = 0; v < CV_; ++v) acc[i][v] = hn::MulAdd(ab, bv[v], acc[i][v]);
    }
  }
  ATTN_UNROLL
  for (int i = 0; i < RB_; ++i) ATTN_UNROLL
  for (int v = 0; v < CV_; ++v) hn::Store(acc[i][v], d, out + (m0 + i) * ldo + x0 + v * N);
}

// GradBlock with compile-time sizes for the tails: rb <= kGradRows rows, cv <= kGradCv vectors.
template <int RB_, int CV_, bool KeyRows, class D, class A>
HWY_INLINE void GradDispatchCv(D d, int cv, bool masked, const A* t, std::size_t R, std::size_t k_begin, std::size_t K,
                               const A* b, std::size_t ldb, A* out, std::size_t ldo, const Rows<A>& rows,
                               std::size_t m0, std::size_t x0) {
  if constexpr (CV_ >= 1) {
    if (cv == CV_) {
      if (masked) return GradBlock<RB_, CV_, KeyRows, true>(d, t, R, k_begin, K, b, ldb, out, ldo, rows, m0, x0);
      return GradBlock<RB_, CV_, KeyRows, false>(d, t, R, k_begin, K, b, ldb, out, ldo, rows, m0, x0);
    }
    return GradDispatchCv<RB_, CV_ - 1, KeyRows>(d, cv, masked, t, R, k_begin, K, b, ldb, out, ldo, rows, m0, x0);
  }
}
template <int RB_, bool KeyRows, class D, class A>
HWY_INLINE void GradDispatch(D d, int rb, int cv, bool masked, const A* t, std::size_t R, std::size_t k_begin,
                             std::size_t K, const A* b, std::size_t ldb, A* out, std::size_t ldo, const Rows<A>& rows,
                             std::size_t m0, std::size_t x0) {
  if constexpr (RB_ >= 1) {
    if (rb == RB_)
      return GradDispatchCv<RB_, kGradCv, KeyRows>(d, cv, masked, t, R, k_begin, K, b, ldb, out, ldo, rows, m0, x0);
    return GradDispatch<RB_ - 1, KeyRows>(d, rb, cv, masked, t, R, k_begin, K, b, ldb, out, ldo, rows, m0, x0);
  }
}

// out[m][0 .. width) += the product over output rows [m_begin, M) (keys if KeyRows, else queries) and
// k in [k_begin, K) (b's and out's rows dp apart, width <= dp a multiple of the lanes), the width
// split into near-equal chunks of at most kGradCv vectors. The chunk loop is outer: one chunk's slab of
// b (K rows x kGradCv vectors, 12 KiB at K = 128 on AVX2) stays in L1 while every row block of the
// output streams its few rows of t past it.
template <bool KeyRows, class D, class A>
HWY_INLINE void GradProduct(D d, bool masked, const A* t, std::size_t R, std::size_t m_begin, std::size_t M,
                            std::size_t k_begin, std::size_t K, const A* b, std::size_t dp, std::size_t width, A* out,
                            const Rows<A>& rows) {
  const std::size_t N = hn::Lanes(d);
  const int dv = static_cast<int>(width / N), chunks = (dv + kGradCv - 1) / kGradCv;
  std::size_t x0 = 0;
  for (int ch = 0; ch < chunks; ++ch) {
    const int cv = dv / chunks + (ch < dv % chunks ? 1 : 0);
    for (std::size_t m0 = m_begin; m0 < M; m0 += kGradRows) {
      const int rb = static_cast<int>(std::min<std::size_t>(kGradRows, M - m0));
      GradDispatch<kGradRows, KeyRows>(d, rb, cv, masked, t, R, k_begin, K, b, dp, out, dp, rows, m0, x0);
    }
    x0 += static_cast<std::size_t>(cv) * N;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::backward_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_BACKWARD_BLOCKS_INL_H_
