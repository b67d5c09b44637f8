// Split-K decode (Flash-Decoding) on tensor cores, over contiguous or paged KV caches.
//
// The query rows of one kv head -- its `group` query heads times seqlen_q -- are packed into slabs of 16
// rows (unpack_row), so every K and V row is read from memory once per slab, not once per query head.
// One block per (key slice, kv head x row slab, sequence): the slice's keys stream through shared memory
// in tiles of BK keys, STAGES deep with cp.async (decode is bound by the cache's bytes, so several tiles
// stay in flight); each of the 4 warps takes BK/4 keys of a tile against all 16 rows (S = Q K^T and
// O += P V on mma.sync) and keeps its own online-softmax state. At the end the 4 warp states are merged
// with attn::merge, and either finalised (one slice) or written as the slice's partial state, which the
// merge kernel combines in slice order (attn::merge, attn::finalize).
#include <cuda_runtime.h>

#include "cuda/params.hpp"
#include "cuda/tile.cuh"

namespace attn::cuda_detail {
namespace {

template <int D>
struct DecConfig;
//                                    keys/tile  stages     smem (K+V)
template <> struct DecConfig<64> { static constexpr int BK = 128, STAGES = 3; };   // 96 KB
template <> struct DecConfig<128> { static constexpr int BK = 64, STAGES = 3; };   // 96 KB
template <> struct DecConfig<256> { static constexpr int BK = 64, STAGES = 2; };   // 128 KB
constexpr int kWarps = 4, kThreads = 128, kRows = 16;

template <int D>
constexpr int dec_smem_bytes() {
  using C = DecConfig<D>;
  constexpr int pipe = (kRows + 2 * C::STAGES * C::BK) * D * 2;
  constexpr int merge = kWarps * kRows * (D + 2) * 4;
  return pipe > merge ? pipe : merge;
}

__device__ __forceinline__ const std::uint16_t* cache_row(const void* base, const DecodeParams& p, std::int64_t b,
                                                          std::int64_t pos, const std::int64_t (&s)[2], std::int64_t g,
                                                          std::int64_t head_stride) {
  return static_cast<const std::uint16_t*>(base) +
         cache_row_offset(b, pos, s[0], s[1], p.block_table, p.bt_stride, p.page_size) + g * head_stride;
}

template <class E, int D>
__global__ void __launch_bounds__(kThreads) decode_kernel(const DecodeParams p) {
  using C = DecConfig<D>;
  constexpr int BK = C::BK, KW = BK / kWarps, NT = KW / 8, DT = D / 8, STAGES = C::STAGES;
  extern __shared__ __align__(128) std::uint16_t smem[];
  std::uint16_t* sQ = smem;
  std::uint16_t* sK = sQ + kRows * D;  // [STAGES][BK][D]
  std::uint16_t* sV = sK + STAGES * BK * D;

  const std::int64_t w = blockIdx.x, b = blockIdx.z;
  const std::int64_t g = blockIdx.y / p.row_blocks, r0 = (blockIdx.y % p.row_blocks) * kRows;
  const std::int64_t group = p.heads / p.kv_heads, rows = group * p.seqlen_q;
  const std::int64_t sk = std::int64_t{p.seqlens[b]} + p.seqlen_new;
  const detail::Mask mask{p.seqlen_q, sk, p.window_left, p.window_right, p.scale, p.softcap};
  // The slice, trimmed to the keys some query of this sequence can see.
  const KeySlice slice = split_slice(sk, p.num_splits, w);
  const std::int64_t lo = slice.begin > mask.first_key(0) ? slice.begin : mask.first_key(0);
  const std::int64_t hi = slice.end < mask.end_key(p.seqlen_q - 1) ? slice.end : mask.end_key(p.seqlen_q - 1);
  const std::int64_t n_tiles = hi > lo ? (hi - lo + BK - 1) / BK : 0;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto load_kv = [&](int stage, std::int64_t t) {
    load_tile<D, kThreads>(sK + stage * BK * D, BK, p.k, [&](int r) -> const std::uint16_t* {
      const std::int64_t j = lo + t * BK + r;
      return j < hi ? cache_row(p.k, p, b, j, p.ks, g, p.k_head_stride) : nullptr;
    });
    load_tile<D, kThreads>(sV + stage * BK * D, BK, p.v, [&](int r) -> const std::uint16_t* {
      const std::int64_t j = lo + t * BK + r;
      return j < hi ? cache_row(p.v, p, b, j, p.vs, g, p.v_head_stride) : nullptr;
    });
  };
  load_tile<D, kThreads>(sQ, kRows, p.q, [&](int r) -> const std::uint16_t* {
    if (r0 + r >= rows) return nullptr;
    const PackedRow pr = unpack_row(r0 + r, g, group, p.seqlen_q);
    return static_cast<const std::uint16_t*>(p.q) + b * p.qs[0] + pr.query * p.qs[1] + pr.head * p.qs[2];
  });
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < n_tiles) load_kv(s, s);
    cp_async_commit();
  }

