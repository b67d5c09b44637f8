// Options shared by every attention entry point, and the per-algorithm knobs.
#pragma once

#include <cstdint>
#include <optional>

namespace attn {

struct AttentionOptions {
  // Multiplies q . k. Default 1 / sqrt(head_dim). Must be finite.
  std::optional<double> softmax_scale;
  // Causal mask aligned to the bottom-right corner (flash-attn >= 2.1): with seqlen_q != seqlen_k,
  // query i sees keys j <= i + seqlen_k - seqlen_q. A query that sees no key gets out = 0, lse = -inf.
  bool causal = false;
  // Sliding window (flash-attn's window_size): query i sees keys j with
  //   i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right,
  // -1 meaning unbounded on that side. causal is window_right = 0 (and overrides a larger one).
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  // Soft-capping of the scaled scores (Gemma 2, Grok): s = softcap * tanh(s / softcap); 0 = off.
  double softcap = 0;
  // ALiBi: adds -slope * |i + seqlen_k - seqlen_q - j| to the (scaled, capped) score of query i and key
  // j. slope of (batch b, head h) = alibi_slopes[b * alibi_batch_stride + h], f32; stride 0 shares one
  // set of slopes across the batch. nullptr = off.
  const float* alibi_slopes = nullptr;
  std::int64_t alibi_batch_stride = 0;
  // Attention sinks (gpt-oss; FlashAttention-3's s_aux): sinks[h], f32, one learned logit per query head
  // that joins the softmax denominator of every row of head h and has no value row:
  //   out_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij) + exp(sinks[h]))
  // The sink is a raw logit (not scaled, capped, biased or masked), dropout never drops it, and the lse
  // includes it (log(sum_j exp(s_ij) + exp(sinks[h]))), so out and lse keep their usual relation and a
  // row that sees no key gets out = 0, lse = sinks[h]. -inf means no sink for that head. nullptr = off.
  // Accepted by every entry point (split-K and decode fold it in once, after their merges; on the CUDA
  // backend a device pointer) and the backward (its gradient dsink).
  const float* sinks = nullptr;
  // Threads for this call; 0 = all available (OpenMP's default). Results do not depend on it.
  int num_threads = 0;
  // Dropout on the attention weights (flash-attn's dropout_p), for training: each softmax weight P_ij
  // is kept with probability 1 - dropout_p and then scaled by 1 / (1 - dropout_p), or set to 0; the
  // output is sum_j (keep_ij / (1 - p)) P_ij v_j while lse stays the log-sum-exp of the undropped
  // scores. dropout_p must be in [0, 1); 0 = off. The keep mask is a pure function of (dropout_seed,
  // dropout_offset, b, h, i, j) (Philox 4x32-10, docs/dropout.md): the backward regenerates it from the
  // same options, and no result depends on tile sizes or threads. Use a new offset (or seed) per call
  // for a new mask; dropout_offset must be < 2^32. Accepted by attention_reference, attention_tiled,
  // attention_varlen and every backward (attn::dropout_mask writes the mask); the inference paths
  // (split-K, decode, the CUDA entry points) reject dropout_p > 0.
  double dropout_p = 0;
  std::uint64_t dropout_seed = 0;
  std::uint64_t dropout_offset = 0;
};

// Tile sizes for the tiled algorithm; unset = chosen from the cache sizes (plan_tiles, src/heuristics/cpu.cpp).
// Any value from 1 to the whole sequence is valid and gives the same result up to rounding.
struct TileOptions {
  std::optional<std::int64_t> q_tile;  // queries per tile (B_r)
  std::optional<std::int64_t> k_tile;  // keys per tile (B_c)
};

// Split-K: the keys each query row sees are cut into `num_splits` contiguous slices of near-equal size,
// each reduced to a partial state, and the partials merged in slice order. num_splits may exceed the
// number of keys; empty slices contribute the neutral state.
struct SplitKOptions {
  std::int64_t num_splits = 1;
};

}  // namespace attn
