// The AMX forward's task: the input formats the tiles take (Format: bf16, f16, f32 as bf16x3 parts), one
// task's geometry and scratch, its queries packed, and the keys each row sees. A Highway per-target header
// of tiled/amx_kernel.cpp (included inside its foreach_target, after amx_pack-inl.h).
#if defined(ATTN_AMX_TASK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_AMX_TASK_INL_H_
#undef ATTN_AMX_TASK_INL_H_
#else
#define ATTN_AMX_TASK_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "amx/amx_round-inl.h"
#include "core/element.hpp"
#include "tiled/amx_pack-inl.h"
#include "validate/problem.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::amx_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The tiles' operands for inputs of type In: E, the 16-bit element the tiles multiply, and how many parts
// in E each input is (1; 3 for f32 on bf16 tiles: bf16x3, amx_round-inl.h's SplitBf16x3).
template <class TileE, class InE, std::size_t kPartsOf>
struct Format {
  using E = TileE;
  using In = InE;
  static constexpr std::size_t kParts = kPartsOf;
};
using Bf16Tiles = Format<bf16_t, bf16_t, 1>;
using F16Tiles = Format<f16_t, f16_t, 1>;
using F32Bf16x3 = Format<bf16_t, float, 3>;

// The part products (A part, B part) a block product sums, in order. bf16x3's six go smallest first, so
// that their roundings stay at their own scale until a0 b0 joins: the largest error over
// bench/micro/f32_split_accuracy.py's cases is 0.59x the f32 textbook's this way, 1.64x largest first.
struct PartPair {
  std::size_t a, b;
};
inline constexpr PartPair kOneProduct[] = {{0, 0}};
inline constexpr PartPair kSixProducts[] = {{2, 0}, {1, 1}, {0, 2}, {1, 0}, {0, 1}, {0, 0}};
template <class F>
constexpr const auto& PartProducts() {
  if constexpr (F::kParts == 1)
    return kOneProduct;
  else
    return kSixProducts;
}

// One task's geometry (after GQA stacking) and one thread's scratch, carved from one aligned block.
struct AmxTask {
  std::size_t real, R;  // stacked query rows, and R = real rounded up to kBlock
  std::size_t dq, dvp;  // head dims rounded up to kBlock
  std::size_t bcp;      // the key tile's scratch width (the tile rounded up to kBlock)
  std::int64_t g, rows_h, i0, b, kv_head;
  const std::uint32_t* k;  // this kv head's packed keys and values (PackedHeads)
  const std::uint32_t* v;
  std::size_t k_plane, v_plane;  // pairs between their parts (f32: bf16x3)
  bool v_nonfinite;
  bool qk_nonfinite;  // f32: some query of the task or key of the head is Inf or NaN
  std::int64_t head_of(std::size_t r) const { return kv_head * g + static_cast<std::int64_t>(r) / rows_h; }
  std::int64_t query_of(std::size_t r) const { return i0 + static_cast<std::int64_t>(r) % rows_h; }
};

struct AmxScratch {
  std::uint16_t* q;              // [parts][R][dq] E bits
  float* s;                      // [R][bcp]
  std::uint16_t* p;              // [parts][R][bcp] E bits
  float* o;                      // [R][dvp]
  float* block;                  // [kBlock][kBlock]: a 2 x 2 block of P V (bf16x3)
  std::size_t q_plane, p_plane;  // elements between the parts of q and of p
  float *m, *l, *alpha, *tmp;
  std::int32_t *lo, *hi;                         // the keys [lo, hi) of the current tile row r sees
  float* drop;                                   // [bcp + kDropSlack]: one row's dropout factors (DropRowFactors)
  static constexpr std::size_t kDropSlack = 64;  // DropRowFactors writes whole vectors of groups: 4 x 16 lanes
  static std::size_t bytes(std::size_t R, std::size_t dq, std::size_t dvp, std::size_t bcp, std::size_t parts) {
    return 2 * parts * R * dq + 4 * R * bcp + 2 * parts * R * bcp + 4 * R * dvp + 4 * kBlock * kBlock +
           4 * (3 * R + dvp) + 4 * 2 * R + 4 * (bcp + kDropSlack);
  }
  AmxScratch(void* base, std::size_t R, std::size_t dq, std::size_t dvp, std::size_t bcp, std::size_t parts)
      : q_plane(R * dq), p_plane(R * bcp) {
    auto* x = static_cast<std::uint8_t*>(base);  // every block a multiple of 64 bytes (R, dq, dvp, bcp of 32)
    q = reinterpret_cast<std::uint16_t*>(x), x += 2 * parts * R * dq;
    s = reinterpret_cast<float*>(x), x += 4 * R * bcp;
    p = reinterpret_cast<std::uint16_t*>(x), x += 2 * parts * R * bcp;
    o = reinterpret_cast<float*>(x), x += 4 * R * dvp;
    block = reinterpret_cast<float*>(x), x += 4 * kBlock * kBlock;
    m = reinterpret_cast<float*>(x), l = m + R, alpha = l + R, tmp = alpha + R;
    lo = reinterpret_cast<std::int32_t*>(tmp + dvp), hi = lo + R;
    drop = reinterpret_cast<float*>(hi + R);
  }
};

