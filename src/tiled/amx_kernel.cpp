// The tiled forward on AMX tiles (bf16 inputs, and f16 where the tiles run TDPFP16PS): the two block
// products on TDPBF16PS (TDPFP16PS), the online softmax between them on the vector units. One kernel template over the
// tile unit (amx/amx_tiles.hpp): the CPU's tiles, or the emulator on any CPU. docs/prefill.md has the floor and the
// design.
//
// Per task (batch b, kv head, query tile of every query head sharing it, stacked to R rows, R padded to
// 32 with zero rows):
//   pack Q      [R][dq] bf16, dq = d rounded up to 32 (zero columns): the A operand of S = Q K^T
//   for each key tile [j0, j0 + n) any row sees (n <= bc, the tile padded to np = n rounded up to 32):
//     pack K    [dq/2][bc] bf16 pairs (K^T in the VNNI layout: pair row x holds (k[c][2x], k[c][2x+1])
//               for every key c), the B operand of S
//     pack V    [bc/2][dvp] bf16 pairs (pair row y holds (v[2y][x], v[2y+1][x]) for every column x;
//               dvp = d_v rounded up to 32), the B operand of O += P V; keys past n are zero rows
//     S  [R][bc] f32 = Q K^T in 2 x 2 blocks of 16 x 16 tiles, blocks no row sees skipped
//     per row, lanes along keys: the score rule (scale, soft-cap, ALiBi) on the keys the row sees and
//               their maximum; m_new, alpha = rescale_factor(m, m_new); P = exp(s - m_new), l = l alpha
//               + the sum of P, and P (times Z / (1 - p) with dropout: DropRowFactors) rounded to bf16
//               for P V (the keys the row does not see 0)
//     O  [R][dvp] f32 = O alpha (rows whose maximum grew) + P V, 2 x 2 blocks of tiles loaded from and
//               stored back to O, key blocks no row of the block sees skipped
//   finalize each row (store_row: the sink, attn::finalize, the lse) and store it.
// P is rounded to bf16 before P V, as flash-attn and PyTorch's CPU flash attention do on these CPUs;
// l sums the f32 weights, so the lse keeps f32 accuracy. f16 inputs run the same with f16 for bf16
// (E, the element type: the packing copies 16-bit patterns whatever they encode). f32 inputs
// (ATTN_AMX_F32=bf16x3) run on bf16 tiles by parts: Q, K, V and P split into three bf16 planes each,
// every block product the sum of six part products (Format, PartProducts in amx_task-inl.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tiled/amx_kernel.cpp"
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128)
#endif
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "attn/online_softmax.hpp"
#include "amx/amx.hpp"
#include "amx/amx_emulator.hpp"
#include "amx/amx_round-inl.h"
#include "amx/amx_tiles.hpp"
#include "core/element.hpp"
#include "cpu/exp_simd-inl.h"
#include "cpu/philox-inl.h"
#include "cpu/tile_ops.hpp"
#include "tiled/amx_forward.hpp"
#include "tiled/amx_pack-inl.h"
#include "tiled/amx_task-inl.h"
#include "tiled/tiled_kernel.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::amx_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The accumulator tiles C0..C3 of a 32 x 32 f32 block at `block`, its rows `row` floats apart: zeroed,
// loaded, stored.
template <class Unit>
HWY_INLINE void ZeroBlock(Unit& u) {
  u.template zero<0>();
  u.template zero<1>();
  u.template zero<2>();
  u.template zero<3>();
}
template <class Unit>
HWY_INLINE void LoadBlock(Unit& u, const float* block, std::size_t row) {
  const std::int64_t stride = 4 * static_cast<std::int64_t>(row);
  u.template load<0>(block, stride);
  u.template load<1>(block + 16, stride);
  u.template load<2>(block + 16 * row, stride);
  u.template load<3>(block + 16 * row + 16, stride);
}
template <class Unit>
HWY_INLINE void StoreBlock(Unit& u, float* block, std::size_t row) {
  const std::int64_t stride = 4 * static_cast<std::int64_t>(row);
  u.template store<0>(block, stride);
  u.template store<1>(block + 16, stride);
  u.template store<2>(block + 16 * row, stride);
  u.template store<3>(block + 16 * row + 16, stride);
}

