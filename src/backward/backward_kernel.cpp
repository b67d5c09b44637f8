// The tiled backward (FlashAttention-2's Algorithm 2) in Highway SIMD with runtime dispatch, one pass:
// one kernel over the storage type T and the accumulator descriptor (double for f64, float otherwise),
// compiled per target by foreach_target like the forward (tiled_kernel.cpp), whose score block
// (tiled_score-inl.h: the rule's scale, soft-cap, ALiBi and mask in registers) and packing
// (tiled_pack-inl.h) it uses. docs/backward.md has the design and the measured numbers.
//
// Per task (batch b, kv head, chunk w of the query tiles: tiles w, w + W, w + 2W ..., of every query
// head of the GQA group, in order):
//   per query tile [i0, i0 + rows) of head h, R = rows rounded up to the vector width:
//     pack Q^T, dO^T [d][R] (queries along the lanes), Q, dO [R][dp], lse, D = rowsum(dO * O) [R];
//     dQ [R][dp] = 0
//     for each key tile [j0, j0 + n) any row sees:
//       pack K, V [n][d] (and K [n][dp] when d is not a multiple of the vector width)
//       S^T  [n][R] = K Q^T     the forward's score block and epilogue          2 n R d flops
//       dP^T [n][R] = V dO^T    the same block, identity epilogue               2 n R d
//                               (both on bf16 pairs with VDPBF16PS for bf16 where bf16_dots(): UsesDp)
//       P^T = exp(S^T - lse), dX^T = P (dP - D) dlogit/ddot, in place, lane-wise (GradStep)
//       dV_j += P^T dO,  dK_j += dX^T Q   into this task's f32 (f64) [seqlen_k][dp] partials   4 n R d
//       dQ   += dX K                      in scratch                                          2 n R d
//     store dQ (converted to T)
// then the W partials of each (b, kv head) are summed in chunk order and stored as dK, dV.
// Five products per tile pair (10 n R d flops, 2.5x the forward's), each a register block whose operands
// stream from L2: per pair the traffic is the K, V tile (2 n d) and the dK_j, dV_j partial rows
// (4 n dp, read and written), against 10 n R d flops. The order of every sum is fixed by the problem
// and the tile sizes (and W, a function of the shape), so gradients are bitwise equal for any thread count.
//
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backward/backward_kernel.cpp"
#ifndef HWY_DISABLED_TARGETS
// As the forward: no SSSE3 (EMU128 covers those machines), no SVE (sizeless vectors in arrays).
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <type_traits>

#include <omp.h>

#include "amx/amx.hpp"
#include "backward/amx_backward.hpp"
#include "backward/backward_kernel.hpp"
#include "backward/backward_scratch.hpp"
#include "core/dropout.hpp"
#include "core/element.hpp"
#include "cpu/philox-inl.h"
#include "tiled/tiled_pack-inl.h"
#include "tiled/tiled_score-inl.h"
#include "backward/backward_blocks-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::backward_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using tiled_simd::HWY_NAMESPACE::Bf16Pair;
using tiled_simd::HWY_NAMESPACE::Epilogue;
using tiled_simd::HWY_NAMESPACE::kQV;
using tiled_simd::HWY_NAMESPACE::kRK;
using tiled_simd::HWY_NAMESPACE::PackKPairs;
using tiled_simd::HWY_NAMESPACE::PackRows;
using tiled_simd::HWY_NAMESPACE::RoundUp;
using tiled_simd::HWY_NAMESPACE::ScoreDispatch;
using tiled_simd::HWY_NAMESPACE::ScoreOperands;

