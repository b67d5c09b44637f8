// The ring's time model (include/attn/ring_model.hpp).
#include "attn/ring_model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace attn::io {
namespace {

void require_positive(const char* name, double x) {
  if (!(x > 0) || !std::isfinite(x))
    throw std::invalid_argument(std::string("attn::io::ring_model: ") + name + ": must be > 0 and finite, got " +
                                std::to_string(x));
}

}  // namespace

RingReport ring_model(const RingParams& p) {
  require_positive("seqlen", static_cast<double>(p.seqlen));
  require_positive("heads", static_cast<double>(p.heads));
  require_positive("kv_heads", static_cast<double>(p.kv_heads));
  require_positive("head_dim", static_cast<double>(p.head_dim));
  require_positive("ranks", static_cast<double>(p.ranks));
  require_positive("element_bytes", p.element_bytes);
  require_positive("flop_rate", p.flop_rate);
  require_positive("link_bandwidth", p.link_bandwidth);
  if (!(p.latency >= 0) || !std::isfinite(p.latency))
    throw std::invalid_argument("attn::io::ring_model: latency: must be >= 0 and finite, got " +
                                std::to_string(p.latency));
  if (p.heads % p.kv_heads)
    throw std::invalid_argument("attn::io::ring_model: kv_heads: must divide heads (" + std::to_string(p.heads) + ")");
  RingReport r;
  r.params = p;
  const double f = p.causal ? 0.5 : 1.0, H = static_cast<double>(p.heads), d = static_cast<double>(p.head_dim);
  const double R = static_cast<double>(p.ranks), N = static_cast<double>(p.seqlen);
  r.chunk_rows = N / R;
  r.step_flops = 4 * r.chunk_rows * r.chunk_rows * H * d * f;
  r.chunk_bytes = 2 * r.chunk_rows * static_cast<double>(p.kv_heads) * d * p.element_bytes;
  r.compute_s = r.step_flops / p.flop_rate;
  r.transfer_s = p.latency + r.chunk_bytes / p.link_bandwidth;
  r.hidden = r.transfer_s <= r.compute_s;
  r.ring_s = r.compute_s + (R - 1) * std::max(r.compute_s, r.transfer_s);
  r.one_rank_s = 4 * N * N * H * d * f / p.flop_rate;
  r.efficiency = r.one_rank_s / (R * r.ring_s);
  const double alpha = 4 * H * d * f / p.flop_rate;
  const double beta = 2 * static_cast<double>(p.kv_heads) * d * p.element_bytes / p.link_bandwidth;
  r.hide_rows = (beta + std::sqrt(beta * beta + 4 * alpha * p.latency)) / (2 * alpha);
  r.hide_seqlen = R * r.hide_rows;
  return r;
}

}  // namespace attn::io