// S = Q K^T for the tile's np keys, 32 x 32 blocks (tiles C0..C3) that some row sees, each the sum of the
// part products (PartProducts) over the head dim.
// kt: the packed keys' block of the tile's first key.
template <class F, class Unit>
HWY_INLINE void Scores(Unit& u, const AmxTask& t, const std::uint32_t* kt, std::size_t np, const AmxScratch& w,
                       std::size_t r_begin, std::size_t r_end) {
  const std::int64_t q_stride = 2 * static_cast<std::int64_t>(t.dq), k_stride = 4 * static_cast<std::int64_t>(kBlock);
  for (std::size_t r0 = r_begin; r0 < r_end; r0 += kBlock)
    for (std::size_t c0 = 0; c0 < np; c0 += kBlock) {
      if (!BlockSeen(w, r0, c0)) continue;
      ZeroBlock(u);
      for (const PartPair& pair : PartProducts<F>())
        for (std::size_t x = 0; x < t.dq; x += kBlock) {
          const std::uint16_t* qa = w.q + pair.a * w.q_plane;
          u.template load<4>(qa + r0 * t.dq + x, q_stride);
          u.template load<5>(qa + (r0 + 16) * t.dq + x, q_stride);
          const std::uint32_t* kb = kt + pair.b * t.k_plane + (c0 / kBlock) * (t.dq / 2) * kBlock + (x / 2) * kBlock;
          u.template load<6>(kb, k_stride);
          u.template load<7>(kb + 16, k_stride);
          amx::dot_2x2_of<typename F::E>(u);
        }
      StoreBlock(u, w.s + r0 * t.bcp + c0, t.bcp);
    }
}

// S = Q K^T one score at a time in f32 from the parts' sums (the f32 inputs), in the textbook's order: for
// an f32 task with an Inf or NaN query or key, where a part product such as q0 k1 = Inf x 0 would give a
// NaN to a score whose f32 dot product is Inf. Rare, so plain loops.
template <class F>
HWY_INLINE void ScoresRows(const AmxTask& t, const std::uint32_t* kt, std::size_t np, const AmxScratch& w,
                           std::size_t r_begin, std::size_t r_end) {
  const auto* kh = reinterpret_cast<const std::uint16_t*>(kt);
  for (std::size_t r = r_begin; r < std::min(r_end, t.real); ++r)
    for (std::size_t c = 0; c < np; ++c) {
      float sum = 0.0f;
      for (std::size_t x = 0; x < t.dq; ++x) {
        const std::size_t word = (c / kBlock) * (t.dq / 2) * kBlock + (x / 2) * kBlock + c % kBlock;
        sum += PartsSum<F>(w.q + r * t.dq + x, w.q_plane) * PartsSum<F>(kh + 2 * word + (x & 1), 2 * t.k_plane);
      }
      w.s[r * t.bcp + c] = sum;
    }
}

