// The decode chunk kernels for f32, bf16 and f16 caches, in Highway (compiled for every x86/Arm target,
// dispatched at run time). Accumulation in f32.
//
// Generic kernel (Chunk<T>), per kv head g and a chunk of n <= kChunk keys, with the R = group x
// seqlen_q query rows of g:
//   scores: each K row is loaded once (16-bit elements widened to f32 in registers) and dotted with up
//           to 4 query rows at a time (q rows stay in L1); the dot goes through the mask's score rule
//           (core/score_rule.hpp), masked keys get -inf.
//   fold:   attn::fold, vectorised over the chunk: the same m/l/o update and the same rescale_factor;
//           p = exp(s - m_new) with Highway's Exp (exp(-inf) = 0 for masked keys).
//   P V:    each V row is loaded once per 4 query rows x 64 output lanes, the o accumulators of that
//           block held in registers across the whole chunk.
// bf16 kernel on AVX512-BF16 CPUs (ChunkDp, below): the same three steps, but scores are computed in
// key order (every kv head of key c before key c + 1) so K is read front to back, which the hardware
// prefetcher streams about twice as fast as the head-by-head order on Zen 4; V row c is prefetched as
// K row c is consumed, so the head-by-head P V pass finds the chunk's V in cache.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

// GCC 12 reports the deliberately undefined upper lanes inside its own AVX-512 intrinsics headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "decode/decode_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include "attn/online_softmax.hpp"
#include "core/dpbf16.hpp"
#include "core/element.hpp"
#include "decode/decode_internal.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

template <class T>
struct HwyOf {
  using type = T;
};
template <>
struct HwyOf<bf16_t> {
  using type = hwy::bfloat16_t;
};
template <>
struct HwyOf<f16_t> {
  using type = hwy::float16_t;
};

// Lanes [x, x + N) of a cache row, widened to f32.
template <class T>
HWY_INLINE VF LoadRow(DF df, const T* row, std::int64_t x) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, row + x);
  } else {
    using H = typename HwyOf<T>::type;
    const hn::Rebind<H, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const H*>(row) + x));
  }
}

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

// dst[r] = q_r . k for NR <= 4 query rows (stride d) and one key row; dst[NR ..] = 0. D > 0 is d at
// compile time (64, 128, 256: the loop unrolls and the out-of-order core overlaps more keys).
template <int NR, int D, class T>
HWY_INLINE void Dots4(const float* q, std::int64_t d, const T* k, float* dst) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df)), dd = D > 0 ? D : d;
  VF acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = hn::Zero(df);
  std::int64_t x = 0;
#pragma GCC unroll 16
  for (; x + N <= dd; x += N) {
    const VF kv = LoadRow(df, k, x);
    for (int r = 0; r < NR; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, q + r * dd + x), kv, acc[r]);
  }
  StoreSum4(df, acc[0], acc[1], acc[2], acc[3], dst);
  for (; x < dd; ++x) {
    const float kx = load<float>(k[x]);
    for (int r = 0; r < NR; ++r) dst[r] += q[r * dd + x] * kx;
  }
}

