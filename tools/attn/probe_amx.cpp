// amx_bf16_peak_gflops: the machine's AMX-BF16 ceiling, measured, beside the FMA probe (probe_fma.cpp).
// Each thread keeps four independent f32 accumulator tiles (tmm0..3) fed from two A tiles (tmm4, tmm5)
// and two B tiles (tmm6, tmm7) loaded once, so only the tile unit limits the rate: one TDPBF16PS has a
// latency of several times its issue interval, which four chains cover. The operands never change and no
// memory is touched in the loop, so this is the unit's rate, not what a kernel that streams its tiles
// from the caches reaches.
//
// The only file of the CLI compiled with -mamx-tile -mamx-bf16 (tools/CMakeLists.txt, where the compiler
// takes them): without the flags it reports 0, as it does where amx_support() says AMX is not usable.
#include <algorithm>
#include <chrono>
#include <cstdint>

#include <omp.h>

#include "amx/amx.hpp"
#include "amx/amx_tiles.hpp"
#include "probes.hpp"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>

namespace attn::cli {
namespace {

// GCC 12's tile intrinsics are asm statements that take buffers by address without a memory operand or
// clobber, so the compiler sees neither the loads read nor the stores write them: this barrier, given
// the address, keeps the buffers' writes before a load and their reads after a store.
inline void memory_barrier(const void* p) { __asm__ volatile("" : : "r"(p) : "memory"); }

constexpr double kFlopsPerDot = 16.0 * 16.0 * 32.0 * 2.0;  // C[16x16] += A[16x32] B[32x16], bf16 pairs

// Runs `iters` rounds of four independent TDPBF16PS; returns the flops done. The accumulators are
// stored and folded into `sink` so the result is observable.
double TileChains(std::int64_t iters, float* sink) {
  const detail::amx::TileConfig cfg = detail::amx::full_tiles();  // every tile 16 rows x 64 bytes
  // A: 16 rows of 32 bf16. B in the VNNI layout: 16 rows, each 16 columns of a (k, k+1) bf16 pair.
  // bf16 1.0 and 2^-23: normal values, so no flush to zero, and sums that stay finite.
  alignas(64) std::uint16_t a[16 * 32], b[16 * 32];
  std::fill(a, a + 16 * 32, std::uint16_t{0x3F80});
  std::fill(b, b + 16 * 32, std::uint16_t{0x3400});
  alignas(64) float c[16 * 16];
  memory_barrier(&cfg);
  memory_barrier(a);
  memory_barrier(b);
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  for (std::int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float s = 0;
  _tile_stored(0, c, 64);
  memory_barrier(c);
  s += c[0];
  _tile_stored(1, c, 64);
  memory_barrier(c);
  s += c[0];
  _tile_stored(2, c, 64);
  memory_barrier(c);
  s += c[0];
  _tile_stored(3, c, 64);
  memory_barrier(c);
  s += c[0];
  _tile_release();
  *sink += s;
  return 4.0 * kFlopsPerDot * static_cast<double>(iters);
}

}  // namespace

double amx_bf16_peak_gflops(int threads) {
  // The grant of the tile state is process-wide (amx_support asks once), so the threads need not ask.
  if (!detail::amx_support().usable()) return 0;
  threads = std::max(threads, 1);
  const std::int64_t iters = 4'000'000;  // about 0.1 s per thread at 2.6 TFLOP/s per core
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {  // the best of three, as the FMA probe: the probe measures the ceiling
    double flops = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    {
      float sink = 0;
      flops += TileChains(iters, &sink);
      if (sink == 12345.f) flops += 1;  // keeps the accumulators observable
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / s / 1e9);
  }
  return best;
}

}  // namespace attn::cli

#else

namespace attn::cli {
double amx_bf16_peak_gflops(int) { return 0; }  // compiled without AMX: cannot run it
}  // namespace attn::cli

#endif
