// The AMX tile emulator (amx/amx_emulator.hpp), which the AMX kernels' tests run on where the CPU has
// no AMX: the SDM's semantics (exact products, the even and odd partial sums, DAZ and FTZ, the tile
// configuration's limits), TDPFP16PS's f16 reading, the kernels' f16 rounding of P, and where the CPU's
// tiles are usable, bit-for-bit agreement with them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include <hwy/highway.h>

#include "amx/amx.hpp"
#include "amx/amx_emulator.hpp"
#include "amx/amx_round-inl.h"
#include "amx/amx_tiles.hpp"
#include "support.hpp"

namespace attn {
namespace {

using detail::amx::EmulatedTiles;
using detail::amx::TileBackend;
using test::ScopedAmxEnv;

std::uint16_t bf16_bits(float x) { return detail::store<bf16_t>(x).bits; }
float bf16_value(std::uint16_t b) { return detail::load<float>(bf16_t{b}); }
float f32_of_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The four C tiles of one dot_2x2 on `Unit`, from A tiles a[2] and B tiles b[2] (bf16 bits, 16 x 32 each) and
// C's start values c[4] (16 x 16 f32 each).
// fp16: TDPFP16PS on f16 bits instead.
template <class Unit>
void run_dot_2x2(const std::uint16_t (&a)[2][512], const std::uint16_t (&b)[2][512], float (&c)[4][256],
                 bool fp16 = false) {
  Unit u;
  u.configure(detail::amx::full_tiles());
  u.template load<0>(c[0], 64);
  u.template load<1>(c[1], 64);
  u.template load<2>(c[2], 64);
  u.template load<3>(c[3], 64);
  u.template load<4>(a[0], 64);
  u.template load<5>(a[1], 64);
  u.template load<6>(b[0], 64);
  u.template load<7>(b[1], 64);
  if (fp16)
    u.dot_2x2_fp16();
  else
    u.dot_2x2();
  u.template store<0>(c[0], 64);
  u.template store<1>(c[1], 64);
  u.template store<2>(c[2], 64);
  u.template store<3>(c[3], 64);
  u.release();
}

TEST(AmxEmulator, SmallIntegerProductsAreExact) {
  alignas(64) std::uint16_t a[2][512], b[2][512];
  alignas(64) float c[4][256] = {};
  for (int t = 0; t < 2; ++t)
    for (int i = 0; i < 512; ++i) {
      a[t][i] = bf16_bits(static_cast<float>((i * 7 + t) % 9 - 4));
      b[t][i] = bf16_bits(static_cast<float>((i * 5 + 3 * t) % 11 - 5));
    }
  run_dot_2x2<EmulatedTiles>(a, b, c);
  // C0 = A0 B0: row m, column n sums over the 32 elements k of A's row m and B's pair rows k/2, lane k%2.
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float want = 0;
      for (int k = 0; k < 32; ++k)
        want += bf16_value(a[0][m * 32 + k]) * bf16_value(b[0][(k / 2) * 32 + 2 * n + k % 2]);
      ASSERT_EQ(c[0][m * 16 + n], want) << m << "," << n;
    }
}

// The SDM's order: the even and the odd products summed apart, each rounding once per step, then added
// to C. 2^24 + 1 + 1 in one chain is 2^24 (ties to even, twice); split into even (2^24 + 1 -> 2^24) and
// odd (1), then 2^24 + 1 -> 2^24 again, and C = 0 + 2^24. A sum of 2^24 and 2 (the two 1s first) would
// give 2^24 + 2: this tells the orders apart.
TEST(AmxEmulator, EvenAndOddProductsAreSummedApart) {
  alignas(64) std::uint16_t a[2][512] = {}, b[2][512] = {};
  alignas(64) float c[4][256] = {};
  a[0][0] = bf16_bits(16777216.0f);  // k = 0 (even): 2^24 x 1
  a[0][1] = bf16_bits(1.0f);         // k = 1 (odd): 1 x 1
  a[0][2] = bf16_bits(1.0f);         // k = 2 (even): 1 x 1
  b[0][0] = b[0][1] = b[0][32] = bf16_bits(1.0f);
  run_dot_2x2<EmulatedTiles>(a, b, c);
  EXPECT_EQ(c[0][0], 16777216.0f);
}

TEST(AmxEmulator, DenormalsReadAsZeroAndResultsFlush) {
  alignas(64) std::uint16_t a[2][512] = {}, b[2][512] = {};
  alignas(64) float c[4][256] = {};
  a[0][0] = 0x0001;  // the smallest bf16 denormal
  b[0][0] = bf16_bits(1e30f);
  a[0][32] = bf16_bits(1e-20f);  // row 1: 1e-20 x 1e-20 = 1e-40, a denormal result
  b[0][0] = bf16_bits(1e30f);
  b[0][2] = bf16_bits(1e-20f);
  c[0][1] = f32_of_bits(0x00000001);  // a denormal C value reads as zero
  run_dot_2x2<EmulatedTiles>(a, b, c);
  EXPECT_EQ(bits_of(c[0][0]), 0u) << "denormal A x 1e30";
  EXPECT_EQ(bits_of(c[0][17]), 0u) << "1e-20 x 1e-20 flushes";
  EXPECT_EQ(bits_of(c[0][1]), 0u) << "denormal C";
}

std::uint16_t f16_bits(float x) { return detail::store<f16_t>(x).bits; }
float f16_value(std::uint16_t b) { return detail::load<float>(f16_t{b}); }

// TDPFP16PS: the same products, sums and order as TDPBF16PS on f16 pairs.
TEST(AmxEmulator, Fp16ProductsAreExactAndSummedApart) {
  alignas(64) std::uint16_t a[2][512], b[2][512];
  alignas(64) float c[4][256] = {};
  for (int t = 0; t < 2; ++t)
    for (int i = 0; i < 512; ++i) {
      a[t][i] = f16_bits(static_cast<float>((i * 7 + t) % 9 - 4) * 0.125f);
      b[t][i] = f16_bits(static_cast<float>((i * 5 + 3 * t) % 11 - 5) * 1024.0f);
    }
  run_dot_2x2<EmulatedTiles>(a, b, c, true);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float want = 0;
      for (int k = 0; k < 32; ++k) want += f16_value(a[1][m * 32 + k]) * f16_value(b[0][(k / 2) * 32 + 2 * n + k % 2]);
      ASSERT_EQ(c[2][m * 16 + n], want) << m << "," << n;  // C2 = A5 B6
    }
  // 2048 x 2^13 = 2^24, plus 1 (odd) and 1 (even): the bf16 test's orders told apart on f16 operands.
  alignas(64) std::uint16_t x[2][512] = {}, y[2][512] = {};
  alignas(64) float z[4][256] = {};
  x[0][0] = f16_bits(2048.0f);
  x[0][1] = x[0][2] = f16_bits(1.0f);
  y[0][0] = f16_bits(8192.0f);
  y[0][1] = y[0][32] = f16_bits(1.0f);
  run_dot_2x2<EmulatedTiles>(x, y, z, true);
  EXPECT_EQ(z[0][0], 16777216.0f);
}

