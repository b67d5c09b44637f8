// The HBM traffic model of FlashAttention (Dao et al. 2022, section 3.2 and Theorem 2), for one head.
//
// Counts are in elements moved between HBM and on-chip SRAM; bytes = elements x element size.
//   standard (Algorithm 0):  read Q,K (2Nd), write S (N^2); read S, write P (2N^2); read P,V (N^2+Nd),
//                            write O (Nd)                                  -> 4Nd + 4N^2
//   tiled (Algorithm 1), M elements of SRAM: B_c = ceil(M / 4d), B_r = min(B_c, d), T_c = ceil(N / B_c)
//                            passes over the queries. Each pass reads its K_j, V_j once (2Nd over all
//                            passes) and reads Q, O and writes O, and reads and writes l and m
//                            -> 2Nd + T_c (3Nd + 4N)
//   FlashAttention-2 order (outer loop over query tiles, inner over key/value tiles), with
//                            B_r = B_c = ceil(M / 4d) (Q_i, O_i, K_j, V_j each B x d fill the SRAM),
//                            T_r = ceil(N / B_r): Q read once (Nd), K and V read once per query tile
//                            (2Nd T_r), O written once (Nd), the LSE written once (N)
//                            -> 2Nd + N + 2Nd T_r
// The counted simulations run those schedules on real data through an instrumented memory and must
// reproduce these closed forms exactly.
#pragma once

#include <cstdint>

namespace attn::io {

struct ModelParams {
  std::int64_t seqlen = 4096;        // N
  std::int64_t head_dim = 64;        // d
  double sram_bytes = 192.0 * 1024;  // on-chip memory per multiprocessor (A100: 192 KB)
  double element_bytes = 2;          // 16-bit
  double bandwidth = 3.35e12;        // bytes/s (H100 SXM HBM3)
  double derate = 0.8;               // fraction of the bandwidth achieved
};

struct Traffic {
  std::int64_t elements = 0;
  double bytes = 0;
  double seconds = 0;
  std::int64_t block_rows = 0;  // B_r (0 for the standard algorithm)
  std::int64_t block_cols = 0;  // B_c
  std::int64_t passes = 0;      // T_c for Algorithm 1, T_r for FlashAttention-2
};

struct Report {
  ModelParams params;
  std::int64_t sram_elements = 0;  // M = floor(sram_bytes / element_bytes)
  Traffic standard, tiled, fa2;
  double reduction = 0;           // standard.bytes / tiled.bytes
  double score_matrix_bytes = 0;  // one N x N matrix
};

// Throws std::invalid_argument (naming the parameter) for non-positive sizes, or an SRAM too small to
// hold one element.
Report model(const ModelParams& p);

// Closed forms on their own (elements), for a given M in elements.
std::int64_t standard_elements(std::int64_t n, std::int64_t d);
std::int64_t tiled_elements(std::int64_t n, std::int64_t d, std::int64_t m);
std::int64_t fa2_elements(std::int64_t n, std::int64_t d, std::int64_t m);

// Runs a schedule on random f64 data (seeded) with every HBM access counted.
struct Counted {
  std::int64_t reads = 0;
  std::int64_t writes = 0;
  std::int64_t elements = 0;            // reads + writes
  std::int64_t sram_peak_elements = 0;  // largest on-chip working set the schedule held at once
  double max_abs_diff = 0;              // its output against attention_reference
};
Counted count_algorithm1(std::int64_t n, std::int64_t d, std::int64_t m, std::uint64_t seed = 1);
Counted count_fa2(std::int64_t n, std::int64_t d, std::int64_t m, std::uint64_t seed = 1);

}  // namespace attn::io

// ---- Planning figures built on the closed forms (src/io/planning.cpp) ------------------------------

namespace attn::io {

// The smallest SRAM, in elements, at which the tiled schedule moves fewer elements than the standard
// one for this N and d: Algorithm 1 (fa2 = false) or the FlashAttention-2 order (fa2 = true). Both
// counts only fall as M grows (T_c = ceil(N / ceil(M / 4d)) never rises), so the answer is a step, found
// by bisection on the closed forms themselves. 0 when no SRAM wins: even one pass (M >= 4Nd) moves
// more (d + 4 >= 4N for Algorithm 1). Throws std::invalid_argument for n or d < 1.
std::int64_t break_even_sram_elements(std::int64_t n, std::int64_t d, bool fa2);

// One decode step (one new query per sequence) over a KV cache of cache_len tokens, per layer: the
// kernel reads K and V (2 x cache_len x kv_heads x head_dim elements) and q (heads x head_dim), and
// writes the output (heads x head_dim). Bandwidth-bound: seconds = bytes / (bandwidth x derate).
struct DecodeParams {
  std::int64_t cache_len = 4096;
  std::int64_t heads = 32;
  std::int64_t kv_heads = 8;
  std::int64_t head_dim = 128;
  double element_bytes = 2;
  double bandwidth = 3.35e12;
  double derate = 0.8;
};
struct DecodeTraffic {
  double kv_bytes = 0;     // the cache read: what grows with the context
  double read_bytes = 0;   // kv_bytes + q
  double write_bytes = 0;  // the output
  double bytes = 0;        // read + write
  double seconds = 0;
};
// Throws std::invalid_argument (naming the field) for non-positive sizes, heads not a multiple of
// kv_heads, a non-finite or non-positive element size or bandwidth, or a derate outside (0, 1].
DecodeTraffic decode_traffic(const DecodeParams& p);

}  // namespace attn::io
