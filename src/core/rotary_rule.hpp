// The rule of rotary position embedding, host and device alike (include/attn/decode.hpp, RotaryTables):
// table column c rotates the pair of features (c, c + rotary_dim / 2) (GPT-NeoX), or (2c, 2c + 1) when
// interleaved (GPT-J), by the angle whose cos and sin are column c of the position's table row. The CPU
// decode (cpu/rotary.hpp) and the CUDA decode's kernels (src/cuda/decode_kernel.cuh) both use it.
#pragma once

#include <cstdint>

#include "attn/host_device.hpp"

namespace attn::detail {

struct RotaryPair {
  std::int64_t first, second;
};

// The features table column c rotates.
ATTN_HOST_DEVICE constexpr RotaryPair rotary_pair(std::int64_t c, std::int64_t rotary_dim, bool interleaved) {
  return interleaved ? RotaryPair{2 * c, 2 * c + 1} : RotaryPair{c, c + rotary_dim / 2};
}

// The table column that rotates feature x (x < rotary_dim).
ATTN_HOST_DEVICE constexpr std::int64_t rotary_column(std::int64_t x, std::int64_t rotary_dim, bool interleaved) {
  return interleaved ? x / 2 : x % (rotary_dim / 2);
}

// (x1, x2) rotated by the angle of cos co and sin si.
template <class A>
ATTN_HOST_DEVICE constexpr void rotate_pair(A& x1, A& x2, A co, A si) {
  const A a = x1, b = x2;
  x1 = a * co - b * si;
  x2 = a * si + b * co;
}

}  // namespace attn::detail