// TDPFP16PS keeps subnormal f16 inputs ("always handled and not treated as zero"); f32 results and C
// values flush as TDPBF16PS's.
TEST(AmxEmulator, Fp16SubnormalInputsKeepTheirValue) {
  alignas(64) std::uint16_t a[2][512] = {}, b[2][512] = {};
  alignas(64) float c[4][256] = {};
  a[0][0] = 0x0001;  // 2^-24, the smallest f16 subnormal
  b[0][0] = f16_bits(1.0f);
  a[0][32] = 0x0200;  // row 1: 2^-15 x 2^-15 = 2^-30, exact
  b[0][2] = 0x0200;
  c[0][5] = f32_of_bits(0x00000001);  // a denormal C value (row 0, column 5: no product) reads as zero
  run_dot_2x2<EmulatedTiles>(a, b, c, true);
  EXPECT_EQ(c[0][0], std::ldexp(1.0f, -24));
  EXPECT_EQ(c[0][17], std::ldexp(1.0f, -30));
  EXPECT_EQ(bits_of(c[0][5]), 0u) << "denormal C";
}

// RoundToF16 on this build's static Highway target, over n floats (a multiple of the lane count). HWY_ATTR:
// the target's attributes, which NEON's operations need on AArch64.
HWY_ATTR void round_to_f16_lanes(const float* x, std::size_t n, std::uint32_t* out) {
  namespace hn = hwy::HWY_NAMESPACE;
  const hn::ScalableTag<float> d;
  const hn::RebindToUnsigned<decltype(d)> du;
  for (std::size_t i = 0; i < n; i += hn::Lanes(d))
    hn::StoreU(detail::amx_simd::HWY_NAMESPACE::RoundToF16(d, hn::LoadU(d, x + i)), du, out + i);
}

// The AMX kernels' f16 rounding of P on SIMD lanes (RoundToF16) is float_to_f16 bit for bit: every f16
// value, the halfway points around it, and random f32 patterns.
TEST(AmxRounding, RoundToF16IsFloatToF16) {
  std::vector<float> xs;
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float v = f16_value(static_cast<std::uint16_t>(h));
    xs.push_back(v);
    if (std::isfinite(v)) {  // the halfway point to the next f16 up in magnitude, and just around it
      const float next = f16_value(static_cast<std::uint16_t>(h + 1));
      const float half = v + (next - v) / 2;
      xs.insert(xs.end(), {half, std::nextafter(half, 0.0f), std::nextafter(half, 2 * half)});
    }
  }
  std::mt19937 rng(11);
  for (int i = 0; i < (1 << 18); ++i) xs.push_back(f32_of_bits(static_cast<std::uint32_t>(rng())));
  xs.resize((xs.size() + 63) / 64 * 64, 0.0f);  // whole vectors of any lane count up to 64
  std::vector<std::uint32_t> got(xs.size());
  round_to_f16_lanes(xs.data(), xs.size(), got.data());
  for (std::size_t i = 0; i < xs.size(); ++i)
    ASSERT_EQ(got[i], detail::store<f16_t>(xs[i]).bits) << xs[i] << " (bits " << bits_of(xs[i]) << ")";
}

