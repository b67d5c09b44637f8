// The AMX forward's operands: every kv head's K and V packed once per call into the tiles' B layouts, a
// Highway per-target header of tiled/amx_kernel.cpp (included inside its foreach_target). The block of
// 32 keys (kBlock) is the unit of the packed keys and of the kernel's 2 x 2 tile blocks.
#if defined(ATTN_AMX_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_AMX_PACK_INL_H_
#undef ATTN_AMX_PACK_INL_H_
#else
#define ATTN_AMX_PACK_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "amx/amx_round-inl.h"
#include "core/element.hpp"
#include "validate/problem.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::amx_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr std::size_t kBlock = 32;  // rows and keys (or columns) of a 2 x 2 block of 16 x 16 tiles

inline std::size_t RoundUp(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

// Every kv head's K and V, packed once per call into the tiles' B layouts (VNNI: 16-bit pairs along the
// dot product), zero past d, d_v and the last key; keys in blocks of 32 (kBlock):
//   K  per block [dq/2][32] pairs: pair row x, column c = (k[c][2x], k[c][2x+1]); a B tile is 16 pair
//      rows x 16 keys, rows 128 bytes apart
//   V  [keys/2][dvp] pairs: pair row y, column x = (v[2y][x], v[2y+1][x]); a B tile is 16 pair rows
//      (32 keys) x 16 columns, rows 4 dvp bytes apart
// f32 inputs (bf16x3) are packed as three such planes each, part k of every element in plane k.
// Packing per task instead would redo it for every query tile (it cost more than the tiles' work).
struct PackedHeads {
  std::size_t dq, dvp;
  std::size_t parts;                      // 16-bit parts of each input: 1, or 3 for f32 (bf16x3)
  std::vector<std::size_t> first;         // per problem: the index of its (b, kv_head) = (0, 0) head
  std::vector<std::size_t> keys;          // per problem: seqlen_k rounded up to kBlock
  std::vector<std::size_t> k_at, v_at;    // per head: offsets into k and v (32-bit pairs)
  std::vector<std::uint8_t> v_nonfinite;  // per head: some value is Inf or NaN
  std::vector<std::uint8_t> k_nonfinite;  // per head, f32 only: some key is Inf or NaN
  std::uint32_t *k = nullptr, *v = nullptr;
  std::size_t k_plane(std::size_t problem) const { return keys[problem] * dq / 2; }  // pairs between parts
  std::size_t v_plane(std::size_t problem) const { return keys[problem] / 2 * dvp; }
};

// Key j's pair x as one 32-bit word: (k[j][2x], k[j][2x+1]), zero past d. The rows' elements are read as
// 16-bit patterns (bf16 or f16, the packing does not care).
inline std::uint32_t PairOf(const std::uint16_t* row, std::int64_t stride, std::size_t x, std::size_t dim) {
  const std::uint32_t lo = row[2 * x * static_cast<std::size_t>(stride)];
  const std::uint32_t hi = 2 * x + 1 < dim ? row[(2 * x + 1) * static_cast<std::size_t>(stride)] : 0u;
  return lo | hi << 16;
}

// The keys of one head, transposed into 32-key blocks of pairs. Rows a fixed stride apart (not paged,
// contiguous dims, even d) go N keys at a time: one gather per pair x collects it from N rows.
HWY_INLINE void PackKeysOfHead(const Problem& p, std::int64_t b, std::int64_t h, std::size_t dq, std::uint32_t* kh) {
  const hn::ScalableTag<std::uint32_t> du;
  const hn::RebindToSigned<decltype(du)> di;
  const std::size_t N = hn::Lanes(du), dim = static_cast<std::size_t>(p.head_dim);
  const std::int64_t row_words = p.k.strides[1] / 2;
  const bool gather = !p.pages.paged() && p.k.strides[3] == 1 && dim % 2 == 0 && p.k.strides[1] % 2 == 0 &&
                      row_words * static_cast<std::int64_t>(N) < (std::int64_t{1} << 31);
  std::int64_t j = 0;
  if (gather) {
    const auto rows = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<std::int32_t>(row_words)));
    for (; j + static_cast<std::int64_t>(N) <= p.seqlen_k; j += static_cast<std::int64_t>(N)) {
      const auto* base =
          reinterpret_cast<const std::uint32_t*>(key_row_ptr<const std::uint16_t>(p.k, p.pages, b, j, h));
      const std::size_t c = static_cast<std::size_t>(j);
      std::uint32_t* kd = kh + (c / kBlock) * (dq / 2) * kBlock + c % kBlock;
      for (std::size_t x = 0; x < dim / 2; ++x) hn::StoreU(hn::GatherIndex(du, base + x, rows), du, kd + x * kBlock);
    }
  }
  for (; j < p.seqlen_k; ++j) {
    const std::uint16_t* ks = key_row_ptr<const std::uint16_t>(p.k, p.pages, b, j, h);
    const std::size_t c = static_cast<std::size_t>(j);
    std::uint32_t* kd = kh + (c / kBlock) * (dq / 2) * kBlock + c % kBlock;
    for (std::size_t x = 0; x < (dim + 1) / 2; ++x) kd[x * kBlock] = PairOf(ks, p.k.strides[3], x, dim);
  }
}