// o_r[x .. x + NV*N) += sum_c p[r][c] v_c[x ..] for NR rows (states stride S, p stride kChunk).
template <int NR, int NV, class T>
HWY_INLINE void AccumulatePV(const float* p, const T* const* vrows, std::int64_t vhs, std::int64_t n, float* o,
                             std::int64_t S, std::int64_t x) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  VF acc[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::LoadU(df, o + r * S + x + v * N);
  for (std::int64_t c = 0; c < n; ++c) {
    const T* vr = vrows[c] + vhs;
    VF vv[NV];
    for (int v = 0; v < NV; ++v) vv[v] = LoadRow(df, vr, x + v * N);
    for (int r = 0; r < NR; ++r) {
      const VF pr = hn::Set(df, p[r * kChunk + c]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(pr, vv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[r][v], df, o + r * S + x + v * N);
}

template <int NR, class T>
HWY_INLINE void PVRows(const float* p, const T* const* vrows, std::int64_t vhs, std::int64_t n, float* o,
                       std::int64_t S, std::int64_t d) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t x = 0;
  for (; x + 4 * N <= d; x += 4 * N) AccumulatePV<NR, 4>(p, vrows, vhs, n, o, S, x);
  for (; x + N <= d; x += N) AccumulatePV<NR, 1>(p, vrows, vhs, n, o, S, x);
  for (; x < d; ++x)
    for (int r = 0; r < NR; ++r) {
      float acc = o[r * S + x];
      for (std::int64_t c = 0; c < n; ++c) acc += p[r * kChunk + c] * load<float>(vrows[c][vhs + x]);
      o[r * S + x] = acc;
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
    const VF e = hn::Exp(df, hn::Sub(hn::LoadU(df, s + c), vm));
    hn::StoreU(e, df, p + c);
    sum = hn::Add(sum, e);
  }
  *l += hn::GetLane(hn::SumOfLanes(df, sum));
}

// P V for stacked rows r0 .. r0 + nr of kv head g. Rows that see every key of the chunk share one
// register-blocked call (pv.template operator()<NR>); a row whose window cuts the chunk gets its own
// call over just the keys it sees: masked keys are skipped, never weighted by p = 0, because 0 x NaN
// is NaN and a non-finite value row must only reach the rows that see it.
template <class PV>
HWY_INLINE void PvRows(const ChunkArgs<float>& a, std::int64_t r0, std::int64_t nr, const float* probs, float* st,
                       PV&& pv) {
  const std::int64_t S = a.state_stride;
  std::int64_t lo[4], hi[4];
  bool full = true;
  for (std::int64_t t = 0; t < nr; ++t) {
    const std::int64_t i = (r0 + t) % a.seqlen_q;
    lo[t] = std::clamp<std::int64_t>(a.first_key[i] - a.j0, 0, a.n);
    hi[t] = std::clamp<std::int64_t>(a.end_key[i] - a.j0, lo[t], a.n);
    full = full && lo[t] == 0 && hi[t] == a.n;
  }
  const float* pr = probs + r0 * kChunk;
  float* o = st + r0 * S;
  if (full) {
    switch (nr) {
      case 4:
        return pv(std::integral_constant<int, 4>(), pr, 0, a.n, o);
      case 3:
        return pv(std::integral_constant<int, 3>(), pr, 0, a.n, o);
      case 2:
        return pv(std::integral_constant<int, 2>(), pr, 0, a.n, o);
      default:
        return pv(std::integral_constant<int, 1>(), pr, 0, a.n, o);
    }
  }
  for (std::int64_t t = 0; t < nr; ++t)
    if (hi[t] > lo[t]) pv(std::integral_constant<int, 1>(), pr + t * kChunk + lo[t], lo[t], hi[t] - lo[t], o + t * S);
}

// scores[g][r][0..n) hold raw dots q . k; apply the mask's score rule (a vector multiply in the common
// case of no softcap and no ALiBi) and set the keys outside each row's range to -inf.
HWY_INLINE void TransformScores(const ChunkArgs<float>& a, float* scores) {
  const DF df;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df)), R = a.group * a.seqlen_q, n = a.n;
  const float ninf = -std::numeric_limits<float>::infinity();
  const bool plain = a.mask->rule.softcap == 0;
  const auto vs = hn::Set(df, static_cast<float>(a.mask->rule.scale));
  for (std::int64_t g = 0; g < a.kv_heads; ++g)
    for (std::int64_t r = 0; r < R; ++r) {
      float* sr = scores + (g * R + r) * kChunk;
      const std::int64_t i = r % a.seqlen_q;
      const float slope = a.slopes[g * a.group + r / a.seqlen_q];
      const std::int64_t lo = std::clamp<std::int64_t>(a.first_key[i] - a.j0, 0, n);
      const std::int64_t hi = std::clamp<std::int64_t>(a.end_key[i] - a.j0, lo, n);
      if (plain && slope == 0.0f) {  // Mask::score is dot * float(scale) here: the same product
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
  for (std::int64_t b = 0; b < a.head_dim * static_cast<std::int64_t>(sizeof(T)); b += 64)
    __builtin_prefetch(vr + b, 0, 2);
}

// The key walk's output layout: the dots of query rows 4b .. 4b + 3 of kv head g with key c are one
// 4-float group at dots4[((g * RB + b) * kChunk + c) * 4], RB = ceil(R / 4), written by one vector store.
// This de-interleaves them to scores[g][r][0 .. kChunk) (lanes past n are copied too; they are set to
// -inf before use).
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

// The key walk (every kv head of key c before key c + 1, so K is read front to back: the pattern the
// hardware prefetcher streams best, about twice the head-by-head order on Zen 4), each kv head's V row
// prefetched as its K row is consumed. It is latency-bound -- each K row's dot-product chains and the
// reduction after them wait on the row's load -- so its instructions per key are kept few (no loop over
// d, one vector store of four dots) and the out-of-order core overlaps more keys.
template <class T, int D>
void ScoreKeys(const ChunkArgs<float>& a, float* dots4) {
  const std::int64_t d = D > 0 ? D : a.head_dim, R = a.group * a.seqlen_q, RB = (R + 3) / 4;
  const T* const* krows = reinterpret_cast<const T* const*>(a.k_rows);
  for (std::int64_t c = 0; c < a.n; ++c)
    for (std::int64_t g = 0; g < a.kv_heads; ++g) {
      PrefetchV<T>(a, c, g);
      const T* kr = krows[c] + g * a.k_head_stride;
      for (std::int64_t b = 0; b < RB; ++b) {
        const float* q = a.q + (g * R + 4 * b) * d;
        float* dst = dots4 + ((g * RB + b) * kChunk + c) * 4;
        switch (std::min<std::int64_t>(4, R - 4 * b)) {
          case 4:
            Dots4<4, D>(q, d, kr, dst);
            break;
          case 3:
            Dots4<3, D>(q, d, kr, dst);
            break;
          case 2:
            Dots4<2, D>(q, d, kr, dst);
            break;
          default:
            Dots4<1, D>(q, d, kr, dst);
            break;
        }
      }
    }
}

template <class T>
void Chunk(const ChunkArgs<float>& a) {
  const std::int64_t d = a.head_dim, R = a.group * a.seqlen_q, S = a.state_stride, n = a.n;
  float* scores = a.scratch;  // [kv_heads][R][kChunk]
  float* probs = a.scratch + a.kv_heads * R * kChunk;
  float* dots4 = a.scratch + chunk_dots4_offset(a.kv_heads, R, d);
  const T* const* vrows = reinterpret_cast<const T* const*>(a.v_rows);
  switch (d) {
    case 64:
      ScoreKeys<T, 64>(a, dots4);
      break;
    case 128:
      ScoreKeys<T, 128>(a, dots4);
      break;
    case 256:
      ScoreKeys<T, 256>(a, dots4);
      break;
    default:
      ScoreKeys<T, 0>(a, dots4);
      break;
  }
  UntangleDots(a, dots4, scores);
  TransformScores(a, scores);
  for (std::int64_t g = 0; g < a.kv_heads; ++g) {
    float* st = a.states + g * R * S;
    for (std::int64_t r = 0; r < R; ++r)
      FoldRow(scores + (g * R + r) * kChunk, probs + r * kChunk, n, st + r * S, st + r * S + S - 2, st + r * S + S - 1,
              d);
    const std::int64_t vh = g * a.v_head_stride;
    for (std::int64_t r0 = 0; r0 < R; r0 += 4)
      PvRows(a, r0, std::min<std::int64_t>(4, R - r0), probs, st,
             [&](auto nr, const float* p, std::int64_t c0, std::int64_t m, float* o) {
               PVRows<decltype(nr)::value>(p, vrows + c0, vh, m, o, S, d);
             });
  }
}

#if ATTN_DPBF16_TARGET
// bf16 caches on CPUs with AVX512-BF16 (core/dpbf16.hpp): q . k with VDPBF16PS, 32 products per
// instruction with no widening of K. q is split into
// q_hi + q_lo (both bf16) when it is not exactly a bf16 value, so an f32 q loses nothing that matters
// (|q_lo| <= 2^-9 |q|, and the rounding of q_lo is 2^-17 |q|, far below f32 accumulation error).
// P V: with a bf16 output, p is rounded to bf16 and VDPBF16PS does two keys per instruction (PVDp2);
// otherwise f32 FMAs on V widened by unpacking (PVDp). Both leave o in the unpack order, which
// FinishDispatch restores once per work item.
#define ATTN_DPBF16 1

// o is kept per 32-element block in the order VPUNPCK{L,H}WD leaves it: lanes 0-15 hold elements
// {0-3, 8-11, 16-19, 24-27}, lanes 16-31 elements {4-7, 12-15, 20-23, 28-31} (FinishDispatch restores).
// o_r (permuted, NB blocks of 32 from x) += sum_c p[r][c] v_c, f32 FMAs on V widened by unpacking.
template <int NR, int NB>
ATTN_DPBF16_ATTR HWY_INLINE void PVDp(const float* p, const std::uint16_t* const* vrows, std::int64_t vhs,
                                      std::int64_t n, float* o, std::int64_t S, std::int64_t x) {
  __m512 acc[NR][2 * NB];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_loadu_ps(o + r * S + x + 16 * v);
  const __m512i zero = _mm512_setzero_si512();
  for (std::int64_t c = 0; c < n; ++c) {
    const std::uint16_t* vr = vrows[c] + vhs + x;
    __m512 vv[2 * NB];
    for (int b = 0; b < NB; ++b) {
      const __m512i raw = _mm512_loadu_si512(vr + 32 * b);
      vv[2 * b] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, raw));
      vv[2 * b + 1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, raw));
    }
    for (int r = 0; r < NR; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * kChunk + c]);
      for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_fmadd_ps(pr, vv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) _mm512_storeu_ps(o + r * S + x + 16 * v, acc[r][v]);
}

