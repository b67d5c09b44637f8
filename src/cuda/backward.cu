// The backward's dispatch over dtype and head dim. The kernels are in backward_kernel.cuh.
#include "cuda/backward_kernel.cuh"
#include "cuda/heuristics.hpp"

namespace attn::cuda_detail {
int launch_backward(const BwdParams& p, DType t, std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                    CUstream_st* stream) {
  const bool bf = t == DType::bf16;
  switch (p.f.head_dim) {
    case 64:
      return bf ? launch_backward_with<Bf16, Bwd64>(p, max_seqlen_q, max_seqlen_k, stream)
                : launch_backward_with<F16, Bwd64>(p, max_seqlen_q, max_seqlen_k, stream);
    case 128:
      return bf ? launch_backward_with<Bf16, Bwd128>(p, max_seqlen_q, max_seqlen_k, stream)
                : launch_backward_with<F16, Bwd128>(p, max_seqlen_q, max_seqlen_k, stream);
    case 256:
      return bf ? launch_backward_with<Bf16, Bwd256>(p, max_seqlen_q, max_seqlen_k, stream)
                : launch_backward_with<F16, Bwd256>(p, max_seqlen_q, max_seqlen_k, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace attn::cuda_detail
