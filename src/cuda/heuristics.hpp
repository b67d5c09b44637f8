// The CUDA backend's heuristics, each with the reason for its numbers: the kernel configuration per
// head dim (forward.cu and decode.cu dispatch on these) and decode's split count. docs/cuda.md shows
// the shared-memory and register budgets behind them.
#pragma once

#include <cstdint>

#include "attn/host_device.hpp"

namespace attn::cuda_detail {

template <int D_, int WARPS_, int MT_, int BC_, int MIN_BLOCKS_>
struct FwdTraits;  // forward_kernel.cuh
template <int D_, int BK_, int STAGES_, int WARPS_, int HB_>
struct DecTraits;  // decode_kernel.cuh
template <int D_, int WARPS_, int BC_, int SPLIT_>
struct BwdTraits;  // backward_kernel.cuh

// Forward: 4 warps of 16-row slabs; a warp owns MT slabs so that each K and V fragment it loads from
// shared memory feeds MT mma (d = 128: 48 ldmatrix per 128 mma instead of 72 with MT = 1), within 255
// registers. Keys per tile: 64 where the registers allow (d = 64), 32 beyond.
//                       D   warps  slabs/warp  keys/tile  min blocks   smem (Q + 2 stages of K, V; 16-bit)
using Fwd64 = FwdTraits<64, 4, 2, 64, 1>;    // 16 + 32 KB
using Fwd128 = FwdTraits<128, 4, 2, 32, 1>;  // 32 + 32 KB
using Fwd256 = FwdTraits<256, 4, 1, 32, 1>;  // 32 + 64 KB

// Backward: blocks of 64 rows (keys in dkdv, queries in dq), 16 a warp. A dkdv warp keeps dK and dV of
// its 16 keys in registers (2 x DC / 2 f32 a thread: 128 at d = 128) beside S^T and dP^T of BC query
// columns (2 x BC / 2), so BC shrinks as D grows; at d = 256 two warps share each 16 rows, one for each
// half of the columns (DC = 128), since 256 accumulators alone fill a thread's 255 registers (with one
// warp a slab, ptxas spilled 588 bytes in the dkdv loop). Registers and spills: scripts/sass-report.
// Unmeasured on a GPU.
//                       D   warps  other side's rows  column groups   smem (2 x 64 + 2 stages x 2 x BC rows)
using Bwd64 = BwdTraits<64, 4, 64, 1>;    // 49 KB
using Bwd128 = BwdTraits<128, 4, 32, 1>;  // 64.5 KB
using Bwd256 = BwdTraits<256, 8, 32, 2>;  // 128.5 KB

// Decode: memory-bound, so the tile and the stage count keep enough bytes in flight per SM (about
// 96 KB of K and V in shared memory, 2 blocks per SM for d <= 128); 4 warps, one kv head per block.
//                       D   keys/tile stages  warps  kv heads/block   smem (K + V)
using Dec64 = DecTraits<64, 128, 3, 4, 1>;   // 96 KB
using Dec128 = DecTraits<128, 64, 3, 4, 1>;  // 96 KB
using Dec256 = DecTraits<256, 64, 2, 4, 1>;  // 128 KB

// Splits per sequence for the decode kernel: enough (batch x kv_heads x row_blocks x splits) blocks to
// give every SM `waves` blocks, but no slice shorter than min_keys keys, and at most max_splits.
ATTN_HOST_DEVICE inline std::int64_t gpu_num_splits(std::int64_t max_keys, std::int64_t blocks_per_split,
                                                    std::int64_t sm_count, std::int64_t waves = 2,
                                                    std::int64_t min_keys = 256, std::int64_t max_splits = 128) {
  if (max_keys <= 0 || blocks_per_split <= 0) return 1;
  const std::int64_t want = (sm_count * waves + blocks_per_split - 1) / blocks_per_split;
  std::int64_t cap = max_keys / min_keys;
  if (cap < 1) cap = 1;
  std::int64_t s = want < cap ? want : cap;
  if (s > max_splits) s = max_splits;
  return s < 1 ? 1 : s;
}

}  // namespace attn::cuda_detail