// The values of one head, two keys interleaved per pair row (zero past the last key); returns whether
// some value is Inf or NaN. Contiguous rows go N columns at a time.
HWY_INLINE bool PackValuesOfHead(const Problem& p, std::int64_t b, std::int64_t h, std::size_t dvp, std::uint32_t* vh) {
  const hn::ScalableTag<std::uint32_t> du;
  const hn::Rebind<std::uint16_t, decltype(du)> d16;
  const std::size_t N = hn::Lanes(du), dim_v = static_cast<std::size_t>(p.head_dim_v);
  const std::size_t vs = static_cast<std::size_t>(p.v.strides[3]);
  // The exponent field of E: all ones is Inf or NaN.
  const std::uint32_t exp16 = p.dtype == DType::f16 ? 0x7C00u : 0x7F80u;
  const auto lo_exp = hn::Set(du, exp16), hi_exp = hn::Set(du, exp16 << 16);
  auto nonfinite_lanes = hn::Zero(du);
  std::uint32_t nonfinite = 0;
  for (std::int64_t j = 0; j < p.seqlen_k; j += 2) {
    const auto* v0 = key_row_ptr<const std::uint16_t>(p.v, p.pages, b, j, h);
    const auto* v1 = j + 1 < p.seqlen_k ? key_row_ptr<const std::uint16_t>(p.v, p.pages, b, j + 1, h) : nullptr;
    std::uint32_t* vd = vh + static_cast<std::size_t>(j / 2) * dvp;
    std::size_t x = 0;
    if (vs == 1)
      for (; x + N <= dim_v; x += N) {
        const auto lo = hn::PromoteTo(du, hn::LoadU(d16, v0 + x));
        const auto hi = v1 ? hn::PromoteTo(du, hn::LoadU(d16, v1 + x)) : hn::Zero(du);
        const auto w = hn::Or(lo, hn::ShiftLeft<16>(hi));
        hn::StoreU(w, du, vd + x);
        const auto bad = hn::Or(hn::VecFromMask(du, hn::Eq(hn::And(w, lo_exp), lo_exp)),
                                hn::VecFromMask(du, hn::Eq(hn::And(w, hi_exp), hi_exp)));
        nonfinite_lanes = hn::Or(nonfinite_lanes, bad);
      }
    for (; x < dim_v; ++x) {
      const std::uint32_t lo = v0[x * vs], hi = v1 ? v1[x * vs] : 0u;
      vd[x] = lo | hi << 16;
      nonfinite |= ((lo & exp16) == exp16) | ((hi & exp16) == exp16);
    }
  }
  return nonfinite != 0 || !hn::AllFalse(du, hn::Ne(nonfinite_lanes, hn::Zero(du)));
}

// Whether some lane of v has a bit set.
template <class D>
HWY_INLINE bool AnyLaneSet(D /*d*/, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  return !hn::AllFalse(du, hn::Ne(hn::BitCast(du, v), hn::Zero(du)));
}

