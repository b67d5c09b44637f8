// The AMX tile unit in C++ (the interface of amx/amx_tiles.hpp), for machines without AMX: the AMX
// kernels' tests, the differential test and the fuzz target run the same kernel template on it
// (ATTN_AMX=emulate), and on a machine with AMX tests compare it with the instructions.
//
// Semantics, from the Intel SDM's pseudo-code (TILELOADD, TILESTORED, TILEZERO, TDPBF16PS):
//   - LDTILECFG: palette 1, at most 16 rows and 64 bytes per row per tile; anything else faults on the
//     CPU, and throws std::logic_error here (a kernel bug, not bad user input).
//   - A load fills the configured rows x colsb bytes from base + row * stride and zeroes the rest of the
//     register; a store writes the configured rows x colsb bytes.
//   - TDPBF16PS, per row m of C and column n: two f32 partial sums, the even and the odd products of the
//     bf16 pairs, each accumulated over k with fused multiply-adds (the products of two bf16 are exact
//     in f32, so each step rounds once, to nearest even); then C[m][n] += even + odd. Denormal inputs
//     (bf16 and the C values) read as zero and denormal results are flushed to zero (DAZ and FTZ,
//     whatever MXCSR says). The A tile's colsb sets k; C's colsb sets n; B has k rows.
//   - TDPFP16PS (AMX-FP16), the same on f16 pairs, except that subnormal f16 inputs keep their value (the
//     reference: "input FP16 denormals are always handled"); f32 results and C values are flushed as
//     TDPBF16PS's. The two partial sums are TDPBF16PS's order, which the hardware showed for bf16; no CPU
//     with AMX-FP16 has been at hand to confirm it for f16.
#pragma once

#include <cstdint>

#include "amx/amx_tiles.hpp"

namespace attn::detail::amx {

class EmulatedTiles {
 public:
  static constexpr bool kNativeConvert = false;  // the kernel rounds P to bf16 or f16 in software
  void configure(const TileConfig& c);
  void release();

  template <int T>
  void zero() {
    zero(T);
  }
  template <int T>
  void load(const void* base, std::int64_t stride) {
    load(T, base, stride);
  }
  template <int T>
  void store(void* base, std::int64_t stride) {
    store(T, base, stride);
  }
  void dot_2x2() {
    dpbf16ps(0, 4, 6);
    dpbf16ps(1, 4, 7);
    dpbf16ps(2, 5, 6);
    dpbf16ps(3, 5, 7);
  }
  void dot_2x2_fp16() {
    dpfp16ps(0, 4, 6);
    dpfp16ps(1, 4, 7);
    dpfp16ps(2, 5, 6);
    dpfp16ps(3, 5, 7);
  }

  void zero(int t);
  void load(int t, const void* base, std::int64_t stride);
  void store(int t, void* base, std::int64_t stride) const;
  void dpbf16ps(int c, int a, int b);
  void dpfp16ps(int c, int a, int b);

 private:
  // C[c] += A[a] B[b] on 16-bit pairs that `to_f32` widens: TDPBF16PS's and TDPFP16PS's common body
  // (defined and instantiated in amx_emulator.cpp).
  template <class Widen>
  void dot_pairs(int c, int a, int b, const char* name, Widen to_f32);
  void require_configured(const char* op, int t) const;

  TileConfig config_{};
  bool configured_ = false;
  alignas(64) std::uint8_t tiles_[8][kTileRows * kTileBytes] = {};
};

}  // namespace attn::detail::amx
