// Options shared by every attention entry point, and the per-algorithm knobs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <utility>

namespace attn {

// A read-only array of f32 values and its length, for the options' per-head values (ALiBi slopes,
// sinks): the length is checked against the problem's heads and batch, as a tensor's shape is, so a
// short array is a named error instead of a read past its end. Holds no memory. {} (or nullptr) = off.
struct F32Array {
  const float* data = nullptr;
  std::int64_t size = 0;

  constexpr F32Array() = default;
  constexpr F32Array(std::nullptr_t) {}
  constexpr F32Array(const float* values, std::int64_t count) : data(values), size(count) {}
  // Any contiguous container of float: std::vector<float>, std::array<float, N>, float[N].
  template <class C, class = decltype(std::data(std::declval<const C&>())),
            class = decltype(std::size(std::declval<const C&>()))>
  constexpr F32Array(const C& values) : data(std::data(values)), size(static_cast<std::int64_t>(std::size(values))) {}

  constexpr explicit operator bool() const { return data != nullptr; }
  constexpr const float& operator[](std::int64_t i) const { return data[i]; }
  // The values from index `first` on (one sequence's slopes within a batch's).
  constexpr F32Array from(std::int64_t first) const { return {data + first, size - first}; }
};

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
  // set of slopes across the batch. The array must hold (batch - 1) * alibi_batch_stride + heads values
  // (batch: the number of sequences). {} = off.
  F32Array alibi_slopes;
  std::int64_t alibi_batch_stride = 0;
  // Attention sinks (gpt-oss; FlashAttention-3's s_aux): sinks[h], f32, one learned logit per query head
  // that joins the softmax denominator of every row of head h and has no value row:
  //   out_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij) + exp(sinks[h]))
  // The sink is a raw logit (not scaled, capped, biased or masked), dropout never drops it, and the lse
  // includes it (log(sum_j exp(s_ij) + exp(sinks[h]))), so out and lse keep their usual relation and a
  // row that sees no key gets out = 0, lse = sinks[h]. -inf means no sink for that head. The array holds
  // exactly heads values (the query heads). {} = off.
  // Accepted by every entry point (split-K and decode fold it in once, after their merges; on the CUDA
  // backend a device pointer) and the backward (its gradient dsink).
  F32Array sinks;
  // Threads for this call; 0 = all available (OpenMP's default). Results do not depend on it.
  int num_threads = 0;
  // Dropout on the attention weights (flash-attn's dropout_p), for training: each softmax weight P_ij
  // is kept with probability 1 - dropout_p and then scaled by 1 / (1 - dropout_p), or set to 0; the
  // output is sum_j (keep_ij / (1 - p)) P_ij v_j while lse stays the log-sum-exp of the undropped
  // scores. dropout_p must be in [0, 1); 0 = off. The keep mask is a pure function of (dropout_seed,
  // dropout_offset, b, h, i, j) (Philox 4x32-10, docs/dropout.md): the backward regenerates it from the
  // same options, and no result depends on tile sizes or threads. Use a new offset (or seed) per call
  // for a new mask; dropout_offset must be < 2^32. Accepted by attention_reference, attention_tiled,
  // attention_varlen, attention_varlen_paged (the mask of attention_varlen on the same keys packed) and
  // every backward (attn::dropout_mask writes the mask); the inference paths (split-K, decode, ring
  // attention, the CUDA entry points) reject dropout_p > 0.
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