  // The lane's two rows (lane/4 and lane/4 + 8 of the slab): query index and ALiBi slope.
  std::int64_t qi[2];
  float slope[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const std::int64_t r = r0 + lane / 4 + 8 * half;
    const PackedRow pr = unpack_row(r < rows ? r : rows - 1, g, group, p.seqlen_q);
    qi[half] = r < rows ? pr.query : p.seqlen_q;  // padding rows: past every query, fully masked
    slope[half] = p.alibi ? p.alibi[b * p.alibi_bstride + pr.head] : 0.f;
  }
  const bool transform = p.softcap > 0 || slope[0] != 0.f || slope[1] != 0.f;
  const float scale = static_cast<float>(p.scale);

  float o[DT][4], m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int d = 0; d < DT; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[d][e] = 0.f;

  for (std::int64_t t = 0; t < n_tiles; ++t) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (t + STAGES - 1 < n_tiles) load_kv(static_cast<int>((t + STAGES - 1) % STAGES), t + STAGES - 1);
    cp_async_commit();
    const int stage = static_cast<int>(t % STAGES);
    const std::int64_t j0 = lo + t * BK + warp * KW;  // this warp's first key
    float s[NT][4];
    warp_qk<E, D, NT>(s, sQ, 0, sK + stage * BK * D, warp * KW);
    // Every row sees [j0, j0 + KW) unless the sub-tile runs past the slice or straddles a mask edge.
    const bool need_mask = j0 + KW > hi || r0 + kRows > rows || !(mask.first_key(p.seqlen_q - 1) <= j0 && j0 + KW <= mask.end_key(0));
    score_slab<NT>(
        s, mask, scale, transform, slope[0], slope[1], need_mask, [&](int half) { return qi[half]; },
        [&](int n, int e) { return j0 + n * 8 + (lane % 4) * 2 + (e & 1); },
        [&](int, std::int64_t i, std::int64_t j) { return j < hi && visible(mask, i, j); });
    softmax_step<NT, DT>(s, m, l, o);
    warp_pv<E, D, NT>(o, s, sV + stage * BK * D, warp * KW);
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the merge buffer

  // Each warp's state -> shared memory: per warp and row, o[D] then m, l.
  float* sm = reinterpret_cast<float*>(smem);
  constexpr int S = D + 2;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = lane / 4 + 8 * half;
    float* st = sm + (warp * kRows + r) * S;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
      st[d * 8 + (lane % 4) * 2] = o[d][2 * half];
      st[d * 8 + (lane % 4) * 2 + 1] = o[d][2 * half + 1];
    }
    const float lsum = quad_sum(l[half]);
    if (lane % 4 == 0) {
      st[D] = m[half];
      st[D + 1] = lsum;
    }
  }
  __syncthreads();

  // Merge the warps in order: 8 threads per row, D/8 columns each (the merge is column-wise, so each
  // thread merges its columns with its own copy of m and l).
  constexpr int COLS = D / 8;
  const int r = threadIdx.x / 8, c0 = (threadIdx.x % 8) * COLS;
  if (r0 + r >= rows) return;
  float mm = sm[r * S + D], ll = sm[r * S + D + 1], oo[COLS];
#pragma unroll
  for (int c = 0; c < COLS; ++c) oo[c] = sm[r * S + c0 + c];
#pragma unroll
  for (int ww = 1; ww < kWarps; ++ww) {
    float* st = sm + (ww * kRows + r) * S;
    merge(RowState<float>{&mm, &ll, oo, COLS}, RowState<float>{st + D, st + D + 1, st + c0, COLS});
  }
  const PackedRow pr = unpack_row(r0 + r, g, group, p.seqlen_q);
  const std::int64_t orow = (b * p.heads + pr.head) * p.seqlen_q + pr.query;
  if (p.num_splits == 1) {
    float res[COLS];
    const float lse = finalize(RowState<float>{&mm, &ll, oo, COLS}, res);
    std::uint16_t* out = static_cast<std::uint16_t*>(p.out) + b * p.os[0] + pr.query * p.os[1] + pr.head * p.os[2] + c0;
#pragma unroll
    for (int c = 0; c < COLS; c += 2) *reinterpret_cast<std::uint32_t*>(out + c) = pack2<E>(res[c], res[c + 1]);
    if (p.lse && c0 == 0) p.lse[b * p.ls[0] + pr.head * p.ls[1] + pr.query * p.ls[2]] = lse;
  } else {
    float* part = p.partial + (orow * p.num_splits + w) * S;
#pragma unroll
    for (int c = 0; c < COLS; ++c) part[c0 + c] = oo[c];
    if (c0 == 0) {
      part[D] = mm;
      part[D + 1] = ll;
    }
  }
}

