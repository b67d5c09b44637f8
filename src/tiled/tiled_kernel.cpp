// The tiled FlashAttention-2 kernel, in Highway SIMD with runtime dispatch: one kernel, parametrised
// by the storage type T (f64, f32, bf16, f16) and the accumulator descriptor (double for f64, float
// for the others). Compiled once per x86/ARM target by foreach_target; the best one is picked at run
// time. docs/prefill.md has the design and the measured numbers.
//
// Per task (batch b, kv head, query tile [i0, i0 + rows) of every query head sharing that kv head):
//   pack Q^T  [d][R]        R = g * rows stacked query rows (padded to the vector width), transposed so
//                           that queries run along the SIMD lanes
//   for each key tile [j0, j0 + n) any row can see:
//     pack K [n][d], V [n][dp] (dp = d_v, v's head dim, rounded up to the vector width, zero columns;
//                            converts dtypes)
//     S^T [n][R] = K Q^T   register block: RK keys (broadcast) x QV query vectors, d-loop innermost;
//                          scale, soft-cap, ALiBi and mask applied to the block in registers, the row
//                          maxima tracked as it is stored (S^T stays in L1/L2). tiled_score-inl.h.
//                          bf16 on CPUs with AVX512-BF16: Q^T and K stay bf16, packed as pairs along
//                          d, and VDPBF16PS does two products per lane (half the instructions, no
//                          widening of K); P V stays in f32 FMAs (P is not rounded to bf16).
//     per row: m_new = max(m, tile max); alpha = rescale_factor(m, m_new); P^T = exp(S^T - m_new) in
//              place (NaN where S^T - m_new is NaN: a NaN score, or +inf - +inf, as in attn::fold),
//              l = l alpha + sum P (vectorised along queries: all of these are lane-wise)
//     with dropout: P^T *= Z / (1 - p) in place (DropTile: Philox on SIMD lanes, one row per lane),
//              after l and before P V, so l and lse stay those of the undropped softmax
//     O [R][dp] = O alpha + P V   register block: 4 query rows (broadcast P) x CV vectors of d_v
//   finalize each row (attn::finalize: l = 0 gives out 0, lse -inf) and store it converted to T.
// Lanes run along queries in S^T, so the softmax needs no horizontal reductions, and K and V are used
// in their natural row layout: no transposition of K per query tile.
//
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tiled/tiled_kernel.cpp"
#ifndef HWY_DISABLED_TARGETS
// SSSE3 adds compile time for machines older than 2008 (EMU128 still covers them); SVE's sizeless
// vectors cannot live in the register-block arrays below (NEON covers AArch64).
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>

#include <omp.h>

#include "attn/online_softmax.hpp"
#include "amx/amx.hpp"
#include "cpu/dpbf16.hpp"
#include "core/dropout.hpp"
#include "cpu/philox-inl.h"
#include "core/element.hpp"
#include "cpu/exp_simd-inl.h"
#include "cpu/tile_ops.hpp"
#include "tiled/amx_forward.hpp"
#include "tiled/tiled_kernel.hpp"
#include "tiled/tiled_pack-inl.h"
#include "tiled/tiled_score-inl.h"

HWY_BEFORE_NAMESPACE();
// Its own namespace: other Highway kernels in libattn (decode) must not share per-target names.
namespace attn::detail::tiled_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// acc[r][..] += P^T[c][r0 + r] V[c][x0 ..] for the keys c_begin <= c < c_end, in key order; with Check,
// only for the rows that see key c (lo[r] <= c < hi[r]).
template <int CV_, bool Check, class D, class A = hn::TFromD<D>>
HWY_INLINE void PvKeys(D d, hn::Vec<D> (&acc)[kPvRows][CV_], const A* HWY_RESTRICT p, std::size_t R,
                       const A* HWY_RESTRICT v, std::size_t dp, const Rows<A>& rows, std::size_t r0, std::size_t x0,
                       std::size_t c_begin, std::size_t c_end) {
  const std::size_t N = hn::Lanes(d);
  for (std::size_t c = c_begin; c < c_end; ++c) {
    hn::Vec<D> vv[CV_];
    ATTN_UNROLL
    for (int cv = 0; cv < CV_; ++cv) vv[cv] = hn::Load(d, v + c * dp + x0 + cv * N);
    const A key = static_cast<A>(c);
    ATTN_UNROLL
    for (int r = 0; r < kPvRows; ++r) {
      if (Check && (key < rows.lo[r0 + r] || key >= rows.hi[r0 + r])) continue;
      const auto pb = hn::Set(d, p[c * R + r0 + r]);
      ATTN_UNROLL
      for (int cv = 0; cv < CV_; ++cv) acc[r][cv] = hn::MulAdd(pb, vv[cv], acc[r][cv]);
    }
  }
}

