// Whether this process can run AMX (Intel's tile matrix unit: Sapphire Rapids and later), and whether
// it should: the one switch the AMX kernels read.
//
// The CPU having AMX is not enough. The tile state (8 KiB per thread) is an XSAVE component the OS must
// enable in XCR0 (bits 17 TILECFG and 18 TILEDATA), and Linux (5.16+) also wants each process to ask for
// it with arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) before its first tile instruction, which
// otherwise dies with SIGILL. A container or a seccomp filter can refuse that call. amx_support() checks
// all three, asks once, and says which step failed, so that a benchmark or `attn info` tells the truth
// about a machine whose /proc/cpuinfo lists amx_bf16 but which cannot use it.
#pragma once

#include <string>

#include "amx/amx_tiles.hpp"

namespace attn::detail {

struct AmxSupport {
  bool cpu_tile = false;    // CPUID.(7,0):EDX bit 24, AMX-TILE: the tile registers and loads/stores
  bool cpu_bf16 = false;    // CPUID.(7,0):EDX bit 22, AMX-BF16: TDPBF16PS
  bool cpu_int8 = false;    // CPUID.(7,0):EDX bit 25, AMX-INT8: TDPBSSD and its signed/unsigned kin
  bool cpu_fp16 = false;    // CPUID.(7,1):EAX bit 21, AMX-FP16: TDPFP16PS (Granite Rapids)
  bool os_enabled = false;  // XCR0 bits 17 and 18: the OS saves and restores the tile state
  bool permitted = false;   // arch_prctl(ARCH_REQ_XCOMP_PERM, 18) succeeded for this process
  int permit_errno = 0;     // the errno of a refused arch_prctl, 0 if it was not refused

  // TDPBF16PS can run in this process: the CPU has AMX-TILE and AMX-BF16, the OS enabled the tile state
  // and granted it to this process.
  bool usable() const;
  // Why it can or cannot, one short sentence: "AMX-BF16 usable", "the CPU has no AMX", "the OS refused
  // the tile state (arch_prctl: Operation not permitted)", ...
  std::string reason() const;
};

// The machine's answer, computed once (on first use, thread-safe); on a CPU other than x86-64 always
// "the CPU has no AMX". Asking for the tile state is process-wide, so the threads that run tiles later
// need not ask again.
const AmxSupport& amx_support();

// ATTN_AMX: auto (the default, also when unset or empty) uses AMX where usable; off never; on insists;
// emulate runs the AMX kernels on the tile emulator (amx/amx_emulator.hpp) on any CPU: for tests, and
// for seeing on a machine without AMX what the AMX path computes (slowly).
enum class AmxMode { automatic, on, off, emulate };

// ATTN_AMX as it is now (read at every call, so tests can change it); any other value throws
// std::invalid_argument naming ATTN_AMX and the values it takes.
AmxMode amx_mode_from_env();
const char* amx_mode_name(AmxMode mode);  // "auto", "on", "off", "emulate"

// The tile unit the AMX kernels run on now: the CPU's (AMX usable, ATTN_AMX auto or on), the emulator
// (ATTN_AMX=emulate), or none (the vector kernels run).
amx::TileBackend amx_backend();

// Whether `backend` runs TDPFP16PS (f16 inputs on the tiles): the emulator always, the CPU's tiles where it
// has AMX-FP16 (Granite Rapids and later), none never.
bool amx_runs_fp16(amx::TileBackend backend);

// ATTN_AMX_F32: bf16x3 sends f32 forwards to the tiles (each f32 split into three bf16 parts, six part
// products per block product; within the f32 accuracy rule), off (the default, also when unset or empty)
// keeps them on the vector kernels: opt-in until it is timed against them on an AMX CPU (docs/prefill.md).
// Any other value throws std::invalid_argument naming ATTN_AMX_F32 and the values it takes.
bool amx_f32_by_parts();

// Whether the AMX kernels run on the CPU's tiles: AMX usable and ATTN_AMX auto or on. With ATTN_AMX=on on a machine
// where AMX is not usable it throws std::invalid_argument("ATTN_AMX=on: <reason>"): whoever forces AMX hears that it
// cannot run rather than timing the fallback unawares. It may throw, so kernels ask it once per call, before their
// parallel regions.
bool amx_enabled();

}  // namespace attn::detail
