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

// Forward: 4 warps of 16-row slabs; a warp owns MT slabs so that each K and V fragment it loads from
// shared memory feeds MT mma (d = 128: 48 ldmatrix per 128 mma instead of 72 with MT = 1), within 255
// registers. Keys per tile: 64 where the registers allow (d = 64), 32 beyond.
//                       D   warps  slabs/warp  keys/tile  min blocks   smem (Q + 2 stages of K, V; 16-bit)
using Fwd64 = FwdTraits<64, 4, 2, 64, 1>;    // 16 + 32 KB
using Fwd128 = FwdTraits<128, 4, 2, 32, 1>;  // 32 + 32 KB
using Fwd256 = FwdTraits<256, 4, 1, 32, 1>;  // 32 + 64 KB

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