// Row r's scores on the tile, lanes along keys: the score rule applied in place to the vectors [begin,
// end) that hold its visible keys [lo, hi) (keys outside them -inf), and their maximum. The common row
// (every key of the tile visible, no transform beyond a positive scale) is left raw: its maximum is that
// of the raw scores, scaled once (a positive scale keeps the order, and rounds the maximum as it would
// each score), and RowWeights takes the exponential's argument in one multiply-add from the raw scores.
template <class D>
HWY_INLINE float RowMaximum(D d, const Problem& p, const AmxTask& t, std::size_t r, std::int64_t j0, bool plain,
                            std::size_t begin, std::size_t end, const AmxScratch& w) {
  const std::size_t N = hn::Lanes(d);
  float* s = w.s + r * t.bcp;
  const ScoreRule& rule = p.rule;
  const auto scale = hn::Set(d, static_cast<float>(rule.scale));
  const auto neg_inf = hn::Set(d, -std::numeric_limits<float>::infinity());
  auto mx = neg_inf;
  if (plain) {
    for (std::size_t c = begin; c < end; c += N) mx = hn::Max(mx, hn::Load(d, s + c));
    return hn::GetLane(hn::MaxOfLanes(d, hn::Mul(mx, scale)));
  }
  const bool softcap = rule.softcap > 0, alibi = rule.alibi_slopes != nullptr;
  const auto cap = hn::Set(d, static_cast<float>(rule.softcap));
  const auto slope = hn::Set(d, alibi ? rule.alibi_slope(t.b, t.head_of(r)) : 0.0f);
  const auto lo_v = hn::Set(d, static_cast<float>(w.lo[r])), hi_v = hn::Set(d, static_cast<float>(w.hi[r]));
  // Key c's ALiBi distance diagonal(i) - (j0 + c), exact in f32 (small integers).
  const float diag = static_cast<float>(p.mask().diagonal(t.query_of(r)) - j0);
  for (std::size_t c = begin; c < end; c += N) {
    const auto key = hn::Add(hn::Set(d, static_cast<float>(c)), hn::Iota(d, 0.0f));
    auto sc = hn::Mul(hn::Load(d, s + c), scale);
    if (softcap) sc = hn::Mul(cap, hn::Tanh(d, hn::Div(sc, cap)));
    if (alibi) sc = hn::NegMulAdd(slope, hn::Abs(hn::Sub(hn::Set(d, diag), key)), sc);
    sc = hn::IfThenElse(hn::And(hn::Ge(key, lo_v), hn::Lt(key, hi_v)), sc, neg_inf);
    hn::Store(sc, d, s + c);
    mx = hn::Max(mx, sc);
  }
  return hn::GetLane(hn::MaxOfLanes(d, mx));
}

