// Integer arithmetic on user-supplied sizes, offsets and counts. Validation and the public helpers do
// all such arithmetic through these, so an overflow is a named error (or, in heuristics whose result
// is clamped anyway, a saturated value), never undefined behaviour.
#pragma once

#include <cstdint>
#include <limits>

namespace attn::detail {

// out = a * b (a + b); false, with out unspecified, when the exact result does not fit in int64.
[[nodiscard]] inline bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}
[[nodiscard]] inline bool checked_add(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return !__builtin_add_overflow(a, b, &out);
}

// a * b and a + b clamped to the int64 range.
inline std::int64_t saturating_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (checked_mul(a, b, r)) return r;
  return (a < 0) != (b < 0) ? std::numeric_limits<std::int64_t>::min() : std::numeric_limits<std::int64_t>::max();
}
inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (checked_add(a, b, r)) return r;
  return b < 0 ? std::numeric_limits<std::int64_t>::min() : std::numeric_limits<std::int64_t>::max();
}

}  // namespace attn::detail
