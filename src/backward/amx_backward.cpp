// The tiled backward on AMX tiles (bf16 inputs): FlashAttention-2's backward with its five block products
// on TDPBF16PS and the gradient step between them on the vector units. One kernel template over the tile
// unit (amx/amx_tiles.hpp): the CPU's tiles, or the emulator on any CPU. docs/backward.md has the floor
// and the design.
//
// Every product keeps its output's rows along the tiles' rows and needs no transpose in the loop: the
// score-like products are computed transposed (keys along rows, queries along columns), so that the
// gradient step runs lane-wise over queries (lse and D are per query: no reduction along a row) and
// writes P^T and dS^T as the A operands of dV and dK directly; dQ is accumulated transposed.
//
// Per task (batch b, kv head, chunk w of the query tiles, as the vector kernel's: backward_kernel.cpp):
//   pack the head's K [keys][dq] and V [keys][dvp] rows (A operands) and K^T [dq][keys] (A of dQ^T)
//   per query tile [i0, i0 + rows) of head h, R = rows rounded up to 32:
//     pack Q^T, dO^T as pairs along d [d/2][R] (B of S^T, dP^T), Q, dO as pairs along rows [R/2][d]
//     (B of dK, dV), O rows [R][dvp]; lse; D = rowsum(O dO) on the tiles (O's rows times dO^T, as dP^T
//     is V's rows times dO^T: where O = V, as with one key, D equals dP bit for bit and dS is 0)
//     dQ^T [dq][R] = 0
//     for each key tile [j0, j0 + n) any row sees (j0 a multiple of 32, np = n rounded up to 32):
//       S^T  [np][R] = K Q^T,  dP^T [np][R] = V dO^T                32 x 32 blocks some row sees
//       per key, lanes along queries: P^T = exp(logit - lse), dS^T = P (dP - D) dlogit/ddot, hidden
//           pairs 0; with dropout dP and the P of dV times Z / (1 - p), the forward's mask regenerated
//           (one Philox call per four keys of N rows); both rounded to bf16, dS^T also as pairs along
//           keys [np/2][R] (B of dQ^T)
//       dV_j += P^T dO,  dK_j += dS^T Q   into the task's f32 [keys][dp] partials
//       dQ^T += K^T dS
//     store dQ = (dQ^T)^T
// then the chunk partials are summed in chunk order and stored (backward_scratch.hpp). Every sum's order
// is fixed by the problem and the plan: gradients are bitwise equal for any thread count.
// P and dS are rounded to bf16 before their products, as flash-attn's kernels and PyTorch's CPU flash
// attention do on these CPUs (the vector kernel keeps them f32: ATTN_AMX=off).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backward/amx_backward.cpp"
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "amx/amx.hpp"
#include "amx/amx_emulator.hpp"
#include "amx/amx_tiles.hpp"
#include "backward/amx_backward.hpp"
#include "backward/amx_backward_pack-inl.h"
#include "backward/backward_scratch.hpp"
#include "core/element.hpp"
#include "amx/amx_round-inl.h"
#include "cpu/exp_simd-inl.h"
#include "cpu/philox-inl.h"
#include "backward/backward_blocks-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::amx_backward_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using amx_simd::HWY_NAMESPACE::Pair16;
using amx_simd::HWY_NAMESPACE::Rounded16;
using amx_simd::HWY_NAMESPACE::Store16;
using amx_simd::HWY_NAMESPACE::StoreRounded;
using backward_simd::HWY_NAMESPACE::SoftcapLogit;

// D = rowsum(O dO) for every row: the diagonal of O's rows times dO^T, on the tiles.
template <class E, class Unit>
void RowSums(Unit& u, const Sizes& z, std::size_t R, const Scratch& w) {
  const std::int64_t o_stride = 2 * static_cast<std::int64_t>(z.dvp), b_stride = 4 * static_cast<std::int64_t>(R);
  for (std::size_t r0 = 0; r0 < R; r0 += kBlock) {
    u.template zero<0>();
    u.template zero<1>();
    u.template zero<2>();
    u.template zero<3>();
    for (std::size_t x = 0; x < z.dvp; x += kBlock) {
      u.template load<4>(w.o + r0 * z.dvp + x, o_stride);
      u.template load<5>(w.o + (r0 + 16) * z.dvp + x, o_stride);
      u.template load<6>(w.dot + (x / 2) * R + r0, b_stride);
      u.template load<7>(w.dot + (x / 2) * R + r0 + 16, b_stride);
      amx::dot_2x2_of<E>(u);
    }
    u.template store<0>(w.block, 64);
    for (std::size_t i = 0; i < 16; ++i) w.dsum[r0 + i] = w.block[i * 17];
    u.template store<3>(w.block, 64);
    for (std::size_t i = 0; i < 16; ++i) w.dsum[r0 + 16 + i] = w.block[i * 17];
  }
}