// Row r's weights on [begin, end): P = exp(s - m) (from RowMaximum's scores), their sum before any
// rounding (as flash-attn's kernels: l, hence the lse, keeps f32 accuracy), and P times the dropout
// factor (kDrop: w.drop holds the factors from key begin on) rounded to E for P V (f32: split into its
// three bf16 parts).
template <class F, bool kNativeConvert, bool kDrop, class D>
HWY_INLINE float RowWeights(D d, const Problem& p, std::size_t r, bool plain, float m_new, std::size_t begin,
                            std::size_t end, const AmxTask& t, const AmxScratch& w) {
  const std::size_t N = hn::Lanes(d);
  const float* s = w.s + r * t.bcp;
  std::uint16_t* prow = w.p + r * t.bcp;
  // A row whose visible scores are all -inf keeps m = -inf: exp(-inf - 0) = 0, not exp(-inf + inf).
  const auto m = hn::Set(d, m_new == -std::numeric_limits<float>::infinity() ? 0.0f : m_new);
  const auto c1 = hn::Set(d, static_cast<float>(p.rule.scale * 1.4426950408889634));
  const auto mc = hn::Mul(m, hn::Set(d, 1.44269504088896341f));
  auto sum = hn::Zero(d);
  for (std::size_t c = begin; c < end; c += N) {
    // plain: t = (s scale - m) log2(e) in one multiply-add
    const auto pv = plain ? exp_simd::HWY_NAMESPACE::Exp2(d, hn::MulSub(hn::Load(d, s + c), c1, mc))
                          : exp_simd::HWY_NAMESPACE::ExpDiff(d, hn::Load(d, s + c), m);
    sum = hn::Add(sum, pv);
    const auto pd = kDrop ? hn::Mul(pv, hn::LoadU(d, w.drop + (c - begin))) : pv;
    if constexpr (F::kParts == 3)
      StoreSplitBf16x3<kNativeConvert>(d, pd, prow + c, w.p_plane);
    else
      StoreRounded<typename F::E, kNativeConvert>(d, pd, prow + c);
  }
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

// Row r's softmax step on the tile, lanes along keys: the score rule on the keys it sees, [lo, hi), their
// maximum into m (alpha = rescale_factor(m, m_new)), l = l alpha + the sum of P, and P (dropped, with
// dropout) rounded to E for the vectors that hold visible keys, 0 for the rest of [0, np).
// Whole vectors only: the scratch rows are np >= hi rounded up to the lane count wide, and lanes of keys
// outside [lo, hi) are replaced by -inf before they count (their S values are stale or never written).
template <class F, bool kNativeConvert, class D>
HWY_INLINE void RowSoftmax(D d, const Problem& p, const AmxTask& t, std::size_t r, std::int64_t j0, std::size_t np,
                           const AmxScratch& w) {
  const std::size_t N = hn::Lanes(d);
  const std::size_t lo = static_cast<std::size_t>(w.lo[r]), hi = static_cast<std::size_t>(w.hi[r]);
  std::uint16_t* prow = w.p + r * t.bcp;
  if (lo >= hi) {  // no key of this tile: the state is unchanged
    for (std::size_t k = 0; k < F::kParts; ++k) std::memset(prow + k * w.p_plane, 0, 2 * np);
    w.alpha[r] = 1.0f;
    return;
  }
  // Whole vectors and whole groups of four keys (dropout's Philox groups; j0 is a multiple of 32).
  const std::size_t step = std::max<std::size_t>(N, 4), begin = lo / step * step, end = RoundUp(hi, step);
  const bool plain = !p.rule.transforms_scores() && p.rule.scale > 0 && lo == 0 && hi == np;
  const float m_old = w.m[r], m_new = std::max(m_old, RowMaximum(d, p, t, r, j0, plain, begin, end, w));
  w.alpha[r] = rescale_factor(m_old, m_new);
  w.m[r] = m_new;
  // m_new is finite or +inf here (some key is visible): +inf - +inf gives NaN, which poisons the row as
  // attn::fold does; a NaN score likewise.
  float sum;
  if (p.dropout.enabled()) {
    const std::int64_t first = (j0 + static_cast<std::int64_t>(begin)) / 4;
    philox_simd::HWY_NAMESPACE::DropRowFactors(d, p.dropout, static_cast<std::uint32_t>(t.query_of(r)),
                                               p.dropout.head_word(t.b, t.head_of(r)), first, (end - begin) / 4,
                                               w.drop);
    sum = RowWeights<F, kNativeConvert, true>(d, p, r, plain, m_new, begin, end, t, w);
  } else {
    sum = RowWeights<F, kNativeConvert, false>(d, p, r, plain, m_new, begin, end, t, w);
  }
  for (std::size_t k = 0; k < F::kParts; ++k) {
    std::memset(prow + k * w.p_plane, 0, 2 * begin);
    std::memset(prow + k * w.p_plane + end, 0, 2 * (np - end));
  }
  w.l[r] = w.l[r] * w.alpha[r] + sum;
}

// O rows whose maximum grew: O *= alpha.
template <class D>
HWY_INLINE void RescaleOutputs(D d, const AmxTask& t, const AmxScratch& w, std::size_t r_begin, std::size_t r_end) {
  const std::size_t N = hn::Lanes(d);
  for (std::size_t r = r_begin; r < r_end; ++r) {
    if (w.alpha[r] == 1.0f) continue;
    const auto a = hn::Set(d, w.alpha[r]);
    float* o = w.o + r * t.dvp;
    for (std::size_t x = 0; x < t.dvp; x += N) hn::Store(hn::Mul(hn::Load(d, o + x), a), d, o + x);
  }
}

// O += P V on the tiles: for each 32 x 32 block of O, the key blocks some row of the block sees, each the
// sum of the part products (PartProducts). One part: the accumulators C0..C3 are loaded from O and stored
// back. bf16x3: they start from zero, the six products go smallest first, and the block is then added to O
// on the vectors (loading O into them would round each small product at O's scale).
// vt: the packed values' pair row of the tile's first key.
template <class F, class Unit, class D>
HWY_INLINE void AddPvTiles(D d, Unit& u, const AmxTask& t, const std::uint32_t* vt, std::size_t np, const AmxScratch& w,
                           std::size_t r_begin, std::size_t r_end) {
  const std::int64_t p_stride = 2 * static_cast<std::int64_t>(t.bcp), v_stride = 4 * static_cast<std::int64_t>(t.dvp);
  const std::size_t N = hn::Lanes(d);
  for (std::size_t r0 = r_begin; r0 < r_end; r0 += kBlock)
    for (std::size_t x0 = 0; x0 < t.dvp; x0 += kBlock) {
      float* o = w.o + r0 * t.dvp + x0;
      if constexpr (F::kParts == 1)
        LoadBlock(u, o, t.dvp);
      else
        ZeroBlock(u);
      for (const PartPair& pair : PartProducts<F>())
        for (std::size_t c0 = 0; c0 < np; c0 += kBlock) {
          if (!BlockSeen(w, r0, c0)) continue;
          const std::uint16_t* pa = w.p + pair.a * w.p_plane;
          const std::uint32_t* vb = vt + pair.b * t.v_plane + (c0 / 2) * t.dvp + x0;
          u.template load<4>(pa + r0 * t.bcp + c0, p_stride);
          u.template load<5>(pa + (r0 + 16) * t.bcp + c0, p_stride);
          u.template load<6>(vb, v_stride);
          u.template load<7>(vb + 16, v_stride);
          amx::dot_2x2_of<typename F::E>(u);
        }
      if constexpr (F::kParts == 1) {
        StoreBlock(u, o, t.dvp);
      } else {
        StoreBlock(u, w.block, kBlock);
        for (std::size_t r = 0; r < kBlock; ++r)
          for (std::size_t x = 0; x < kBlock; x += N)
            hn::Store(hn::Add(hn::Load(d, o + r * t.dvp + x), hn::Load(d, w.block + r * kBlock + x)), d,
                      o + r * t.dvp + x);
      }
    }
}

// O += P V one row at a time over only the keys the row sees: for a tile that cuts through some row's
// window while some value is Inf or NaN, where a tile product's p = 0 x Inf would give NaN to a row that
// must not see that value (bf16x3: any tile, where p1 v0 = 0 x Inf would give NaN to a row whose f32
// product is Inf). Rare (a non-finite value), so plain loops; the same rounded P (bf16x3: its parts' sum).
template <class F>
HWY_INLINE void AddPvRows(const AmxTask& t, const std::uint32_t* vt, const AmxScratch& w) {
  for (std::size_t r = 0; r < t.real; ++r) {
    float* o = w.o + r * t.dvp;
    for (std::int32_t c = w.lo[r]; c < w.hi[r]; ++c) {
      const float pc = PartsSum<F>(w.p + r * t.bcp + static_cast<std::size_t>(c), w.p_plane);
      const auto* vrow = reinterpret_cast<const std::uint16_t*>(vt + static_cast<std::size_t>(c / 2) * t.dvp) + (c & 1);
      for (std::size_t x = 0; x < t.dvp; ++x) o[x] += pc * PartsSum<F>(vrow + 2 * x, 2 * t.v_plane);
    }
  }
}

// One task: a tile of queries of one kv head's group against every key tile any of them sees. Key
// tiles start at multiples of kBlock (the packed keys' blocks); keys before the first a row sees are
// masked like any other.
template <class F, class Unit, class D>
void RunTask(D d, Unit& u, const Problem& p, const TiledPlan& plan, const TileTask& task, const PackedHeads& heads,
             std::size_t problem, std::size_t head, const AmxScratch& w, std::size_t bcp) {
  AmxTask t;
  t.g = p.group();
  t.rows_h = task.rows;
  t.i0 = task.i0;
  t.b = task.b;
  t.kv_head = task.kv_head;
  t.real = static_cast<std::size_t>(t.g * t.rows_h);
  t.R = RoundUp(t.real, kBlock);
  t.dq = heads.dq;
  t.dvp = heads.dvp;
  t.bcp = bcp;
  t.k = heads.k + heads.k_at[head];
  t.v = heads.v + heads.v_at[head];
  t.k_plane = heads.k_plane(problem);
  t.v_plane = heads.v_plane(problem);
  t.v_nonfinite = heads.v_nonfinite[head] != 0;
  t.qk_nonfinite = PackQueries<F>(p, t, w) || heads.k_nonfinite[head] != 0;
  // bf16x3 takes a non-finite input off the part products (ScoresRows, AddPvRows)
  constexpr bool kByParts = F::kParts > 1;
  const bool score_rows = kByParts && t.qk_nonfinite;
  const auto block = static_cast<std::int64_t>(kBlock);
  const std::int64_t k_begin = p.first_key(t.i0) / block * block, k_end = p.end_key(t.i0 + t.rows_h - 1);
  for (std::int64_t j0 = k_begin; j0 < k_end; j0 += plan.k_tile) {
    const std::int64_t n = std::min(plan.k_tile, k_end - j0);
    const std::size_t np = RoundUp(static_cast<std::size_t>(n), kBlock);
    const std::uint32_t* kt = t.k + static_cast<std::size_t>(j0 / block) * (t.dq / 2) * kBlock;
    const std::uint32_t* vt = t.v + static_cast<std::size_t>(j0 / 2) * t.dvp;
    const bool masked = RowBounds(p, t, j0, n, np, w);
    const bool pv_rows = t.v_nonfinite && (masked || kByParts);
    // Row block by row block: the tile unit's work on one block (its P V, the next block's scores) can
    // overlap the vector units' softmax of another in the out-of-order window.
    for (std::size_t r0 = 0; r0 < t.R; r0 += kBlock) {
      const std::size_t r1 = r0 + kBlock;
      if (score_rows)
        ScoresRows<F>(t, kt, np, w, r0, r1);
      else
        Scores<F>(u, t, kt, np, w, r0, r1);
      for (std::size_t r = r0; r < std::min(r1, t.real); ++r)
        RowSoftmax<F, Unit::kNativeConvert>(d, p, t, r, j0, np, w);
      RescaleOutputs(d, t, w, r0, std::min(r1, t.real));
      if (!pv_rows) AddPvTiles<F>(d, u, t, vt, np, w, r0, r1);
    }
    if (pv_rows) AddPvRows<F>(t, vt, w);
  }
  // out is the input's type, or (a ring block's partial output) f32.
  const bool acc_out = p.out.dtype != p.dtype;
  for (std::size_t r = 0; r < t.real; ++r) {
    const RowState<float> s{w.m + r, w.l + r, w.o + r * t.dvp, p.head_dim_v};
    if (acc_out)
      store_row<float>(p, s, w.tmp, t.b, t.query_of(r), t.head_of(r));
    else
      store_row<typename F::In>(p, s, w.tmp, t.b, t.query_of(r), t.head_of(r));
  }
}

// Packs every kv head (one parallel loop), then runs the tasks (another) with one scratch per thread.
template <class Unit, class F>
void RunAllOn(const std::vector<Problem>& ps, const std::vector<TiledPlan>& plans,
              const std::vector<std::int64_t>& first_task, int threads) {
  const hn::ScalableTag<float> d;
  std::size_t R = 0, bcp = 0;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    R = std::max(R, RoundUp(static_cast<std::size_t>(ps[i].group() * plans[i].q_tile), kBlock));
    bcp = std::max(bcp, RoundUp(static_cast<std::size_t>(plans[i].k_tile), kBlock));
  }
  std::size_t k_total = 0, v_total = 0;
  PackedHeads heads = PlanHeads(ps, F::kParts, k_total, v_total);
  std::unique_ptr<std::uint32_t[]> once;
  heads.k = PackBuffer(k_total + v_total, once);
  heads.v = heads.k + k_total;
  const auto n_heads = static_cast<std::int64_t>(heads.k_at.size());
  const std::int64_t tasks = first_task.back();
  const std::size_t bytes = AmxScratch::bytes(R, heads.dq, heads.dvp, bcp, F::kParts);
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t hi = 0; hi < n_heads; ++hi) {
      const std::size_t pi = static_cast<std::size_t>(
          std::upper_bound(heads.first.begin(), heads.first.end(), static_cast<std::size_t>(hi)) - heads.first.begin() -
          1);
      const std::int64_t local = hi - static_cast<std::int64_t>(heads.first[pi]);
      PackHead(ps[pi], local / ps[pi].kv_heads, local % ps[pi].kv_heads, pi, static_cast<std::size_t>(hi), heads);
    }  // the loop's barrier: every head is packed before a task reads one
    void* base = ::operator new (bytes, std::align_val_t{64});
    std::memset(base, 0, bytes);
    const AmxScratch w(base, R, heads.dq, heads.dvp, bcp, F::kParts);
    Unit u;
    u.configure(amx::full_tiles());
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const auto it = std::upper_bound(first_task.begin(), first_task.end(), t);
      const auto pi = static_cast<std::uint32_t>(it - first_task.begin() - 1);
      const TileTask task = task_of(ps[pi], plans[pi], pi, t - first_task[pi]);
      const std::size_t head = heads.first[pi] + static_cast<std::size_t>(task.b * ps[pi].kv_heads + task.kv_head);
      RunTask<F>(d, u, ps[pi], plans[pi], task, heads, pi, head, w, bcp);
    }
    u.release();
    ::operator delete (base, std::align_val_t{64});
  }
}