TEST(AmxEmulator, ConfigurationAndUseOutsideItThrow) {
  EmulatedTiles u;
  alignas(64) float buf[256] = {};
  EXPECT_THROW(u.load(0, buf, 64), std::logic_error);  // before LDTILECFG
  detail::amx::TileConfig bad = detail::amx::full_tiles();
  bad.rows[3] = 17;
  EXPECT_THROW(u.configure(bad), std::logic_error);
  bad = detail::amx::full_tiles();
  bad.palette_id = 2;
  EXPECT_THROW(u.configure(bad), std::logic_error);
  detail::amx::TileConfig narrow = detail::amx::full_tiles();
  narrow.colsb[0] = 32;  // C with 8 columns against a B of 16: the shapes disagree
  u.configure(narrow);
  EXPECT_THROW(u.dpbf16ps(0, 4, 6), std::logic_error);
}

TEST(AmxEmulator, LoadsAndStoresTouchOnlyTheConfiguredBytes) {
  EmulatedTiles u;
  detail::amx::TileConfig cfg = detail::amx::full_tiles();
  cfg.rows[0] = 3;
  cfg.colsb[0] = 8;
  u.configure(cfg);
  std::vector<float> src(256, 5.0f), dst(256, -1.0f);
  u.load(0, src.data(), 64);
  // Stores write the configured bytes only: rows 0..2, two floats each.
  u.store(0, dst.data(), 64);
  for (int r = 0; r < 16; ++r)
    for (int x = 0; x < 16; ++x) EXPECT_EQ(dst[r * 16 + x], (r < 3 && x < 2) ? 5.0f : -1.0f) << r << "," << x;
}

#if defined(ATTN_AMX_HARDWARE)
// fp16: TDPFP16PS on f16 patterns (where the CPU has AMX-FP16).
void check_against_the_instructions(bool fp16) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> exponent(-60, 40), mantissa(0, 127), coin(0, 1), kind(0, 19);
  std::uniform_int_distribution<int> exponent16(-14, 15), mantissa16(0, 1023);
  auto random_bits = [&]() -> std::uint16_t {
    const int k = kind(rng);
    if (k == 0) return 0;
    if (fp16) {
      if (k == 1) return static_cast<std::uint16_t>(mantissa16(rng) | (coin(rng) << 15));  // subnormal
      return static_cast<std::uint16_t>((coin(rng) << 15) | ((exponent16(rng) + 15) << 10) | mantissa16(rng));
    }
    if (k == 1) return static_cast<std::uint16_t>(mantissa(rng) | (coin(rng) << 15));  // denormal
    const int e = std::clamp(exponent(rng) + 127, 1, 254);
    return static_cast<std::uint16_t>((coin(rng) << 15) | (e << 7) | mantissa(rng));
  };
  for (int trial = 0; trial < 200; ++trial) {
    alignas(64) std::uint16_t a[2][512], b[2][512];
    alignas(64) float c_hw[4][256], c_em[4][256];
    for (auto& t : a)
      for (auto& x : t) x = random_bits();
    for (auto& t : b)
      for (auto& x : t) x = random_bits();
    for (int t = 0; t < 4; ++t)
      for (int i = 0; i < 256; ++i) c_hw[t][i] = c_em[t][i] = bf16_value(random_bits());
    run_dot_2x2<detail::amx::HardwareTiles>(a, b, c_hw, fp16);
    run_dot_2x2<EmulatedTiles>(a, b, c_em, fp16);
    for (int t = 0; t < 4; ++t)
      for (int i = 0; i < 256; ++i)
        ASSERT_EQ(bits_of(c_hw[t][i]), bits_of(c_em[t][i]))
            << "trial " << trial << " tile " << t << " element " << i << ": " << c_hw[t][i] << " vs " << c_em[t][i];
  }
}

// TDPFP16PS's order and subnormals are the reference's reading, never yet compared with a CPU: where one
// has AMX-FP16, this says whether the emulator is right.
TEST(AmxEmulator, Fp16MatchesTheInstructionsBitwise) {
  if (!detail::amx_support().usable() || !detail::amx_support().cpu_fp16)
    GTEST_SKIP() << "no AMX-FP16 here: " << detail::amx_support().reason();
  check_against_the_instructions(true);
}

// Random values over a wide exponent range (with denormals, zeros and cancelling signs): the emulator and
// TDPBF16PS agree bit for bit.
TEST(AmxEmulator, MatchesTheInstructionsBitwise) {
  if (!detail::amx_support().usable()) GTEST_SKIP() << detail::amx_support().reason();
  check_against_the_instructions(false);
}
#endif

}  // namespace
}  // namespace attn
