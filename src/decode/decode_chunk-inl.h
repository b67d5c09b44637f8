// The steps both decode chunk kernels share (the generic one in decode_simd.cpp, the AVX512-BF16 one in
// decode_simd_bf16-inl.h), a Highway per-target header: the key walk and its dots4 layout, the score
// transform, the vectorised fold, P V split by what each row sees, and RunChunk, which strings them
// together around a kernel's own dot products and P V. Included by decode_simd.cpp inside
// foreach_target, once per target.
#if defined(ATTN_DECODE_CHUNK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_DECODE_CHUNK_INL_H_
#undef ATTN_DECODE_CHUNK_INL_H_
#else
#define ATTN_DECODE_CHUNK_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "attn/online_softmax.hpp"
#include "cpu/exp_simd-inl.h"
#include "decode/decode_internal.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

#if !(HWY_TARGET == HWY_SCALAR || HWY_HAVE_SCALABLE)
// The 128-bit blocks of v added together.
template <class D>
HWY_INLINE hn::Vec<hn::Full128<float>> FoldBlocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(d) <= 4) {
    return v;
  } else {
    const hn::Half<D> dh;
    return FoldBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}
#endif

// dst[r] = the sum of the lanes of a_r, r < 4: one transposing tree (two interleave levels inside each
// 128-bit block, then the blocks added) instead of four horizontal sums, whose latency chains the key
// walk would wait on.
template <class D, class V = hn::Vec<D>>
HWY_INLINE void StoreSum4(D d, V a0, V a1, V a2, V a3, float* HWY_RESTRICT dst) {
#if HWY_TARGET == HWY_SCALAR || HWY_HAVE_SCALABLE
  dst[0] = hn::GetLane(hn::SumOfLanes(d, a0));
  dst[1] = hn::GetLane(hn::SumOfLanes(d, a1));
  dst[2] = hn::GetLane(hn::SumOfLanes(d, a2));
  dst[3] = hn::GetLane(hn::SumOfLanes(d, a3));
#else
  // Per block: t0 = (a0[0] + a0[2], a1[0] + a1[2], a0[1] + a0[3], a1[1] + a1[3]), t1 likewise for a2, a3;
  // the 64-bit halves of t0 and t1 then add up to (sum a0, sum a1, sum a2, sum a3).
  const V t0 = hn::Add(hn::InterleaveLower(d, a0, a1), hn::InterleaveUpper(d, a0, a1));
  const V t1 = hn::Add(hn::InterleaveLower(d, a2, a3), hn::InterleaveUpper(d, a2, a3));
  const hn::Repartition<std::uint64_t, D> d64;
  const auto w0 = hn::BitCast(d64, t0), w1 = hn::BitCast(d64, t1);
  const V u =
      hn::Add(hn::BitCast(d, hn::InterleaveLower(d64, w0, w1)), hn::BitCast(d, hn::InterleaveUpper(d64, w0, w1)));
  hn::StoreU(FoldBlocks(d, u), hn::Full128<float>(), dst);
#endif
}

// f(std::integral_constant<int, nr>(), args...) for nr in 1 .. 4: kernels register-block up to 4 query
// rows, and the row count must be a template argument for the blocks to stay in registers.
template <class F, class... Args>
HWY_INLINE void WithRowCount(std::int64_t nr, F&& f, Args&&... args) {
  switch (nr) {
    case 4:
      f(std::integral_constant<int, 4>(), args...);
      break;
    case 3:
      f(std::integral_constant<int, 3>(), args...);
      break;
    case 2:
      f(std::integral_constant<int, 2>(), args...);
      break;
    default:
      f(std::integral_constant<int, 1>(), args...);
      break;
  }
}

