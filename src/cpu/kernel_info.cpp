// attn::kernel_info (include/attn/info.hpp): the Highway target runtime dispatch picks, where the bf16
// kernels run (amx/amx.hpp: ATTN_AMX), and whether the bf16 vector kernels take the VDPBF16PS dot
// products (cpu/dpbf16.hpp: AVX512-BF16 where they pay, or ATTN_BF16_DOTS).
#include "attn/info.hpp"

#include <cstdint>
#include <vector>

#include <hwy/targets.h>

#include "amx/amx.hpp"
#include "cpu/dpbf16.hpp"
#include "decode/decode_internal.hpp"

namespace attn {

KernelInfo kernel_info() {
  KernelInfo k;
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();  // best first
  k.simd = targets.empty() ? "none" : hwy::TargetName(targets.front());
  const bool avx512 = !targets.empty() && (targets.front() == HWY_AVX3 || targets.front() == HWY_AVX3_DL);
  k.bf16_dots = detail::bf16_dots() && avx512;
  const detail::amx::TileBackend tiles = detail::amx_backend();
  k.amx = tiles == detail::amx::TileBackend::hardware   ? "hardware"
          : tiles == detail::amx::TileBackend::emulated ? "emulated"
                                                        : "none";
  k.amx_reason = detail::amx_support().reason();
  k.f16_on_tiles = detail::amx_runs_fp16(tiles);
  k.f32_on_tiles = tiles != detail::amx::TileBackend::none && detail::amx_f32_by_parts();
  k.summary = "SIMD " + k.simd;
  k.summary += tiles == detail::amx::TileBackend::hardware ? ", bf16 forward, backward and wide decode on AMX tiles"
               : tiles == detail::amx::TileBackend::emulated
                   ? ", bf16 forward, backward and wide decode on the AMX emulator (slow)"
                   : "";
  if (k.f16_on_tiles) k.summary += ", f16 forward and backward on the tiles too";
  if (k.f32_on_tiles) k.summary += ", f32 forward on the tiles as bf16x3 parts";
  k.summary += k.bf16_dots                    ? ", bf16 dot products (AVX512-BF16)"
               : detail::cpu_has_avx512bf16() ? ", bf16 widened to f32 (AVX512-BF16 not used)"
                                              : ", bf16 widened to f32";
  k.quantized_query = detail::decode_query_codes_run(128, 1);
  if (k.quantized_query) k.summary += ", quantized_query on integer dots (AVX512-VNNI)";
  return k;
}

}  // namespace attn
