// The AMX backward's buffers and operands: the padded sizes, one thread's scratch, and the packing of a
// head's K, V, K^T and a query tile's Q, dO, O into the tiles' layouts. A Highway per-target header of
// backward/amx_backward.cpp (included inside its foreach_target).
#if defined(ATTN_AMX_BACKWARD_PACK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_AMX_BACKWARD_PACK_INL_H_
#undef ATTN_AMX_BACKWARD_PACK_INL_H_
#else
#define ATTN_AMX_BACKWARD_PACK_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backward/amx_backward.hpp"
#include "core/element.hpp"

HWY_BEFORE_NAMESPACE();
namespace attn::detail::amx_backward_simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr std::size_t kBlock = 32;  // rows and columns of a 2 x 2 block of 16 x 16 tiles

inline std::size_t RoundUp(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

// The padded sizes every buffer is laid out with: query rows R, key tile bc, head dims dq and dvp, the
// partials' row width dp = max(dq, dvp), keys: a head's keys (all multiples of kBlock).
struct Sizes {
  std::size_t R, bc, dq, dvp, dp, keys;
};

// One thread's buffers, carved from one 64-byte aligned block (every part a multiple of 64 bytes).
struct Scratch {
  std::uint16_t *k, *v, *kt;                   // the head's K [keys][dq], V [keys][dvp] rows and K^T [dq][keys]
  std::uint32_t *qt, *dot;                     // Q^T [dq/2][R], dO^T [dvp/2][R]: pairs along d
  std::uint32_t *qv, *dov;                     // Q [R/2][dq], dO [R/2][dvp]: pairs along rows
  std::uint16_t* o;                            // O [R][dvp]
  float *st, *dpt;                             // S^T, dP^T [bc][R]
  std::uint16_t *pt, *dst;                     // P^T, dS^T [bc][R] bf16 or f16
  std::uint32_t* dsv;                          // dS^T [bc/2][R]: pairs along keys
  float* dqt;                                  // dQ^T [dq][R]
  float *lse, *dsum, *lo, *hi, *dist, *slope;  // per query row [R]; lo, hi, dist relative to the key tile
  float* block;                                // [16][16]: one tile's f32 (D's diagonal)
  std::uint8_t* seen;                          // [bc / 32][R / 32]: key block x row block, some pair visible

  static std::size_t bytes(const Sizes& z) {
    return 2 * z.keys * (2 * z.dq + z.dvp) + 4 * z.R * (z.dq + z.dvp) + 2 * z.R * z.dvp + 8 * z.bc * z.R +
           4 * z.bc * z.R + 2 * z.bc * z.R + 4 * z.dq * z.R + 4 * 6 * z.R + 4 * 256 + z.bc * z.R / (kBlock * kBlock);
  }
  Scratch(void* base, const Sizes& z) {
    auto* x = static_cast<std::uint8_t*>(base);
    auto take = [&x](std::size_t n) {
      std::uint8_t* at = x;
      x += n;
      return at;
    };
    k = reinterpret_cast<std::uint16_t*>(take(2 * z.keys * z.dq));
    v = reinterpret_cast<std::uint16_t*>(take(2 * z.keys * z.dvp));
    kt = reinterpret_cast<std::uint16_t*>(take(2 * z.keys * z.dq));
    qt = reinterpret_cast<std::uint32_t*>(take(2 * z.R * z.dq));
    dot = reinterpret_cast<std::uint32_t*>(take(2 * z.R * z.dvp));
    qv = reinterpret_cast<std::uint32_t*>(take(2 * z.R * z.dq));
    dov = reinterpret_cast<std::uint32_t*>(take(2 * z.R * z.dvp));
    o = reinterpret_cast<std::uint16_t*>(take(2 * z.R * z.dvp));
    st = reinterpret_cast<float*>(take(4 * z.bc * z.R));
    dpt = reinterpret_cast<float*>(take(4 * z.bc * z.R));
    pt = reinterpret_cast<std::uint16_t*>(take(2 * z.bc * z.R));
    dst = reinterpret_cast<std::uint16_t*>(take(2 * z.bc * z.R));
    dsv = reinterpret_cast<std::uint32_t*>(take(2 * z.bc * z.R));
    dqt = reinterpret_cast<float*>(take(4 * z.dq * z.R));
    float* rows = reinterpret_cast<float*>(take(4 * 6 * z.R));
    lse = rows, dsum = rows + z.R, lo = rows + 2 * z.R, hi = rows + 3 * z.R, dist = rows + 4 * z.R;
    slope = rows + 5 * z.R;
    block = reinterpret_cast<float*>(take(4 * 256));
    seen = take(z.bc * z.R / (kBlock * kBlock));
  }
};

// A query tile: rows [i0, i0 + rows) of query head h (kv head hk), R = rows rounded up to kBlock.
struct QueryTile {
  std::int64_t b, h, hk, i0, rows;
  std::size_t R;
};

// Element x of a row as its 16-bit pattern (bf16 or f16), zero past dim.
inline std::uint16_t Bits(const std::uint16_t* row, std::int64_t stride, std::size_t x, std::size_t dim) {
  return x < dim ? row[x * static_cast<std::size_t>(stride)] : std::uint16_t{0};
}

// dst[x] = the bits of row0[x] | row1[x] << 16 for x < dim (row1 null: zeros), the pairs of two rows; N
// columns at a time where the rows are contiguous.
template <class D>
HWY_INLINE void PairTwoRows(D /*d*/, const std::uint16_t* row0, const std::uint16_t* row1, std::int64_t stride,
                            std::size_t dim, std::uint32_t* dst) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<std::uint16_t, decltype(du)> d16;
  const std::size_t N = hn::Lanes(du);
  std::size_t x = 0;
  if (stride == 1)
    for (; x + N <= dim; x += N) {
      const auto lo = hn::PromoteTo(du, hn::LoadU(d16, &row0[x]));
      const auto hi = row1 ? hn::PromoteTo(du, hn::LoadU(d16, &row1[x])) : hn::Zero(du);
      hn::StoreU(hn::Or(lo, hn::ShiftLeft<16>(hi)), du, dst + x);
    }
  for (; x < dim; ++x)
    dst[x] = std::uint32_t{Bits(row0, stride, x, dim)} | (row1 ? std::uint32_t{Bits(row1, stride, x, dim)} << 16 : 0u);
}

