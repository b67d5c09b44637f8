// A CPU emulation of the part of the CUDA runtime and of CUDA C++ that attn's kernels and their tests
// use, so that src/cuda/*.cu and tests/test_cuda.cpp compile with the host compiler and run without a
// GPU (the target test_cuda_emulated; docs/cuda.md, "Emulation"). It is found before the real
// cuda_runtime.h only by that target's include path.
//
// Device side: a block runs as one fiber per thread on one OS thread (emu.cpp). Fibers switch only at
// __syncthreads and at warp collectives (shuffles, ldmatrix, mma.sync: emu_ptx.hpp), where the lanes of
// a warp exchange their operands as the hardware does. Shared memory is one buffer per block, filled with
// NaN bytes before the block starts; a cp.async destination holds NaN from the issue until the issuing
// thread waits for its group, where the data lands (so reading it too early or overwriting it too soon
// shows), and each copy checks that its source lies inside a cudaMalloc allocation (a zero-size one too).
//
// Host side: "device" memory is host memory that cudaMalloc hands out and tracks, so that
// cudaPointerGetAttributes tells it from host memory; everything else runs synchronously. The emulated
// device has 132 SMs (an H100/H200), so the split heuristics plan as they would there.
//
// The names live in namespace attn_emu (no clash with a real libcudart linked into the same program) and
// are made visible by a using-directive, which is why this header is for the emulation target only.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

struct CUstream_st;

namespace attn_emu {

// ---- runtime API ------------------------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorLaunchFailure = 719
};
using cudaStream_t = CUstream_st*;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  int device = 0;
  void* devicePointer = nullptr;
  void* hostPointer = nullptr;
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct cudaDeviceProp {
  char name[256];
  int multiProcessorCount;
};
constexpr int kSmCount = 132;
constexpr std::size_t kMaxDynamicSmem = 227 * 1024;

cudaError_t cudaMalloc(void** p, std::size_t bytes);
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t);
cudaError_t cudaFreeAsync(void* p, cudaStream_t);
cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t = nullptr);
cudaError_t cudaMemset(void* p, int value, std::size_t bytes);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p);
cudaError_t cudaGetDeviceCount(int* n);
cudaError_t cudaGetDevice(int* d);
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr attr, int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaStreamSynchronize(cudaStream_t);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t e);
// Events time on the host clock (everything before them has run: the emulation is synchronous).
struct CUevent_st;
using cudaEvent_t = CUevent_st*;
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b);
template <class Kernel>
cudaError_t cudaFuncSetAttribute(Kernel*, cudaFuncAttribute attr, int value) {
  return attr == cudaFuncAttributeMaxDynamicSharedMemorySize && (value < 0 || std::size_t(value) > kMaxDynamicSmem)
             ? cudaErrorInvalidValue
             : cudaSuccess;
}

// ---- device side ------------------------------------------------------------------------------------
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 {
  float x, y;
};

const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
void syncthreads();
int syncthreads_or(int predicate);  // a barrier that returns whether any live thread passed non-zero
std::uint8_t* dynamic_smem();

// A warp collective: every lane of the calling thread's warp passes `bytes` (<= kSlotBytes) of `in` and
// `kind` (which collective; all lanes must agree); returns when all have, with the 32 lanes' inputs at
// slots + lane * kSlotBytes. `result` is scratch shared by the warp for this collective: the first lane
// to find `*fresh` true computes into it and clears it.
constexpr std::size_t kSlotBytes = 64;
struct Exchange {
  const std::uint8_t* slots;
  float* result;  // 128 floats
  bool* fresh;
};
Exchange warp_exchange(const void* in, std::size_t bytes, int kind);
int lane_id();
int any_in_warp(int predicate);  // __any_sync: whether any lane of the calling thread's warp passed non-zero

template <class T>
T shfl(T x, int src_lane) {
  static_assert(sizeof(T) <= kSlotBytes);
  const Exchange e = warp_exchange(&x, sizeof(T), 1);
  T r;
  std::memcpy(&r, e.slots + static_cast<std::size_t>(src_lane & 31) * kSlotBytes, sizeof(T));
  return r;
}
template <class T>
T shfl_xor(T x, int lane_mask) {
  static_assert(sizeof(T) <= kSlotBytes);
  const Exchange e = warp_exchange(&x, sizeof(T), 1);
  T r;
  std::memcpy(&r, e.slots + static_cast<std::size_t>(lane_id() ^ lane_mask) * kSlotBytes, sizeof(T));
  return r;
}

// Shared-memory "addresses" are byte offsets into the block's dynamic shared memory.
std::uint32_t smem_offset(const void* p);
std::uint16_t smem_load16(std::uint32_t offset);  // checked against the block's shared-memory size
void cp_async(std::uint32_t dst, const void* src, int src_bytes);
void cp_async_commit();
void cp_async_wait(int groups_left);
enum Collective { kShuffle = 1, kLdmatrix = 2, kLdmatrixTrans = 3, kMmaBf16 = 4, kMmaF16 = 5, kVote = 6 };

// Shared-memory reads by ldmatrix, counted as the hardware serves them (a performance property the
// results cannot show). Each of an x4's four 8 x 8 matrices is 8 row reads of 16 bytes; they take one
// wavefront when they fall in distinct banks (4-byte words, bank = word % 32), and one more for each
// further distinct word that one bank must deliver (a bank conflict). So 4 wavefronts per ldmatrix.x4 is
// conflict-free. Running totals since the program started; tests reset them.
struct SmemStats {
  std::uint64_t ldmatrix = 0, ldmatrix_wavefronts = 0;
};
SmemStats& smem_stats();
void count_ldmatrix(const std::uint8_t* slots);  // the 32 lanes' row addresses of one ldmatrix.x4

// Runs kernel body `body` over `grid` blocks of `block` threads; sets the last error on a bad
// configuration instead of running.
void launch(dim3 grid, dim3 block, std::size_t smem_bytes, const std::function<void()>& body);
template <class Kernel>
struct Launch {
  Kernel* kernel;
  dim3 grid, block;
  std::size_t smem;
  template <class... Args>
  void operator()(const Args&... args) const {
    Kernel* k = kernel;
    launch(grid, block, smem, [&] { k(args...); });
  }
};

}  // namespace attn_emu

using namespace attn_emu;  // the CUDA names, unqualified, as code written for CUDA expects them

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#define threadIdx (::attn_emu::thread_idx())
#define blockIdx (::attn_emu::block_idx())
#define blockDim (::attn_emu::block_dim())
#define gridDim (::attn_emu::grid_dim())

inline void __syncthreads() { ::attn_emu::syncthreads(); }
inline int __syncthreads_or(int predicate) { return ::attn_emu::syncthreads_or(predicate); }
template <class T>
T __shfl_sync(unsigned, T x, int src_lane) {
  return ::attn_emu::shfl(x, src_lane);
}
template <class T>
T __shfl_xor_sync(unsigned, T x, int lane_mask) {
  return ::attn_emu::shfl_xor(x, lane_mask);
}
inline int __any_sync(unsigned, int predicate) { return ::attn_emu::any_in_warp(predicate); }
inline float __expf(float x) { return std::exp(x); }