// f(std::integral_constant<int, D>()) with D = d for the head dims the dot products unroll for (64, 128,
// 192, 256: the out-of-order core then overlaps more keys), else D = 0 (d read at run time). 192 unrolled
// ran about 10% faster than the run-time loop; 512 and 576 (MLA) ran alike either way, their loops long
// enough (`attn bench decode --head-dim`, docs/head-dims.md).
template <class F>
HWY_INLINE void WithHeadDim(std::int64_t d, F&& f) {
  switch (d) {
    case 64:
      return f(std::integral_constant<int, 64>());
    case 128:
      return f(std::integral_constant<int, 128>());
    case 192:
      return f(std::integral_constant<int, 192>());
    case 256:
      return f(std::integral_constant<int, 256>());
    default:
      return f(std::integral_constant<int, 0>());
  }
}

// attn::fold for one row over a chunk, vectorised: s[0..kChunk) scores (-inf past n), p gets exp(s - m).
HWY_INLINE void FoldRow(float* s, float* p, std::int64_t n, float* o, float* m, float* l, std::int64_t d) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const float ninf = -std::numeric_limits<float>::infinity();
  if (*m != *m) {  // poisoned by an earlier NaN score: stays NaN (attn::fold)
    std::memset(p, 0, sizeof(float) * kChunk);
    return;
  }
  for (std::int64_t c = n; c < kChunk; ++c) s[c] = ninf;
  VF vmax = hn::Set(df, ninf), nan = hn::Zero(df);
  for (std::int64_t c = 0; c < kChunk; c += N) {
    const VF v = hn::LoadU(df, s + c);
    vmax = hn::Max(vmax, v);
    nan = hn::Or(nan, hn::VecFromMask(df, hn::IsNaN(v)));
  }
  // A NaN score (NaN in q or in a visible key) poisons the row, as attn::fold does; vector max and
  // exp would otherwise drop it.
  if (!hn::AllFalse(df, hn::MaskFromVec(nan))) {
    poison(RowState<float>{m, l, o, d});
    std::memset(p, 0, sizeof(float) * kChunk);
    return;
  }
  const float m_tile = hn::GetLane(hn::MaxOfLanes(df, vmax));
  if (m_tile == ninf) {  // nothing visible: the state is unchanged, p = 0
    std::memset(p, 0, sizeof(float) * kChunk);
    return;
  }
  const float m_new = m_tile > *m ? m_tile : *m;
  const float alpha = m_new == *m ? 1.0f : rescale_factor(*m, m_new);  // exp(0) = 1 exactly: skip the call
  if (alpha != 1.0f) {
    *l *= alpha;
    const VF va = hn::Set(df, alpha);
    std::int64_t x = 0;
    for (; x + N <= d; x += N) hn::StoreU(hn::Mul(hn::LoadU(df, o + x), va), df, o + x);
    for (; x < d; ++x) o[x] *= alpha;
  }
  *m = m_new;
  const VF vm = hn::Set(df, m_new);
  VF sum = hn::Zero(df);
  for (std::int64_t c = 0; c < kChunk; c += N) {
    const VF e = exp_simd::HWY_NAMESPACE::ExpDiff(df, hn::LoadU(df, s + c), vm);
    hn::StoreU(e, df, p + c);
    sum = hn::Add(sum, e);
  }
  *l += hn::GetLane(hn::SumOfLanes(df, sum));
}

// P V for the stacked query rows r0 .. r0 + nr of kv head g, through
//   pv(std::integral_constant<int, k>(), g, p, c0, m, o):  o_t += sum_{c < m} p[t][c] v_{c0 + c}, t < k
// (p and o rows kChunk and state_stride apart). Rows that see every key of the chunk share one
// register-blocked call; a row whose window cuts the chunk gets its own call over just the keys it
// sees: masked keys are skipped, never weighted by p = 0, because 0 x NaN is NaN and a non-finite value
// row must only reach the rows that see it.
template <class PvFn>
HWY_INLINE void PvVisibleKeys(const ChunkArgs<float>& a, std::int64_t g, std::int64_t r0, std::int64_t nr,
                              const float* probs, float* st, PvFn&& pv) {
  const std::int64_t S = a.state_stride;
  std::int64_t lo[4], hi[4];
  bool full = true;
  for (std::int64_t t = 0; t < nr; ++t) {
    const std::int64_t i = (r0 + t) % a.seqlen_q;
    const Mask::TileKeys keys = Mask::cut_to_tile(a.first_key[i], a.end_key[i], a.j0, a.n);
    lo[t] = keys.lo;
    hi[t] = keys.hi;
    full = full && lo[t] == 0 && hi[t] == a.n;
  }
  const float* pr = probs + r0 * kChunk;
  float* o = st + r0 * S;
  if (full) return WithRowCount(nr, pv, g, pr, std::int64_t{0}, a.n, o);
  for (std::int64_t t = 0; t < nr; ++t)
    if (hi[t] > lo[t])
      pv(std::integral_constant<int, 1>(), g, pr + t * kChunk + lo[t], lo[t], hi[t] - lo[t], o + t * S);
}

