// Philox 4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw, "Parallel random
// numbers: as easy as 1, 2, 3" (SC 2011), as Random123 defines it (philox.h; the known answers of its
// tests/kat_vectors are checked by tests/test_dropout.cpp). A pure function of a 128-bit counter and a
// 64-bit key: any element's random words can be computed on their own, in any order, on any thread or
// device, which is what lets the backward regenerate the forward's dropout mask instead of storing it.
// Host + device (ATTN_HOST_DEVICE, as online_softmax.hpp) so the CUDA kernels can share it.
#pragma once

#include <cstdint>

#include "attn/host_device.hpp"

namespace attn::detail {

// The round multipliers and the key's Weyl increments (golden ratio, sqrt(3) - 1). Also used by the
// SIMD rounds of cpu/philox-inl.h, which the tests hold to philox4x32_10.
constexpr std::uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr std::uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;
constexpr int kPhiloxRounds = 10;

struct PhiloxWords {
  std::uint32_t w[4];
};

// One round: two 32x32 -> 64-bit products, their halves crossed with the other counter words and the key.
ATTN_HOST_DEVICE inline void philox_round(std::uint32_t (&c)[4], std::uint32_t k0, std::uint32_t k1) {
  const std::uint64_t p0 = std::uint64_t{kPhiloxM0} * c[0], p1 = std::uint64_t{kPhiloxM1} * c[2];
  const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
  const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
  const std::uint32_t c1 = c[1], c3 = c[3];
  c[0] = hi1 ^ c1 ^ k0;
  c[1] = lo1;
  c[2] = hi0 ^ c3 ^ k1;
  c[3] = lo0;
}

// Ten rounds, the key bumped by the Weyl constants before each but the first.
ATTN_HOST_DEVICE inline PhiloxWords philox4x32_10(std::uint32_t c0, std::uint32_t c1, std::uint32_t c2,
                                                  std::uint32_t c3, std::uint32_t k0, std::uint32_t k1) {
  std::uint32_t c[4] = {c0, c1, c2, c3};
  for (int r = 0; r < kPhiloxRounds; ++r) {
    philox_round(c, k0, k1);
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {{c[0], c[1], c[2], c[3]}};
}

}  // namespace attn::detail
