// Device building blocks shared by the forward and decode kernels: loading a tile into swizzled shared
// memory with cp.async, S = Q K^T and O += P V for one warp's 16 x n slab on tensor cores, the scores'
// scale and mask, the online-softmax step over a slab's registers (the rescale rule is
// attn::rescale_factor), and the handling of NaN and infinite values in tiles the mask cuts.
#pragma once

#include <cstdint>
#include <limits>

#include "attn/online_softmax.hpp"
#include "cuda/layout.hpp"
#include "cuda/ptx.cuh"

namespace attn::cuda_detail {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A row of a tile to load: the address of its D contiguous 16-bit elements, and whether to read them
// (else the row is zero-filled: cp.async with source size 0, which reads nothing). Callers clamp the
// row index, so that `ptr` lies inside the tensor even when !ok: no instruction names an address outside
// it (the CPU emulation checks this), and no pointer select is needed per row.
struct RowSource {
  const std::uint16_t* ptr;
  bool ok;
};

// Which 16-byte chunks of a tile a thread copies: chunk `ch` of rows r0, r0 + kStep, r0 + 2 kStep, ...
// (its rows a fixed stride apart, so a row's address is the previous one's plus a constant).
template <int D, int THREADS>
struct TileCopyLane {
  static constexpr int kChunks = D / 8, kStep = THREADS / kChunks;
  static_assert(THREADS % kChunks == 0, "a thread keeps its chunk column from row to row");
  int ch = static_cast<int>(threadIdx.x % kChunks), r0 = static_cast<int>(threadIdx.x / kChunks);
};

// Loads rows [0, ROWS) of a tile into a swizzled [*][D] shared-memory tile: row r comes from src(r) (a
// RowSource) and goes to shared row dst_row(r). All threads of the block take part; the loop is
// unrolled and branch-free.
template <int D, int THREADS, int ROWS, class SrcFn, class DstFn>
__device__ __forceinline__ void load_tile(std::uint16_t* smem, SrcFn src, DstFn dst_row) {
  using Lane = TileCopyLane<D, THREADS>;
  constexpr int kTotal = ROWS * Lane::kChunks;
  const Lane lane;
#pragma unroll
  for (int k = 0; k < (kTotal + THREADS - 1) / THREADS; ++k) {
    const int r = lane.r0 + k * Lane::kStep;
    if (kTotal % THREADS != 0 && r >= ROWS) break;
    const RowSource row = src(r);
    cp_async_16(smem_addr(smem + swizzle(dst_row(r), lane.ch * 8, D)), row.ptr + lane.ch * 8, row.ok ? 16 : 0);
  }
}
template <int D, int THREADS, int ROWS, class SrcFn>
__device__ __forceinline__ void load_tile(std::uint16_t* smem, SrcFn src) {
  load_tile<D, THREADS, ROWS>(smem, src, [](int r) { return r; });
}

// Row r's index, clamped to the last of `valid` rows (valid >= 1): the address a RowSource names for a
// row past the end.
__device__ __forceinline__ int clamp_row(int r, int valid) { return r < valid ? r : valid - 1; }

// load_tile for a tile whose row r is at first + r x stride (elements), of which the first `valid`
// (>= 1) are read and the rest zero-filled. A whole tile (valid == ROWS: every tile but a sequence's
// last) walks the thread's source pointer by a constant from row to row: two instructions per copy,
// where forming each row's address from its clamped 64-bit index took about ten (scripts/sass-report).
template <int D, int THREADS, int ROWS, class DstFn>
__device__ __forceinline__ void load_strided_tile(std::uint16_t* smem, const std::uint16_t* first, std::int64_t stride,
                                                  int valid, DstFn dst_row) {
  using Lane = TileCopyLane<D, THREADS>;
  constexpr int kTotal = ROWS * Lane::kChunks;
  if (valid < ROWS)
    return load_tile<D, THREADS, ROWS>(
        smem,
        [&](int r) {
          return RowSource{first + clamp_row(r, valid) * stride, r < valid};
        },
        dst_row);
  const Lane lane;
  const std::uint16_t* src = first + lane.r0 * stride + lane.ch * 8;
#pragma unroll
  for (int k = 0; k < (kTotal + THREADS - 1) / THREADS; ++k) {
    const int r = lane.r0 + k * Lane::kStep;
    if (kTotal % THREADS != 0 && r >= ROWS) break;
    cp_async_16(smem_addr(smem + swizzle(dst_row(r), lane.ch * 8, D)), src, 16);
    src += Lane::kStep * stride;
  }
}
template <int D, int THREADS, int ROWS>
__device__ __forceinline__ void load_strided_tile(std::uint16_t* smem, const std::uint16_t* first, std::int64_t stride,
                                                  int valid) {
  load_strided_tile<D, THREADS, ROWS>(smem, first, stride, valid, [](int r) { return r; });
}

// How many of a tile's `rows` rows hold data when `left` rows remain from its first one (left >= 1).
__device__ __forceinline__ int valid_rows(std::int64_t left, int rows) {
  return static_cast<int>(left < rows ? left : rows);
}

// One lane's ldmatrix addresses in a swizzled [*][D] tile (layout.hpp, tiled_byte_offset): four
// per-lane byte offsets, for k-steps kk % 4 = 0..3; row_add (a multiple of 8) and kk / 4 are constants
// that the address takes as an immediate. Lane constants, so the compiler hoists them out of tile loops.
template <int D>
struct LaneOffsets {
  std::uint32_t off[4];
  __device__ __forceinline__ explicit LaneOffsets(RowCol rc) {
#pragma unroll
    for (int i = 0; i < 4; ++i) off[i] = rc.row * D * 2 + lane_chunk_bytes(rc.row, rc.col / 8, i);
  }
  // Address of the lane's segment in rows row_add + (lane's row) at k-step kk of the tile at `base`.
  __device__ __forceinline__ std::uint32_t at(std::uint32_t base, int row_add, int kk) const {
    return base + off[kk % 4] + (row_add * D * 2 + (kk / 4) * 128);
  }
};

// s[mt][n][.] = Q[q_row0 + 16 mt .. +16) K[k_row0 .. +8*NT)^T for one warp's MT slabs of 16 query rows;
// Q and K are swizzled [*][D] tiles, and q_row0, k_row0 multiples of 8 (LaneOffsets keeps row % 8). Each
// K fragment is loaded once and used by all MT slabs, so MT slabs per warp divide the ldmatrix traffic
// for K by MT (FlashAttention-2's tile: 2 slabs). Each n-tile's k-steps are a chain of dependent mma;
// with few (decode: one slab, NT = 2) the chains are split in two, even and odd k-steps, so twice as many
// are in flight, and the halves are added at the end.
template <class E, int D, int NT, int MT>
__device__ __forceinline__ void warp_qk(float (&s)[MT][NT][4], const std::uint16_t* sq, int q_row0,
                                        const std::uint16_t* sk, int k_row0) {
  static_assert(NT % 2 == 0);
  constexpr int kChains = NT * MT >= 4 ? 1 : 2;
  const int lane = threadIdx.x % 32;
  float acc[kChains][MT][NT][4];
#pragma unroll
  for (int c = 0; c < kChains; ++c)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][mt][n][e] = 0.f;
  const LaneOffsets<D> qa(ldmatrix_a_addr(lane)), kb(ldmatrix_b_addr(lane));
  const std::uint32_t q_base = smem_addr(sq + q_row0 * D), k_base = smem_addr(sk + k_row0 * D);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], qa.at(q_base, mt * 16, kk));
