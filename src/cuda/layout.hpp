// The CUDA kernels' index arithmetic as pure host+device functions, so that the CPU test suite
// (tests/test_cuda_layout.cpp) checks every map the kernels rely on without a GPU:
//   * the register fragments of mma.sync.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16")
//     and the lane addresses that ldmatrix.x4 (plain and .trans) needs to produce them;
//   * the XOR swizzle of shared-memory tiles (16-byte chunks, conflict-free ldmatrix);
//   * the key-tile schedule of a block of query rows under a mask (causal tile skipping);
//   * split-K slicing and the split heuristic from the SM count;
//   * varlen (cu_seqlens) and paged-cache row offsets.
// Nothing here touches memory; the kernels and the tests call the same functions.
#pragma once

#include <cstdint>

#include "attn/host_device.hpp"
#include "core/cache_index.hpp"
#include "core/score_rule.hpp"
#include "core/split.hpp"

namespace attn::cuda_detail {

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} fragments --------------------------------
// lane = 0..31; group = lane / 4, tig (thread in group) = lane % 4.
struct RowCol {
  int row, col;
};
// A (16 x 16, row-major): 4 registers of 2 halves; element e = 2 * reg + half, e in 0..7.
ATTN_HOST_DEVICE constexpr RowCol mma_a_coord(int lane, int e) {
  return {lane / 4 + 8 * ((e >> 1) & 1), (lane % 4) * 2 + (e & 1) + 8 * (e >> 2)};
}
// B (16 x 8, k x n, "col"): 2 registers of 2 halves; e in 0..3. row = k, col = n.
ATTN_HOST_DEVICE constexpr RowCol mma_b_coord(int lane, int e) {
  return {(lane % 4) * 2 + (e & 1) + 8 * (e >> 1), lane / 4};
}
// C/D (16 x 8, f32): 4 registers; e in 0..3.
ATTN_HOST_DEVICE constexpr RowCol mma_c_coord(int lane, int e) {
  return {lane / 4 + 8 * (e >> 1), (lane % 4) * 2 + (e & 1)};
}

// ---- ldmatrix.sync.aligned.m8n8.x4 ---------------------------------------------------------------
// Lanes 8m .. 8m+7 give the row addresses of matrix m; after the load, register m of lane l holds
// row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m (with .trans: of its transpose).
ATTN_HOST_DEVICE constexpr RowCol ldmatrix_holds(int lane, int reg_half, bool trans) {
  // reg_half = 0 or 1: which of the two 16-bit halves of the lane's register.
  return trans ? RowCol{(lane % 4) * 2 + reg_half, lane / 4} : RowCol{lane / 4, (lane % 4) * 2 + reg_half};
}
// The (row, col) of the 16 x 16 tile whose 8-element row segment lane `lane` addresses, for the three
// uses in the kernels. Each returns the row and the first column of that segment.
//  A operand (Q, row-major [row][k]): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
//  (rows 8-15, k 8-15) = registers a0..a3.
ATTN_HOST_DEVICE constexpr RowCol ldmatrix_a_addr(int lane) {
  return {(lane % 8) + 8 * ((lane / 8) & 1), 8 * (lane / 16)};
}
//  B operand from a row-major [n][k] tile (K for S = Q K^T): matrices (n 0-7, k 0-7), (n 0-7, k 8-15),
//  (n 8-15, k 0-7), (n 8-15, k 8-15) = b0, b1 of n-tile 0, then b0, b1 of n-tile 1. Returns {n, k}.
ATTN_HOST_DEVICE constexpr RowCol ldmatrix_b_addr(int lane) {
  return {(lane % 8) + 8 * (lane / 16), 8 * ((lane / 8) & 1)};
}
//  B operand from a row-major [k][n] tile with .trans (V for O = P V): matrices (k 0-7, n 0-7),
//  (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) = b0, b1 of n-tile 0, then of n-tile 1.
//  Returns {k, n}.
ATTN_HOST_DEVICE constexpr RowCol ldmatrix_bt_addr(int lane) {
  return {(lane % 8) + 8 * ((lane / 8) & 1), 8 * (lane / 16)};
}

// ---- shared-memory swizzle -------------------------------------------------------------------------
// Tiles are [rows][dim] 16-bit elements, dim a multiple of 64 (8 chunks of 16 bytes or more). Chunk c
// of row r is stored at chunk c ^ (r % 8) of that row: the 8 rows of one ldmatrix matrix, all reading
// the same logical chunk, land in 8 different 16-byte bank groups.
ATTN_HOST_DEVICE constexpr int swizzle(int row, int col, int dim) {
  return row * dim + ((((col >> 3) ^ (row & 7)) << 3) | (col & 7));
}

