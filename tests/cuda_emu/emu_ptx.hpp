// The wrappers of src/cuda/ptx.cuh, emulated on the CPU (included by ptx.cuh when ATTN_CUDA_EMULATION
// is defined). Each warp-wide instruction is a warp collective (cuda_runtime.h): the lanes hand in their
// operands and each takes its part of the result by the fragment maps of layout.hpp -- the maps the
// kernels are written against and that test_cuda_layout checks against the PTX ISA -- so a kernel that
// computes the right thing here computes it on the hardware, up to the tensor cores' rounding.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/element.hpp"
#include "cuda/layout.hpp"
#include "cuda_runtime.h"

#define ATTN_DYNAMIC_SMEM(T, name) T* name = reinterpret_cast<T*>(::attn_emu::dynamic_smem())
#define ATTN_LAUNCH(kernel, grid, block, smem_bytes, stream)     \
  ::attn_emu::Launch<std::remove_pointer_t<decltype(+kernel)>> { \
    kernel, dim3(grid), dim3(block), std::size_t(smem_bytes)     \
  }

namespace attn::cuda_detail {

template <class E>
inline float to_float(std::uint16_t bits) {
  if constexpr (std::is_same_v<E, Bf16>)
    return detail::bf16_to_float(bf16_t{bits});
  else
    return detail::f16_to_float(f16_t{bits});
}

// ex2.approx.ftz.f32 as the hardware rounds it, in the worst case: 2^x with its relative error of about
// 2^-22 applied (up or down, by the bits of x), and subnormal inputs and results flushed to zero; so the
// tests hold the kernels to their accuracy with the approximation in place, not with an exact exp2.
inline float exp2_fast(float x) {
  if (std::fpclassify(x) == FP_SUBNORMAL) x = std::copysign(0.f, x);
  const float r = static_cast<float>(std::exp2(static_cast<double>(x)));
  if (std::fpclassify(r) == FP_SUBNORMAL) return 0.f;
  if (!std::isfinite(r) || r == 0.f) return r;
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return r * (bits & 1 ? 1.f + 0x1p-22f : 1.f - 0x1p-22f);
}

// D = A B + D (m16n8k16): the first lane to resume forms the 16 x 8 product from all lanes' fragments.
template <class E>
inline void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  const std::uint32_t in[6] = {a[0], a[1], a[2], a[3], b0, b1};
  const auto x =
      ::attn_emu::warp_exchange(in, sizeof in, std::is_same_v<E, Bf16> ? ::attn_emu::kMmaBf16 : ::attn_emu::kMmaF16);
  if (*x.fresh) {
    *x.fresh = false;
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; ++lane) {
      std::uint32_t r[6];
      std::memcpy(r, x.slots + lane * ::attn_emu::kSlotBytes, sizeof r);
      for (int e = 0; e < 8; ++e) {
        const RowCol c = mma_a_coord(lane, e);
        A[c.row][c.col] = to_float<E>(static_cast<std::uint16_t>(r[e / 2] >> (16 * (e % 2))));
      }
      for (int e = 0; e < 4; ++e) {
        const RowCol c = mma_b_coord(lane, e);
        B[c.row][c.col] = to_float<E>(static_cast<std::uint16_t>(r[4 + e / 2] >> (16 * (e % 2))));
      }
    }
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        float acc = 0.f;
        for (int k = 0; k < 16; ++k) acc += A[i][k] * B[k][j];
        x.result[i * 8 + j] = acc;
      }
  }
  const int lane = ::attn_emu::lane_id();
  for (int e = 0; e < 4; ++e) {
    const RowCol c = mma_c_coord(lane, e);
    d[e] += x.result[c.row * 8 + c.col];
  }
}

inline std::uint32_t smem_addr(const void* p) { return ::attn_emu::smem_offset(p); }

// ldmatrix.x4: lanes 8m .. 8m+7 address the rows of matrix m; register m of each lane receives the
// elements ldmatrix_holds names.
inline void emu_ldmatrix(std::uint32_t (&r)[4], std::uint32_t addr, bool trans) {
  const auto x =
      ::attn_emu::warp_exchange(&addr, sizeof addr, trans ? ::attn_emu::kLdmatrixTrans : ::attn_emu::kLdmatrix);
  if (*x.fresh) {  // the first lane to resume counts the instruction's shared-memory wavefronts
    *x.fresh = false;
    ::attn_emu::count_ldmatrix(x.slots);
  }
  const int lane = ::attn_emu::lane_id();
  for (int m = 0; m < 4; ++m) {
    r[m] = 0;
    for (int half = 0; half < 2; ++half) {
      const RowCol held = ldmatrix_holds(lane, half, trans);
      std::uint32_t row_addr;
      std::memcpy(&row_addr, x.slots + (8 * m + held.row) * ::attn_emu::kSlotBytes, sizeof row_addr);
      r[m] |= std::uint32_t{::attn_emu::smem_load16(row_addr + 2 * held.col)} << (16 * half);
    }
  }
}
inline void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t addr) { emu_ldmatrix(r, addr, false); }
inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t addr) { emu_ldmatrix(r, addr, true); }

inline void cp_async_16(std::uint32_t dst, const void* src, int src_bytes) {
  ::attn_emu::cp_async(dst, src, src_bytes);
}
inline void cp_async_commit() { ::attn_emu::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  ::attn_emu::cp_async_wait(N);
}

// Two floats -> one register of two 16-bit values (low half = first), rounded to nearest even.
template <class E>
inline std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<E, Bf16>)
    return std::uint32_t{detail::float_to_bf16(lo).bits} | (std::uint32_t{detail::float_to_bf16(hi).bits} << 16);
  else
    return std::uint32_t{detail::float_to_f16(lo).bits} | (std::uint32_t{detail::float_to_f16(hi).bits} << 16);
}

}  // namespace attn::cuda_detail
