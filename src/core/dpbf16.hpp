// VDPBF16PS (AVX512-BF16: Zen 4, Sapphire Rapids and later), which Highway 1.0.3 does not expose.
// One instruction multiplies 32 bf16 pairs and adds each lane's two products to an f32 accumulator:
// the products of two bf16 values are exact in f32 and each is added with one f32 rounding, as an FMA
// on widened values would, except that subnormal inputs and outputs are flushed to zero. Kernels use it
// for q . k (a flushed subnormal logit changes a score by < 1e-37) and, in decode with a bf16 output,
// for P V on p rounded to bf16 (flash-attn's rule); f32 outputs keep P V in f32 FMAs, so their
// subnormal values survive.
//
// Usage, inside a Highway per-target namespace: guard the code with ATTN_DPBF16_TARGET (true only while
// compiling an AVX-512 target with GCC/Clang), mark every function that contains the intrinsic or
// inlines one that does with ATTN_DPBF16_ATTR, enter that code through a function that is not inlined
// into unmarked code, and run it only when cpu_has_avx512bf16(). (Inline assembly would need no
// attribute, but GCC then keeps register-blocked accumulator arrays in memory.)
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ATTN_DPBF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
#define ATTN_DPBF16_TARGET (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
namespace attn::detail {
inline bool cpu_has_avx512bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
}  // namespace attn::detail
#else
#define ATTN_DPBF16_TARGET 0
namespace attn::detail {
inline bool cpu_has_avx512bf16() { return false; }
}  // namespace attn::detail
#endif
