// AMX detection and the ATTN_AMX switch (amx/amx.hpp). Detection must tell the truth: it agrees with
// the kernel's /proc/cpuinfo flags, and where it says usable, a tile dot product runs and gives the
// exact answer. Tests that need AMX (or its absence) report skipped on the other kind of machine.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "amx/amx.hpp"
#include "support.hpp"

#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#include <immintrin.h>
#define ATTN_TEST_AMX_TILES 1
#endif

namespace attn {
namespace {

using detail::AmxMode;
using detail::AmxSupport;
using test::ScopedAmxEnv;

// The first "flags" line of /proc/cpuinfo, as a set; nullopt where the file is absent (not Linux).
std::optional<std::set<std::string>> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  if (!in) return std::nullopt;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return std::set<std::string>{};  // an architecture whose cpuinfo names them otherwise (AArch64: Features)
}

TEST(AmxSupport, AgreesWithProcCpuinfo) {
  const auto flags = cpuinfo_flags();
  if (!flags) GTEST_SKIP() << "no /proc/cpuinfo";
  const AmxSupport& s = detail::amx_support();
  // Linux lists the AMX flags only where it also enabled the tile state in XCR0 (it clears them, and
  // the features that depend on AMX-TILE, otherwise), so CPUID's bits count here only with os_enabled.
  const bool tiles = s.cpu_tile && s.os_enabled;
  const auto has = [&](const char* f) { return flags->count(f) == 1; };
  EXPECT_EQ(has("amx_tile"), tiles);
  EXPECT_EQ(has("amx_bf16"), tiles && s.cpu_bf16);
  EXPECT_EQ(has("amx_int8"), tiles && s.cpu_int8);
  // Kernels before 6.4 do not know amx_fp16: only a listed flag is evidence.
  if (has("amx_fp16")) {
    EXPECT_TRUE(tiles && s.cpu_fp16);
  }
  EXPECT_EQ(s.usable(), has("amx_bf16") && s.permitted) << s.reason();
}

TEST(AmxSupport, ComputedOnce) { EXPECT_EQ(&detail::amx_support(), &detail::amx_support()); }

TEST(AmxSupport, ReasonNamesTheStepThatFailed) {
  AmxSupport s;
  EXPECT_FALSE(s.usable());
  EXPECT_NE(s.reason().find("the CPU has no AMX"), std::string::npos) << s.reason();
  s.cpu_tile = s.cpu_int8 = true;
  EXPECT_EQ(s.reason(), "the CPU has AMX but not AMX-BF16");
  s.cpu_bf16 = true;
  EXPECT_NE(s.reason().find("XCR0"), std::string::npos) << s.reason();
  s.os_enabled = true;
  s.permit_errno = EPERM;
  EXPECT_FALSE(s.usable());
  EXPECT_EQ(s.reason(), std::string("the OS refused the tile state (arch_prctl: ") + std::strerror(EPERM) + ")");
  s.permitted = true;
  s.permit_errno = 0;
  EXPECT_TRUE(s.usable());
  EXPECT_EQ(s.reason(), "AMX-BF16 usable");
}

TEST(AmxMode, ParsesTheEnvironment) {
  {
    const ScopedAmxEnv env(std::nullopt);
    EXPECT_EQ(detail::amx_mode_from_env(), AmxMode::automatic);
  }
  for (const auto& [text, mode] :
       {std::pair{"", AmxMode::automatic}, std::pair{"auto", AmxMode::automatic}, std::pair{"on", AmxMode::on},
        std::pair{"off", AmxMode::off}, std::pair{"emulate", AmxMode::emulate}}) {
    const ScopedAmxEnv env{std::string(text)};
    EXPECT_EQ(detail::amx_mode_from_env(), mode) << "ATTN_AMX=" << text;
  }
  EXPECT_STREQ(detail::amx_mode_name(AmxMode::automatic), "auto");
  EXPECT_STREQ(detail::amx_mode_name(AmxMode::on), "on");
  EXPECT_STREQ(detail::amx_mode_name(AmxMode::off), "off");
  EXPECT_STREQ(detail::amx_mode_name(AmxMode::emulate), "emulate");
}

TEST(AmxMode, BadValueIsNamed) {
  for (const char* bad : {"yes", "ON", "1", "auto "}) {
    const ScopedAmxEnv env(std::string{bad});
    try {
      detail::amx_mode_from_env();
      ADD_FAILURE() << "ATTN_AMX=" << bad << " was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("ATTN_AMX"), std::string::npos) << m;
      EXPECT_NE(m.find("on, off, auto or emulate"), std::string::npos) << m;
      EXPECT_NE(m.find(std::string("'") + bad + "'"), std::string::npos) << m;
    }
    EXPECT_THROW(detail::amx_enabled(), std::invalid_argument);
  }
}

TEST(AmxMode, OffDisables) {
  const ScopedAmxEnv env(std::string("off"));
  EXPECT_FALSE(detail::amx_enabled());
}

TEST(AmxMode, AutoFollowsSupport) {
  const ScopedAmxEnv env(std::nullopt);
  EXPECT_EQ(detail::amx_enabled(), detail::amx_support().usable());
}

TEST(AmxMode, OnWithoutAmxThrowsTheReason) {
  const AmxSupport& s = detail::amx_support();
  if (s.usable()) GTEST_SKIP() << "AMX is usable here: ATTN_AMX=on has nothing to refuse";
  const ScopedAmxEnv env(std::string("on"));
  try {
    detail::amx_enabled();
    ADD_FAILURE() << "ATTN_AMX=on fell back silently";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "ATTN_AMX=on: " + s.reason());
  }
}