// Pair words of two f32 vectors' bf16x3 parts: (lo's part k, hi's part k) into dst[k plane], N lanes each.
// Returns the lanes where lo or hi is Inf or NaN.
template <class D>
HWY_INLINE hn::Mask<D> StoreSplitPairs(D d, hn::Vec<D> lo, hn::Vec<D> hi, std::uint32_t* dst, std::size_t plane) {
  const hn::RebindToUnsigned<D> du;
  hn::Vec<decltype(du)> a[3], e[3];
  SplitInputBf16x3(d, lo, a);
  SplitInputBf16x3(d, hi, e);
  for (std::size_t k = 0; k < 3; ++k) hn::StoreU(hn::Or(a[k], hn::ShiftLeft<16>(e[k])), du, dst + k * plane);
  return hn::Not(hn::And(hn::IsFinite(lo), hn::IsFinite(hi)));
}

// The same for one pair of scalars.
inline bool StoreSplitPair(float lo, float hi, std::uint32_t* dst, std::size_t plane) {
  const Bf16Parts a = SplitBf16x3(lo), e = SplitBf16x3(hi);
  for (std::size_t k = 0; k < 3; ++k) dst[k * plane] = a.part[k] | static_cast<std::uint32_t>(e.part[k]) << 16;
  return !std::isfinite(lo) || !std::isfinite(hi);
}

// f32 keys (bf16x3): pair x of key j split into its three parts, part k into plane k of the layout above.
// Rows a fixed stride apart (not paged, contiguous dims) go N keys at a time, gathered as PackKeysOfHead
// gathers bf16 pairs. Returns whether some key is Inf or NaN.
HWY_INLINE bool PackSplitKeysOfHead(const Problem& p, std::int64_t b, std::int64_t h, std::size_t dq, std::size_t plane,
                                    std::uint32_t* kh) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const std::size_t N = hn::Lanes(d), dim = static_cast<std::size_t>(p.head_dim);
  const std::size_t ks = static_cast<std::size_t>(p.k.strides[3]);
  const bool gather =
      !p.pages.paged() && ks == 1 && p.k.strides[1] * static_cast<std::int64_t>(N) < (std::int64_t{1} << 31);
  auto bad = hn::Zero(d);  // all-ones lanes where some input was Inf or NaN
  bool nonfinite = false;
  std::int64_t j = 0;
  if (gather) {
    const auto rows = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<std::int32_t>(p.k.strides[1])));
    for (; j + static_cast<std::int64_t>(N) <= p.seqlen_k; j += static_cast<std::int64_t>(N)) {
      const float* base = key_row_ptr<const float>(p.k, p.pages, b, j, h);
      const std::size_t c = static_cast<std::size_t>(j);
      std::uint32_t* kd = kh + (c / kBlock) * (dq / 2) * kBlock + c % kBlock;
      for (std::size_t x = 0; x < dim; x += 2) {
        const auto lo = hn::GatherIndex(d, base + x, rows);
        const auto hi = x + 1 < dim ? hn::GatherIndex(d, base + x + 1, rows) : hn::Zero(d);
        bad = hn::Or(bad, hn::VecFromMask(d, StoreSplitPairs(d, lo, hi, kd + x / 2 * kBlock, plane)));
      }
    }
  }
  for (; j < p.seqlen_k; ++j) {
    const float* row = key_row_ptr<const float>(p.k, p.pages, b, j, h);
    const std::size_t c = static_cast<std::size_t>(j);
    std::uint32_t* kd = kh + (c / kBlock) * (dq / 2) * kBlock + c % kBlock;
    for (std::size_t x = 0; x < dim; x += 2)
      nonfinite |= StoreSplitPair(row[x * ks], x + 1 < dim ? row[(x + 1) * ks] : 0.0f, kd + x / 2 * kBlock, plane);
  }
  return nonfinite || AnyLaneSet(d, bad);
}