// O[r0 + r][x0 .. x0 + CV_ N) = O * alpha[r] + sum_c P^T[c][r0 + r] V[c][x0 ..]: the only place the
// fold's o-update is re-expressed (as one fused multiply-add chain per register).
//
// Masked: the tile cuts through some row's window. Keys a row cannot see are skipped, not weighted by
// p = 0: 0 x NaN is NaN, and a NaN or Inf in a value row must only reach the rows that see it.
template <int CV_, bool Masked, class D, class A = hn::TFromD<D>>
HWY_INLINE void PvBlock(D d, const A* HWY_RESTRICT p, std::size_t R, const A* HWY_RESTRICT v, std::size_t dp,
                        std::size_t n, A* HWY_RESTRICT o, const A* HWY_RESTRICT alpha, const Rows<A>& rows,
                        std::size_t r0, std::size_t x0) {
  const std::size_t N = hn::Lanes(d);
  hn::Vec<D> acc[kPvRows][CV_];
  ATTN_UNROLL
  for (int r = 0; r < kPvRows; ++r) {
    const auto a = hn::Set(d, alpha[r0 + r]);
    ATTN_UNROLL
    for (int cv = 0; cv < CV_; ++cv) acc[r][cv] = hn::Mul(hn::Load(d, o + (r0 + r) * dp + x0 + cv * N), a);
  }
  if constexpr (Masked) {
    // Keys no row of the block sees are not visited at all (half of a causal diagonal tile, on
    // average); the keys every row sees, [all_lo, all_hi), run the loop without per-row checks (most
    // of a diagonal tile), the rest with them. The order of the keys, hence every sum, is unchanged.
    A all_lo = 0, all_hi = static_cast<A>(n), any_lo = 0, any_hi = 0;
    ATTN_UNROLL
    for (int r = 0; r < kPvRows; ++r) {
      all_lo = std::max(all_lo, rows.lo[r0 + r]);
      all_hi = std::min(all_hi, rows.hi[r0 + r]);
    }
    KeysSomeRowSees(rows, r0, r0 + kPvRows, static_cast<A>(n), any_lo, any_hi);
    const auto begin = static_cast<std::size_t>(any_lo), end = static_cast<std::size_t>(std::max(any_lo, any_hi));
    const auto full_lo = std::clamp(static_cast<std::size_t>(all_lo), begin, end);
    const auto full_hi = std::clamp(static_cast<std::size_t>(std::max(all_lo, all_hi)), full_lo, end);
    PvKeys<CV_, true>(d, acc, p, R, v, dp, rows, r0, x0, begin, full_lo);
    PvKeys<CV_, false>(d, acc, p, R, v, dp, rows, r0, x0, full_lo, full_hi);
    PvKeys<CV_, true>(d, acc, p, R, v, dp, rows, r0, x0, full_hi, end);
  } else {
    PvKeys<CV_, false>(d, acc, p, R, v, dp, rows, r0, x0, 0, n);
  }
  ATTN_UNROLL
  for (int r = 0; r < kPvRows; ++r) ATTN_UNROLL
  for (int cv = 0; cv < CV_; ++cv) hn::Store(acc[r][cv], d, o + (r0 + r) * dp + x0 + cv * N);
}

template <int CV_, class D, class A>
HWY_INLINE void PvDispatch(D d, int cv, bool masked, const A* p, std::size_t R, const A* v, std::size_t dp,
                           std::size_t n, A* o, const A* alpha, const Rows<A>& rows, std::size_t r0, std::size_t x0) {
  if constexpr (CV_ >= 1) {
    if (cv == CV_) {
      if (masked) return PvBlock<CV_, true>(d, p, R, v, dp, n, o, alpha, rows, r0, x0);
      return PvBlock<CV_, false>(d, p, R, v, dp, n, o, alpha, rows, r0, x0);
    }
    return PvDispatch<CV_ - 1>(d, cv, masked, p, R, v, dp, n, o, alpha, rows, r0, x0);
  }
}

