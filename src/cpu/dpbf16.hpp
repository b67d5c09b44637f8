// VDPBF16PS (AVX512-BF16: Zen 4, Sapphire Rapids and later), which Highway 1.0.3 does not expose.
// One instruction multiplies 32 bf16 pairs and adds each lane's two products to an f32 accumulator:
// the products of two bf16 values are exact in f32 and each is added with one f32 rounding, as an FMA
// on widened values would, except that subnormal inputs and outputs are flushed to zero. Kernels use it
// for q . k (a flushed subnormal logit changes a score by < 1e-37) and, in decode with a bf16 output,
// for P V on p rounded to bf16 (flash-attn's rule); f32 outputs keep P V in f32 FMAs, so their
// subnormal values survive.
//
// Having the instruction is not enough: whether it pays depends on the core. On Zen 4 one VDPBF16PS
// issues as often as one 512-bit FMA and does twice its products; on the Intel cores measured here
// (Sapphire/Emerald Rapids) it issues at a quarter of the FMA rate, so half the products per cycle, and
// bf16 kernels are faster widening to f32 FMAs. bf16_dots() is the one switch every kernel asks.
//
// Usage, inside a Highway per-target namespace: guard the code with ATTN_DPBF16_TARGET (true only while
// compiling an AVX-512 target with GCC/Clang), mark every function that contains the intrinsic or
// inlines one that does with ATTN_DPBF16_ATTR, enter that code through a function that is not inlined
// into unmarked code, and run it only when bf16_dots(). (Inline assembly would need no attribute, but
// GCC then keeps register-blocked accumulator arrays in memory.)
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ATTN_DPBF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16,avx512vnni,avx512vbmi")))
#define ATTN_DPBF16_TARGET (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
#else
#define ATTN_DPBF16_TARGET 0
#endif

namespace attn::detail {

// The CPU can run VDPBF16PS, and AVX512-VNNI's VPDPWSSD and AVX512-VBMI's byte permutes beside it
// (ATTN_DPBF16_ATTR enables all three): Sapphire Rapids and later, Zen 4 and later. Cooper Lake has the
// first two and not VBMI, and takes the kernels without VDPBF16PS (which its cores, like the later
// Intel ones, would not choose by default: bf16_dots_pay).
bool cpu_has_avx512bf16();

// The CPU's default: the instruction pays on this core (AMD's cores with it; not Intel's, above).
bool bf16_dots_pay();

// Whether the bf16 paths of the tiled forward, the backward and decode take VDPBF16PS now: never
// without the instruction; else as forced (force_bf16_dots); else as the environment variable
// ATTN_BF16_DOTS says (on, off or auto; read once; any other value is named on stderr and read as auto,
// since kernels ask inside their parallel loops, where nothing may throw); else bf16_dots_pay(). The two paths round
// differently (the order of a pair's two products, and subnormals), so a process keeps one choice unless it forces
// another.
bool bf16_dots();

// Tests and benchmarks: 1 forces the instruction (where the CPU has it), 0 the widening path, -1 goes
// back to the default. Set between kernel calls, not during one.
void force_bf16_dots(int mode);

}  // namespace attn::detail