// scores[g][r][0..n) hold raw dots q . k; apply the mask's score rule (a vector multiply in the common
// case of no softcap and no ALiBi) and set the keys outside each row's range to -inf.
HWY_INLINE void TransformScores(const ChunkArgs<float>& a, float* scores) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df)), R = a.group * a.seqlen_q, n = a.n;
  const float ninf = -std::numeric_limits<float>::infinity();
  const auto vs = hn::Set(df, static_cast<float>(a.mask->rule.scale));
  for (std::int64_t g = 0; g < a.kv_heads; ++g)
    for (std::int64_t r = 0; r < R; ++r) {
      float* sr = scores + (g * R + r) * kChunk;
      const std::int64_t i = r % a.seqlen_q;
      const float slope = a.slopes[g * a.group + r / a.seqlen_q];
      const auto [lo, hi] = Mask::cut_to_tile(a.first_key[i], a.end_key[i], a.j0, n);
      if (!a.mask->transforms_scores(slope)) {  // Mask::score is dot * float(scale) here: the same product
        for (std::int64_t c = 0; c < n; c += N) hn::StoreU(hn::Mul(hn::LoadU(df, sr + c), vs), df, sr + c);
      } else {
        for (std::int64_t c = lo; c < hi; ++c) sr[c] = a.mask->score(sr[c], i, a.j0 + c, slope);
      }
      for (std::int64_t c = 0; c < lo; ++c) sr[c] = ninf;
      for (std::int64_t c = hi; c < n; ++c) sr[c] = ninf;
    }
}

// Prefetches kv head g's V row of key c (consumed by the head-by-head P V pass after the scores).
template <class T>
HWY_INLINE void PrefetchV(const ChunkArgs<float>& a, std::int64_t c, std::int64_t g) {
  const char* vr = static_cast<const char*>(a.v_rows[c]) + g * a.v_head_stride * static_cast<std::int64_t>(sizeof(T));
  for (std::int64_t b = 0; b < a.head_dim_v * static_cast<std::int64_t>(sizeof(T)); b += 64)
    __builtin_prefetch(vr + b, 0, 2);
}

// The key walk (every kv head of key c before key c + 1, so K is read front to back: the pattern the
// hardware prefetcher streams best, about twice the head-by-head order on Zen 4), each kv head's V row
// prefetched as its K row is consumed. It is latency-bound -- each K row's dot-product chains and the
// reduction after them wait on the row's load -- so its instructions per key are kept few (no loop over
// d, one vector store of four dots) and the out-of-order core overlaps more keys.
//
// Output layout: the dots of query rows 4b .. 4b + 3 of kv head g with key c are one 4-float group at
// dots4[((g * RB + b) * kChunk + c) * 4], RB = ceil(R / 4), written by
//   dots(nr, row, k, dst, c, g):  dst[t] = q_{row + t} . k for t < nr, dst[nr ..] = 0
// where row = g * R + 4 b is the first of the nr <= 4 query rows and k is kv head g's K row of key c
// (c and g locate the key's scales in a quantized cache with scales per block of dims).
// Kernels form the row pointers in dots and pass them, through WithRowCount, to a lambda that captures
// nothing: GCC then compiles the walk as tightly as a loop nest written out by hand (an inner lambda
// that captures them costs several instructions per block).
template <class T, class DotsFn>
HWY_INLINE void WalkKeys(const ChunkArgs<float>& a, float* dots4, DotsFn&& dots) {
  const std::int64_t R = a.group * a.seqlen_q, RB = (R + 3) / 4;
  const T* const* krows = reinterpret_cast<const T* const*>(a.k_rows);
  for (std::int64_t c = 0; c < a.n; ++c)
    for (std::int64_t g = 0; g < a.kv_heads; ++g) {
      PrefetchV<T>(a, c, g);
      const T* kr = krows[c] + g * a.k_head_stride;
      for (std::int64_t b = 0; b < RB; ++b)
        dots(std::min<std::int64_t>(4, R - 4 * b), g * R + 4 * b, kr, dots4 + ((g * RB + b) * kChunk + c) * 4, c, g);
    }
}