// The cache lines of one row of dim elements of t (stride t.strides[3]) starting at `row`, to L2.
template <class T>
HWY_INLINE void PrefetchRowAt(const T* row, const TensorView& t, std::size_t dim) {
  const char* bytes_at = reinterpret_cast<const char*>(row);
  const std::size_t bytes = (dim - 1) * static_cast<std::size_t>(t.strides[3]) * sizeof(T) + sizeof(T);
  for (std::size_t off = 0; off < bytes; off += 64) __builtin_prefetch(bytes_at + off, 0, 2);
}
template <class T>
HWY_INLINE void PrefetchRow(const TensorView& t, const PageTable& pages, std::int64_t b, std::int64_t s, std::int64_t h,
                            std::size_t dim) {
  PrefetchRowAt(key_row_ptr<const T>(t, pages, b, s, h), t, dim);
}

// S^T = K Q^T with the epilogue for one key tile of n keys; the query block outer so its Q^T columns
// stay in L1. The next tile's K and V rows (next_n of them from key `next`) lie a head stride apart: no
// hardware prefetcher follows them, so the packing would wait on every line. They are requested while
// this tile computes. Not inlined: on AVX-512 targets the score code carries the avx512bf16 attribute
// (ATTN_SCORE_ATTR), which RunTask, run on every CPU of the target, must not.
template <bool Dp, class T, class D, class A = hn::TFromD<D>>
ATTN_SCORE_ATTR HWY_NOINLINE void ScoreTile(D d, const Problem& p, const TileTask& task, const ScoreOperands<A>& op,
                                            std::int64_t n, std::int64_t next, std::int64_t next_n, A* s,
                                            const Rows<A>& rows, const Epilogue& ep) {
  const std::size_t N = hn::Lanes(d), R = op.R;
  const auto neg_inf = hn::Set(d, -std::numeric_limits<A>::infinity());
  for (std::size_t r0 = 0; r0 < R; r0 += kQV * N) {
    const int qv = static_cast<int>(std::min<std::size_t>(kQV, (R - r0) / N));
    // The keys some row of this query block sees, [any_lo, any_hi): blocks of keys outside it (half of
    // a causal diagonal tile, on average) are stored as the -inf the epilogue would give them, unmultiplied.
    A any_lo = 0, any_hi = static_cast<A>(n);
    if (ep.mask) KeysSomeRowSees(rows, r0, r0 + static_cast<std::size_t>(qv) * N, static_cast<A>(n), any_lo, any_hi);
    for (std::int64_t c0 = 0; c0 < n; c0 += kRK) {
      const int rk = static_cast<int>(std::min<std::int64_t>(kRK, n - c0));
      if (r0 == 0)
        for (std::int64_t c = c0; c < std::min<std::int64_t>(c0 + kRK, next_n); ++c) {
          PrefetchRow<T>(p.k, p.pages, task.b, next + c, task.kv_head, op.dim);
          PrefetchRow<T>(p.v, p.pages, task.b, next + c, task.kv_head, static_cast<std::size_t>(p.head_dim_v));
        }
      if (static_cast<A>(c0 + rk) <= any_lo || static_cast<A>(c0) >= any_hi) {
        for (int kk = 0; kk < rk; ++kk)
          for (int v = 0; v < qv; ++v) hn::Store(neg_inf, d, s + static_cast<std::size_t>(c0 + kk) * R + r0 + v * N);
        continue;
      }
      ScoreDispatch<kRK, Dp>(d, rk, qv, op, static_cast<std::size_t>(c0), r0, s, rows, ep);
    }
  }
}

// One thread's scratch, carved from a single aligned block (sizes in accumulator elements).
template <class A>
struct Scratch {
  A *qt, *o, *s, *k, *v, *tmp;
  Rows<A> rows;
  std::uint32_t *ctr_i, *ctr_h;  // dropout's per-row counter words (DropTile), R each
  static std::size_t elements(std::size_t R, std::size_t bc, std::size_t dim, std::size_t dp) {
    return dim * R + R * dp + bc * R + bc * dp + 8 * R + dp + 2 * R + bc * dim;
  }
  // Every block that is loaded as whole vectors starts at a multiple of the vector size (R and dp
  // are multiples of the lane count); K, read only by broadcasts, goes last.
  Scratch(A* base, std::size_t R, std::size_t bc, std::size_t dim, std::size_t dp) {
    qt = base;
    o = qt + dim * R;
    s = o + R * dp;
    v = s + bc * R;
    A* x = v + bc * dp;
    rows = {x, x + R, x + 2 * R, x + 3 * R, x + 4 * R, x + 5 * R, x + 6 * R, x + 7 * R};
    tmp = x + 8 * R;
    ctr_i = reinterpret_cast<std::uint32_t*>(tmp + dp);  // 2R elements hold 2R 32-bit words
    ctr_h = ctr_i + R;
    k = tmp + dp + 2 * R;
  }
};