// Each row's visible keys of the tile [j0, j0 + n), relative to j0 (padding rows: none), its ALiBi
// distance, and which 32 x 32 blocks of the tile hold a visible pair. Returns whether any does.
inline bool TileBounds(const BackwardProblem& p, const QueryTile& qt, std::int64_t j0, std::int64_t n, std::size_t np,
                       const Scratch& w) {
  const Mask mask = p.mask();
  for (std::size_t r = 0; r < qt.R; ++r) {
    std::int64_t lo = 0, hi = 0, dist = 0;
    if (r < static_cast<std::size_t>(qt.rows)) {
      const std::int64_t i = qt.i0 + static_cast<std::int64_t>(r);
      const Mask::TileKeys keys = mask.tile_keys(i, j0, n);
      lo = keys.lo, hi = keys.hi, dist = mask.diagonal(i) - j0;
    }
    w.lo[r] = static_cast<float>(lo), w.hi[r] = static_cast<float>(hi), w.dist[r] = static_cast<float>(dist);
  }
  bool any = false;
  const std::size_t row_blocks = qt.R / kBlock;
  for (std::size_t c0 = 0; c0 < np; c0 += kBlock)
    for (std::size_t rb = 0; rb < row_blocks; ++rb) {
      bool seen = false;
      for (std::size_t r = rb * kBlock; r < (rb + 1) * kBlock && !seen; ++r)
        seen = w.lo[r] < w.hi[r] && w.lo[r] < static_cast<float>(c0 + kBlock) && w.hi[r] > static_cast<float>(c0);
      w.seen[(c0 / kBlock) * row_blocks + rb] = seen;
      any |= seen;
    }
  return any;
}

// out [np][R] = A [np][dim] (rows lda elements apart) times B [dim/2][R] (pairs along dim), for the
// blocks some pair sees: S^T = K Q^T and dP^T = V dO^T.
template <class E, class Unit>
void KeyRowProduct(Unit& u, const std::uint16_t* a, std::size_t lda, const std::uint32_t* bt, std::size_t dim,
                   std::size_t np, std::size_t R, const Scratch& w, float* out) {
  const std::size_t row_blocks = R / kBlock;
  const std::int64_t a_stride = 2 * static_cast<std::int64_t>(lda), rs = 4 * static_cast<std::int64_t>(R);
  for (std::size_t c0 = 0; c0 < np; c0 += kBlock)
    for (std::size_t r0 = 0; r0 < R; r0 += kBlock) {
      if (!w.seen[(c0 / kBlock) * row_blocks + r0 / kBlock]) continue;
      u.template zero<0>();
      u.template zero<1>();
      u.template zero<2>();
      u.template zero<3>();
      for (std::size_t x = 0; x < dim; x += kBlock) {
        u.template load<4>(a + c0 * lda + x, a_stride);
        u.template load<5>(a + (c0 + 16) * lda + x, a_stride);
        u.template load<6>(bt + (x / 2) * R + r0, rs);
        u.template load<7>(bt + (x / 2) * R + r0 + 16, rs);
        amx::dot_2x2_of<E>(u);
      }
      float* s = out + c0 * R + r0;
      u.template store<0>(s, rs);
      u.template store<1>(s + 16, rs);
      u.template store<2>(s + 16 * R, rs);
      u.template store<3>(s + 16 * R + 16, rs);
    }
}

// The gradient step's constants for one (query tile, key tile) pair.
struct StepRule {
  const ScoreRule* rule;
  bool plain;                  // no soft-cap, no ALiBi: P = 2^(s c1 - lse log2 e) in one multiply-add
  const DropoutRule* dropout;  // null without dropout
  std::int64_t i0, j0;         // the tiles' first query and key (dropout's counters)
  std::uint32_t head_word;     // dropout's counter word of (b, h)
};