// The same sum with p rounded to bf16 and two keys per VDPBF16PS: pb[r][j] holds (p[r][2j], p[r][2j + 1])
// as bf16, V rows 2j and 2j + 1 are interleaved by VPUNPCK{L,H}WD (the o order above). An odd tail
// pairs the last key with a zero row, never with a real one (0 x NaN is NaN).
template <int NR, int NB>
ATTN_DPBF16_ATTR HWY_INLINE void PVDp2(const std::uint32_t* pb, const std::uint16_t* const* vrows, std::int64_t vhs,
                                       std::int64_t n, float* o, std::int64_t S, std::int64_t x) {
  __m512 acc[NR][2 * NB];
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_loadu_ps(o + r * S + x + 16 * v);
  for (std::int64_t c = 0; c < n; c += 2) {
    const std::uint16_t* v0 = vrows[c] + vhs + x;
    const std::uint16_t* v1 = c + 1 < n ? vrows[c + 1] + vhs + x : nullptr;
    __m512bh vv[2 * NB];
    for (int b = 0; b < NB; ++b) {
      const __m512i a = _mm512_loadu_si512(v0 + 32 * b);
      const __m512i z = v1 ? _mm512_loadu_si512(v1 + 32 * b) : _mm512_setzero_si512();
      vv[2 * b] = (__m512bh)_mm512_unpacklo_epi16(a, z);
      vv[2 * b + 1] = (__m512bh)_mm512_unpackhi_epi16(a, z);
    }
    for (int r = 0; r < NR; ++r) {
      const __m512bh pr = (__m512bh)_mm512_set1_epi32(static_cast<int>(pb[r * (kChunk / 2) + c / 2]));
      for (int v = 0; v < 2 * NB; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pr, vv[v]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int v = 0; v < 2 * NB; ++v) _mm512_storeu_ps(o + r * S + x + 16 * v, acc[r][v]);
}

template <int NR>
ATTN_DPBF16_ATTR HWY_INLINE void PVRowsDp(const float* p, const std::uint16_t* const* vrows, std::int64_t vhs,
                                          std::int64_t n, float* o, std::int64_t S, std::int64_t d, bool bf16_p) {
  std::int64_t x = 0;
  if (bf16_p) {
    // p rows [0, n) rounded to bf16 (round to nearest even), zero past n: pairs are 32-bit words.
    alignas(64) std::uint32_t pb[NR * (kChunk / 2)];
    for (int r = 0; r < NR; ++r) {
      const float* pr = p + r * kChunk;
      auto* dst = reinterpret_cast<__m256bh*>(pb + r * (kChunk / 2));
      for (std::int64_t c = 0; c < kChunk; c += 16) {
        const __mmask16 live = c >= n ? 0 : n - c >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - c)) - 1);
        dst[c / 16] = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(live, pr + c));
      }
    }
    for (; x + 64 <= d; x += 64) PVDp2<NR, 2>(pb, vrows, vhs, n, o, S, x);
    if (x < d) PVDp2<NR, 1>(pb, vrows, vhs, n, o, S, x);
    return;
  }
  for (; x + 64 <= d; x += 64) PVDp<NR, 2>(p, vrows, vhs, n, o, S, x);
  if (x < d) PVDp<NR, 1>(p, vrows, vhs, n, o, S, x);
}