// One task's geometry: its R rows (real of them queries, the rest padding to whole vectors), row r
// being query query_of(r) of head head_of(r) (the group's heads one after another, rows_h queries each),
// and V's rows padded to dp values.
struct TaskRows {
  std::size_t N, dim, dim_v, dp, real, R;
  std::int64_t g, rows_h, i0, b, kv_head;
  std::int64_t head_of(std::size_t r) const { return kv_head * g + static_cast<std::int64_t>(r) / rows_h; }
  std::int64_t query_of(std::size_t r) const { return i0 + static_cast<std::int64_t>(r) % rows_h; }
};

template <class D>
HWY_INLINE TaskRows TaskRowsOf(D d, const Problem& p, const TileTask& task) {
  TaskRows t;
  t.N = hn::Lanes(d);
  t.dim = static_cast<std::size_t>(p.head_dim);
  t.dim_v = static_cast<std::size_t>(p.head_dim_v);
  t.dp = RoundUp(t.dim_v, t.N);
  t.g = p.group();
  t.rows_h = task.rows;
  t.i0 = task.i0;
  t.b = task.b;
  t.kv_head = task.kv_head;
  t.real = static_cast<std::size_t>(t.g * t.rows_h);
  t.R = RoundUp(t.real, std::max<std::size_t>(t.N, kPvRows));
  return t;
}

// Q^T into the scratch (bf16 pairs for the dot-product kernel), zero for the padding rows; O and the row
// states reset to the neutral element; dropout's counter words per row.
template <bool kMayDp, class T, class A>
HWY_INLINE void LoadQueries(const Problem& p, const TaskRows& t, bool use_dp, Scratch<A>& w) {
  const std::size_t R = t.R, dim = t.dim, real = t.real;
  std::fill(w.qt, w.qt + dim * R, A(0));
  std::fill(w.o, w.o + R * t.dp, A(0));
  // Q's rows lie a head stride apart, each a cache miss that no hardware prefetcher follows; transposed
  // element by element, one row's misses at a time, they cost 10% of this function at causal seq 1024.
  // The row kQAhead ahead is requested while this one is transposed.
  constexpr std::size_t kQAhead = 8;
  auto q_row = [&](std::size_t r) { return row_ptr<const T>(p.q, t.b, t.query_of(r), t.head_of(r)); };
  for (std::size_t r = 0; r < std::min(kQAhead, real); ++r) PrefetchRowAt(q_row(r), p.q, dim);
  for (std::size_t r = 0; r < real; ++r) {
    if (r + kQAhead < real) PrefetchRowAt(q_row(r + kQAhead), p.q, dim);
    const T* src = q_row(r);
    if constexpr (kMayDp) {
      if (use_dp) {
        auto* qt2 = reinterpret_cast<std::uint32_t*>(w.qt);  // [dim2][R] fits in [dim][R] floats
        for (std::size_t x = 0; x < (dim + 1) / 2; ++x) qt2[x * R + r] = Bf16Pair(src, x, dim, p.q.strides[3]);
        continue;
      }
    }
    for (std::size_t x = 0; x < dim; ++x) w.qt[x * R + r] = load<A>(src[x * p.q.strides[3]]);
  }
  const Rows<A>& rw = w.rows;
  for (std::size_t r = 0; r < R; ++r) {
    rw.m[r] = -std::numeric_limits<A>::infinity();
    rw.l[r] = A(0);
    rw.slope[r] = r < real ? static_cast<A>(p.rule.alibi_slope(t.b, t.head_of(r))) : A(0);
    rw.dist[r] = A(0);
  }
  if (p.dropout.enabled())
    for (std::size_t r = 0; r < R; ++r) {  // padding rows: any counter (their P is never stored)
      w.ctr_i[r] = r < real ? static_cast<std::uint32_t>(t.query_of(r)) : 0u;
      w.ctr_h[r] = r < real ? p.dropout.head_word(t.b, t.head_of(r)) : 0u;
    }
}

