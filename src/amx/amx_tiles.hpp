// The AMX tile unit as the kernels use it: eight tile registers of up to 16 rows x 64 bytes, a
// configuration, row-strided loads and stores, and TDPBF16PS (C[16 x 16] f32 += A[16 x 32 bf16]
// B[16 pair rows x 16 columns of bf16 pairs]), and TDPFP16PS, the same on f16 pairs (AMX-FP16: Granite
// Rapids and later). Two implementations with one interface, so that one kernel template runs on either:
//   HardwareTiles  the instructions themselves (x86-64 with GCC or Clang), as inline assembly: asm needs
//                  no -mamx-* flag, so the file that holds the kernel is compiled like every other, and
//                  the instructions only run where amx_backend() says the tiles are usable.
//   EmulatedTiles  (amx/amx_emulator.hpp) the ISA reference's semantics in C++, on every CPU, so the AMX
//                  kernels are tested on machines without AMX too.
// Tile registers are compile-time numbers (the instructions encode them): the kernels use the fixed
// 2 x 2 blocking below, C tiles 0-3 accumulating A tiles 4, 5 times B tiles 6, 7.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/element.hpp"

namespace attn::detail::amx {

constexpr int kTileRows = 16;   // rows of a full tile
constexpr int kTileBytes = 64;  // bytes of a full tile row: 16 f32, 32 bf16, 16 bf16 pairs

// LDTILECFG's 64-byte operand, palette 1: per tile its bytes per row and its rows.
struct alignas(64) TileConfig {
  std::uint8_t palette_id = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

// Every one of the eight tiles full: 16 rows of 64 bytes.
inline TileConfig full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = kTileBytes, c.rows[t] = kTileRows;
  return c;
}

// Which tile unit a kernel runs on: none (the vector kernels), the CPU's own, or the emulator.
enum class TileBackend { none, hardware, emulated };

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_AMX_HARDWARE 1

// The instructions. Loads and stores clobber memory: they read and write the kernel's scratch through
// addresses the compiler cannot see into, so nothing may be kept in registers across them.
struct HardwareTiles {
  // The CPU rounds f32 to bf16 (AVX512-BF16's VCVTNEPS2BF16) and to f16 (F16C's VCVTPS2PH): every AMX CPU
  // has both.
  static constexpr bool kNativeConvert = true;
  void configure(const TileConfig& c) { __asm__ volatile("ldtilecfg %0" : : "m"(c)); }
  void release() { __asm__ volatile("tilerelease" ::: "memory"); }

  template <int T>
  void zero() {
    static_assert(T >= 0 && T < 8, "tile registers are tmm0 to tmm7");
    __asm__ volatile("tilezero %%tmm%c0" : : "i"(T));
  }
  template <int T>
  void load(const void* base, std::int64_t stride) {
    static_assert(T >= 0 && T < 8, "tile registers are tmm0 to tmm7");
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" : : "r"(base), "r"(stride), "i"(T) : "memory");
  }
  template <int T>
  void store(void* base, std::int64_t stride) {
    static_assert(T >= 0 && T < 8, "tile registers are tmm0 to tmm7");
    __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" : : "r"(base), "r"(stride), "i"(T) : "memory");
  }
  // C tiles 0..3 += A tiles {4, 5} x B tiles {6, 7}: C0 = A4 B6, C1 = A4 B7, C2 = A5 B6, C3 = A5 B7.
  void dot_2x2() {
    __asm__ volatile(
        "tdpbf16ps %%tmm6, %%tmm4, %%tmm0\n\t"
        "tdpbf16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpbf16ps %%tmm6, %%tmm5, %%tmm2\n\t"
        "tdpbf16ps %%tmm7, %%tmm5, %%tmm3" ::);
  }
  // The same on f16 pairs; only where the CPU has AMX-FP16 (amx_runs_fp16).
  void dot_2x2_fp16() {
    __asm__ volatile(
        "tdpfp16ps %%tmm6, %%tmm4, %%tmm0\n\t"
        "tdpfp16ps %%tmm7, %%tmm4, %%tmm1\n\t"
        "tdpfp16ps %%tmm6, %%tmm5, %%tmm2\n\t"
        "tdpfp16ps %%tmm7, %%tmm5, %%tmm3" ::);
  }
};
#endif

// C tiles 0..3 += A tiles {4, 5} x B tiles {6, 7} on pairs of E (bf16_t: TDPBF16PS; f16_t: TDPFP16PS), on
// either tile unit.
template <class E, class Unit>
inline void dot_2x2_of(Unit& u) {
  static_assert(std::is_same_v<E, bf16_t> || std::is_same_v<E, f16_t>, "the tiles take bf16 or f16 pairs");
  if constexpr (std::is_same_v<E, f16_t>)
    u.dot_2x2_fp16();
  else
    u.dot_2x2();
}

}  // namespace attn::detail::amx