// A row's pairs along its own elements, (x, x + 1) for even x < dim, into column r of a [dim/2][R] block.
inline void PairColumn(const std::uint16_t* row, std::int64_t stride, std::size_t dim, std::size_t R, std::size_t r,
                       std::uint32_t* dst) {
  if (stride == 1 && dim % 2 == 0) {  // the row's 32-bit words are its pairs
    std::uint32_t word;
    for (std::size_t x = 0; x < dim / 2; ++x) {
      std::memcpy(&word, row + 2 * x, 4);
      dst[x * R + r] = word;
    }
    return;
  }
  for (std::size_t x = 0; x < dim; x += 2)
    dst[(x / 2) * R + r] = std::uint32_t{Bits(row, stride, x, dim)} | std::uint32_t{Bits(row, stride, x + 1, dim)}
                                                                          << 16;
}

// A row's 16-bit patterns into dst [dim], zero to `width`.
inline void CopyRow(const std::uint16_t* row, std::int64_t stride, std::size_t dim, std::size_t width,
                    std::uint16_t* dst) {
  if (stride == 1)
    std::memcpy(dst, row, 2 * dim);
  else
    for (std::size_t x = 0; x < dim; ++x) dst[x] = row[x * static_cast<std::size_t>(stride)];
  std::memset(dst + dim, 0, 2 * (width - dim));
}