// One vector of query rows' constants, loaded once for the 32 keys of a block.
template <class D>
struct RowVectors {
  hn::Vec<D> lse, lse2, dsum, lo, hi, dist, slope;  // lse2 = lse log2(e)
  RowVectors(D d, const Scratch& w, std::size_t r)
      : lse(hn::Load(d, w.lse + r)),
        lse2(hn::Mul(lse, hn::Set(d, 1.44269504088896341f))),
        dsum(hn::Load(d, w.dsum + r)),
        lo(hn::Load(d, w.lo + r)),
        hi(hn::Load(d, w.hi + r)),
        dist(hn::Load(d, w.dist + r)),
        slope(hn::Load(d, w.slope + r)) {}
};

// Key c's P and dS (lanes: the query rows r..r + N), hidden pairs exactly 0 by selection (Masked: some
// row of the vector does not see every key of the block). With dropout (kDrop, the keys' factors Z /
// (1 - p) in `factor`): dS = P (Z dP / (1 - p) - D), and P is returned dropped, as dV's operand.
template <bool Masked, bool kDrop, class D, class V = hn::Vec<D>>
HWY_INLINE void KeyStep(D d, const StepRule& sr, const RowVectors<D>& rv, const Scratch& w, std::size_t R,
                        std::size_t c, std::size_t r, V factor, V& p, V& ds) {
  const ScoreRule& rule = *sr.rule;
  const V x = hn::Load(d, w.st + c * R + r);
  V dpv = hn::Load(d, w.dpt + c * R + r);
  if constexpr (kDrop) dpv = hn::Mul(dpv, factor);
  V grad = hn::Set(d, static_cast<float>(rule.scale));
  if (sr.plain) {
    const V c1 = hn::Set(d, static_cast<float>(rule.scale * 1.4426950408889634));
    p = exp_simd::HWY_NAMESPACE::Exp2(d, hn::MulSub(x, c1, rv.lse2));
  } else {
    V logit = hn::Mul(x, grad);
    if (rule.softcap > 0) logit = SoftcapLogit(d, logit, hn::Set(d, static_cast<float>(rule.softcap)), grad, grad);
    if (rule.alibi_slopes != nullptr)
      logit = hn::NegMulAdd(rv.slope, hn::Abs(hn::Sub(rv.dist, hn::Set(d, static_cast<float>(c)))), logit);
    p = exp_simd::HWY_NAMESPACE::ExpDiff(d, logit, rv.lse);
  }
  ds = hn::Mul(hn::Mul(p, hn::Sub(dpv, rv.dsum)), grad);
  if constexpr (kDrop) p = hn::Mul(p, factor);
  if constexpr (Masked) {
    const V key = hn::Set(d, static_cast<float>(c));
    const auto hidden = hn::Or(hn::Lt(key, rv.lo), hn::Ge(key, rv.hi));
    p = hn::IfThenZeroElse(hidden, p);
    ds = hn::IfThenZeroElse(hidden, ds);
  }
}

// Keys c and c + 1 of one vector of query rows: P^T and dS^T rounded to E as rows (P on the CPU's
// conversion where its tiles run: StoreRounded), dS^T also as pairs.
template <class E, bool kNative, bool Masked, bool kDrop, class D, class V = hn::Vec<D>>
HWY_INLINE void PairStep(D d, const StepRule& sr, const RowVectors<D>& rv, std::size_t c, std::size_t r, std::size_t R,
                         const Scratch& w, V f0, V f1) {
  const hn::RebindToUnsigned<D> du;
  V p0, ds0, p1, ds1;
  KeyStep<Masked, kDrop>(d, sr, rv, w, R, c, r, f0, p0, ds0);
  KeyStep<Masked, kDrop>(d, sr, rv, w, R, c + 1, r, f1, p1, ds1);
  StoreRounded<E, kNative>(d, p0, w.pt + c * R + r);
  StoreRounded<E, kNative>(d, p1, w.pt + (c + 1) * R + r);
  const auto ds0_bits = Rounded16<E>(d, ds0), ds1_bits = Rounded16<E>(d, ds1);
  Store16(d, ds0_bits, w.dst + c * R + r);
  Store16(d, ds1_bits, w.dst + (c + 1) * R + r);
  hn::Store(Pair16(du, ds0_bits, ds1_bits), du, w.dsv + (c / 2) * R + r);
}

