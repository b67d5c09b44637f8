// The kernel configurations of variants.hpp: the same kernel templates as the library
// (src/cuda/forward_kernel.cuh, decode_kernel.cuh) with other traits. Why each is here:
//   forward, d = 128 (the library: 4 warps x 2 slabs of 16 rows, 32-key tiles, 255 registers -> 2 blocks
//   of 4 warps per SM): the H200 run's configuration (8 warps x 1 slab, 64 keys: 1 block of 8 warps per
//   SM), the same held to 128 registers (2 blocks per SM); FlashAttention-2's tile (4 warps x 2 slabs, 64
//   keys; it spills), 8 warps x 2 slabs of 32 keys; 4 warps x 1 slab, 2 blocks per SM. A slab's K and V
//   fragments are loaded once for all of a warp's slabs (tile.cuh), so two slabs halve the ldmatrix bytes
//   per mma: with one, 72 ldmatrix.x4 (4 shared-memory wavefronts each) per 128 mma, which at one
//   wavefront per clock caps an SM at 0.44 mma per clock, under what Hopper's tensor cores issue with
//   mma.sync; with two, 48 per 128 (scripts/sass-report).
//   decode, d = 128 (the library: 64-key tiles, 3 stages, 4 warps on one kv head): 2 stages (69 KiB
//   of shared memory: 3 blocks per SM); 8 warps on 128-key tiles; 2 warps on 32-key tiles 4 stages deep
//   (68 KiB: 3 blocks per SM with 3 tiles each in flight, 144 KiB per SM against the library's 128);
//   and blocks that read 2, 4 or 8 kv heads' rows of the same keys (for a [.., keys, kv_heads, d] cache
//   those rows are adjacent in memory; the library's blocks each read one head's 256-byte rows at a
//   stride of kv_heads x 256 bytes).
#include "cuda/decode_kernel.cuh"
#include "cuda/forward_kernel.cuh"
#include "gpu/variants.hpp"

namespace attn::cuda_detail {
namespace {

template <class C>
int forward_with(const FwdParams& p, DType t, std::int64_t max_seqlen_q, CUstream_st* stream) {
  if (t != DType::bf16 || p.head_dim != C::D) return launch_forward(p, t, max_seqlen_q, stream);
  return launch_forward_with<Bf16, C>(p, max_seqlen_q, stream);
}

template <class C>
int decode_with(const DecodeParams& p, DType t, CUstream_st* stream) {
  if (t != DType::bf16 || p.head_dim != C::D || p.kv_heads % C::HB != 0) return launch_decode(p, t, stream);
  return launch_decode_with<Bf16, C>(p, stream);
}

}  // namespace

const std::vector<ForwardVariant>& forward_variants() {
  static const std::vector<ForwardVariant> v = {
      {"4 warps x 2 slabs, 32 keys (library)", forward_with<FwdTraits<128, 4, 2, 32>>},
      {"8 warps x 1 slab, 64 keys (H200 run)", forward_with<FwdTraits<128, 8, 1, 64>>},
      {"8 warps x 1 slab, 64 keys, <=128 regs", forward_with<FwdTraits<128, 8, 1, 64, 2>>},
      {"4 warps x 2 slabs, 64 keys (FA2 tile)", forward_with<FwdTraits<128, 4, 2, 64>>},
      {"8 warps x 2 slabs, 32 keys", forward_with<FwdTraits<128, 8, 2, 32>>},
      {"4 warps x 1 slab, 64 keys, 2 blocks/SM", forward_with<FwdTraits<128, 4, 1, 64, 2>>},
  };
  return v;
}

const std::vector<DecodeVariant>& decode_variants() {
  static const std::vector<DecodeVariant> v = {
      {"64 keys x 3 stages, 4 warps, 1 head (library)", decode_with<DecTraits<128, 64, 3, 4, 1>>, 1},
      {"64 keys x 2 stages, 4 warps, 1 head", decode_with<DecTraits<128, 64, 2, 4, 1>>, 1},
      {"128 keys x 2 stages, 8 warps, 1 head", decode_with<DecTraits<128, 128, 2, 8, 1>>, 1},
      {"32 keys x 4 stages, 2 warps, 1 head", decode_with<DecTraits<128, 32, 4, 2, 1>>, 1},
      {"32 keys x 3 stages, 4 warps, 2 heads", decode_with<DecTraits<128, 32, 3, 4, 2>>, 2},
      {"16 keys x 3 stages, 4 warps, 4 heads", decode_with<DecTraits<128, 16, 3, 4, 4>>, 4},
      {"16 keys x 3 stages, 8 warps, 8 heads", decode_with<DecTraits<128, 16, 3, 8, 8>>, 8},
  };
  return v;
}

}  // namespace attn::cuda_detail