// [n][r_begin, r_end) = B A^T for B [n][dim] (broadcast) and A^T [dim][R] (lanes), with the forward's
// epilogue; Dp: the operands are bf16 pairs and VDPBF16PS does the products (ScoreOperands).
// Not inlined: on AVX-512 targets the score block carries the avx512bf16 attribute (ATTN_SCORE_ATTR),
// which the rest of the kernel must not (the f32 block uses no bf16 instruction).
template <bool Dp, class D, class A = hn::TFromD<D>>
ATTN_SCORE_ATTR HWY_NOINLINE void ProductTile(D d, const ScoreOperands<A>& op, std::size_t n, A* out,
                                              const Rows<A>& rows, const Epilogue& ep, std::size_t r_begin,
                                              std::size_t r_end) {
  const std::size_t N = hn::Lanes(d);
  for (std::size_t r0 = r_begin; r0 < r_end; r0 += kQV * N) {
    const int qv = static_cast<int>(std::min<std::size_t>(kQV, (r_end - r0) / N));
    for (std::size_t c0 = 0; c0 < n; c0 += kRK) {
      const int rk = static_cast<int>(std::min<std::size_t>(kRK, n - c0));
      ScoreDispatch<kRK, Dp>(d, rk, qv, op, c0, r0, out, rows, ep);
    }
  }
}

// bf16 where the dot products pay (bf16_dots, cpu/dpbf16.hpp): the two score-like products (S = Q K^T, dP = dO V^T)
// take the bf16 inputs as pairs, as the forward's scores do (half the instructions, no widening); the three gradient
// products stay f32 FMAs, since P and dS are not bf16 values and rounding them would cost accuracy.
template <class T>
constexpr bool kMayDp = std::is_same_v<T, bf16_t>&& static_cast<bool>(ATTN_DPBF16_TARGET);
template <class T>
bool UsesDp() {
  return kMayDp<T> && bf16_dots();
}

// One thread's scratch, carved from one aligned block. Blocks loaded as whole vectors come first and
// have sizes that are multiples of the lane count; K and V, read only by broadcasts, go last.
template <class A>
struct Scratch {
  A *qt, *dot, *q, *dout, *dq, *s, *dpt, *kdp, *lse, *dsum, *k, *v;
  std::uint32_t *ctr_i, *ctr_h;  // dropout's per-row counter words (DropTile): query position, head word
  Rows<A> rows;
  bool pairs;  // the dot-product path (UsesDp, asked once per call): qt, dot, k and v hold bf16 pairs
  // kdp: K's rows at the products' width dp, a buffer of their own when k does not hold them (dim < dp,
  // or k_pairs: k holds K as bf16 pairs for the dot-product path, and v V).
  static bool own_kdp(std::size_t dim, std::size_t dp, bool k_pairs) { return dim != dp || k_pairs; }
  static std::size_t elements(std::size_t R, std::size_t bc, std::size_t dim, std::size_t dp, bool k_pairs) {
    return 2 * dim * R + 3 * R * dp + 2 * bc * R + (own_kdp(dim, dp, k_pairs) ? bc * dp : 0) + 10 * R + 2 * bc * dim;
  }
  Scratch(A* base, std::size_t R, std::size_t bc, std::size_t dim, std::size_t dp, bool k_pairs) : pairs(k_pairs) {
    qt = base;
    dot = qt + dim * R;
    q = dot + dim * R;
    dout = q + R * dp;
    dq = dout + R * dp;
    s = dq + R * dp;
    dpt = s + bc * R;
    kdp = dpt + bc * R;
    A* x = kdp + (own_kdp(dim, dp, k_pairs) ? bc * dp : 0);
    rows = {nullptr, nullptr, nullptr, x, x + R, x + 2 * R, x + 3 * R, x + 4 * R};
    lse = x + 5 * R;
    dsum = x + 6 * R;
    ctr_i = reinterpret_cast<std::uint32_t*>(x + 8 * R);  // 2R elements hold 2R 32-bit words
    ctr_h = ctr_i + R;
    k = x + 10 * R;  // x + 7R spare (keeps the offsets multiples of the lanes), x + 8R: the counters
    v = k + bc * dim;
    if (!own_kdp(dim, dp, k_pairs)) kdp = k;
  }
};