// The task's queries as 16-bit rows [R][dq] (f32: three planes of bf16x3 parts), zero past d and past the
// real rows; the row states reset. Returns whether some query is Inf or NaN (f32 only).
template <class F>
HWY_INLINE bool PackQueries(const Problem& p, const AmxTask& t, const AmxScratch& w) {
  std::memset(w.q, 0, 2 * F::kParts * w.q_plane);
  const std::size_t dim = static_cast<std::size_t>(p.head_dim), stride = static_cast<std::size_t>(p.q.strides[3]);
  const hn::ScalableTag<float> d;
  const std::size_t N = hn::Lanes(d);
  auto bad = hn::Zero(d);  // all-ones lanes where some query was Inf or NaN (f32, on lanes)
  bool nonfinite = false;
  for (std::size_t r = 0; r < t.real; ++r) {
    std::uint16_t* dst = w.q + r * t.dq;
    if constexpr (F::kParts == 3) {
      const float* src = row_ptr<const float>(p.q, t.b, t.query_of(r), t.head_of(r));
      std::size_t x = 0;
      if (stride == 1)
        for (; x + N <= dim; x += N) {
          const auto q = hn::LoadU(d, src + x);
          bad = hn::Or(bad, hn::VecFromMask(d, hn::Not(hn::IsFinite(q))));
          StoreSplitInput(d, q, dst + x, w.q_plane);
        }
      for (; x < dim; ++x) {
        nonfinite |= !std::isfinite(src[x * stride]);
        const Bf16Parts parts = SplitBf16x3(src[x * stride]);
        for (std::size_t k = 0; k < 3; ++k) dst[k * w.q_plane + x] = parts.part[k];
      }
    } else {
      const std::uint16_t* src = row_ptr<const std::uint16_t>(p.q, t.b, t.query_of(r), t.head_of(r));
      if (stride == 1)
        std::memcpy(dst, src, 2 * dim);
      else
        for (std::size_t x = 0; x < dim; ++x) dst[x] = src[x * stride];
    }
  }
  std::fill(w.m, w.m + t.R, -std::numeric_limits<float>::infinity());
  std::fill(w.l, w.l + t.R, 0.0f);
  std::fill(w.o, w.o + t.R * t.dvp, 0.0f);
  std::memset(w.p, 0, 2 * F::kParts * w.p_plane);  // the padding rows' weights stay zero for every tile
  return nonfinite || AnyLaneSet(d, bad);
}

// Each row's visible keys of the tile [j0, j0 + n) (padding rows: none); whether some row does not see
// every key the tile's blocks hold, [j0, j0 + np): the packed heads hold real keys past n (the next
// tile's, and before j0 + lo those of a window's start), which P V multiplies by p = 0.
HWY_INLINE bool RowBounds(const Problem& p, const AmxTask& t, std::int64_t j0, std::int64_t n, std::size_t np,
                          const AmxScratch& w) {
  bool masked = false;
  const Mask mask = p.mask();
  for (std::size_t r = 0; r < t.R; ++r) {
    std::int64_t lo = 0, hi = 0;
    if (r < t.real) {
      const std::int64_t i = t.query_of(r);
      const Mask::TileKeys keys = mask.tile_keys(i, j0, n);
      lo = keys.lo;
      hi = keys.hi;
    }
    w.lo[r] = static_cast<std::int32_t>(lo);
    w.hi[r] = static_cast<std::int32_t>(hi);
    masked |= r < t.real && (lo > 0 || hi < static_cast<std::int64_t>(np));
  }
  return masked;
}

// Whether some row of [r0, r0 + kBlock) sees a key of [c0, c0 + kBlock).
HWY_INLINE bool BlockSeen(const AmxScratch& w, std::size_t r0, std::size_t c0) {
  for (std::size_t r = r0; r < r0 + kBlock; ++r)
    if (w.lo[r] < w.hi[r] && static_cast<std::size_t>(w.lo[r]) < c0 + kBlock && static_cast<std::size_t>(w.hi[r]) > c0)
      return true;
  return false;
}

// An input element as f32 from its parts, the smallest first (bf16x3's parts then sum to the f32 input
// exactly, a non-finite one included); halves[0] is its first part, the others plane halves apart.
template <class F>
HWY_INLINE float PartsSum(const std::uint16_t* halves, std::size_t plane) {
  float sum = 0.0f;
  for (std::size_t k = F::kParts; k-- > 0;) sum += load<float>(typename F::E{halves[k * plane]});
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::amx_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_AMX_TASK_INL_H_
