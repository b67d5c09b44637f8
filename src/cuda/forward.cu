// The dispatch over dtype and head dim, to the configurations of heuristics.hpp. The
// kernel itself is in forward_kernel.cuh.
#include "cuda/forward_kernel.cuh"
#include "cuda/heuristics.hpp"

namespace attn::cuda_detail {
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