// One vector of query rows over the 32 keys [c0, c0 + 32), four keys (one dropout group: j0 is a
// multiple of 32) at a time.
template <class E, bool kNative, bool Masked, bool kDrop, class D>
HWY_INLINE void BlockStep(D d, const StepRule& sr, const RowVectors<D>& rv, std::size_t c0, std::size_t r,
                          std::size_t R, const Scratch& w) {
  const hn::Rebind<std::uint32_t, D> du;
  const auto ci =
      hn::Add(hn::Iota(du, 0u), hn::Set(du, static_cast<std::uint32_t>(sr.i0 + static_cast<std::int64_t>(r))));
  const auto ch = hn::Set(du, sr.head_word);
  for (std::size_t c = c0; c < c0 + kBlock; c += 4) {
    hn::Vec<D> f[4] = {hn::Set(d, 1.0f), hn::Set(d, 1.0f), hn::Set(d, 1.0f), hn::Set(d, 1.0f)};
    if constexpr (kDrop)
      philox_simd::HWY_NAMESPACE::GroupFactors(d, *sr.dropout, (sr.j0 + static_cast<std::int64_t>(c)) / 4, ci, ch, f);
    PairStep<E, kNative, Masked, kDrop>(d, sr, rv, c, r, R, w, f[0], f[1]);
    PairStep<E, kNative, Masked, kDrop>(d, sr, rv, c + 2, r, R, w, f[2], f[3]);
  }
}

// The gradient step on the blocks some pair sees; the masks' selections only where some row of a vector
// does not see the whole block.
template <class E, bool kNative, bool kDrop, class D>
void GradientStep(D d, const StepRule& sr, std::size_t np, std::size_t R, const Scratch& w) {
  const std::size_t N = hn::Lanes(d), row_blocks = R / kBlock;
  for (std::size_t r0 = 0; r0 < R; r0 += kBlock)
    for (std::size_t r = r0; r < r0 + kBlock; r += N) {
      const RowVectors<D> rv(d, w, r);
      for (std::size_t c0 = 0; c0 < np; c0 += kBlock) {
        if (!w.seen[(c0 / kBlock) * row_blocks + r0 / kBlock]) continue;
        const bool whole = hn::AllTrue(d, hn::And(hn::Le(rv.lo, hn::Set(d, static_cast<float>(c0))),
                                                  hn::Ge(rv.hi, hn::Set(d, static_cast<float>(c0 + kBlock)))));
        if (whole)
          BlockStep<E, kNative, false, kDrop>(d, sr, rv, c0, r, R, w);
        else
          BlockStep<E, kNative, true, kDrop>(d, sr, rv, c0, r, R, w);
      }
    }
}

// acc [np][dp] (the partials' rows of the tile's keys) += A^T-side [np][R] bf16 rows times B [R/2][width]
// (pairs along rows), over the row blocks some pair of the key block sees: dV += P^T dO, dK += dS^T Q.
template <class E, class Unit>
void KeyGradient(Unit& u, const std::uint16_t* a, const std::uint32_t* bv, std::size_t width, std::size_t np,
                 std::size_t R, const Sizes& z, const Scratch& w, float* acc) {
  const std::size_t row_blocks = R / kBlock;
  const std::int64_t a_stride = 2 * static_cast<std::int64_t>(R), b_stride = 4 * static_cast<std::int64_t>(width);
  const std::int64_t acc_stride = 4 * static_cast<std::int64_t>(z.dp);
  for (std::size_t c0 = 0; c0 < np; c0 += kBlock) {
    const std::uint8_t* seen = w.seen + (c0 / kBlock) * row_blocks;
    if (std::find(seen, seen + row_blocks, 1) == seen + row_blocks) continue;
    for (std::size_t x0 = 0; x0 < width; x0 += kBlock) {
      float* c = acc + c0 * z.dp + x0;
      u.template load<0>(c, acc_stride);
      u.template load<1>(c + 16, acc_stride);
      u.template load<2>(c + 16 * z.dp, acc_stride);
      u.template load<3>(c + 16 * z.dp + 16, acc_stride);
      for (std::size_t r0 = 0; r0 < R; r0 += kBlock) {
        if (!seen[r0 / kBlock]) continue;
        u.template load<4>(a + c0 * R + r0, a_stride);
        u.template load<5>(a + (c0 + 16) * R + r0, a_stride);
        u.template load<6>(bv + (r0 / 2) * width + x0, b_stride);
        u.template load<7>(bv + (r0 / 2) * width + x0 + 16, b_stride);
        amx::dot_2x2_of<E>(u);
      }
      u.template store<0>(c, acc_stride);
      u.template store<1>(c + 16, acc_stride);
      u.template store<2>(c + 16 * z.dp, acc_stride);
      u.template store<3>(c + 16 * z.dp + 16, acc_stride);
    }
  }
}

