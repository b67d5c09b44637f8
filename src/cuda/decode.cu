// The dispatch over dtype and head dim, to the configurations of heuristics.hpp. The
// kernels are in decode_kernel.cuh.
#include "cuda/decode_kernel.cuh"
#include "cuda/heuristics.hpp"

namespace attn::cuda_detail {
int launch_decode(const DecodeParams& p, DType t, CUstream_st* stream) {
  const bool bf = t == DType::bf16;
  switch (p.head_dim) {
    case 64:
      return bf ? launch_decode_with<Bf16, Dec64>(p, stream) : launch_decode_with<F16, Dec64>(p, stream);
    case 128:
      return bf ? launch_decode_with<Bf16, Dec128>(p, stream) : launch_decode_with<F16, Dec128>(p, stream);
    case 256:
      return bf ? launch_decode_with<Bf16, Dec256>(p, stream) : launch_decode_with<F16, Dec256>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace attn::cuda_detail
