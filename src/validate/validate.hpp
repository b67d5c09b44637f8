// The view checks of validate.cpp, for entry points whose arguments are not a plain (q, k, v, out)
// problem (decode's KV caches). Each throws std::invalid_argument naming `who` and `arg` (see the rule
// list at the top of validate.cpp).
#pragma once

#include <cstdint>
#include <string_view>

#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "core/dropout.hpp"
#include "core/score_rule.hpp"

namespace attn::detail {

struct Span {  // byte range [lo, hi) a view may touch
  std::uintptr_t lo = 0, hi = 0;
  bool empty() const { return lo == hi; }
};

// Checks one view on its own (rank, sizes >= 1 or, for dim 1 with allow_empty_seqlen, >= 0, strides
// >= 0, overflow, null data) and returns its byte span. Rank 4 dims are named batch, seqlen, heads,
// head_dim; rank 3 batch, heads, seqlen_q.
// The quantized dtypes (i8, fp8) pass only with allow_quantized (decode's cache.k and cache.v).
Span check_view(std::string_view who, std::string_view arg, const TensorView& t, int rank, bool allow_empty_seqlen,
                bool allow_quantized = false);
// Outputs: every element must have its own address.
void check_no_self_alias(std::string_view who, std::string_view arg, const TensorView& t);
// The same test without throwing: a dim whose stride lets two elements share an address, or -1.
int aliasing_dim(const TensorView& t);
bool overlaps(Span a, Span b);
// "<arg>: <dim> must equal <other>'s (want), got got".
void require_equal(std::string_view who, std::string_view arg, const char* dim, std::int64_t got,
                   std::string_view other, std::int64_t want);

// The AttentionOptions every entry point shares, checked and resolved: the score rule (the scale is
// the option or 1/sqrt(head_dim); causal is folded into window_right = 0), the dropout rule (its
// `heads` set by `validate`, core/dropout.hpp) and the thread count. Problem and DecodeProblem carry it.
struct ResolvedOptions {
  ScoreRule rule;
  DropoutRule dropout;
  int num_threads;  // 0 = all cores
};

// Checks the shared options (scale, threads, window, softcap, ALiBi, dropout) and resolves them.
ResolvedOptions resolve_options(std::string_view who, const AttentionOptions& opts, std::int64_t head_dim);

// With dropout on, the sizes must keep the Philox counter of every element distinct (core/dropout.hpp):
// seqlen_q <= 2^32, seqlen_k <= 2^34, batch * heads <= 2^32. Nothing to check with dropout off.
void check_dropout_extent(std::string_view who, const DropoutRule& dropout, std::int64_t batch, std::int64_t heads,
                          std::int64_t seqlen_q, std::int64_t seqlen_k);

// The options' arrays against the problem's sizes (batch: the number of sequences; heads: query heads):
// alibi_slopes must hold (batch - 1) * alibi_batch_stride + heads values, sinks exactly heads.
void check_option_arrays(std::string_view who, const AttentionOptions& opts, std::int64_t batch, std::int64_t heads);

// For the entry points without dropout (the inference paths): dropout_p must be 0. `what` names the
// path in the message ("split-K is an inference path").
void reject_dropout(std::string_view who, const DropoutRule& dropout, std::string_view what);

// tiles.q_tile and tiles.k_tile, when set, must be >= 1.
void validate_tiles(std::string_view who, const TileOptions& tiles);

}  // namespace attn::detail
