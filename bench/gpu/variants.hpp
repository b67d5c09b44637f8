// Other configurations of attn's CUDA kernels, next to the library's own, for timing them on a GPU
// (attn_gpu_bench --variants, run by scripts/gpu-check) and for checking them against the f64 oracle on
// the CPU emulation (tests/test_cuda_variants.cpp) before any GPU time is spent on them. Each variant is
// a launcher that cuda_detail::launchers() can point to: it runs its configuration for bf16 at head
// dim 128 (the benchmark's case) and hands every other call to the library's launcher.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/params.hpp"

namespace attn::cuda_detail {

struct ForwardVariant {
  const char* name;
  int (*launch)(const FwdParams&, DType, std::int64_t, CUstream_st*);
};
struct DecodeVariant {
  const char* name;
  int (*launch)(const DecodeParams&, DType, CUstream_st*);
  int heads_per_block;  // kv heads one block reads (kv_heads must be a multiple, else the library runs)
};

// The first entry of each list is the library's configuration, for reference.
const std::vector<ForwardVariant>& forward_variants();
const std::vector<DecodeVariant>& decode_variants();

}  // namespace attn::cuda_detail