// What the kernels compute instead of calling swizzle() per ldmatrix: a lane's row is fixed (plus
// multiples of 8, which keep row % 8), and at k-step kk it reads chunk 2 kk + c0 (c0 = 0 or 1). Since
// (2 kk + c0) ^ (row % 8) = 8 (kk / 4) + ((2 (kk % 4) + c0) ^ (row % 8)), a lane keeps the four byte
// offsets of kk % 4 = 0..3 (lane_chunk_bytes) and the rest is a compile-time constant that ldmatrix takes
// as an immediate. tiled_byte_offset is that sum; tests/test_cuda_layout.cpp checks it equals 2 x swizzle.
ATTN_HOST_DEVICE constexpr int lane_chunk_bytes(int row, int c0, int kk_mod4) {
  return ((2 * kk_mod4 + c0) ^ (row & 7)) << 4;
}
ATTN_HOST_DEVICE constexpr int tiled_byte_offset(int row, int c0, int kk, int dim) {
  return row * dim * 2 + lane_chunk_bytes(row, c0, kk % 4) + (kk / 4) * 128;
}

// ---- key-tile schedule ----------------------------------------------------------------------------
// A block of query rows [i0, i0 + rows) of one (seqlen_q, seqlen_k) pair visits the key tiles
// [first, end) of size k_tile, starting at key 0; tiles outside every row's visible keys are skipped
// (causal: the tiles above the diagonal). Since first_key and end_key are non-decreasing in i, the
// block's keys are [first_key(i0), end_key(last row)).
struct TileRange {
  std::int64_t first, end;  // tile indices; empty when first >= end
};
ATTN_HOST_DEVICE inline TileRange key_tiles(const detail::Mask& m, std::int64_t i0, std::int64_t rows,
                                            std::int64_t k_tile) {
  const std::int64_t last = (i0 + rows < m.seqlen_q ? i0 + rows : m.seqlen_q) - 1;
  if (last < i0) return {0, 0};
  const std::int64_t lo = m.first_key(i0), hi = m.end_key(last);
  if (lo >= hi) return {0, 0};
  return {lo / k_tile, (hi + k_tile - 1) / k_tile};
}
// Whether every query of [i_first, i_last] sees every key of [j0, j1): since first_key and end_key are
// non-decreasing in i, the last query's first key and the first query's end bound them all.
ATTN_HOST_DEVICE inline bool all_rows_see(const detail::Mask& m, std::int64_t i_first, std::int64_t i_last,
                                          std::int64_t j0, std::int64_t j1) {
  return m.first_key(i_last) <= j0 && j1 <= m.end_key(i_first);
}
// Whether key tile t needs per-element masking for rows [i0, i0 + rows): false when every row of the
// block (that exists) sees every key of the tile, and the tile lies inside seqlen_k.
ATTN_HOST_DEVICE inline bool tile_needs_mask(const detail::Mask& m, std::int64_t i0, std::int64_t rows,
                                             std::int64_t k_tile, std::int64_t t) {
  const std::int64_t last = (i0 + rows < m.seqlen_q ? i0 + rows : m.seqlen_q) - 1;
  const std::int64_t j0 = t * k_tile, j1 = j0 + k_tile;
  return j1 > m.seqlen_k || !all_rows_see(m, i0, last, j0, j1);
}
// The query rows that may see a key of [j0, j1) (j0 < j1): [begin, end), the rows whose end_key passes
// j0 and whose first_key is below j1 (both non-decreasing in i, so two binary searches). A row inside
// may still see none of them (a fully masked row); none outside sees any. The backward's key blocks
// (backward_kernel.cuh) visit these rows only.
struct RowRange {
  std::int64_t begin, end;
};
ATTN_HOST_DEVICE inline RowRange query_rows(const detail::Mask& m, std::int64_t j0, std::int64_t j1) {
  std::int64_t lo = 0, hi = m.seqlen_q;  // first row with end_key > j0
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (m.end_key(mid) > j0)
      hi = mid;
    else
      lo = mid + 1;
  }
  const std::int64_t begin = lo;
  hi = m.seqlen_q;  // first row with first_key >= j1
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (m.first_key(mid) >= j1)
      hi = mid;
    else
      lo = mid + 1;
  }
  return {begin, lo};
}
// Whether key j is visible to query i (the per-element rule the masked tiles apply).
ATTN_HOST_DEVICE inline bool visible(const detail::Mask& m, std::int64_t i, std::int64_t j) {
  return i < m.seqlen_q && j < m.seqlen_k && m.first_key(i) <= j && j < m.end_key(i);
}

// ---- decode rows ------------------------------------------------------------------------------------
// The decode kernel packs the query rows of one kv head: row r of kv head g is query head
// g * group + r / seqlen_q at query position r % seqlen_q.
struct PackedRow {
  std::int64_t head, query;
};
ATTN_HOST_DEVICE constexpr PackedRow unpack_row(std::int64_t r, std::int64_t kv_head, std::int64_t group,
                                                std::int64_t seqlen_q) {
  return {kv_head * group + r / seqlen_q, r % seqlen_q};
}

// ---- varlen ---------------------------------------------------------------------------------------------
// Varlen: sequence b's rows are [cu[b], cu[b + 1]) of the packed dimension.
ATTN_HOST_DEVICE constexpr std::int64_t varlen_row(const std::int32_t* cu, std::int64_t b, std::int64_t i) {
  return std::int64_t{cu[b]} + i;
}

}  // namespace attn::cuda_detail
