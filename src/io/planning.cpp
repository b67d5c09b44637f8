// Planning figures built on the closed forms of io_model.cpp: the break-even SRAM size and the bytes
// of one decode step (include/attn/io_model.hpp).
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attn/io_model.hpp"
#include "io/arg_checks.hpp"

namespace attn::io {

using detail::fail;
using detail::require_positive;

std::int64_t break_even_sram_elements(std::int64_t n, std::int64_t d, bool fa2) {
  constexpr const char* where = "io::break_even_sram_elements";
  require_positive(where, "seqlen", n);
  require_positive(where, "head_dim", d);
  const std::int64_t standard = standard_elements(n, d);  // throws on overflow
  const auto tiled = [&](std::int64_t m) { return fa2 ? fa2_elements(n, d, m) : tiled_elements(n, d, m); };
  // At M = 4Nd one tile holds every key (one pass); more SRAM changes nothing.
  std::int64_t hi;
  if (__builtin_mul_overflow(4 * d, n, &hi)) fail(where, "4 x seqlen x head_dim overflows int64");
  if (tiled(hi) >= standard) return 0;
  std::int64_t lo = 0;  // invariant: tiled(lo) >= standard (or lo = 0), tiled(hi) < standard
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (tiled(mid) < standard ? hi : lo) = mid;
  }
  return hi;
}

DecodeTraffic decode_traffic(const DecodeParams& p) {
  constexpr const char* where = "io::decode_traffic";
  require_positive(where, "cache_len", p.cache_len);
  require_positive(where, "heads", p.heads);
  require_positive(where, "kv_heads", p.kv_heads);
  require_positive(where, "head_dim", p.head_dim);
  if (p.heads % p.kv_heads != 0)
    fail(where,
         "heads must be a multiple of kv_heads, got " + std::to_string(p.heads) + " and " + std::to_string(p.kv_heads));
  if (!(std::isfinite(p.element_bytes) && p.element_bytes > 0)) fail(where, "element_bytes must be finite and > 0");
  if (!(std::isfinite(p.bandwidth) && p.bandwidth > 0)) fail(where, "bandwidth must be finite and > 0 bytes/s");
  if (!(std::isfinite(p.derate) && p.derate > 0 && p.derate <= 1)) fail(where, "derate must be in (0, 1]");
  // Doubles, not int64: the figures are bytes and seconds, and a long cache times many heads must not
  // overflow on the way there.
  const double d = static_cast<double>(p.head_dim), b = p.element_bytes;
  DecodeTraffic t;
  t.kv_bytes = 2.0 * static_cast<double>(p.cache_len) * static_cast<double>(p.kv_heads) * d * b;
  t.read_bytes = t.kv_bytes + static_cast<double>(p.heads) * d * b;
  t.write_bytes = static_cast<double>(p.heads) * d * b;
  t.bytes = t.read_bytes + t.write_bytes;
  t.seconds = t.bytes / (p.bandwidth * p.derate);
  return t;
}

}  // namespace attn::io
