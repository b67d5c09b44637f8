#include "amx/amx_emulator.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/element.hpp"

namespace attn::detail::amx {
namespace {

// Denormals to zero of the same sign: DAZ on inputs, FTZ on results.
float flush(float x) { return std::fabs(x) < std::numeric_limits<float>::min() ? std::copysign(0.0f, x) : x; }

float bf16_to_f32(std::uint16_t bits) {
  const std::uint32_t u = std::uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return flush(f);
}

// Exact (every f16 is an f32), subnormals kept: TDPFP16PS does not read them as zero.
float f16_to_f32(std::uint16_t bits) { return f16_to_float(f16_t{bits}); }

}  // namespace

void EmulatedTiles::configure(const TileConfig& c) {
  if (c.palette_id != 1) throw std::logic_error("amx emulator: LDTILECFG palette " + std::to_string(c.palette_id));
  for (int t = 0; t < 8; ++t)
    if (c.rows[t] > kTileRows || c.colsb[t] > kTileBytes || c.colsb[t] % 4 != 0)
      throw std::logic_error("amx emulator: tile " + std::to_string(t) + " configured past 16 rows x 64 bytes");
  config_ = c;
  configured_ = true;
  std::memset(tiles_, 0, sizeof tiles_);
}

void EmulatedTiles::release() {
  configured_ = false;
  std::memset(tiles_, 0, sizeof tiles_);
}

void EmulatedTiles::require_configured(const char* op, int t) const {
  if (!configured_ || t < 0 || t > 7 || config_.rows[t] == 0)
    throw std::logic_error(std::string("amx emulator: ") + op + " of tile " + std::to_string(t) +
                           " that is not configured (the CPU raises #UD)");
}

void EmulatedTiles::zero(int t) {
  require_configured("TILEZERO", t);
  std::memset(tiles_[t], 0, sizeof tiles_[t]);
}

void EmulatedTiles::load(int t, const void* base, std::int64_t stride) {
  require_configured("TILELOADD", t);
  std::memset(tiles_[t], 0, sizeof tiles_[t]);
  const auto* src = static_cast<const std::uint8_t*>(base);
  for (int r = 0; r < config_.rows[t]; ++r) std::memcpy(tiles_[t] + r * kTileBytes, src + r * stride, config_.colsb[t]);
}

void EmulatedTiles::store(int t, void* base, std::int64_t stride) const {
  require_configured("TILESTORED", t);
  auto* dst = static_cast<std::uint8_t*>(base);
  for (int r = 0; r < config_.rows[t]; ++r) std::memcpy(dst + r * stride, tiles_[t] + r * kTileBytes, config_.colsb[t]);
}

template <class Widen>
void EmulatedTiles::dot_pairs(int c, int a, int b, const char* name, Widen to_f32) {
  require_configured(name, c);
  require_configured(name, a);
  require_configured(name, b);
  const int rows = config_.rows[c], n_cols = config_.colsb[c] / 4, k_pairs = config_.colsb[a] / 4;
  if (config_.rows[a] != rows || config_.rows[b] != k_pairs || config_.colsb[b] != config_.colsb[c])
    throw std::logic_error(std::string("amx emulator: ") + name +
                           " with tile shapes that do not match (the CPU raises #UD)");
  std::uint16_t ab[kTileRows * kTileBytes / 2], bb[kTileRows * kTileBytes / 2];
  float cf[kTileRows * kTileBytes / 4];
  std::memcpy(ab, tiles_[a], sizeof ab);
  std::memcpy(bb, tiles_[b], sizeof bb);
  std::memcpy(cf, tiles_[c], sizeof cf);
  constexpr int kRowHalves = kTileBytes / 2, kRowFloats = kTileBytes / 4;
  for (int m = 0; m < rows; ++m)
    for (int n = 0; n < n_cols; ++n) {
      float even = 0.0f, odd = 0.0f;
      for (int k = 0; k < k_pairs; ++k) {
        even = flush(std::fma(to_f32(ab[m * kRowHalves + 2 * k]), to_f32(bb[k * kRowHalves + 2 * n]), even));
        odd = flush(std::fma(to_f32(ab[m * kRowHalves + 2 * k + 1]), to_f32(bb[k * kRowHalves + 2 * n + 1]), odd));
      }
      float& dst = cf[m * kRowFloats + n];
      dst = flush(flush(dst) + flush(even + odd));
    }
  std::memcpy(tiles_[c], cf, sizeof cf);
}

// Lambdas, not the functions' pointers: one instance each, the widening inlined into the loop.
void EmulatedTiles::dpbf16ps(int c, int a, int b) {
  dot_pairs(c, a, b, "TDPBF16PS", [](std::uint16_t x) { return bf16_to_f32(x); });
}

void EmulatedTiles::dpfp16ps(int c, int a, int b) {
  dot_pairs(c, a, b, "TDPFP16PS", [](std::uint16_t x) { return f16_to_f32(x); });
}

}  // namespace attn::detail::amx