// The key walk for kernels that hold a block's q in registers across keys: in runs of kHeldKeys keys, kv
// head by kv head, for each kv head g and block b of 4 query rows,
//   block(nr, row, g, prefetch_v, dst, c0, c1):  dst[4 c + t] = q_{row + t} . k_c for c0 <= c < c1, t < nr
//                                                 (0 past nr)
// with WalkKeys' rows and dots4 layout; k_c is kv head g's K row of key c, and with prefetch_v (the
// head's first block) the block also prefetches each key's V row (PrefetchV) as it reads its K row.
// For a quantized cache, loading q for every key cost the dot products about a fifth of their time (16
// vector loads per key at head dim 128, beside the codes' conversion): in runs of 16 keys int8, q8_0 and
// fp8 caches ran 10-25% faster on Zen 4. A bf16 cache, which has no conversion and is closer to the
// memory's rate, ran 5-10% slower with 2 threads (K read with a stride of one kv head's row; 10-30% with
// whole chunks per kv head) and keeps WalkKeys (docs/decode.md).
constexpr std::int64_t kHeldKeys = 16;
template <class BlockFn>
HWY_INLINE void WalkHeads(const ChunkArgs<float>& a, float* dots4, BlockFn&& block) {
  const std::int64_t R = a.group * a.seqlen_q, RB = (R + 3) / 4;
  for (std::int64_t c0 = 0; c0 < a.n; c0 += kHeldKeys)
    for (std::int64_t g = 0; g < a.kv_heads; ++g)
      for (std::int64_t b = 0; b < RB; ++b)
        block(std::min<std::int64_t>(4, R - 4 * b), g * R + 4 * b, g, b == 0, dots4 + (g * RB + b) * kChunk * 4, c0,
              std::min(a.n, c0 + kHeldKeys));
}

// K's scales of key c and kv head g when they are per block of dims (k_groups > 1; ChunkArgs' layout),
// else nullptr (one scale per row is applied by RunChunk).
HWY_INLINE const float* KeyBlockScales(const ChunkArgs<float>& a, std::int64_t c, std::int64_t g) {
  return a.k_scales != nullptr && a.k_groups > 1 ? a.k_scales + (c * a.kv_heads + g) * a.k_groups : nullptr;
}

// De-interleaves WalkKeys' dots4 to scores[g][r][0 .. kChunk) (lanes past n are copied too; they are set
// to -inf before use).
HWY_INLINE void UntangleDots(const ChunkArgs<float>& a, const float* dots4, float* scores) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df)), R = a.group * a.seqlen_q, RB = (R + 3) / 4;
  for (std::int64_t g = 0; g < a.kv_heads; ++g)
    for (std::int64_t b = 0; b < RB; ++b) {
      const float* src = dots4 + (g * RB + b) * kChunk * 4;
      const std::int64_t nr = std::min<std::int64_t>(4, R - 4 * b);
      float* dst = scores + (g * R + 4 * b) * kChunk;
      for (std::int64_t c = 0; c < a.n; c += N) {
        VF rows[4];
        hn::LoadInterleaved4(df, src + c * 4, rows[0], rows[1], rows[2], rows[3]);
        for (std::int64_t t = 0; t < nr; ++t) hn::StoreU(rows[t], df, dst + t * kChunk + c);
      }
    }
}