// The width the kernel packs at: q and k rows (head_dim) and v, out and dout rows (head_dim_v) are
// packed into rows of the wider of the two, zero past their own length. Each product runs at its own
// dim, not the width: S = Q K^T, dK = dS^T Q and dQ = dS K at head_dim, dP = dO V^T and dV = P^T dO at
// head_dim_v (the zeros past a row's length would add nothing but flops).
inline std::size_t Width(const BackwardProblem& p) {
  return static_cast<std::size_t>(std::max(p.head_dim, p.head_dim_v));
}

// Everything a query tile's pairs share: where it is and its packed query side.
struct QueryTile {
  std::int64_t b, h, hk, i0, rows;
  std::size_t R;
};

// Query row r's column of a transposed operand [len][R] (Q^T, dO^T) from its packed row (the accumulator
// type), or, on the dot-product path, [len / 2][R] bf16 pairs from the tensor's own row.
template <class T, class A>
void PackTransposed(bool pairs, const TensorView& t, const A* packed, std::size_t len, const QueryTile& qt,
                    std::size_t r, std::size_t R, A* dst) {
  if constexpr (kMayDp<T>) {
    if (pairs) {
      const bf16_t* src = row_ptr<const bf16_t>(t, qt.b, qt.i0 + static_cast<std::int64_t>(r), qt.h);
      auto* dst2 = reinterpret_cast<std::uint32_t*>(dst);  // [len / 2][R] fits in [len][R]
      for (std::size_t x = 0; x < (len + 1) / 2; ++x) dst2[x * R + r] = Bf16Pair(src, x, len, t.strides[3]);
      return;
    }
  }
  for (std::size_t x = 0; x < len; ++x) dst[x * R + r] = packed[x];
}

// D = rowsum(dO * O) for query row r, summed as the score block sums dP^T = V dO^T: one multiply-add per
// element in order (hn::MulAdd, on one lane), or VDPBF16PS on the same pairs on the dot-product path. So
// where D and dP are equal in exact arithmetic (one key: O = v, and dS = P (dP - D) = 0) they are equal
// as computed, and a gradient that vanishes comes out 0, not rounding noise.
#if ATTN_DPBF16_TARGET
ATTN_SCORE_ATTR HWY_NOINLINE float RowSumDp(const bf16_t* dout, std::int64_t dout_stride, const bf16_t* o,
                                            std::int64_t o_stride, std::size_t len) {
  __m512 acc = _mm512_setzero_ps();
  for (std::size_t x = 0; x < (len + 1) / 2; ++x) {
    const __m512i g = _mm512_set1_epi32(static_cast<int>(Bf16Pair(dout, x, len, dout_stride)));
    const __m512i v = _mm512_set1_epi32(static_cast<int>(Bf16Pair(o, x, len, o_stride)));
    acc = _mm512_dpbf16_ps(acc, (__m512bh)g, (__m512bh)v);
  }
  return _mm512_cvtss_f32(acc);
}
#endif
template <class T, class A>
A RowSum(bool pairs, const BackwardProblem& p, const QueryTile& qt, std::size_t r, const A* dout_row, const T* o) {
  const std::size_t len = static_cast<std::size_t>(p.head_dim_v);
  if constexpr (kMayDp<T>) {
    if (pairs) {
      const bf16_t* g = row_ptr<const bf16_t>(p.dout, qt.b, qt.i0 + static_cast<std::int64_t>(r), qt.h);
      return RowSumDp(g, p.dout.strides[3], o, p.out.strides[3], len);
    }
  }
  const hn::CappedTag<A, 1> d1;
  auto sum = hn::Zero(d1);
  for (std::size_t x = 0; x < len; ++x)
    sum = hn::MulAdd(hn::Set(d1, load<A>(o[x * p.out.strides[3]])), hn::Set(d1, dout_row[x]), sum);
  return hn::GetLane(sum);
}

