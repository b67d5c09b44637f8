// The score rule: everything that turns a dot product q . k into a softmax logit, and which keys a
// query sees. It is resolved once from AttentionOptions (resolve_options, validate/validate.cpp) and carried
// unchanged to every kernel -- reference, tiled, split-K, varlen, decode, and the CUDA kernels (host +
// device, like online_softmax.hpp). A new score transform is a field here, its resolution and its
// tests, and each kernel's use of `logit` or of the fields it vectorises.
//
// Window arithmetic saturates: a window wider than any sequence is "unbounded on that side", so
// window_left = window_right = INT64_MAX means the same as -1 and never overflows.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "attn/host_device.hpp"

namespace attn::detail {

struct Mask;

struct ScoreRule {
  double scale = 1;                     // multiplies q . k (finite)
  double softcap = 0;                   // s = softcap tanh(s / softcap); 0 = off
  std::int64_t window_left = -1;        // -1 = unbounded
  std::int64_t window_right = -1;       // -1 = unbounded; causal is folded in as 0
  const float* alibi_slopes = nullptr;  // slope of (b, h) = alibi_slopes[b * alibi_batch_stride + h]
  std::int64_t alibi_batch_stride = 0;  // 0: one set of slopes for the whole batch
  const float* sinks = nullptr;         // sink logit of query head h = sinks[h]; nullptr = none
  // Moves every query's diagonal position by this many keys: the problem is then the block of a larger
  // one whose queries and keys start elsewhere (ring attention's chunk pairs, a rank's slice of a
  // sharded cache; src/distributed/). 0 for every public entry point.
  std::int64_t diagonal_shift = 0;

  // Whether any transform beyond the scale applies (kernels pick their fast path on it).
  ATTN_HOST_DEVICE bool transforms_scores() const { return softcap > 0 || alibi_slopes != nullptr; }
  ATTN_HOST_DEVICE float alibi_slope(std::int64_t b, std::int64_t h) const {
    return alibi_slopes ? alibi_slopes[b * alibi_batch_stride + h] : 0.0f;
  }
  // Head h's sink logit (AttentionOptions::sinks), -inf without sinks: fold_sink's argument.
  ATTN_HOST_DEVICE float sink(std::int64_t h) const {
    return sinks ? sinks[h] : -std::numeric_limits<float>::infinity();
  }
  // The rule of sequence b of a batch, as a batch of one (varlen's and decode's per-sequence problems).
  ATTN_HOST_DEVICE ScoreRule for_sequence(std::int64_t b) const {
    ScoreRule r = *this;
    if (alibi_slopes) r.alibi_slopes = alibi_slopes + b * alibi_batch_stride;
    r.alibi_batch_stride = 0;
    return r;
  }
  // The logit of a visible key: scaled, soft-capped, then ALiBi-biased by `slope` times the distance
  // of key j from query i's diagonal position.
  template <class A>
  ATTN_HOST_DEVICE A logit(A dot, std::int64_t distance, A slope) const {
    A s = dot * static_cast<A>(scale);
    if (softcap > 0) s = static_cast<A>(softcap) * std::tanh(s / static_cast<A>(softcap));
    if (slope != A(0)) s -= slope * static_cast<A>(distance < 0 ? -distance : distance);
    return s;
  }
  // d logit / d dot, for the backward pass: the scale times the soft-cap's derivative sech^2(u) at
  // u = dot * scale / softcap. ALiBi is additive (its slopes get no gradient).
  template <class A>
  ATTN_HOST_DEVICE A logit_grad(A dot) const {
    const A s = static_cast<A>(scale);
    if (!(softcap > 0)) return s;
    return s * softcap_slope(dot * s / static_cast<A>(softcap));
  }
  // sech^2(u) = 1 - tanh^2(u), as 4e / (1 + e)^2 with e = exp(-2|u|): a few ulps everywhere. Where the
  // logits saturate 1 - t * t keeps only the rounding error of t = tanh(u) next to 1 (at u = 15, 3e-4 of
  // the value in f64). The SIMD backward computes the same expression (backward_blocks-inl.h, GradStep).
  template <class A>
  ATTN_HOST_DEVICE static A softcap_slope(A u) {
    const A e = std::exp(A(-2) * (u < A(0) ? -u : u));
    return A(4) * e / ((A(1) + e) * (A(1) + e));
  }
  ATTN_HOST_DEVICE Mask mask(std::int64_t seqlen_q, std::int64_t seqlen_k) const;
};

// The rule applied to one (seqlen_q, seqlen_k) pair. Query i sees exactly the keys
// [first_key(i), end_key(i)); both are non-decreasing in i. Masks are aligned to the bottom-right
// corner (flash-attn >= 2.1): query i sits at key position diagonal(i) = i + seqlen_k - seqlen_q
// (+ rule.diagonal_shift for a block of a larger problem). A fully masked row has first_key(i) >= end_key(i).
struct Mask {
  std::int64_t seqlen_q, seqlen_k;
  ScoreRule rule;

