// The closed-form HBM traffic of standard attention, FlashAttention's Algorithm 1 and the
// FlashAttention-2 loop order (see include/attn/io_model.hpp for the formulas).
//
// Element counts are exact integers: the counted simulations (src/io/counted.cpp) must reproduce them
// to the element, so nothing here goes through floating point until bytes and seconds.
#include "attn/io_model.hpp"
#include "io/arg_checks.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace attn::io {
namespace {

using detail::fail;
using detail::require_positive;

std::string num(double v) {
  // Readable text for a double parameter (e.g. 0.8, 196608, nan).
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// Checked int64 arithmetic: a count that does not fit is a parameter error, not a wrong answer.
std::int64_t mul(const char* where, std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    fail(where, "element count overflows int64 (" + std::to_string(a) + " x " + std::to_string(b) + ")");
  return r;
}

std::int64_t add(const char* where, std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    fail(where, "element count overflows int64 (" + std::to_string(a) + " + " + std::to_string(b) + ")");
  return r;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// B = ceil(M / 4d): the key tile that lets K_j, V_j, Q_i, O_i (each B x d) share M elements.
std::int64_t block_for(const char* where, std::int64_t d, std::int64_t m) { return ceil_div(m, mul(where, 4, d)); }

void check_sizes(const char* where, std::int64_t n, std::int64_t d) {
  require_positive(where, "seqlen", n);
  require_positive(where, "head_dim", d);
}

void check_sizes(const char* where, std::int64_t n, std::int64_t d, std::int64_t m) {
  check_sizes(where, n, d);
  require_positive(where, "sram_elements", m);
}

Traffic traffic(std::int64_t elements, const ModelParams& p) {
  Traffic t;
  t.elements = elements;
  t.bytes = static_cast<double>(elements) * p.element_bytes;
  t.seconds = t.bytes / (p.bandwidth * p.derate);
  return t;
}

}  // namespace

std::int64_t standard_elements(std::int64_t n, std::int64_t d) {
  constexpr const char* where = "io::standard_elements";
  check_sizes(where, n, d);
  // 4Nd + 4N^2: Q, K in; S out; S in, P out; P, V in; O out.
  return add(where, mul(where, 4, mul(where, n, d)), mul(where, 4, mul(where, n, n)));
}

std::int64_t tiled_elements(std::int64_t n, std::int64_t d, std::int64_t m) {
  constexpr const char* where = "io::tiled_elements";
  check_sizes(where, n, d, m);
  const std::int64_t nd = mul(where, n, d);
  const std::int64_t passes = ceil_div(n, block_for(where, d, m));  // T_c
  // 2Nd + T_c (3Nd + 4N): K, V once; per pass Q in, O in and out, l and m in and out.
  const std::int64_t per_pass = add(where, mul(where, 3, nd), mul(where, 4, n));
  return add(where, mul(where, 2, nd), mul(where, passes, per_pass));
}

std::int64_t fa2_elements(std::int64_t n, std::int64_t d, std::int64_t m) {
  constexpr const char* where = "io::fa2_elements";
  check_sizes(where, n, d, m);
  const std::int64_t nd = mul(where, n, d);
  const std::int64_t passes = ceil_div(n, block_for(where, d, m));  // T_r
  // 2Nd + N + 2Nd T_r: Q in and O out once, the LSE out once, K and V in once per query tile.
  return add(where, add(where, mul(where, 2, nd), n), mul(where, mul(where, 2, nd), passes));
}

Report model(const ModelParams& p) {
  constexpr const char* where = "io::model";
  check_sizes(where, p.seqlen, p.head_dim);
  if (!(std::isfinite(p.element_bytes) && p.element_bytes > 0))
    fail(where, "element_bytes must be finite and > 0, got " + num(p.element_bytes));
  if (!(std::isfinite(p.sram_bytes) && p.sram_bytes >= p.element_bytes))
    fail(where, "sram_bytes must be finite and hold at least one element (>= element_bytes = " + num(p.element_bytes) +
                    "), got " + num(p.sram_bytes));
  if (!(std::isfinite(p.bandwidth) && p.bandwidth > 0))
    fail(where, "bandwidth must be finite and > 0 bytes/s, got " + num(p.bandwidth));
  if (!(std::isfinite(p.derate) && p.derate > 0 && p.derate <= 1))
    fail(where, "derate must be in (0, 1], got " + num(p.derate));
  const double m_elems = std::floor(p.sram_bytes / p.element_bytes);
  if (m_elems >= 9.0e18)  // beyond int64: no SRAM is that large, and the cast would be undefined
    fail(where, "sram_bytes / element_bytes must fit in int64, got " + num(m_elems));

  Report r;
  r.params = p;
  r.sram_elements = static_cast<std::int64_t>(m_elems);
  const std::int64_t n = p.seqlen, d = p.head_dim, m = r.sram_elements;

  r.standard = traffic(standard_elements(n, d), p);

  const std::int64_t b = block_for(where, d, m);
  r.tiled = traffic(tiled_elements(n, d, m), p);
  r.tiled.block_cols = b;
  r.tiled.block_rows = b < d ? b : d;  // B_r = min(B_c, d), as in the paper
  r.tiled.passes = ceil_div(n, b);

  r.fa2 = traffic(fa2_elements(n, d, m), p);
  r.fa2.block_rows = b;
  r.fa2.block_cols = b;
  r.fa2.passes = ceil_div(n, b);

  r.reduction = r.standard.bytes / r.tiled.bytes;
  r.score_matrix_bytes = static_cast<double>(mul(where, n, n)) * p.element_bytes;
  return r;
}

}  // namespace attn::io
