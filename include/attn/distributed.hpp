// Context parallelism over MPI: attention over a sequence spread across the ranks of a communicator,
// exact (f64 within 1e-12 of attention_tiled / attention_decode on the whole sequence, for any rank
// count and any split). Built into libattn_mpi (CMake target attn::attn_mpi) when MPI is found;
// docs/distributed.md.
//
// Every call is collective: all ranks of `comm` call it with the same options. Each rank validates its
// own arguments and then the ranks compare theirs (dtypes, batch, heads, head dims, the options, and
// the layout's rules); if any rank's are bad, every rank throws the same std::invalid_argument -- the
// message of the lowest such rank, naming the argument, the rule and the rank -- and no rank writes
// its outputs. A rank that dies mid-call ends the job through MPI's default error handler
// (MPI_ERRORS_ARE_FATAL): mpirun reports the dead rank and stops the others; nothing waits forever.
#pragma once

#include <mpi.h>

#include <cstdint>

#include "attn/decode.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

// How the whole sequence's rows are spread over R ranks.
enum class RingLayout {
  contiguous,  // rank r holds rows [sum of ranks < r's lengths, + its own): any lengths, uneven too
  zigzag,      // cut into 2R chunks; rank r holds chunk r then chunk 2R-1-r, half its rows each (even
               // lengths): under a causal mask every rank then does the same work
};

struct RingOptions {
  RingLayout layout = RingLayout::contiguous;
};

// What a ring call did on this rank: the (query segment, key segment) blocks of the score matrix it
// computed, and those the mask hides entirely, which it skipped.
struct RingStats {
  std::int64_t blocks_computed = 0, blocks_skipped = 0;
};

// Ring attention (the forward pass; ring_attention_backward below is its backward). Rank r holds its rows of the whole
// q and of the whole k and v, each spread by the layout (the query and key sequences may differ in length; masks are
// those of the whole (seqlen_q, seqlen_k) problem, bottom-right aligned as in attention.hpp):
//   q [batch, rows_q(r), heads, head_dim], k [batch, rows_k(r), kv_heads, head_dim],
//   v [batch, rows_k(r), kv_heads, head_dim_v], out [batch, rows_q(r), heads, head_dim_v],
//   lse [batch, heads, rows_q(r)] (optional, per rank).
// The k/v chunks travel around the ring (rank r sends to r + 1 and receives from r - 1), each step's
// transfer posted before that step's compute so that they overlap; each rank folds every chunk into
// its rows' states in ring order (its own chunk first), so results are the same for any thread count.
// Every mask, GQA, softcap, ALiBi and sinks (folded once, after the last chunk) as in attention_tiled;
// dropout is not supported (dropout_p must be 0). For f32, bf16 and f16 the blocks' partial outputs
// are kept in f32.
void ring_attention(MPI_Comm comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const AttentionOptions& opts = {}, const RingOptions& ring = {}, const TensorView* lse = nullptr,
                    RingStats* stats = nullptr);

// The backward of ring_attention: each rank passes its rows of q, out, dout and lse (the forward's:
// out and lse as ring_attention wrote them) and its k/v rows, and gets its rows' dq and its k/v rows'
// dk and dv (shapes and dtypes as in attention_backward, backward.hpp; written, not added to). The
// k/v chunks travel the ring as in the forward, each with its running dk, dv (f32 for bf16 and f16),
// which every rank adds its blocks to and which return to the chunk's owner after the last step.
// dsink (optional, with sinks): the whole sequence's, the ranks' parts summed in rank order. The same
// options as the forward; the result is the same for any thread count.
void ring_attention_backward(MPI_Comm comm, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& dout, const TensorView& lse, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const AttentionOptions& opts = {},
                             const RingOptions& ring = {}, const TensorView* dsink = nullptr,
                             RingStats* stats = nullptr);

// How the ranks' partial results of a sharded decode are combined.
enum class ShardMerge {
  rank_order,  // every rank gathers all partials and merges them in rank order: bitwise the same
               // result on every rank, for any thread count
  allreduce,   // MPI_Allreduce with the merge as a user-defined operation (commutative, associative up
               // to rounding); MPI chooses the order
};

// Sharded KV decode: every rank holds the same q and its own slice of each sequence's cache; sequence
// b's keys are rank 0's cache.seqlens[b] keys, then rank 1's, and so on. Each rank decodes its slice
// (attention_decode's kernel, with the masks and ALiBi distances of the whole sequence) to a partial
// state, and the partials are merged; every rank writes the whole out and lse. q, out, lse and the
// options as in attention_decode (include/attn/decode.hpp); the slice may be contiguous or paged, of
// any cache type, and may hold no keys. Appending (k_new, v_new), rotary and cache.leftpad are not
// supported here (each rank owns its slice: append to the last rank's with attention_decode).
void sharded_decode(MPI_Comm comm, const TensorView& q, const KVCache& slice, const TensorView& out,
                    const AttentionOptions& opts = {}, const DecodeOptions& decode = {},
                    ShardMerge merge = ShardMerge::rank_order, const TensorView* lse = nullptr);

}  // namespace attn
