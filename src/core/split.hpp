// The split rule of split-K and decode, CPU and CUDA alike: `keys` keys cut into `splits` contiguous
// slices of near-equal size, the larger first,
//   slice w = [w floor(keys/splits) + min(w, keys mod splits), the next slice's start).
// Boundaries depend only on (keys, splits), never on threads or blocks, so every backend merges the
// same partials in the same order. With splits > keys the last splits - keys slices are empty: their
// state is the neutral element and merging it is a bitwise no-op, so callers never materialise them.
#pragma once

#include <cstdint>

#include "attn/attention.hpp"  // KeyRange
#include "attn/host_device.hpp"

namespace attn::detail {

// Requires keys >= 0, splits >= 1 and 0 <= w < splits (attn::splitk_slice checks them for users).
ATTN_HOST_DEVICE inline KeyRange split_slice(std::int64_t keys, std::int64_t splits, std::int64_t w) {
  const std::int64_t base = keys / splits, extra = keys % splits;
  const std::int64_t begin = w * base + (w < extra ? w : extra);
  return {begin, begin + base + (w < extra ? 1 : 0)};
}

// Slices that can hold a key: min(splits, keys), at least one (an empty sequence has one empty slice).
ATTN_HOST_DEVICE inline std::int64_t nonempty_slices(std::int64_t keys, std::int64_t splits) {
  const std::int64_t n = splits < keys ? splits : keys;
  return n > 1 ? n : 1;
}

// Batch-invariant decode (DecodeOptions::keys_per_split): a sequence whose queries see n keys is cut
// into max(1, ceil(n / keys_per_split)) slices (by split_slice), a function of the sequence alone.
ATTN_HOST_DEVICE inline std::int64_t slices_for_keys_per_split(std::int64_t n, std::int64_t keys_per_split) {
  const std::int64_t s = (n + keys_per_split - 1) / keys_per_split;
  return s > 1 ? s : 1;
}

}  // namespace attn::detail