// Each row's visible keys [lo, hi) of the key tile [j0, j0 + n) and its distance to the tile for ALiBi;
// the epilogue masks when some row does not see the whole tile.
template <class A>
HWY_INLINE Epilogue TileRowBounds(const Problem& p, const TaskRows& t, std::int64_t j0, std::int64_t n,
                                  const Rows<A>& rw) {
  Epilogue ep{&p.rule, false};
  const Mask mask = p.mask();
  for (std::size_t r = 0; r < t.R; ++r) {
    A lo = 0, hi = static_cast<A>(n);
    if (r < t.real) {
      const std::int64_t i = t.query_of(r);
      const Mask::TileKeys keys = mask.tile_keys(i, j0, n);
      lo = static_cast<A>(keys.lo);
      hi = static_cast<A>(keys.hi);
      rw.dist[r] = static_cast<A>(mask.diagonal(i) - j0);
    }
    ep.mask |= lo > A(0) || hi < static_cast<A>(n);
    rw.lo[r] = lo;
    rw.hi[r] = hi;
    rw.mtile[r] = -std::numeric_limits<A>::infinity();
  }
  return ep;
}

// The online-softmax step, lane-wise over queries: m and alpha (attn::rescale_factor's), the scores
// replaced by P = exp(s - m), l = l alpha + the row sums of P.
template <class D, class A = hn::TFromD<D>>
HWY_INLINE void SoftmaxStep(D d, std::size_t R, std::int64_t n, A* s, const Rows<A>& rw) {
  for (std::size_t r = 0; r < R; ++r) {
    const A m_new = std::max(rw.m[r], rw.mtile[r]);
    rw.alpha[r] = rescale_factor(rw.m[r], m_new);
    rw.m[r] = m_new;
  }
  const auto neg_inf = hn::Set(d, -std::numeric_limits<A>::infinity());
  for (std::size_t r = 0; r < R; r += hn::Lanes(d)) {
    const auto m = hn::Load(d, rw.m + r);
    // A row that has seen no key keeps m = -inf; its scores are all -inf and must give p = 0.
    const auto m_sub = hn::IfThenZeroElse(hn::Eq(m, neg_inf), m);
    auto sum = hn::Zero(d);
    for (std::int64_t c = 0; c < n; ++c) {
      A* sc = s + static_cast<std::size_t>(c) * R + r;
      // exp(-inf) = 0. A NaN score (NaN in q or in a visible key) and a +inf score (whose row has
      // m = +inf, so inf - inf) give NaN, which must poison the row, as std::exp does in attn::fold
      // (when no later tile's alpha = exp(inf - inf) would catch it).
      const auto pv = exp_simd::HWY_NAMESPACE::ExpDiff(d, hn::Load(d, sc), m_sub);
      hn::Store(pv, d, sc);
      sum = hn::Add(sum, pv);
    }
    hn::Store(hn::MulAdd(hn::Load(d, rw.l + r), hn::Load(d, rw.alpha + r), sum), d, rw.l + r);
  }
}

// O = O alpha + P V, d split into near-equal chunks of at most kMaxCv vectors.
template <class D, class A = hn::TFromD<D>>
HWY_INLINE void AddPv(D d, const TaskRows& t, std::int64_t n, bool mask, Scratch<A>& w) {
  const int dv = static_cast<int>(t.dp / t.N);
  const int chunks = (dv + kMaxCv - 1) / kMaxCv;
  for (std::size_t r0 = 0; r0 < t.R; r0 += kPvRows) {
    std::size_t x0 = 0;
    for (int ch = 0; ch < chunks; ++ch) {
      const int cv = dv / chunks + (ch < dv % chunks ? 1 : 0);
      PvDispatch<kMaxCv>(d, cv, mask, w.s, t.R, w.v, t.dp, static_cast<std::size_t>(n), w.o, w.rows.alpha, w.rows, r0,
                         x0);
      x0 += static_cast<std::size_t>(cv) * t.N;
    }
  }
}

