// One rank's part of a sharded KV decode, without the transport: attn_mpi's sharded_decode
// (sharded_decode.cpp) and the Python package's attn.distributed.sharded_decode both decode a rank's
// slice here and merge the ranks' partial states in rank order, each over its own transport.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "attn/decode.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn::detail {

// Sequence b's keys are rank 0's seqlens[b] keys, then rank 1's, and so on: on rank `rank` they are
// followed by those of the later ranks, key_shift[b] = sum over x > rank of seqlens[x][b], which moves
// the slice's diagonal (masks, windows, ALiBi distances) to where its keys lie in the whole sequence.
// all_seqlens: every rank's [batch] key counts, rank after rank.
std::vector<std::int64_t> slice_key_shift(const std::vector<std::int64_t>& all_seqlens, std::int64_t batch, int rank);

// This rank's partial state of its slice: attention_decode's kernel over `slice` with the whole
// sequence's masks (key_shift as above, [batch]) and without the sinks (they are folded once, after
// the merge), written into out [batch, seqlen_q, heads, head_dim_v] and lse [batch, heads, seqlen_q],
// both of the accumulator type (f64 for f64 caches, else f32); q is read in that type. Validates as
// attention_decode does (std::invalid_argument naming `who` and the argument) before writing.
void decode_slice_partial(std::string_view who, const TensorView& q, const KVCache& slice, const AttentionOptions& opts,
                          const DecodeOptions& dec, const std::int64_t* key_shift, const TensorView& out,
                          const TensorView& lse);

}  // namespace attn::detail
