// What this build runs on this CPU, for the question every user of a dispatching library asks: which
// kernel ran? `attn info`, the benchmarks' headers and Python's attn.info() print it.
#pragma once

#include <string>

namespace attn {

struct KernelInfo {
  std::string simd;        // the Highway target runtime dispatch picks: "AVX3_SPR", "AVX2", "NEON", ...
  std::string amx;         // where the bf16 forward, backward and wide decode run: "hardware" (the CPU's
                           // AMX tiles), "emulated" (ATTN_AMX=emulate) or "none" (the vector kernels)
  std::string amx_reason;  // why AMX can or cannot run: "AMX-BF16 usable", "the CPU has no AMX", ...
  // the f16 forward and backward run on that tile unit too (TDPFP16PS: the emulator, or a CPU with AMX-FP16); false:
  // on the vector kernels
  bool f16_on_tiles = false;
  // the f32 forward runs on that tile unit, each f32 split into three bf16 parts (ATTN_AMX_F32=bf16x3, opt-in
  // until timed against the vector kernel on an AMX CPU); false: on the vector kernels
  bool f32_on_tiles = false;
  bool bf16_dots = false;  // the bf16 vector kernels take VDPBF16PS (AVX512-BF16) instead of widening to f32
  // DecodeOptions::quantized_query runs its integer kernel (AVX512-VNNI) for the head dims it takes (64,
  // 128, 192, 256); false: that option runs the exact kernel here
  bool quantized_query = false;
  std::string summary;  // all of it in one line
};

// The answer now (ATTN_AMX, ATTN_ISA and ATTN_BF16_DOTS are read at every call). ATTN_AMX=on on a machine
// where AMX cannot run throws std::invalid_argument("ATTN_AMX=on: <reason>"), as the kernels do.
KernelInfo kernel_info();

}  // namespace attn