// Dots4 with VDPBF16PS: dst[r] = q_r . k for NR <= 4 query rows (q_hi + q_lo, stride d) and one key row
// (bf16, d a multiple of 32); dst[NR ..] = 0.
template <int NR, int D, bool kLo>
ATTN_DPBF16_ATTR HWY_INLINE void DotsDp(const std::uint16_t* qh, const std::uint16_t* ql, std::int64_t d,
                                        const std::uint16_t* k, float* dst) {
  __m512 acc[4];
  for (int r = 0; r < 4; ++r) acc[r] = _mm512_setzero_ps();
  const std::int64_t dd = D > 0 ? D : d;
#pragma GCC unroll 8
  for (std::int64_t x = 0; x < dd; x += 32) {
    const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + x);
    for (int r = 0; r < NR; ++r) {
      acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(qh + r * dd + x), kv);
      if constexpr (kLo) acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_loadu_si512(ql + r * dd + x), kv);
    }
  }
  StoreSum4(DF(), VF{acc[0]}, VF{acc[1]}, VF{acc[2]}, VF{acc[3]}, dst);
}

// ScoreKeys with DotsDp: the same walk, the same dots4 layout.
template <int D, bool kLo>
ATTN_DPBF16_ATTR void ScoreKeysDp(const ChunkArgs<float>& a, float* dots4) {
  const std::int64_t d = D > 0 ? D : a.head_dim, R = a.group * a.seqlen_q, RB = (R + 3) / 4;
  const auto* const* krows = reinterpret_cast<const std::uint16_t* const*>(a.k_rows);
  for (std::int64_t c = 0; c < a.n; ++c) {
    for (std::int64_t g = 0; g < a.kv_heads; ++g) {
      PrefetchV<bf16_t>(a, c, g);
      const std::uint16_t* kr = krows[c] + g * a.k_head_stride;
      for (std::int64_t b = 0; b < RB; ++b) {
        const std::uint16_t* qh = a.q_hi + (g * R + 4 * b) * d;
        const std::uint16_t* ql = kLo ? a.q_lo + (g * R + 4 * b) * d : nullptr;
        float* dst = dots4 + ((g * RB + b) * kChunk + c) * 4;
        switch (std::min<std::int64_t>(4, R - 4 * b)) {
          case 4:
            DotsDp<4, D, kLo>(qh, ql, d, kr, dst);
            break;
          case 3:
            DotsDp<3, D, kLo>(qh, ql, d, kr, dst);
            break;
          case 2:
            DotsDp<2, D, kLo>(qh, ql, d, kr, dst);
            break;
          default:
            DotsDp<1, D, kLo>(qh, ql, d, kr, dst);
            break;
        }
      }
    }
  }
}