// f32 values (bf16x3): pair row y split into three planes of the layout above, N columns at a time where
// the dims are contiguous. Returns whether some value is Inf or NaN.
HWY_INLINE bool PackSplitValuesOfHead(const Problem& p, std::int64_t b, std::int64_t h, std::size_t dvp,
                                      std::size_t plane, std::uint32_t* vh) {
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d), dim_v = static_cast<std::size_t>(p.head_dim_v);
  const std::size_t vs = static_cast<std::size_t>(p.v.strides[3]);
  auto bad = hn::Zero(d);  // all-ones lanes where some input was Inf or NaN
  bool nonfinite = false;
  for (std::int64_t j = 0; j < p.seqlen_k; j += 2) {
    const float* v0 = key_row_ptr<const float>(p.v, p.pages, b, j, h);
    const float* v1 = j + 1 < p.seqlen_k ? key_row_ptr<const float>(p.v, p.pages, b, j + 1, h) : nullptr;
    std::uint32_t* vd = vh + static_cast<std::size_t>(j / 2) * dvp;
    std::size_t x = 0;
    if (vs == 1)
      for (; x + N <= dim_v; x += N) {
        const auto hi = v1 ? hn::LoadU(d, v1 + x) : hn::Zero(d);
        bad = hn::Or(bad, hn::VecFromMask(d, StoreSplitPairs(d, hn::LoadU(d, v0 + x), hi, vd + x, plane)));
      }
    for (; x < dim_v; ++x) nonfinite |= StoreSplitPair(v0[x * vs], v1 ? v1[x * vs] : 0.0f, vd + x, plane);
  }
  return nonfinite || AnyLaneSet(d, bad);
}

// Head `hi` of problem `p` (batch b, kv head h) into its place in `heads`, zero past d, d_v and the
// last key.
HWY_INLINE void PackHead(const Problem& p, std::int64_t b, std::int64_t h, std::size_t problem, std::size_t hi,
                         PackedHeads& heads) {
  std::uint32_t* kh = heads.k + heads.k_at[hi];
  std::uint32_t* vh = heads.v + heads.v_at[hi];
  const std::size_t k_plane = heads.k_plane(problem), v_plane = heads.v_plane(problem);
  std::memset(kh, 0, 4 * heads.parts * k_plane);
  std::memset(vh, 0, 4 * heads.parts * v_plane);
  if (heads.parts == 3) {
    heads.k_nonfinite[hi] = PackSplitKeysOfHead(p, b, h, heads.dq, k_plane, kh);
    heads.v_nonfinite[hi] = PackSplitValuesOfHead(p, b, h, heads.dvp, v_plane, vh);
    return;
  }
  PackKeysOfHead(p, b, h, heads.dq, kh);
  heads.v_nonfinite[hi] = PackValuesOfHead(p, b, h, heads.dvp, vh);
}

// Storage for `words` packed pairs, kept by the calling thread for its next call (a model calls the
// forward once per layer with the same sizes: the pages are then already mapped, where a fresh block
// costs a page fault per 4 KiB, about a tenth of the packing's time). At most 256 MiB stays cached. Not
// value-initialised: PackHead writes every element.
// A larger block is owned by `once`, freed with it.
inline std::uint32_t* PackBuffer(std::size_t words, std::unique_ptr<std::uint32_t[]>& once) {
  constexpr std::size_t kKeepWords = (std::size_t{256} << 20) / 4;
  static thread_local std::unique_ptr<std::uint32_t[]> kept;
  static thread_local std::size_t kept_words = 0;
  if (words > kKeepWords) {
    once.reset(new std::uint32_t[words]);
    return once.get();
  }
  if (words > kept_words) {
    kept.reset(new std::uint32_t[words]);
    kept_words = words;
  }
  return kept.get();
}

// The packed heads' layout for `ps` (their storage is allocated by the caller: k_total and v_total pairs),
// `parts` planes each.
inline PackedHeads PlanHeads(const std::vector<Problem>& ps, std::size_t parts, std::size_t& k_total,
                             std::size_t& v_total) {
  PackedHeads heads;
  heads.parts = parts;
  heads.dq = RoundUp(static_cast<std::size_t>(ps[0].head_dim), kBlock);
  heads.dvp = RoundUp(static_cast<std::size_t>(ps[0].head_dim_v), kBlock);
  k_total = v_total = 0;
  for (const Problem& p : ps) {
    heads.first.push_back(heads.k_at.size());
    const std::size_t keys = RoundUp(static_cast<std::size_t>(p.seqlen_k), kBlock);
    heads.keys.push_back(keys);
    for (std::int64_t h = 0; h < p.batch * p.kv_heads; ++h) {
      heads.k_at.push_back(k_total);
      heads.v_at.push_back(v_total);
      k_total += parts * keys * heads.dq / 2;
      v_total += parts * keys / 2 * heads.dvp;
    }
  }
  heads.v_nonfinite.assign(heads.k_at.size(), 0);
  heads.k_nonfinite.assign(heads.k_at.size(), 0);
  return heads;
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::amx_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_AMX_PACK_INL_H_