// One task: a tile of queries of one kv head's group against every key tile any of them sees.
template <class T, class D, class A = hn::TFromD<D>>
void RunTask(D d, const Problem& p, const TiledPlan& plan, const TileTask& task, Scratch<A>& w) {
  const TaskRows t = TaskRowsOf(d, p, task);
  // bf16 with AVX512-BF16: the scores take bf16 pairs (cpu/dpbf16.hpp); otherwise the accumulator type.
  constexpr bool kMayDp = std::is_same_v<T, bf16_t> && static_cast<bool>(ATTN_DPBF16_TARGET);
  const bool use_dp = kMayDp && bf16_dots();
  const ScoreOperands<A> op{w.qt, w.k, t.R, t.dim, t.dim};
  LoadQueries<kMayDp, T>(p, t, use_dp, w);

  // Keys any row of the tile sees: first_key and end_key are non-decreasing in i.
  const std::int64_t k_begin = p.first_key(t.i0), k_end = p.end_key(t.i0 + t.rows_h - 1);
  const std::int64_t bc = plan.k_tile;
  for (std::int64_t j0 = k_begin; j0 < k_end; j0 += bc) {
    const std::int64_t n = std::min(bc, k_end - j0);
    if (use_dp)
      PackKPairs(reinterpret_cast<std::uint32_t*>(w.k), p.k, t.b, j0, n, t.kv_head, t.dim, p.pages);
    else
      PackRows<T>(d, w.k, t.dim, p.k, t.b, j0, n, t.kv_head, t.dim, p.pages);
    PackRows<T>(d, w.v, t.dp, p.v, t.b, j0, n, t.kv_head, t.dim_v, p.pages);
    Epilogue ep = TileRowBounds(p, t, j0, n, w.rows);
    const std::int64_t next = j0 + bc, next_n = std::min(bc, k_end - next);
    if (use_dp)
      ScoreTile<kMayDp, T>(d, p, task, op, n, next, next_n, w.s, w.rows, ep);
    else
      ScoreTile<false, T>(d, p, task, op, n, next, next_n, w.s, w.rows, ep);
    SoftmaxStep(d, t.R, n, w.s, w.rows);
    // Dropout: P^T *= Z / (1 - p), the one place the forward drops weights, after l summed the undropped
    // P and before P V; not at all without dropout.
    if (p.dropout.enabled()) philox_simd::HWY_NAMESPACE::DropTile(d, p.dropout, w.ctr_i, w.ctr_h, j0, n, w.s, t.R, t.R);
    AddPv(d, t, n, ep.mask, w);
  }

  // out is T, or (a ring block's partial output, src/distributed/ring_block.cpp) the accumulator type.
  const bool acc_out = !std::is_same_v<T, A> && p.out.dtype != p.dtype;
  for (std::size_t r = 0; r < t.real; ++r) {
    const RowState<A> s{w.rows.m + r, w.rows.l + r, w.o + r * t.dp, p.head_dim_v};
    if (acc_out)
      store_row<A>(p, s, w.tmp, t.b, t.query_of(r), t.head_of(r));
    else
      store_row<T>(p, s, w.tmp, t.b, t.query_of(r), t.head_of(r));
  }
}

template <class T>
void RunAll(const std::vector<Problem>& ps, const std::vector<TiledPlan>& plans,
            const std::vector<std::int64_t>& first_task, int threads) {
  using A = Acc<T>;
  const hn::ScalableTag<A> d;
  const std::size_t N = hn::Lanes(d), dim = static_cast<std::size_t>(ps[0].head_dim);
  const std::size_t dp = RoundUp(static_cast<std::size_t>(ps[0].head_dim_v), N);
  std::size_t R = 0, bc = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    R = std::max(R,
                 RoundUp(static_cast<std::size_t>(ps[i].group() * plans[i].q_tile), std::max<std::size_t>(N, kPvRows)));
    bc = std::max(bc, static_cast<std::size_t>(plans[i].k_tile));
  }
  const std::int64_t tasks = first_task.back();
  const std::size_t bytes = Scratch<A>::elements(R, bc, dim, dp) * sizeof(A);
#pragma omp parallel num_threads(threads)
  {
    A* base = static_cast<A*>(::operator new (bytes, std::align_val_t{64}));
    std::fill(base, base + bytes / sizeof(A), A(0));  // V's padding columns stay zero
    Scratch<A> w(base, R, bc, dim, dp);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const auto it = std::upper_bound(first_task.begin(), first_task.end(), t);
      const auto pi = static_cast<std::uint32_t>(it - first_task.begin() - 1);
      RunTask<T>(d, ps[pi], plans[pi], task_of(ps[pi], plans[pi], pi, t - first_task[pi]), w);
    }
    ::operator delete (base, std::align_val_t{64});
  }
}

