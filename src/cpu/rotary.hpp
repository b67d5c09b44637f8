// Rotary position embedding (RoPE) as flash_attn_with_kvcache applies it to the appended keys and to the
// queries (include/attn/decode.hpp, DecodeOptions::rotary): the first rotary_dim features of a row at
// position p are rotated pairwise by the angle whose cos and sin are row p of the tables, pairs being
// (c, c + rotary_dim / 2) (GPT-NeoX, interleaved = false) or (2c, 2c + 1) (GPT-J, interleaved = true):
// core/rotary_rule.hpp and RotarySpec (core/cache_index.hpp), shared with the CUDA decode. The CPU decode calls
// rotate_row where it packs q and where it appends k_new.
#pragma once

#include <cstdint>

#include "attn/decode.hpp"
#include "core/element.hpp"
#include "core/cache_index.hpp"

namespace attn::detail {

// DecodeOptions::rotary as the rule both backends apply; q_per_row when the mask is causal or windowed.
inline RotarySpec rotary_spec(const RotaryTables* r, bool q_per_row) {
  if (r == nullptr) return {};
  return {r->cos, r->sin, r->dtype, r->rotary_dim, r->interleaved, q_per_row};
}

// x[0 .. rotary_dim) of one row (contiguous, accumulator type A) rotated in place at position `pos`
// (validated: 0 <= pos < the tables' positions).
template <class A>
void rotate_row(A* x, const RotarySpec& rotary, std::int64_t pos) {
  const std::int64_t half = rotary.half();
  dispatch_dtype(rotary.dtype, [&]<class T>() {
    const T* cos = static_cast<const T*>(rotary.cos) + pos * half;
    const T* sin = static_cast<const T*>(rotary.sin) + pos * half;
    for (std::int64_t c = 0; c < half; ++c) {
      const RotaryPair pair = rotary.pair(c);
      rotate_pair(x[pair.first], x[pair.second], load<A>(cos[c]), load<A>(sin[c]));
    }
  });
}

}  // namespace attn::detail
