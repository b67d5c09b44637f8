// Force-included (-include) in the explorer's WebAssembly build of the tiled kernel.
//
// Highway 1.0.3 has no f64 on its WASM SIMD target, so the build compiles the kernel for EMU128 only
// (HWY_COMPILE_ONLY_EMU128). With a single target HWY_DYNAMIC_DISPATCH(tiled_simd::Target) becomes
// N_EMU128::tiled_simd::Target, the namespace prefix in front of the qualified name, which names
// nothing. This alias makes that name the kernel's attn::detail::tiled_simd::N_EMU128, so the kernel
// compiles unchanged; its members are found at the point of use, after the kernel has defined them.
#pragma once

namespace attn::detail::tiled_simd::N_EMU128 {}
namespace attn::detail::N_EMU128 {
namespace tiled_simd = ::attn::detail::tiled_simd::N_EMU128;
}
