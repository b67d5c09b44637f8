// The library's forward configurations (docs/cuda.md) and the dispatch over dtype and head dim. The
// kernel itself is in forward_kernel.cuh.
#include "cuda/forward_kernel.cuh"

namespace attn::cuda_detail {
namespace {

//                    D   warps  slabs/warp  keys/tile     smem (Q + 2 stages of K, V; 16-bit)
using Fwd64 = FwdTraits<64, 4, 2, 64>;    // 16 + 32 KB
using Fwd128 = FwdTraits<128, 4, 2, 32>;  // 32 + 32 KB
using Fwd256 = FwdTraits<256, 4, 1, 32>;  // 32 + 64 KB

}  // namespace

int launch_forward(const FwdParams& p, DType t, std::int64_t max_seqlen_q, CUstream_st* stream) {
  const bool bf = t == DType::bf16;
  switch (p.head_dim) {
    case 64:
      return bf ? launch_forward_with<Bf16, Fwd64>(p, max_seqlen_q, stream)
                : launch_forward_with<F16, Fwd64>(p, max_seqlen_q, stream);
    case 128:
      return bf ? launch_forward_with<Bf16, Fwd128>(p, max_seqlen_q, stream)
                : launch_forward_with<F16, Fwd128>(p, max_seqlen_q, stream);
    case 256:
      return bf ? launch_forward_with<Bf16, Fwd256>(p, max_seqlen_q, stream)
                : launch_forward_with<F16, Fwd256>(p, max_seqlen_q, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace attn::cuda_detail