void RunF64(const std::vector<Problem>& ps, const std::vector<TiledPlan>& pl, const std::vector<std::int64_t>& f,
            int th) {
  RunAll<double>(ps, pl, f, th);
}
void RunF32(const std::vector<Problem>& ps, const std::vector<TiledPlan>& pl, const std::vector<std::int64_t>& f,
            int th) {
  RunAll<float>(ps, pl, f, th);
}
void RunBF16(const std::vector<Problem>& ps, const std::vector<TiledPlan>& pl, const std::vector<std::int64_t>& f,
             int th) {
  RunAll<bf16_t>(ps, pl, f, th);
}
void RunF16(const std::vector<Problem>& ps, const std::vector<TiledPlan>& pl, const std::vector<std::int64_t>& f,
            int th) {
  RunAll<f16_t>(ps, pl, f, th);
}

std::int64_t Target() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::tiled_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
namespace tiled_simd {
HWY_EXPORT(RunF64);
HWY_EXPORT(RunF32);
HWY_EXPORT(RunBF16);
HWY_EXPORT(RunF16);
HWY_EXPORT(Target);
}  // namespace tiled_simd

// The dispatches below name the exported functions unqualified, under `using namespace tiled_simd`: where
// one target is compiled (AArch64, where this kernel is NEON only), HWY_DYNAMIC_DISPATCH(F) is
// HWY_STATIC_DISPATCH(F), i.e. N_NEON::F, and tiled_simd::F would be the undeclared N_NEON::tiled_simd::F.
std::int64_t tiled_target() {
  using namespace tiled_simd;
  return HWY_DYNAMIC_DISPATCH(Target)();
}

// bf16 (f16; f32 with ATTN_AMX_F32=bf16x3) problems go to the tiles when amx_backend() names a tile unit
// (the CPU's or the emulator) and the AMX kernel takes all of them there (amx_forward.hpp).
bool runs_on_tiles(const std::vector<Problem>& problems) {
  if (problems[0].dtype == DType::f64) return false;
  const amx::TileBackend backend = amx_backend();
  if (backend == amx::TileBackend::none) return false;
  for (const Problem& p : problems)
    if (!amx_forward_takes(p, backend)) return false;
  return true;
}

void run_tiled(const std::vector<Problem>& problems, const TileOptions& tiles, int threads) {
  if (problems.empty()) return;
  if (runs_on_tiles(problems)) {
    std::vector<TiledPlan> plans;
    std::vector<std::int64_t> first_task{0};
    for (const Problem& p : problems) {
      plans.push_back(amx_plan(p, tiles));
      const std::int64_t q_tile = plans.back().q_tile;
      first_task.push_back(first_task.back() + p.batch * p.kv_heads * ((p.seqlen_q + q_tile - 1) / q_tile));
    }
    return run_tiled_amx(problems, plans, first_task, threads, amx_backend());
  }
  std::vector<TiledPlan> plans;
  std::vector<std::int64_t> first_task{0};
  plans.reserve(problems.size());
  first_task.reserve(problems.size() + 1);
  for (const Problem& p : problems) {
    // The tiles hold K rows of head_dim and V and O rows of head_dim_v: sized for the wider.
    const TilePlan t = plan_tiles(p.seqlen_q, p.seqlen_k, std::max(p.head_dim, p.head_dim_v), p.dtype, tiles);
    // GQA stacks the group's heads in one tile: the default query tile is shared among them.
    std::int64_t q_tile = t.q_tile;
    if (!tiles.q_tile) q_tile = std::max<std::int64_t>(1, q_tile / p.group());
    plans.push_back({q_tile, t.k_tile});
    first_task.push_back(first_task.back() + p.batch * p.kv_heads * ((p.seqlen_q + q_tile - 1) / q_tile));
  }
  using namespace tiled_simd;
  switch (problems[0].dtype) {
    case DType::f64:
      return HWY_DYNAMIC_DISPATCH(RunF64)(problems, plans, first_task, threads);
    case DType::f32:
      return HWY_DYNAMIC_DISPATCH(RunF32)(problems, plans, first_task, threads);
    case DType::bf16:
      return HWY_DYNAMIC_DISPATCH(RunBF16)(problems, plans, first_task, threads);
    case DType::f16:
      return HWY_DYNAMIC_DISPATCH(RunF16)(problems, plans, first_task, threads);
    default:  // the quantized cache types: validation admits them in decode only
      break;
  }
}

}  // namespace attn::detail
#endif  // HWY_ONCE
