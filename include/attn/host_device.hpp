// ATTN_HOST_DEVICE marks the functions the CPU and the CUDA backend share: __host__ __device__ under nvcc,
// nothing for a host compiler. Headers shared by both backends (attn/online_softmax.hpp, src/core/)
// include this alone.
#pragma once

#if defined(__CUDACC__)
#define ATTN_HOST_DEVICE __host__ __device__
#else
#define ATTN_HOST_DEVICE
#endif