// dQ^T [dq][R] += K^T [dq][keys j0 + c] times dS (pairs along keys), over the key blocks some pair sees.
template <class E, class Unit>
void QueryGradient(Unit& u, std::int64_t j0, std::size_t np, std::size_t R, const Sizes& z, std::size_t keys,
                   const Scratch& w) {
  const std::size_t row_blocks = R / kBlock;
  const std::int64_t a_stride = 2 * static_cast<std::int64_t>(keys), rs = 4 * static_cast<std::int64_t>(R);
  const std::uint16_t* kt = w.kt + static_cast<std::size_t>(j0);
  for (std::size_t r0 = 0; r0 < R; r0 += kBlock) {
    bool any = false;
    for (std::size_t c0 = 0; c0 < np; c0 += kBlock) any |= w.seen[(c0 / kBlock) * row_blocks + r0 / kBlock] != 0;
    if (!any) continue;
    for (std::size_t x0 = 0; x0 < z.dq; x0 += kBlock) {
      float* c = w.dqt + x0 * R + r0;
      u.template load<0>(c, rs);
      u.template load<1>(c + 16, rs);
      u.template load<2>(c + 16 * R, rs);
      u.template load<3>(c + 16 * R + 16, rs);
      for (std::size_t c0 = 0; c0 < np; c0 += kBlock) {
        if (!w.seen[(c0 / kBlock) * row_blocks + r0 / kBlock]) continue;
        u.template load<4>(kt + x0 * keys + c0, a_stride);
        u.template load<5>(kt + (x0 + 16) * keys + c0, a_stride);
        u.template load<6>(w.dsv + (c0 / 2) * R + r0, rs);
        u.template load<7>(w.dsv + (c0 / 2) * R + r0 + 16, rs);
        amx::dot_2x2_of<E>(u);
      }
      u.template store<0>(c, rs);
      u.template store<1>(c + 16, rs);
      u.template store<2>(c + 16 * R, rs);
      u.template store<3>(c + 16 * R + 16, rs);
    }
  }
}

// One (query tile, key tile [j0, j0 + n)) pair: the two recomputed products, the gradient step, the
// three gradient products.
template <class E, class Unit, class D>
void Pair(D d, Unit& u, const BackwardProblem& p, const QueryTile& qt, std::int64_t j0, std::int64_t n, const Sizes& z,
          const Scratch& w, float* dk_acc, float* dv_acc) {
  const std::size_t np = RoundUp(static_cast<std::size_t>(n), kBlock), R = qt.R;
  if (!TileBounds(p, qt, j0, n, np, w)) return;
  const std::size_t keys = RoundUp(static_cast<std::size_t>(p.seqlen_k), kBlock), c = static_cast<std::size_t>(j0);
  KeyRowProduct<E>(u, w.k + c * z.dq, z.dq, w.qt, z.dq, np, R, w, w.st);
  KeyRowProduct<E>(u, w.v + c * z.dvp, z.dvp, w.dot, z.dvp, np, R, w, w.dpt);
  const StepRule sr{&p.rule, !p.rule.transforms_scores(),    p.dropout.enabled() ? &p.dropout : nullptr, qt.i0,
                    j0,      p.dropout.head_word(qt.b, qt.h)};
  if (sr.dropout)
    GradientStep<E, Unit::kNativeConvert, true>(d, sr, np, R, w);
  else
    GradientStep<E, Unit::kNativeConvert, false>(d, sr, np, R, w);
  KeyGradient<E>(u, w.pt, w.dov, z.dvp, np, R, z, w, dv_acc + c * z.dp);
  KeyGradient<E>(u, w.dst, w.qv, z.dq, np, R, z, w, dk_acc + c * z.dp);
  QueryGradient<E>(u, j0, np, R, z, keys, w);
}