TEST(AmxMode, OnWithAmxEnables) {
  if (!detail::amx_support().usable()) GTEST_SKIP() << detail::amx_support().reason();
  const ScopedAmxEnv env(std::string("on"));
  EXPECT_TRUE(detail::amx_enabled());
}

#if defined(ATTN_TEST_AMX_TILES)
// GCC's tile intrinsics are asm statements that see the buffers' addresses only, not their contents.
inline void memory_barrier(const void* p) { __asm__ volatile("" : : "r"(p) : "memory"); }

std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<std::uint16_t>(u >> 16);  // exact for the small integers used here
}

// C[16x16] = A[16x32] B[32x16] with one TDPBF16PS; b_vnni holds B's rows k, k+1 interleaved.
__attribute__((target("amx-tile,amx-bf16"))) void tile_dot(const std::uint16_t* a, const std::uint16_t* b_vnni,
                                                           float* c) {
  struct alignas(64) {
    std::uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
    std::uint16_t colsb[16] = {64, 64, 64};
    std::uint8_t rows[16] = {16, 16, 16};
  } cfg;
  memory_barrier(&cfg);
  memory_barrier(a);
  memory_barrier(b_vnni);
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b_vnni, 64);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, c, 64);
  memory_barrier(c);
  _tile_release();
}

// Where detection says usable, the permission it asked for is real: a tile instruction runs (without
// it, SIGILL) and computes the product, exact here since every product and sum is a small integer.
TEST(AmxSupport, UsableMeansATileProductRuns) {
  if (!detail::amx_support().usable()) GTEST_SKIP() << detail::amx_support().reason();
  alignas(64) std::uint16_t a[16 * 32], b_vnni[16 * 32];
  alignas(64) float c[16 * 16];
  const auto av = [](int i, int k) { return static_cast<float>((i + 2 * k) % 5 - 2); };
  const auto bv = [](int k, int j) { return static_cast<float>((3 * k + j) % 7 - 3); };
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 32; ++k) a[i * 32 + k] = bf16_bits(av(i, k));
  for (int k = 0; k < 32; ++k)
    for (int j = 0; j < 16; ++j) b_vnni[(k / 2) * 32 + 2 * j + k % 2] = bf16_bits(bv(k, j));
  tile_dot(a, b_vnni, c);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float want = 0;
      for (int k = 0; k < 32; ++k) want += av(i, k) * bv(k, j);
      EXPECT_EQ(c[i * 16 + j], want) << "row " << i << ", column " << j;
    }
}
#endif

}  // namespace
}  // namespace attn