template <class T, class D, class A = hn::TFromD<D>>
void PackQueries(D d, const BackwardProblem& p, const QueryTile& qt, Scratch<A>& w) {
  const std::size_t dim = Width(p), dp = RoundUp(dim, hn::Lanes(d)), R = qt.R;
  const std::size_t dq = static_cast<std::size_t>(p.head_dim), dv = static_cast<std::size_t>(p.head_dim_v);
  std::fill(w.qt, w.qt + 2 * dim * R, A(0));  // Q^T and dO^T, padding rows (and columns) zero
  PackRows<T>(d, w.q, dp, p.q, qt.b, qt.i0, qt.rows, qt.h, dq);
  PackRows<T>(d, w.dout, dp, p.dout, qt.b, qt.i0, qt.rows, qt.h, dv);
  const TensorView& l = *p.lse;
  const A slope = static_cast<A>(p.rule.alibi_slope(qt.b, qt.h));
  for (std::size_t r = 0; r < R; ++r) {
    w.lse[r] = w.dsum[r] = A(0);
    w.rows.slope[r] = slope;
    w.ctr_i[r] = static_cast<std::uint32_t>(qt.i0 + static_cast<std::int64_t>(r));
    w.ctr_h[r] = p.dropout.head_word(qt.b, qt.h);
    if (r >= static_cast<std::size_t>(qt.rows)) continue;
    const std::int64_t i = qt.i0 + static_cast<std::int64_t>(r);
    const T* o = row_ptr<const T>(p.out, qt.b, i, qt.h);
    PackTransposed<T>(w.pairs, p.q, w.q + r * dp, dq, qt, r, R, w.qt);
    PackTransposed<T>(w.pairs, p.dout, w.dout + r * dp, dv, qt, r, R, w.dot);
    w.dsum[r] = RowSum<T>(w.pairs, p, qt, r, w.dout + r * dp, o);
    w.lse[r] = static_cast<const A*>(l.data)[qt.b * l.strides[0] + qt.h * l.strides[1] + i * l.strides[2]];
  }
}