// One task: the query tiles of chunk `chunk` of (b, kv head hk), into the task's dK, dV partials.
template <class E, class Unit, class D>
void RunTask(D d, Unit& u, const BackwardProblem& p, const BackwardPlan& plan, const BackwardLayout::Task& task,
             const Sizes& z, const Scratch& w, float* dk_acc, float* dv_acc) {
  const std::size_t keys = RoundUp(static_cast<std::size_t>(p.seqlen_k), kBlock);
  std::fill(dk_acc, dk_acc + keys * z.dp, 0.0f);
  std::fill(dv_acc, dv_acc + keys * z.dp, 0.0f);
  PackHead(p, task.b, task.hk, z, w);
  const std::int64_t q_tiles = (p.seqlen_q + plan.q_tile - 1) / plan.q_tile;
  const Mask mask = p.mask();
  const auto block = static_cast<std::int64_t>(kBlock);
  for (std::int64_t h = task.hk * p.group(); h < (task.hk + 1) * p.group(); ++h)
    for (std::int64_t t = task.chunk; t < q_tiles; t += plan.chunks) {
      QueryTile qt{task.b, h, task.hk, t * plan.q_tile, std::min(plan.q_tile, p.seqlen_q - t * plan.q_tile), 0};
      qt.R = RoundUp(static_cast<std::size_t>(qt.rows), kBlock);
      std::fill(w.dqt, w.dqt + z.dq * qt.R, 0.0f);
      // Key tiles start at multiples of kBlock (the packed rows' blocks); keys before a row's first are masked.
      const std::int64_t k_begin = mask.first_key(qt.i0) / block * block, k_end = mask.end_key(qt.i0 + qt.rows - 1);
      if (k_begin < k_end) {
        PackQueryTile(d, p, qt, z, w);
        RowSums<E>(u, z, qt.R, w);
      }
      for (std::int64_t j0 = k_begin; j0 < k_end; j0 += plan.k_tile)
        Pair<E>(d, u, p, qt, j0, std::min(plan.k_tile, k_end - j0), z, w, dk_acc, dv_acc);
      // dQ = (dQ^T)^T, row by row through a [dq] row of the block buffer's size or more (w.st).
      for (std::int64_t r = 0; r < qt.rows; ++r) {
        float* row = w.st;
        for (std::size_t x = 0; x < z.dq; ++x) row[x] = w.dqt[x * qt.R + static_cast<std::size_t>(r)];
        store_gradient_rows<E>(p.dq, row, z.dq, qt.b, qt.i0 + r, 1, h, static_cast<std::size_t>(p.head_dim));
      }
    }
}

// The job's padded sizes: the widest query tile and key tile, the head dims and the longest head.
inline Sizes SizesOf(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& plans) {
  Sizes z{kBlock,
          kBlock,
          RoundUp(static_cast<std::size_t>(ps[0].head_dim), kBlock),
          RoundUp(static_cast<std::size_t>(ps[0].head_dim_v), kBlock),
          0,
          kBlock};
  z.dp = std::max(z.dq, z.dvp);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    z.R = std::max(z.R, RoundUp(static_cast<std::size_t>(plans[i].q_tile), kBlock));
    z.bc = std::max(z.bc, RoundUp(static_cast<std::size_t>(plans[i].k_tile), kBlock));
    z.keys = std::max(z.keys, RoundUp(static_cast<std::size_t>(ps[i].seqlen_k), kBlock));
  }
  return z;
}