// The head's K and V rows and K^T, zero past d, d_v and the last key.
inline void PackHead(const BackwardProblem& p, std::int64_t b, std::int64_t hk, const Sizes& z, const Scratch& w) {
  const std::size_t dim = static_cast<std::size_t>(p.head_dim), dim_v = static_cast<std::size_t>(p.head_dim_v);
  const std::size_t keys = RoundUp(static_cast<std::size_t>(p.seqlen_k), kBlock);
  const std::size_t n = static_cast<std::size_t>(p.seqlen_k);
  std::memset(w.k + n * z.dq, 0, 2 * (keys - n) * z.dq);
  std::memset(w.v + n * z.dvp, 0, 2 * (keys - n) * z.dvp);
  std::memset(w.kt + dim * keys, 0, 2 * keys * (z.dq - dim));
  for (std::size_t c = 0; c < n; ++c) {
    const auto j = static_cast<std::int64_t>(c);
    CopyRow(row_ptr<const std::uint16_t>(p.k, b, j, hk), p.k.strides[3], dim, z.dq, w.k + c * z.dq);
    CopyRow(row_ptr<const std::uint16_t>(p.v, b, j, hk), p.v.strides[3], dim_v, z.dvp, w.v + c * z.dvp);
  }
  // K^T from the packed rows, 32 x 32 blocks so that both sides stay in L1.
  for (std::size_t c0 = 0; c0 < keys; c0 += kBlock)
    for (std::size_t x0 = 0; x0 < dim; x0 += kBlock)
      for (std::size_t x = x0; x < std::min(dim, x0 + kBlock); ++x)
        for (std::size_t c = c0; c < c0 + kBlock; ++c) w.kt[x * keys + c] = w.k[c * z.dq + x];
}

// The query tile's operands (padding rows and columns zero), lse, and the row constants of the score rule.
template <class D>
void PackQueryTile(D d, const BackwardProblem& p, const QueryTile& qt, const Sizes& z, const Scratch& w) {
  const std::size_t R = qt.R, dim = static_cast<std::size_t>(p.head_dim);
  const std::size_t dim_v = static_cast<std::size_t>(p.head_dim_v), rows = static_cast<std::size_t>(qt.rows);
  std::memset(w.qt, 0, 2 * R * z.dq);
  std::memset(w.dot, 0, 2 * R * z.dvp);
  std::memset(w.qv, 0, 2 * R * z.dq);
  std::memset(w.dov, 0, 2 * R * z.dvp);
  std::memset(w.o + rows * z.dvp, 0, 2 * (R - rows) * z.dvp);
  const TensorView& l = *p.lse;
  const float slope = p.rule.alibi_slope(qt.b, qt.h);
  auto row_of = [&](const TensorView& t, std::size_t r) {
    return r < rows ? row_ptr<const std::uint16_t>(t, qt.b, qt.i0 + static_cast<std::int64_t>(r), qt.h) : nullptr;
  };
  for (std::size_t r = 0; r < R; ++r) {
    w.lse[r] = w.dsum[r] = 0.0f;
    w.slope[r] = slope;
    if (r >= rows) continue;
    const std::int64_t i = qt.i0 + static_cast<std::int64_t>(r);
    const std::uint16_t *q = row_of(p.q, r), *g = row_of(p.dout, r);
    PairColumn(q, p.q.strides[3], dim, R, r, w.qt);
    PairColumn(g, p.dout.strides[3], dim_v, R, r, w.dot);
    CopyRow(row_of(p.out, r), p.out.strides[3], dim_v, z.dvp, w.o + r * z.dvp);
    if (r % 2 == 0) {  // rows r and r + 1 share pair row r / 2
      PairTwoRows(d, q, row_of(p.q, r + 1), p.q.strides[3], dim, w.qv + (r / 2) * z.dq);
      PairTwoRows(d, g, row_of(p.dout, r + 1), p.dout.strides[3], dim_v, w.dov + (r / 2) * z.dvp);
    }
    w.lse[r] = static_cast<const float*>(l.data)[qt.b * l.strides[0] + qt.h * l.strides[1] + i * l.strides[2]];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attn::detail::amx_backward_simd
HWY_AFTER_NAMESPACE();

#endif  // ATTN_AMX_BACKWARD_PACK_INL_H_