// Requests the next key tile's K and V rows and its dK, dV partial rows into L2 while this pair
// computes: the tensor rows lie a head stride apart and the partials were last touched a whole key
// walk ago, so neither is in L2, and the packing and the products' accumulator loads would wait on
// every line. Inlined, not a call: GCC 12 finds a function whose only effect is __builtin_prefetch pure
// and drops every call to it (ipa-pure-const), leaving no prefetch instruction in the kernel.
template <class T, class A>
HWY_INLINE void PrefetchKeyTile(const BackwardProblem& p, const QueryTile& qt, std::int64_t j0, std::int64_t n,
                                std::size_t dp, const A* dk_acc, const A* dv_acc) {
  for (std::int64_t j = j0; j < j0 + n; ++j)
    for (const TensorView* t : {&p.k, &p.v}) {
      const std::size_t row_bytes = static_cast<std::size_t>((t->shape[3] - 1) * t->strides[3] + 1) * sizeof(T);
      const char* row = reinterpret_cast<const char*>(row_ptr<const T>(*t, qt.b, j, qt.hk));
      for (std::size_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(row + off, 0, 2);
    }
  for (const A* acc : {dk_acc, dv_acc}) {
    const char* first = reinterpret_cast<const char*>(acc + j0 * dp);
    for (std::size_t off = 0; off < static_cast<std::size_t>(n) * dp * sizeof(A); off += 64)
      __builtin_prefetch(first + off, 1, 2);
  }
}

// One (query tile, key tile [j0, j0 + n)) pair: recompute, then the three gradient products. The
// next key tile [j0 + n, j0 + n + next_n) is prefetched.
template <class T, class D, class A = hn::TFromD<D>>
void Pair(D d, const BackwardProblem& p, const QueryTile& qt, Scratch<A>& w, std::int64_t j0, std::int64_t n,
          std::int64_t next_n, A* dk_acc, A* dv_acc) {
  const std::size_t dim = Width(p), dp = RoundUp(dim, hn::Lanes(d)), R = qt.R;
  const std::size_t dq = static_cast<std::size_t>(p.head_dim), dv = static_cast<std::size_t>(p.head_dim_v);
  const bool use_dp = w.pairs;
  if (use_dp) {  // K and V as bf16 pairs of their own dims (the products' operands: ScoreOperands below)
    PackKPairs(reinterpret_cast<std::uint32_t*>(w.k), p.k, qt.b, j0, n, qt.hk, dq, PageTable{});
    PackKPairs(reinterpret_cast<std::uint32_t*>(w.v), p.v, qt.b, j0, n, qt.hk, dv, PageTable{});
  } else {
    PackRows<T>(d, w.k, dim, p.k, qt.b, j0, n, qt.hk, dq);  // columns past a row's own length stay zero
    PackRows<T>(d, w.v, dim, p.v, qt.b, j0, n, qt.hk, dv);
  }
  if (w.kdp != w.k) PackRows<T>(d, w.kdp, dp, p.k, qt.b, j0, n, qt.hk, dq);
  PrefetchKeyTile<T>(p, qt, j0 + n, next_n, dp, dk_acc, dv_acc);
  const Mask mask = p.mask();
  bool masked = static_cast<std::size_t>(qt.rows) < R;  // padding rows are masked
  std::size_t first_row = R, end_row = 0;               // the rows that see a key of this tile
  for (std::size_t r = 0; r < R; ++r) {
    A lo = 0, hi = 0, dist = 0;
    if (r < static_cast<std::size_t>(qt.rows)) {
      const std::int64_t i = qt.i0 + static_cast<std::int64_t>(r);
      const Mask::TileKeys keys = mask.tile_keys(i, j0, n);
      lo = static_cast<A>(keys.lo);
      hi = static_cast<A>(keys.hi);
      dist = static_cast<A>(mask.diagonal(i) - j0);
      masked |= lo > A(0) || hi < static_cast<A>(n);
      if (lo < hi) {
        first_row = std::min(first_row, r);
        end_row = r + 1;
      }
    }
    w.rows.lo[r] = lo;
    w.rows.hi[r] = hi;
    w.rows.dist[r] = dist;
  }
  if (first_row >= end_row) return;  // no row sees these keys
  // Only the rows [r0, r1) that see some key of the tile (contiguous: the mask bounds are monotone),
  // widened to whole vectors and row blocks: a causal diagonal tile skips the rows above the band.
  const std::size_t align = std::max<std::size_t>(hn::Lanes(d), kGradRows);
  const std::size_t r0 = first_row / align * align, r1 = RoundUp(end_row, align);
  static const ScoreRule kIdentity{};  // scale 1, no transform: dP^T is the plain product
  const std::size_t nn = static_cast<std::size_t>(n);
  // Soft-capped: the score block holds dot * scale alone, and GradStep applies the cap and ALiBi (it needs
  // the cap's argument for the derivative).
  ScoreRule s_rule = p.rule;
  if (s_rule.softcap > 0) {
    s_rule.softcap = 0;
    s_rule.alibi_slopes = nullptr;
  }
  // The pairs are packed at each product's own dim (PackKPairs' row length), the accumulator rows at the width.
  const ScoreOperands<A> s_op{w.qt, w.k, R, use_dp ? dq : dim, dq}, dp_op{w.dot, w.v, R, use_dp ? dv : dim, dv};
  const Epilogue s_ep{&s_rule, masked}, dp_ep{&kIdentity, false};
  if (use_dp) {
    ProductTile<kMayDp<T>>(d, s_op, nn, w.s, w.rows, s_ep, r0, r1);
    ProductTile<kMayDp<T>>(d, dp_op, nn, w.dpt, w.rows, dp_ep, r0, r1);
  } else {
    ProductTile<false>(d, s_op, nn, w.s, w.rows, s_ep, r0, r1);
    ProductTile<false>(d, dp_op, nn, w.dpt, w.rows, dp_ep, r0, r1);
  }
  // Dropout (keep mask Z, factor Z / (1 - p), regenerated as the forward drew it): dS = P (Z dP / (1 - p)
  // - D) needs the dropped dP before GradStep, and dV = (P Z / (1 - p))^T dO the dropped P after it
  // (GradStep's dX keeps the undropped P). The only places the backward drops.
  namespace ps = philox_simd::HWY_NAMESPACE;
  const bool drop = p.dropout.enabled();
  if (drop) ps::DropTile(d, p.dropout, w.ctr_i + r0, w.ctr_h + r0, j0, n, w.dpt + r0, R, r1 - r0);
  GradStep(d, w.s, w.dpt, R, nn, RowGrads<A>{w.lse, w.dsum}, w.rows, p.rule, masked, r0, r1);
  if (drop) ps::DropTile(d, p.dropout, w.ctr_i + r0, w.ctr_h + r0, j0, n, w.s + r0, R, r1 - r0);
  const std::size_t wq = RoundUp(dq, hn::Lanes(d)), wv = RoundUp(dv, hn::Lanes(d));  // the products' widths
  GradProduct<true>(d, masked, w.s, R, 0, nn, r0, r1, w.dout, dp, wv, dv_acc + j0 * dp, w.rows);
  GradProduct<true>(d, masked, w.dpt, R, 0, nn, r0, r1, w.q, dp, wq, dk_acc + j0 * dp, w.rows);
  GradProduct<false>(d, masked, w.dpt, R, r0, r1, 0, nn, w.kdp, dp, wq, w.dq, w.rows);
}

// One task: the query tiles of chunk `w` of (b, kv head hk), into this task's dK, dV partials.
template <class T, class D, class A = hn::TFromD<D>>
void RunTask(D d, const BackwardProblem& p, const BackwardPlan& plan, std::int64_t b, std::int64_t hk,
             std::int64_t chunk, Scratch<A>& w, A* dk_acc, A* dv_acc) {
  const std::size_t N = hn::Lanes(d), dim = Width(p), dp = RoundUp(dim, N);
  const std::size_t acc_rows = static_cast<std::size_t>(p.seqlen_k) * dp;
  std::fill(dk_acc, dk_acc + acc_rows, A(0));
  std::fill(dv_acc, dv_acc + acc_rows, A(0));
  const std::int64_t q_tiles = (p.seqlen_q + plan.q_tile - 1) / plan.q_tile;
  const Mask mask = p.mask();
  for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
    for (std::int64_t t = chunk; t < q_tiles; t += plan.chunks) {
      QueryTile qt{b, h, hk, t * plan.q_tile, std::min(plan.q_tile, p.seqlen_q - t * plan.q_tile), 0};
      qt.R = RoundUp(static_cast<std::size_t>(qt.rows), std::max<std::size_t>(N, kGradRows));
      std::fill(w.dq, w.dq + qt.R * dp, A(0));
      // Keys any row of the tile sees: first_key and end_key are non-decreasing in i.
      const std::int64_t k_begin = mask.first_key(qt.i0), k_end = mask.end_key(qt.i0 + qt.rows - 1);
      if (k_begin < k_end) PackQueries<T>(d, p, qt, w);
      for (std::int64_t j0 = k_begin; j0 < k_end; j0 += plan.k_tile) {
        const std::int64_t n = std::min(plan.k_tile, k_end - j0);
        Pair<T>(d, p, qt, w, j0, n, std::clamp<std::int64_t>(k_end - j0 - n, 0, plan.k_tile), dk_acc, dv_acc);
      }
      store_gradient_rows<T>(p.dq, w.dq, dp, b, qt.i0, qt.rows, h, static_cast<std::size_t>(p.head_dim));
    }
}

template <class T>
void RunAll(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& plans, int threads) {
  using A = Acc<T>;
  const hn::ScalableTag<A> d;
  const std::size_t N = hn::Lanes(d), dim = Width(ps[0]), dp = RoundUp(dim, N);
  const BackwardLayout layout(ps, plans, dp, std::max<std::size_t>(N, kGradRows));
  // All memory before anything is written: a bad_alloc leaves the gradients untouched.
  AlignedBuffer<A> partials(layout.partial_elements);
  std::vector<AlignedBuffer<A>> scratch;
  const bool pairs = UsesDp<T>();
  for (int t = 0; t < threads; ++t) {
    scratch.emplace_back(Scratch<A>::elements(layout.max_R, layout.max_bc, dim, dp, pairs));
    std::fill(scratch.back().data(), scratch.back().data() + scratch.back().size(), A(0));
  }
  const std::int64_t tasks = layout.first_task.back();
#pragma omp parallel num_threads(threads)
  {
    Scratch<A> w(scratch[static_cast<std::size_t>(omp_get_thread_num())].data(), layout.max_R, layout.max_bc, dim, dp,
                 pairs);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const BackwardLayout::Task task = layout.task(plans, ps, t);
      const BackwardProblem& p = ps[task.problem];
      A* dk_acc = partials.data() + layout.partial_offset(plans, ps, task);
      RunTask<T>(d, p, plans[task.problem], task.b, task.hk, task.chunk, w, dk_acc, dk_acc + layout.keys(p) * dp);
    }
    // dK, dV: each (problem, b, kv head)'s chunk partials summed in chunk order.
    const std::int64_t heads = layout.first_head.back();
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t e = 0; e < heads; ++e) store_key_gradients<T>(ps, plans, layout, partials.data(), e);
  }
}