  ATTN_HOST_DEVICE std::int64_t diagonal(std::int64_t i) const {
    return seqlen_k - (seqlen_q - i) + rule.diagonal_shift;
  }
  // Both ends compute a difference with the window only where it lies strictly inside (0, seqlen_k), so
  // neither a huge window nor a shifted diagonal overflows.
  ATTN_HOST_DEVICE std::int64_t first_key(std::int64_t i) const {
    const std::int64_t diag = diagonal(i);
    if (rule.window_left < 0 || rule.window_left >= diag) return 0;
    return diag - rule.window_left < seqlen_k ? diag - rule.window_left : seqlen_k;
  }
  ATTN_HOST_DEVICE std::int64_t end_key(std::int64_t i) const {
    const std::int64_t diag = diagonal(i);
    // diag + window_right + 1 >= seqlen_k, written so that a huge window cannot overflow.
    if (rule.window_right < 0 || rule.window_right >= seqlen_k - diag - 1) return seqlen_k;
    return diag + rule.window_right + 1 > 0 ? diag + rule.window_right + 1 : 0;
  }
  ATTN_HOST_DEVICE std::int64_t visible_count(std::int64_t i) const {
    const std::int64_t n = end_key(i) - first_key(i);
    return n > 0 ? n : 0;
  }
  // The keys some query sees: [first_key(0), first_key(0) + seen_count()), the union of every query's
  // (the ends are non-decreasing in i). Decode's slices cut this range.
  ATTN_HOST_DEVICE std::int64_t seen_count() const {
    const std::int64_t n = end_key(seqlen_q - 1) - first_key(0);
    return n > 0 ? n : 0;
  }
  // The keys of the tile [j0, j0 + n) that query i sees, relative to j0: [lo, hi) with 0 <= lo <= hi <= n
  // (lo = hi: none). Every kernel's per-row tile bounds come from here.
  struct TileKeys {
    std::int64_t lo, hi;
  };
  ATTN_HOST_DEVICE TileKeys tile_keys(std::int64_t i, std::int64_t j0, std::int64_t n) const {
    return cut_to_tile(first_key(i), end_key(i), j0, n);
  }
  // The same for a row whose [first_key, end_key) a kernel looked up once for many tiles (decode).
  ATTN_HOST_DEVICE static TileKeys cut_to_tile(std::int64_t first_key, std::int64_t end_key, std::int64_t j0,
                                               std::int64_t n) {
    const std::int64_t first = first_key - j0, end = end_key - j0;
    const std::int64_t lo = first < 0 ? 0 : (first > n ? n : first);
    const std::int64_t hi = end < lo ? lo : (end > n ? n : end);
    return {lo, hi};
  }
  // Whether a row's scores need more than the scale: a soft-cap, or its ALiBi slope when that is not 0
  // (a kernel that knows the row's slope; ScoreRule::transforms_scores asks of any row).
  ATTN_HOST_DEVICE bool transforms_scores(float slope) const { return rule.softcap > 0 || slope != 0.f; }
  // The logit of visible key j for query i (ScoreRule::logit at this pair's distance).
  template <class A>
  ATTN_HOST_DEVICE A score(A dot, std::int64_t i, std::int64_t j, A slope) const {
    return rule.logit(dot, diagonal(i) - j, slope);
  }
};

ATTN_HOST_DEVICE inline Mask ScoreRule::mask(std::int64_t seqlen_q, std::int64_t seqlen_k) const {
  return {seqlen_q, seqlen_k, *this};
}

}  // namespace attn::detail
