// The ring's time model (`attn io --ring`, docs/distributed.md): per ring step, one rank's compute on
// a pair of chunks against the transfer of one k/v chunk over the link to its neighbour.
//
// With R ranks holding c = N / R rows each (zigzag under a causal mask, so every rank and every step
// does the same work):
//   compute per step   t_c = 4 c^2 H d f / rate          f = 1/2 causal, 1 full (QK^T and PV, 2 flops
//                                                        per multiply-add)
//   transfer per step  t_t = latency + 2 c H_kv d b / bandwidth      (k and v, b bytes per element)
//   ring time          T = t_c + (R - 1) max(t_c, t_t)   (the first step computes on the rank's own
//                                                        chunk; each later one waits for the slower)
//   one rank alone     T_1 = 4 N^2 H d f / rate,  efficiency = T_1 / (R T)
// The transfer hides behind the compute when t_t <= t_c, i.e. for chunks of at least
//   c* = (beta + sqrt(beta^2 + 4 alpha latency)) / (2 alpha),  alpha = 4 H d f / rate,
//   beta = 2 H_kv d b / bandwidth,
// rows per rank: compute grows with c^2, the transfer with c.
#pragma once

#include <cstdint>

namespace attn::io {

struct RingParams {
  std::int64_t seqlen = 131072;  // N, the whole sequence
  std::int64_t heads = 32, kv_heads = 8, head_dim = 128;
  std::int64_t ranks = 8;
  double element_bytes = 2;
  bool causal = true;
  double flop_rate = 2e12;         // per rank, flop/s sustained by the attention kernel
  double link_bandwidth = 12.5e9;  // bytes/s each way (100 Gb/s)
  double latency = 5e-6;           // seconds per message
};

struct RingReport {
  RingParams params;
  double chunk_rows = 0;   // c = N / R
  double step_flops = 0;   // one rank, one step
  double chunk_bytes = 0;  // one k/v chunk
  double compute_s = 0;    // t_c
  double transfer_s = 0;   // t_t
  bool hidden = false;     // t_t <= t_c
  double ring_s = 0;       // T
  double one_rank_s = 0;   // T_1
  double efficiency = 0;   // T_1 / (R T)
  double hide_rows = 0;    // c*
  double hide_seqlen = 0;  // R c*: the shortest sequence whose transfers hide at this R
};

// Throws std::invalid_argument naming the parameter for non-positive sizes, rates or bandwidths, a
// negative latency, or kv_heads not dividing heads.
RingReport ring_model(const RingParams& p);

}  // namespace attn::io