void RunF64(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& pl, int th) {
  RunAll<double>(ps, pl, th);
}
void RunF32(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& pl, int th) {
  RunAll<float>(ps, pl, th);
}
void RunBF16(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& pl, int th) {
  RunAll<bf16_t>(ps, pl, th);
}
void RunF16(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& pl, int th) {
  RunAll<f16_t>(ps, pl, th);
}
std::int64_t Target() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::backward_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
namespace backward_simd {
HWY_EXPORT(RunF64);
HWY_EXPORT(RunF32);
HWY_EXPORT(RunBF16);
HWY_EXPORT(RunF16);
HWY_EXPORT(Target);
}  // namespace backward_simd

// The dispatches below name the exported functions unqualified, under `using namespace backward_simd`: where
// one target is compiled (AArch64, where this kernel is NEON only), HWY_DYNAMIC_DISPATCH(F) is
// HWY_STATIC_DISPATCH(F), i.e. N_NEON::F, and backward_simd::F would be the undeclared N_NEON::backward_simd::F.
std::int64_t backward_target() {
  using namespace backward_simd;
  return HWY_DYNAMIC_DISPATCH(Target)();
}

// bf16 (and f16) problems go to the tiles when amx_backend() names a tile unit (the CPU's or the emulator)
// and the AMX kernel takes all of them there (amx_backward.hpp).
bool backward_on_tiles(const std::vector<BackwardProblem>& problems) {
  if (problems[0].dtype != DType::bf16 && problems[0].dtype != DType::f16) return false;
  const amx::TileBackend backend = amx_backend();
  if (backend == amx::TileBackend::none) return false;
  return std::all_of(problems.begin(), problems.end(),
                     [backend](const BackwardProblem& p) { return amx_backward_takes(p, backend); });
}

void run_backward(const std::vector<BackwardProblem>& problems, const TileOptions& tiles, int threads) {
  if (problems.empty()) return;
  std::vector<BackwardPlan> plans;
  plans.reserve(problems.size());
  if (backward_on_tiles(problems)) {
    for (const BackwardProblem& p : problems) plans.push_back(amx_backward_plan(p, tiles));
    return run_backward_amx(problems, plans, threads, amx_backend());
  }
  for (const BackwardProblem& p : problems) plans.push_back(plan_backward(p, tiles));
  using namespace backward_simd;
  switch (problems[0].dtype) {
    case DType::f64:
      return HWY_DYNAMIC_DISPATCH(RunF64)(problems, plans, threads);
    case DType::f32:
      return HWY_DYNAMIC_DISPATCH(RunF32)(problems, plans, threads);
    case DType::bf16:
      return HWY_DYNAMIC_DISPATCH(RunBF16)(problems, plans, threads);
    case DType::f16:
      return HWY_DYNAMIC_DISPATCH(RunF16)(problems, plans, threads);
    default:  // the quantized cache types: validation admits them in decode only
      break;
  }
}

}  // namespace attn::detail
#endif  // HWY_ONCE