ATTN_DPBF16_ATTR void ChunkDp(const ChunkArgs<float>& a) {
  const std::int64_t d = a.head_dim, R = a.group * a.seqlen_q, S = a.state_stride;
  float* scores = a.scratch;  // [kv_heads][R][kChunk]
  float* probs = a.scratch + a.kv_heads * R * kChunk;
  float* dots4 = a.scratch + chunk_dots4_offset(a.kv_heads, R, d);
  const auto* const* vrows = reinterpret_cast<const std::uint16_t* const*>(a.v_rows);
  const bool lo = a.q_lo != nullptr;
  switch (d) {
    case 64:
      lo ? ScoreKeysDp<64, true>(a, dots4) : ScoreKeysDp<64, false>(a, dots4);
      break;
    case 128:
      lo ? ScoreKeysDp<128, true>(a, dots4) : ScoreKeysDp<128, false>(a, dots4);
      break;
    case 256:
      lo ? ScoreKeysDp<256, true>(a, dots4) : ScoreKeysDp<256, false>(a, dots4);
      break;
    default:
      lo ? ScoreKeysDp<0, true>(a, dots4) : ScoreKeysDp<0, false>(a, dots4);
      break;
  }
  UntangleDots(a, dots4, scores);
  TransformScores(a, scores);
  for (std::int64_t g = 0; g < a.kv_heads; ++g) {
    const std::int64_t gs = g * R * kChunk;
    float* st = a.states + g * R * S;
    for (std::int64_t r = 0; r < R; ++r)
      FoldRow(scores + gs + r * kChunk, probs + r * kChunk, a.n, st + r * S, st + r * S + S - 2, st + r * S + S - 1, d);
    const std::int64_t vh = g * a.v_head_stride;
    for (std::int64_t r0 = 0; r0 < R; r0 += 4)
      PvRows(a, r0, std::min<std::int64_t>(4, R - r0), probs, st,
             [&](auto nr, const float* p, std::int64_t c0, std::int64_t m, float* o) {
               PVRowsDp<decltype(nr)::value>(p, vrows + c0, vh, m, o, S, d, a.bf16_out);
             });
  }
}