// rows[t][c] *= unit * scales[(t / rows_per_scale) * kChunk + c] for `count` rows of kChunk lanes, c < n:
// a quantized cache's per-key scales (one row of them per kv head) applied to its dots or weights, times
// the power of two its loaded codes leave out (stored_unit, decode_quant-inl.h; exact, so the product is
// the one of the exact codes).
HWY_INLINE void ScaleLanes(const float* scales, float* rows, std::int64_t count, std::int64_t rows_per_scale,
                           std::int64_t n, float unit) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const VF vu = hn::Set(df, unit);
  for (std::int64_t t = 0; t < count; ++t) {
    const float* s = scales + (t / rows_per_scale) * kChunk;
    float* row = rows + t * kChunk;
    std::int64_t c = 0;
    for (; c + N <= n; c += N)
      hn::StoreU(hn::Mul(hn::LoadU(df, row + c), hn::Mul(hn::LoadU(df, s + c), vu)), df, row + c);
    for (; c < n; ++c) row[c] *= s[c] * unit;
  }
}

// Kv head g's K rows of the item's next chunk, into L2, before kv head g's P V pass: that pass works from
// cache (its V was prefetched by the key walk), and without these the memory would idle during it.
template <class T>
HWY_INLINE void PrefetchNextK(const ChunkArgs<float>& a, std::int64_t g) {
  constexpr auto kBytes = static_cast<std::int64_t>(sizeof(T));
  const std::int64_t bytes = a.head_dim * kBytes, at = g * a.k_head_stride * kBytes;
  for (std::int64_t c = 0; c < a.next_n; ++c) {
    const char* kr = static_cast<const char*>(a.next_k_rows[c]) + at;
    for (std::int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(kr + b, 0, 2);
  }
}

// One chunk of a cache of T, all kv heads: score_keys(dots4) fills the key walk's dots (WalkKeys), which
// become masked, scaled scores; then per kv head g every row is folded (probabilities in the scratch) and
// P V is added through pv (PvVisibleKeys). A quantized cache's per-row scales are applied times `unit`,
// the power of two the kernel's loaded codes leave out.
template <class T, class ScoreKeysFn, class PvFn>
HWY_INLINE void RunChunk(const ChunkArgs<float>& a, float unit, ScoreKeysFn&& score_keys, PvFn&& pv) {
  const std::int64_t dv = a.head_dim_v, R = a.group * a.seqlen_q, S = a.state_stride;
  float* scores = a.scratch;  // [kv_heads][R][kChunk]
  float* probs = a.scratch + a.kv_heads * R * kChunk;
  float* dots4 = a.scratch + chunk_dots4_offset(a.kv_heads, R, a.head_dim, dv);
  score_keys(dots4);
  UntangleDots(a, dots4, scores);
  if (a.k_scales && a.k_groups == 1) ScaleLanes(a.k_scales, scores, a.kv_heads * R, R, a.n, unit);
  TransformScores(a, scores);
  for (std::int64_t g = 0; g < a.kv_heads; ++g) {
    float* st = a.states + g * R * S;
    for (std::int64_t r = 0; r < R; ++r)
      FoldRow(scores + (g * R + r) * kChunk, probs + r * kChunk, a.n, st + r * S, st + r * S + S - 2,
              st + r * S + S - 1, dv);
    if (a.v_scales && a.v_groups == 1) ScaleLanes(a.v_scales + g * kChunk, probs, R, R, a.n, unit);
    PrefetchNextK<T>(a, g);
    for (std::int64_t r0 = 0; r0 < R; r0 += 4)
      PvVisibleKeys(a, g, r0, std::min<std::int64_t>(4, R - r0), probs, st, pv);
  }
}

}  // namespace attn::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // ATTN_DECODE_CHUNK_INL_H_
