// The dropout rule: which softmax weights P_ij the forward keeps, and by what it scales them. Resolved
// once from AttentionOptions (resolve_options, validate/validate.cpp) next to the score rule and carried
// unchanged to every kernel that supports dropout, which all ask this struct, per element or per group
// of four keys, so that the forward, the backward and the public mask (attn::dropout_mask) draw the same
// bits whatever their tile sizes, loop orders or thread counts. docs/dropout.md.
//
// Element mapping. Element (b, h, i, j) -- b the global batch index (the sequence index of a varlen
// batch), h the query head, i and j the query and key positions within the sequence -- is kept iff
//   philox4x32_10(counter, key).w[j % 4] < threshold,
//   counter = {j / 4, i, b * heads + h, offset},  key = {seed & 0xffffffff, seed >> 32},
// so the four keys 4g .. 4g + 3 of one row share one Philox call (keep4). Each word is a separate
// counter field, so distinct elements get distinct (counter, word) pairs as long as
//   seqlen_k <= 2^34, seqlen_q <= 2^32, batch * heads <= 2^32 and offset < 2^32,
// which validation enforces (check_dropout_extent and resolve_options). Different seeds or offsets give
// independent masks: training uses a new offset (or seed) per call.
#pragma once

#include <cstdint>

#include "attn/host_device.hpp"
#include "core/philox.hpp"

namespace attn::detail {

struct DropoutRule {
  double p = 0;                 // the drop probability, in [0, 1); 0 = off
  double scale = 1;             // 1 / (1 - p): what a kept weight is multiplied by
  std::uint32_t threshold = 0;  // keep iff the Philox word < threshold: floor((1 - p) 2^32), <= 2^32 - 1
  std::uint64_t seed = 0;       // the Philox key
  std::uint32_t offset = 0;     // the counter's last word
  std::int64_t heads = 0;       // query heads of the problem (the counter's b * heads + h)
  std::int64_t batch_base = 0;  // the global batch index of the problem's b = 0 (varlen's sequences)

  ATTN_HOST_DEVICE bool enabled() const { return p > 0; }

  // The counter's third word, that of (batch b, head h). A kernel that runs Philox itself (the tiled
  // forward's SIMD lanes) builds the counter {g, i, head_word(b, h), offset} and the key {key0(), key1()}.
  ATTN_HOST_DEVICE std::uint32_t head_word(std::int64_t b, std::int64_t h) const {
    return static_cast<std::uint32_t>((batch_base + b) * heads + h);
  }
  ATTN_HOST_DEVICE std::uint32_t key0() const { return static_cast<std::uint32_t>(seed); }
  ATTN_HOST_DEVICE std::uint32_t key1() const { return static_cast<std::uint32_t>(seed >> 32); }

  // Bit t of the result: whether key 4g + t of row (b, h, i) is kept. One Philox call.
  ATTN_HOST_DEVICE unsigned keep4(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t g) const {
    const PhiloxWords r = philox4x32_10(static_cast<std::uint32_t>(g), static_cast<std::uint32_t>(i), head_word(b, h),
                                        offset, key0(), key1());
    return unsigned{r.w[0] < threshold} | unsigned{r.w[1] < threshold} << 1 | unsigned{r.w[2] < threshold} << 2 |
           unsigned{r.w[3] < threshold} << 3;
  }
  ATTN_HOST_DEVICE bool keep(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return (keep4(b, h, i, j >> 2) >> (j & 3) & 1u) != 0;
  }
  // The factor P_ij is multiplied by in P V: 1 / (1 - p) if kept, 0 if dropped (1 when off).
  template <class A>
  ATTN_HOST_DEVICE A factor(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (!enabled()) return A(1);
    return keep(b, h, i, j) ? static_cast<A>(scale) : A(0);
  }
  // x[(j - j_begin) * stride] *= factor(b, h, i, j) for j in [j_begin, j_end): one Philox call per group
  // of four keys. The kernels' way to drop a row (or a tile's column) of P in place.
  template <class A>
  ATTN_HOST_DEVICE void scale_row(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j_begin,
                                  std::int64_t j_end, A* x, std::int64_t stride) const {
    const A kept = static_cast<A>(scale);
    for (std::int64_t j = j_begin; j < j_end;) {
      const unsigned bits = keep4(b, h, i, j >> 2);
      for (const std::int64_t group_end = (j | 3) + 1; j < j_end && j < group_end; ++j, x += stride)
        *x *= (bits >> (j & 3) & 1u) ? kept : A(0);
    }
  }
  // The rule of sequence b of a batch, run as a batch of one (varlen's per-sequence problems).
  ATTN_HOST_DEVICE DropoutRule for_sequence(std::int64_t b) const {
    DropoutRule r = *this;
    r.batch_base += b;
    return r;
  }
};

}  // namespace attn::detail
