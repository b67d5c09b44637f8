#include "amx/amx.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define ATTN_AMX_PROBE_X86 1
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace attn::detail {
namespace {

#if defined(ATTN_AMX_PROBE_X86)
constexpr unsigned kXfeatureXtiledata = 18;     // XCR0 bit 18 TILEDATA (bit 17 TILECFG rides with it)
constexpr unsigned kArchReqXcompPerm = 0x1023;  // arch/x86/include/uapi/asm/prctl.h

// XCR0, the state components the OS saves on a context switch. xgetbv is an invalid opcode unless the
// OS set CR4.OSXSAVE (CPUID.1:ECX bit 27), so that bit is checked first. Inline assembly: the _xgetbv
// intrinsic would need -mxsave for the whole file.
std::uint64_t read_xcr0() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (std::uint64_t{hi} << 32) | lo;
}

AmxSupport detect() {
  AmxSupport s;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return s;  // no leaf 7: far older than AMX
  const unsigned subleaves = a;                            // the last valid subleaf of leaf 7
  s.cpu_bf16 = (d >> 22) & 1;
  s.cpu_tile = (d >> 24) & 1;
  s.cpu_int8 = (d >> 25) & 1;
  if (subleaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) s.cpu_fp16 = (a >> 21) & 1;
  if (!s.cpu_tile) return s;
  const std::uint64_t tile_state = (std::uint64_t{1} << 17) | (std::uint64_t{1} << kXfeatureXtiledata);
  s.os_enabled = (read_xcr0() & tile_state) == tile_state;
  if (!s.os_enabled) return s;
#if defined(__linux__)
  // Without this grant the first tile instruction raises SIGILL. A refusal (a kernel before 5.16: EINVAL;
  // a seccomp filter: EPERM or ENOSYS) is an answer, not a crash.
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0)
    s.permitted = true;
  else
    s.permit_errno = errno;
#else
  s.permitted = true;  // other systems grant the tile state to every process that the OS enabled it for
#endif
  return s;
}
#else
AmxSupport detect() { return {}; }
#endif

}  // namespace

bool AmxSupport::usable() const { return cpu_tile && cpu_bf16 && os_enabled && permitted; }

std::string AmxSupport::reason() const {
  if (!cpu_tile && !cpu_bf16 && !cpu_int8 && !cpu_fp16) {
#if defined(ATTN_AMX_PROBE_X86)
    return "the CPU has no AMX";
#else
    return "the CPU has no AMX (not x86-64)";
#endif
  }
  if (!cpu_tile || !cpu_bf16) return "the CPU has AMX but not AMX-BF16";
  if (!os_enabled) return "the OS has not enabled the AMX tile state (XCR0 bits 17, 18)";
  if (!permitted) return std::string("the OS refused the tile state (arch_prctl: ") + std::strerror(permit_errno) + ")";
  return "AMX-BF16 usable";
}

const AmxSupport& amx_support() {
  static const AmxSupport s = detect();
  return s;
}

AmxMode amx_mode_from_env() {
  const char* v = std::getenv("ATTN_AMX");
  const std::string s = v == nullptr ? "" : v;
  if (s.empty() || s == "auto") return AmxMode::automatic;
  if (s == "on") return AmxMode::on;
  if (s == "off") return AmxMode::off;
  if (s == "emulate") return AmxMode::emulate;
  throw std::invalid_argument("ATTN_AMX: must be on, off, auto or emulate, not '" + s + "'");
}

const char* amx_mode_name(AmxMode mode) {
  switch (mode) {
    case AmxMode::on:
      return "on";
    case AmxMode::off:
      return "off";
    case AmxMode::emulate:
      return "emulate";
    case AmxMode::automatic:
      break;
  }
  return "auto";
}

amx::TileBackend amx_backend() {
  const AmxMode mode = amx_mode_from_env();
  if (mode == AmxMode::off) return amx::TileBackend::none;
  if (mode == AmxMode::emulate) return amx::TileBackend::emulated;
  const AmxSupport& s = amx_support();
  if (!s.usable() && mode == AmxMode::on) throw std::invalid_argument("ATTN_AMX=on: " + s.reason());
  return s.usable() ? amx::TileBackend::hardware : amx::TileBackend::none;
}

bool amx_f32_by_parts() {
  const char* v = std::getenv("ATTN_AMX_F32");
  const std::string s = v == nullptr ? "" : v;
  if (s.empty() || s == "off") return false;
  if (s == "bf16x3") return true;
  throw std::invalid_argument("ATTN_AMX_F32: must be bf16x3 or off, not '" + s + "'");
}

bool amx_runs_fp16(amx::TileBackend backend) {
  return backend == amx::TileBackend::emulated || (backend == amx::TileBackend::hardware && amx_support().cpu_fp16);
}

bool amx_enabled() { return amx_backend() == amx::TileBackend::hardware; }

}  // namespace attn::detail