#pragma unroll
    for (int n2 = 0; n2 < NT / 2; ++n2) {
      std::uint32_t b[4];
      ldmatrix_x4(b, kb.at(k_base, n2 * 16, kk));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<E>(acc[kk % kChains][mt][2 * n2], a[mt], b[0], b[1]);
        mma_16816<E>(acc[kk % kChains][mt][2 * n2 + 1], a[mt], b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[mt][n][e] = kChains == 1 ? acc[0][mt][n][e] : acc[0][mt][n][e] + acc[kChains - 1][mt][n][e];
}

// o[mt][d][.] += P[mt] V[v_row0 .. +8*NT) for one warp's MT slabs; p holds each slab's 16 x 8*NT
// probabilities in C-fragment layout (as warp_qk left them), V is a swizzled [*][D] tile, v_row0 a
// multiple of 8. Each V fragment is loaded once for all MT slabs. o may hold only DC of the D columns,
// from col0 on (a multiple of 64: the swizzle repeats every 64 columns, so the columns' lane offsets are
// those of column 0 moved by 128 bytes per 64 columns).
template <class E, int D, int NT, int MT, int DC = D>
__device__ __forceinline__ void warp_pv(float (&o)[MT][DC / 8][4], const float (&p)[MT][NT][4], const std::uint16_t* sv,
                                        int v_row0, int col0 = 0) {
  static_assert(DC % 16 == 0 && D % DC == 0);
  const int lane = threadIdx.x % 32;
  const LaneOffsets<D> vb(ldmatrix_bt_addr(lane));
  const std::uint32_t v_base = smem_addr(sv + v_row0 * D) + static_cast<std::uint32_t>(col0 / 64) * 128;
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    // The C fragments of n-tiles 2kk and 2kk+1 are exactly the A fragment of a 16 x 16 k-step.
    std::uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = pack2<E>(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = pack2<E>(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = pack2<E>(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = pack2<E>(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int d2 = 0; d2 < DC / 16; ++d2) {
      std::uint32_t b[4];
      ldmatrix_x4_trans(b, vb.at(v_base, kk * 16, d2));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<E>(o[mt][2 * d2], a[mt], b[0], b[1]);
        mma_16816<E>(o[mt][2 * d2 + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Scores live in base-2 units inside the tile loops: x = log2(e) * logit, so p = 2^(x - m) is one ex2
// per element (exp2_fast). The running max m is in the same units; it leaves a kernel (to attn::merge,
// the LSE) multiplied by ln 2.
constexpr float kLog2e = 1.44269504088896340736f, kLn2 = 0.693147180559945309417f;

// Whether a tile's scores can stay raw dot products until the exponent (softmax_step's `scale`): every
// key visible to every row, no softcap or ALiBi, and a positive scale, so that the largest raw dot is
// the largest scaled score (rounding is monotonic). Otherwise mask_scores transforms them first.
__device__ __forceinline__ bool raw_scores_fold(bool need_mask, bool transform, float scale_log2) {
  return !need_mask && !transform && scale_log2 > 0.f;
}

// The online-softmax step for one warp's 16 rows: the lane holds rows lane/4 (half 0) and lane/4 + 8
// (half 1). s holds dots whose base-2 scores are s x scale (scale = scale x log2(e) for raw dots, 1 for
// mask_scores' output; -inf = masked) and becomes p = 2^(s x scale - m_new), one FFMA and one ex2 per
// element; m is the running max in base 2, l the lane's partial row sum (summed over the quad at the
// end). o is rescaled by attn::rescale_factor's rule (in base 2), and only when some row of the warp
// has a new maximum: once the maxima settle, most tiles of a long row skip those DT x 4 multiplies
// (alpha = 1 multiplies exactly, so skipping changes no bit).
template <int NT, int DT>
__device__ __forceinline__ void softmax_step(float (&s)[NT][4], float (&m)[2], float (&l)[2], float (&o)[DT][4],
                                             float scale) {
  float alpha[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float mx = kNegInf;
#pragma unroll
    for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * half], s[n][2 * half + 1]));
    const float m_new = fmaxf(m[half], quad_max(mx) * scale);
    // The max did not grow (or nothing is visible yet: o and l are 0): exactly 1, whatever ex2 gives.
    alpha[half] = m_new == m[half] ? 1.f : rescale_factor_with(m[half], m_new, exp2_fast);
    const float neg_m = m_new == kNegInf ? 0.f : -m_new;  // a row with nothing visible yet: p = 2^-inf = 0
    m[half] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = exp2_fast(fmaf(s[n][2 * half + e], scale, neg_m));
        s[n][2 * half + e] = pv;
        sum += pv;
      }
    l[half] = l[half] * alpha[half] + sum;
  }
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[d][e] *= alpha[e >> 1];
  }
}

// Scores of any other slab (on a mask edge, or softcap/ALiBi on): Mask::score's transform, in base 2,
// and -inf where visible_fn hides the key (checked only when need_mask). row_of(half) and key_of(n, e)
// give the query and key indices. Callers take this path per tile, not per element.
template <int NT, class RowFn, class KeyFn, class VisibleFn>
__device__ __forceinline__ void mask_scores(float (&s)[NT][4], const detail::Mask& mask, float slope0, float slope1,
                                            bool need_mask, RowFn row_of, KeyFn key_of, VisibleFn visible_fn) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1;
      const std::int64_t i = row_of(half), j = key_of(n, e);
      s[n][e] =
          need_mask && !visible_fn(half, i, j) ? kNegInf : mask.score(s[n][e], i, j, half ? slope1 : slope0) * kLog2e;
    }
}

// ---- Non-finite values in masked tiles (docs/robustness.md) -------------------------------------------
// The CPU skips the keys a row cannot see; the P V product above weights them by p = 0, and 0 x NaN or
// 0 x inf would carry a value row's NaN or infinity into rows that mask its key. So in a tile the mask
// cuts, the kernels check the V tile first (any_nonfinite); if it holds a NaN or infinity (rare), each
// row adds p x v for exactly those elements of the keys it sees (add_nonfinite_values: NaN, +-inf, or
// NaN for 0 x inf, as the CPU's fold does), the elements are zeroed in shared memory (zero_nonfinite),
// and the product adds the finite rest. Rows that see no such key get bit for bit what they get
// without it.
template <class E>
__device__ __forceinline__ bool is_nonfinite(std::uint16_t x) {
  constexpr std::uint16_t kExp = std::is_same_v<E, Bf16> ? 0x7F80 : 0x7C00;  // all exponent bits set
  return (x & kExp) == kExp;
}

// Whether rows [0, ROWS) of a [ROWS][D] shared tile hold a NaN or infinity; a barrier of the block.
template <class E, int D, int ROWS, int THREADS>
__device__ __forceinline__ bool any_nonfinite(const std::uint16_t* tile) {
  int bad = 0;
  for (int i = threadIdx.x; i < ROWS * D; i += THREADS) bad |= is_nonfinite<E>(tile[i]);
  return __syncthreads_or(bad) != 0;
}

// Zeroes the NaN and infinite elements of rows [0, ROWS) of a [ROWS][D] shared tile; all threads.
template <class E, int D, int ROWS, int THREADS>
__device__ __forceinline__ void zero_nonfinite(std::uint16_t* tile) {
  for (int i = threadIdx.x; i < ROWS * D; i += THREADS)
    if (is_nonfinite<E>(tile[i])) tile[i] = 0;
}

// o += p x v over the non-finite elements of V rows [v_row0, v_row0 + 8*NT) that visible_key(half, j)
// admits for the lane's row (j: key within the slab's 8*NT keys); p in C-fragment layout as softmax_step
// left it. One key at a time on CUDA cores: only for the rare tiles above. prow, indexed by j, lives in
// local memory, on this path only; which keys the row sees is asked once per key (a bit mask), not once
// per key and column (fewer registers: the d = 128 forward stopped spilling on sm_80 with it).
// Inlined into both kernels: as an out-of-line call taking o and p by reference, their addresses
// escape and the compiler keeps them in local memory on every tile, not only on this path
// (scripts/sass-report shows it as local loads and stores in the hot blocks).
// o may hold only DC of the D columns, from col0 on (warp_pv's column groups).
template <class E, int D, int NT, int DC = D, class VisibleFn>
__device__ __forceinline__ void add_nonfinite_values(float (&o)[DC / 8][4], const float (&p)[NT][4],
                                                     const std::uint16_t* sv, int v_row0, VisibleFn visible_key,
                                                     int col0 = 0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float prow[8 * NT];  // the row's p for every key: the quad's four lanes hold two keys of each n-tile
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          prow[n * 8 + 2 * q + e] = __shfl_sync(0xffffffffu, p[n][2 * half + e], (lane & ~3) | q);
    std::uint64_t sees = 0;  // bit j: the row sees key j
#pragma unroll 1
    for (int j = 0; j < 8 * NT; ++j) sees |= std::uint64_t{visible_key(half, j)} << j;
#pragma unroll
    for (int d = 0; d < DC / 8; ++d)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = col0 + d * 8 + (lane % 4) * 2 + c;
#pragma unroll 1
        for (int j = 0; j < 8 * NT; ++j) {
          const std::uint16_t x = sv[swizzle(v_row0 + j, col, D)];
          if (is_nonfinite<E>(x) && (sees >> j & 1)) o[d][2 * half + c] += prow[j] * to_float<E>(x);
        }
      }
  }
}

}  // namespace attn::cuda_detail