bool UseDp(const ChunkArgs<float>& a, DType t) {
  return cpu_has_avx512bf16() && t == DType::bf16 && a.head_dim % 32 == 0 && a.q_hi != nullptr;
}
#else
bool UseDp(const ChunkArgs<float>&, DType) { return false; }
#endif

void FinishDispatch(const ChunkArgs<float>& a, DType t) {
  if (!UseDp(a, t)) return;
  float tmp[32];
  for (std::int64_t r = 0; r < a.kv_heads * a.group * a.seqlen_q; ++r)
    for (std::int64_t x = 0; x < a.head_dim; x += 32) {
      float* o = a.states + r * a.state_stride + x;
      for (int i = 0; i < 16; ++i) {  // lane i of each half: element 8 (i / 4) + i % 4 (+ 4 in the upper half)
        tmp[8 * (i / 4) + i % 4] = o[i];
        tmp[8 * (i / 4) + i % 4 + 4] = o[16 + i];
      }
      std::memcpy(o, tmp, sizeof tmp);
    }
}

void ChunkDispatch(const ChunkArgs<float>& a, DType t) {
#ifdef ATTN_DPBF16
  if (UseDp(a, t)) return ChunkDp(a);
#endif
  switch (t) {
    case DType::bf16:
      return Chunk<bf16_t>(a);
    case DType::f16:
      return Chunk<f16_t>(a);
    default:
      return Chunk<float>(a);
  }
}

#undef ATTN_DPBF16
}  // namespace attn::detail::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attn::detail {
HWY_EXPORT(ChunkDispatch);
HWY_EXPORT(FinishDispatch);
void decode_chunk_simd(const ChunkArgs<float>& a, DType cache_dtype) {
  HWY_DYNAMIC_DISPATCH(ChunkDispatch)(a, cache_dtype);
}
void decode_finish_simd(const ChunkArgs<float>& a, DType cache_dtype) {
  HWY_DYNAMIC_DISPATCH(FinishDispatch)(a, cache_dtype);
}
}  // namespace attn::detail
#endif