template <class Unit, class E>
void RunAllOn(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& plans, int threads) {
  const hn::ScalableTag<float> d;
  const Sizes z = SizesOf(ps, plans);
  const BackwardLayout layout(ps, plans, z.dp, kBlock, kBlock);
  // All memory before anything is written: a bad_alloc leaves the gradients untouched.
  AlignedBuffer<float> partials(layout.partial_elements);
  std::vector<AlignedBuffer<std::uint8_t>> scratch;
  for (int t = 0; t < threads; ++t) {
    scratch.emplace_back(Scratch::bytes(z));
    std::memset(scratch.back().data(), 0, scratch.back().size());
  }
  const std::int64_t tasks = layout.first_task.back();
#pragma omp parallel num_threads(threads)
  {
    const Scratch w(scratch[static_cast<std::size_t>(omp_get_thread_num())].data(), z);
    Unit u;
    u.configure(amx::full_tiles());
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const BackwardLayout::Task task = layout.task(plans, ps, t);
      const BackwardProblem& p = ps[task.problem];
      float* dk_acc = partials.data() + layout.partial_offset(plans, ps, task);
      RunTask<E>(d, u, p, plans[task.problem], task, z, w, dk_acc, dk_acc + layout.keys(p) * z.dp);
    }
    u.release();
    const std::int64_t heads = layout.first_head.back();
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t e = 0; e < heads; ++e) store_key_gradients<E>(ps, plans, layout, partials.data(), e);
  }
}

// The element type's instance: f16 problems on TDPFP16PS, bf16 on TDPBF16PS (one dtype per call).
template <class Unit>
void RunTyped(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& plans, int threads) {
  if (ps[0].dtype == DType::f16)
    RunAllOn<Unit, f16_t>(ps, plans, threads);
  else
    RunAllOn<Unit, bf16_t>(ps, plans, threads);
}

void RunEmulated(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& plans, int threads) {
  RunTyped<amx::EmulatedTiles>(ps, plans, threads);
}

void RunHardware(const std::vector<BackwardProblem>& ps, const std::vector<BackwardPlan>& plans, int threads) {
#if defined(ATTN_AMX_HARDWARE)
  RunTyped<amx::HardwareTiles>(ps, plans, threads);
#else
  RunTyped<amx::EmulatedTiles>(ps, plans, threads);  // unreachable: amx_backend() is never hardware here
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::amx_backward_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
namespace amx_backward_simd {
HWY_EXPORT(RunEmulated);
HWY_EXPORT(RunHardware);
}  // namespace amx_backward_simd

namespace {
// No element of t (16-bit patterns) has the exponent field `exponent` all ones: no Inf or NaN.
bool all_finite(const TensorView& t, std::uint16_t exponent) {
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t s = 0; s < t.shape[1]; ++s)
      for (std::int64_t h = 0; h < t.shape[2]; ++h) {
        const std::uint16_t* row = row_ptr<const std::uint16_t>(t, b, s, h);
        std::uint32_t bad = 0;
        for (std::int64_t x = 0; x < t.shape[3]; ++x) bad |= (row[x * t.strides[3]] & exponent) == exponent;
        if (bad) return false;
      }
  return true;
}
}  // namespace

bool amx_backward_takes(const BackwardProblem& p, amx::TileBackend backend) {
  if (p.dtype != DType::bf16 && !(p.dtype == DType::f16 && amx_runs_fp16(backend))) return false;
  const std::uint16_t exponent = p.dtype == DType::f16 ? 0x7C00 : 0x7F80;
  return all_finite(p.q, exponent) && all_finite(p.k, exponent) && all_finite(p.dout, exponent);
}

BackwardPlan amx_backward_plan(const BackwardProblem& p, const TileOptions& tiles) {
  TileOptions t = tiles;
  t.q_tile = tiles.q_tile.value_or(256);
  t.k_tile = tiles.k_tile.value_or(128);
  BackwardPlan plan = plan_backward(p, t);
  plan.k_tile = (plan.k_tile + 31) / 32 * 32;  // key tiles are whole blocks of the packed rows
  return plan;
}

void run_backward_amx(const std::vector<BackwardProblem>& problems, const std::vector<BackwardPlan>& plans, int threads,
                      amx::TileBackend backend) {
  using namespace amx_backward_simd;
  if (backend == amx::TileBackend::hardware)
    HWY_DYNAMIC_DISPATCH(RunHardware)(problems, plans, threads);
  else
    HWY_DYNAMIC_DISPATCH(RunEmulated)(problems, plans, threads);
}

}  // namespace attn::detail
#endif  // HWY_ONCE