// One warp per output row: merge its num_splits partial states in slice order, then finalise.
template <class E, int D>
__global__ void __launch_bounds__(128) merge_kernel(const DecodeParams p) {
  constexpr int COLS = D / 32, S = D + 2;
  const std::int64_t row = std::int64_t{blockIdx.x} * 4 + threadIdx.x / 32;
  if (row >= p.batch * p.heads * p.seqlen_q) return;
  const int lane = threadIdx.x % 32;
  const std::int64_t i = row % p.seqlen_q, h = (row / p.seqlen_q) % p.heads, b = row / (p.seqlen_q * p.heads);
  const float* part = p.partial + row * p.num_splits * S;
  float m = part[D], l = part[D + 1], o[COLS];
#pragma unroll
  for (int c = 0; c < COLS; ++c) o[c] = part[lane * COLS + c];
  for (std::int64_t w = 1; w < p.num_splits; ++w) {
    const float* st = part + w * S;
    float bo[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) bo[c] = st[lane * COLS + c];
    float bm = st[D], bl = st[D + 1];
    merge(RowState<float>{&m, &l, o, COLS}, RowState<float>{&bm, &bl, bo, COLS});
  }
  float res[COLS];
  const float lse = finalize(RowState<float>{&m, &l, o, COLS}, res);
  std::uint16_t* out = static_cast<std::uint16_t*>(p.out) + b * p.os[0] + i * p.os[1] + h * p.os[2] + lane * COLS;
#pragma unroll
  for (int c = 0; c < COLS; c += 2) *reinterpret_cast<std::uint32_t*>(out + c) = pack2<E>(res[c], res[c + 1]);
  if (p.lse && lane == 0) p.lse[b * p.ls[0] + h * p.ls[1] + i * p.ls[2]] = lse;
}

// k_new/v_new -> the cache at positions seqlens[b] .. (one block per new row and sequence).
__global__ void append_kernel(const DecodeParams p) {
  const std::int64_t j = blockIdx.x, b = blockIdx.y, pos = std::int64_t{p.seqlens[b]} + j;
  const std::int64_t n = p.kv_heads * p.head_dim;
  for (std::int64_t x = threadIdx.x; x < n; x += blockDim.x) {
    const std::int64_t g = x / p.head_dim, c = x % p.head_dim;
    const std::int64_t ko = cache_row_offset(b, pos, p.ks[0], p.ks[1], p.block_table, p.bt_stride, p.page_size);
    const std::int64_t vo = cache_row_offset(b, pos, p.vs[0], p.vs[1], p.block_table, p.bt_stride, p.page_size);
    const_cast<std::uint16_t*>(static_cast<const std::uint16_t*>(p.k))[ko + g * p.k_head_stride + c] =
        static_cast<const std::uint16_t*>(p.k_new)[b * p.kns[0] + j * p.kns[1] + g * p.kns[2] + c];
    const_cast<std::uint16_t*>(static_cast<const std::uint16_t*>(p.v))[vo + g * p.v_head_stride + c] =
        static_cast<const std::uint16_t*>(p.v_new)[b * p.vns[0] + j * p.vns[1] + g * p.vns[2] + c];
  }
}

template <class E, int D>
int launch(const DecodeParams& p, cudaStream_t stream) {
  if (p.seqlen_new > 0) {
    append_kernel<<<dim3(static_cast<unsigned>(p.seqlen_new), static_cast<unsigned>(p.batch)), 256, 0, stream>>>(p);
    if (cudaError_t e = cudaGetLastError()) return e;
  }
  constexpr int smem = dec_smem_bytes<D>();
  auto kernel = decode_kernel<E, D>;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) return e;
  const dim3 grid(static_cast<unsigned>(p.num_splits), static_cast<unsigned>(p.kv_heads * p.row_blocks),
                  static_cast<unsigned>(p.batch));
  kernel<<<grid, kThreads, smem, stream>>>(p);
  if (cudaError_t e = cudaGetLastError()) return e;
  if (p.num_splits > 1) {
    const std::int64_t rows = p.batch * p.heads * p.seqlen_q;
    merge_kernel<E, D><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, stream>>>(p);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

}  // namespace

int launch_decode(const DecodeParams& p, DType t, CUstream_st* stream) {
  const bool bf = t == DType::bf16;
  switch (p.head_dim) {
    case 64: return bf ? launch<Bf16, 64>(p, stream) : launch<F16, 64>(p, stream);
    case 128: return bf ? launch<Bf16, 128>(p, stream) : launch<F16, 128>(p, stream);
    case 256: return bf ? launch<Bf16, 256>(p, stream) : launch<F16, 256>(p, stream);
  }
  return cudaErrorInvalidValue;
}

constexpr int decode_rows_per_block() { return kRows; }

}  // namespace attn::cuda_detail