// The element type's instance: f16 problems on TDPFP16PS, bf16 on TDPBF16PS, f32 on TDPBF16PS by parts
// (one dtype per call).
template <class Unit>
void RunTyped(const std::vector<Problem>& ps, const std::vector<TiledPlan>& plans,
              const std::vector<std::int64_t>& first_task, int threads) {
  if (ps[0].dtype == DType::f16)
    RunAllOn<Unit, F16Tiles>(ps, plans, first_task, threads);
  else if (ps[0].dtype == DType::f32)
    RunAllOn<Unit, F32Bf16x3>(ps, plans, first_task, threads);
  else
    RunAllOn<Unit, Bf16Tiles>(ps, plans, first_task, threads);
}

void RunEmulated(const std::vector<Problem>& ps, const std::vector<TiledPlan>& plans,
                 const std::vector<std::int64_t>& first_task, int threads) {
  RunTyped<amx::EmulatedTiles>(ps, plans, first_task, threads);
}

void RunHardware(const std::vector<Problem>& ps, const std::vector<TiledPlan>& plans,
                 const std::vector<std::int64_t>& first_task, int threads) {
#if defined(ATTN_AMX_HARDWARE)
  RunTyped<amx::HardwareTiles>(ps, plans, first_task, threads);
#else
  RunTyped<amx::EmulatedTiles>(ps, plans, first_task, threads);  // unreachable: amx_backend() is never hardware here
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::amx_simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
namespace amx_simd {
HWY_EXPORT(RunEmulated);
HWY_EXPORT(RunHardware);
}  // namespace amx_simd

bool amx_forward_takes(const Problem& p, amx::TileBackend backend) {
  return p.dtype == DType::bf16 || (p.dtype == DType::f16 && amx_runs_fp16(backend)) ||
         (p.dtype == DType::f32 && amx_f32_by_parts());
}

TiledPlan amx_plan(const Problem& p, const TileOptions& tiles) {
  // About 128 stacked query rows and 512 keys a tile (the tiles' per-tile costs, O's loads and stores
  // and the row bounds, amortised): docs/prefill.md has the sweep.
  // Key tiles are whole blocks of the packed keys: a forced k_tile is rounded up to a multiple of 32.
  const std::int64_t k_tile = (tiles.k_tile.value_or(512) + 31) / 32 * 32;
  return {tiles.q_tile.value_or(std::max<std::int64_t>(1, 128 / p.group())), k_tile};
}

void run_tiled_amx(const std::vector<Problem>& problems, const std::vector<TiledPlan>& plans,
                   const std::vector<std::int64_t>& first_task, int threads, amx::TileBackend backend) {
  using namespace amx_simd;
  if (backend == amx::TileBackend::hardware)
    HWY_DYNAMIC_DISPATCH(RunHardware)(problems, plans, first_task, threads);
  else
    HWY_DYNAMIC_DISPATCH(RunEmulated)(problems, plans, first_task, threads);
}

}  // namespace attn::detail
#endif  // HWY_ONCE
