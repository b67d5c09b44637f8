// Thin wrappers over the inline PTX the kernels use (sm_80 and later): tensor-core mma.sync
// m16n8k16 with f32 accumulation, ldmatrix, cp.async, and 16-bit packing; and the two CUDA-C
// constructs that need a spelling of their own, the dynamic shared-memory array and a kernel launch.
// Fragment layouts are documented (and tested on the CPU) in layout.hpp.
//
// With ATTN_CUDA_EMULATION the same names come from tests/cuda_emu/emu_ptx.hpp, which runs them on the
// CPU (a warp's lanes as fibers), so that the kernels' tests also run without a GPU (docs/cuda.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace attn::cuda_detail {

struct Bf16 {};  // element tags: which mma variant and which conversions
struct F16 {};

}  // namespace attn::cuda_detail

#if defined(ATTN_CUDA_EMULATION)
#include "emu_ptx.hpp"
#else

// The block's dynamic shared memory, as an array `name` of T; a kernel launch.
#define ATTN_DYNAMIC_SMEM(T, name) extern __shared__ __align__(128) T name[]
#define ATTN_LAUNCH(kernel, grid, block, smem_bytes, stream) kernel<<<grid, block, smem_bytes, stream>>>

namespace attn::cuda_detail {

// D = A B + D; a: 4 regs (16x16 row), b: 2 regs (16x8 col), d: 4 f32 (16x8).
template <class E>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (std::is_same_v<E, Bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte global -> shared copy; src_bytes < 16 zero-fills the rest (0: the whole chunk is zero,
// and nothing is read -- used for rows past the end, so no out-of-bounds read is issued).
__device__ __forceinline__ void cp_async_16(std::uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 2^x by the special-function unit: one MUFU.EX2, relative error about 2^-22, results below 2^-126
// flushed to zero (exp2f adds a range check and two multiplies to keep them). p = 2^(s - m) <= 1, so
// a flushed p is below 2^-126 of the row's largest weight.
__device__ __forceinline__ float exp2_fast(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// One 16-bit value (bits) -> float.
template <class E>
__device__ __forceinline__ float to_float(std::uint16_t bits) {
  if constexpr (std::is_same_v<E, Bf16>) {
    return __uint_as_float(std::uint32_t{bits} << 16);
  } else {
    return __half2float(__ushort_as_half(bits));
  }
}

// Two floats -> one register of two 16-bit values (low half = first).
template <class E>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<E, Bf16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&v);
  }
}

}  // namespace attn::cuda_detail

#endif  // ATTN_CUDA_EMULATION
