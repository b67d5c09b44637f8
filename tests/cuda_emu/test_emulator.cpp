// The CUDA emulator's own rules (cuda_runtime.h, emu.cpp), on small kernels written for it: shuffles and
// barriers behave as on a GPU, exited threads count as arrived at a barrier, a cp.async destination reads
// NaN until its thread waits, and what would hang or fault on a GPU aborts with a message.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/ptx.cuh"  // with ATTN_CUDA_EMULATION: the emulated wrappers of emu_ptx.hpp

namespace {

template <class T>
T* device_array(std::size_t n) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  std::memset(p, 0, n * sizeof(T));
  return p;
}

TEST(CudaEmulator, ShufflesAndBarriersFollowCudaSemantics) {
  int* out = device_array<int>(64 * 4);
  launch(dim3(1), dim3(64), 0, [&] {
    const int t = static_cast<int>(threadIdx.x);
    out[t] = __shfl_xor_sync(0xffffffffu, t, 1);        // the partner lane's value
    out[64 + t] = __shfl_sync(0xffffffffu, t * 10, 5);  // lane 5 of the same warp
    out[128 + t] = __syncthreads_or(t == 37 ? 1 : 0);   // one thread of the block says yes
    out[192 + t] = __any_sync(0xffffffffu, t == 40);    // one lane of warp 1: only warp 1 hears it
  });
  for (int t = 0; t < 64; ++t) {
    EXPECT_EQ(out[t], t ^ 1);
    EXPECT_EQ(out[64 + t], (t / 32 * 32 + 5) * 10);
    EXPECT_EQ(out[128 + t], 1);
    EXPECT_EQ(out[192 + t], t >= 32 ? 1 : 0);
  }
  cudaFree(out);
}

// ex2.approx.ftz as emulated: within about 2^-22 of 2^x (relative), exact special values, subnormal results and
// inputs flushed to zero, as the PTX ISA states for the hardware instruction.
TEST(CudaEmulator, FastExp2HasTheHardwareRangeAndAccuracy) {
  using attn::cuda_detail::exp2_fast;
  for (float x : {-30.5f, -3.25f, -1.0f, 0.0f, 0.7f, 1.0f, 12.0f}) {
    const double want = std::exp2(static_cast<double>(x));
    EXPECT_LE(std::abs(exp2_fast(x) - want), 0x1.8p-22 * want) << x;  // 2^-22, and the roundings to f32
  }
  EXPECT_EQ(exp2_fast(-INFINITY), 0.f);
  EXPECT_EQ(exp2_fast(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(exp2_fast(NAN)));
  EXPECT_EQ(exp2_fast(-130.f), 0.f);                        // 2^-130 is subnormal: flushed
  EXPECT_EQ(exp2_fast(0x1p-140f), 1.f * (1.f - 0x1p-22f));  // a subnormal input reads as 0
}

TEST(CudaEmulator, ExitedThreadsCountAsArrivedAtABarrier) {
  int* out = device_array<int>(64);
  launch(dim3(2), dim3(64), 0, [&] {
    const int t = static_cast<int>(threadIdx.x);
    if (t >= 32) return;  // warp 1 exits; warp 0's barrier must still open
    __syncthreads();
    out[t + 32 * blockIdx.x] = 1;
  });
  for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], 1);
  cudaFree(out);
}

TEST(CudaEmulator, ACpAsyncDestinationReadsNanUntilItsThreadWaits) {
  std::uint16_t* src = device_array<std::uint16_t>(8);
  for (int i = 0; i < 8; ++i) src[i] = static_cast<std::uint16_t>(100 + i);
  std::uint16_t before = 0, after = 0;
  launch(dim3(1), dim3(32), 64, [&] {
    std::uint16_t* smem = reinterpret_cast<std::uint16_t*>(dynamic_smem());
    if (threadIdx.x != 0) return;
    smem[0] = 7;  // the old contents: gone once the copy is issued
    attn::cuda_detail::cp_async_16(attn::cuda_detail::smem_addr(smem), src, 16);
    attn::cuda_detail::cp_async_commit();
    before = smem[0];
    attn::cuda_detail::cp_async_wait<0>();
    after = smem[0];
  });
  EXPECT_EQ(before, 0xFFFF);
  EXPECT_EQ(after, 100);
  cudaFree(src);
}

// The bank model of ldmatrix (smem_stats): the 8 rows of a matrix in an unswizzled [16][64] 16-bit tile
// (128-byte rows) read the same column, so all fall in banks 0-3: 8 wavefronts a matrix, 32 for the x4.
// Swizzled (layout.hpp), the rows spread over all 32 banks: one wavefront a matrix.
TEST(CudaEmulator, CountsTheSharedMemoryWavefrontsOfLdmatrix) {
  auto wavefronts = [](bool swizzled) {
    smem_stats() = {};
    launch(dim3(1), dim3(32), 16 * 64 * 2, [&] {
      const auto rc = attn::cuda_detail::ldmatrix_a_addr(static_cast<int>(threadIdx.x));
      const int element = swizzled ? attn::cuda_detail::swizzle(rc.row, rc.col, 64) : rc.row * 64 + rc.col;
      std::uint32_t r[4];
      attn::cuda_detail::ldmatrix_x4(r, attn::cuda_detail::smem_addr(dynamic_smem() + 2 * element));
    });
    EXPECT_EQ(smem_stats().ldmatrix, 1u);
    return smem_stats().ldmatrix_wavefronts;
  };
  EXPECT_EQ(wavefronts(false), 32u);
  EXPECT_EQ(wavefronts(true), 4u);
}

TEST(CudaEmulator, AConfigurationTheHardwareRejectsIsALaunchError) {
  launch(dim3(1), dim3(2048), 0, [] {});
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  launch(dim3(1), dim3(32), 300 * 1024, [] {});
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, then cleared
}

TEST(CudaEmulatorDeathTest, WhatWouldHangOrFaultOnAGpuAborts) {
  // Lanes of one warp at different collectives.
  EXPECT_DEATH(launch(dim3(1), dim3(32), 0,
                      [] {
                        if (threadIdx.x == 0)
                          (void)__shfl_xor_sync(0xffffffffu, 1, 1);
                        else
                          __syncthreads();
                      }),
               "deadlock|different collectives");
  // A barrier that one lane waits at while the rest of its warp waits in a shuffle: neither can open.
  EXPECT_DEATH(launch(dim3(1), dim3(64), 0,
                      [] {
                        if (threadIdx.x == 63)
                          __syncthreads();
                        else if (threadIdx.x >= 32)
                          (void)__shfl_xor_sync(0xffffffffu, 1, 1);
                        else
                          __syncthreads();
                      }),
               "deadlock");
  // A cp.async whose source is not device memory.
  EXPECT_DEATH(launch(dim3(1), dim3(32), 64,
                      [] {
                        static std::uint16_t host[8];
                        attn::cuda_detail::cp_async_16(0, host, 16);
                        attn::cuda_detail::cp_async_wait<0>();
                      }),
               "outside every cudaMalloc allocation");
  // An ldmatrix row address off the 16-byte grid.
  EXPECT_DEATH(launch(dim3(1), dim3(32), 1024,
                      [] {
                        std::uint32_t r[4];
                        attn::cuda_detail::ldmatrix_x4(r, 16 * (threadIdx.x % 8) + 2);
                      }),
               "not 16-byte aligned");
}

}  // namespace
