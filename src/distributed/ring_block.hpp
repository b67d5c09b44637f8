// Context parallelism's arithmetic without its transport: one rank's queries folded over the key
// chunks of the whole sequence, one chunk at a time, in any order (src/distributed/ring.cpp moves the
// chunks between ranks over MPI; tests/test_ring_block.cpp drives every rank in one process).
//
// A (query segment, key segment) pair is a block of the whole problem's score matrix. It runs through
// the tiled kernel as a problem of its own whose diagonal is shifted (ScoreRule::diagonal_shift) to
// where the block lies, so every mask, window and ALiBi distance is the whole sequence's; its output
// and lse, written in the accumulator type (f32 for bf16 and f16 inputs, which the kernel reads as
// they are), are merged into the rank's running states
// (merge/merge_output.hpp); the sinks are folded once, after the last chunk. A block the mask hides
// entirely is skipped, not computed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "validate/problem.hpp"

namespace attn::detail {

// A run of a rank's rows and where it starts in the whole sequence.
struct Segment {
  std::int64_t local_begin, length, global_begin;
};

// Rank `rank`'s segments when the whole sequence is spread over lengths.size() ranks with lengths[r]
// rows on rank r: in rank order (one segment each), or zigzag (the sequence cut into 2R chunks, rank r
// holding chunk r and then chunk 2R-1-r, lengths[r] / 2 rows each; every length even), which gives
// every rank the same causal work.
std::vector<Segment> ring_segments(bool zigzag, const std::vector<std::int64_t>& lengths, int rank);

// Whether any query of segment qs sees any key of segment ks under `rule`'s mask of the whole
// (total_q, total_k) problem.
bool block_visible(const ScoreRule& rule, std::int64_t total_q, std::int64_t total_k, const Segment& qs,
                   const Segment& ks);

// The diagonal shift (ScoreRule::diagonal_shift) that makes block (qs, ks), run as a problem of its own,
// see the whole (total_q, total_k) problem's mask: its query i is the whole problem's query
// qs.global_begin + i, whose diagonal is key position (qs.global_begin + i) + total_k - total_q, i.e.
// the block's key i + shift + ks.length - qs.length.
inline std::int64_t block_shift(std::int64_t total_q, std::int64_t total_k, const Segment& qs, const Segment& ks) {
  return qs.global_begin + total_k - total_q - ks.global_begin - (ks.length - qs.length);
}

struct BlockCounts {
  std::int64_t computed = 0, skipped = 0;
};

// Calls f(qs, ks) for every non-empty block of q_segs x k_segs that the mask does not hide entirely,
// in segment order, and counts the blocks computed and skipped.
template <class F>
void for_each_visible_block(const ScoreRule& rule, std::int64_t total_q, std::int64_t total_k,
                            const std::vector<Segment>& q_segs, const std::vector<Segment>& k_segs, BlockCounts& counts,
                            F&& f) {
  for (const Segment& qs : q_segs)
    for (const Segment& ks : k_segs) {
      if (qs.length == 0 || ks.length == 0) continue;
      if (!block_visible(rule, total_q, total_k, qs, ks)) {
        ++counts.skipped;
        continue;
      }
      ++counts.computed;
      f(qs, ks);
    }
}

// A rank's view copied (and converted) into a dense [shape] buffer of `dtype` that it owns.
struct DenseCopy {
  std::vector<std::byte> bytes;
  TensorView view;
};
// A dense view of `shape` over bytes (its size already shape's elements x dtype's size).
TensorView dense_view(std::vector<std::byte>& bytes, std::array<std::int64_t, 4> shape, DType dtype);
// A dense zeroed [shape] buffer of `dtype`, and one holding src converted to `dtype`.
DenseCopy dense_zeros(std::array<std::int64_t, 4> shape, DType dtype);
DenseCopy dense_copy(const TensorView& src, DType dtype);
// dst <- src, element by element, converted (same shapes, any strides and dtypes).
void convert_into(const TensorView& src, const TensorView& dst);
// The segment's rows of a view along dimension `dim` (1 for [b, s, h, d] tensors, 2 for lse [b, h, s]).
TensorView rows_of(const TensorView& t, const Segment& seg, int dim = 1);

class RingAccumulator {
 public:
  // `local`: the validated problem of this rank's q, k, v, out and lse, whose rule (sinks included)
  // and threads every block uses; q_segs: its query segments; total_q, total_k: the whole sequence's.
  RingAccumulator(const Problem& local, std::vector<Segment> q_segs, std::int64_t total_q, std::int64_t total_k);

  // Folds the blocks of one key chunk: k, v [batch, rows, kv_heads, head_dim / head_dim_v] of the
  // local problem's dtype, whose rows form the segments k_segs.
  void fold_chunk(const TensorView& k, const TensorView& v, const std::vector<Segment>& k_segs, BlockCounts& counts);

  // Folds the sinks, finalizes every row and writes the local problem's out and lse.
  void finish();

 private:
  template <class A>
  void fold_block(const TensorView& k, const TensorView& v, const Segment& qs, const Segment& ks);
  template <class A>
  void finish_rows();

  Problem local_;
  std::vector<Segment> q_segs_;
  std::int64_t total_q_, total_k_;
  DType acc_;
  // Of the accumulator type, in bytes: the running state of local row (b, i, h) at t = (b * seqlen_q +
  // i) * heads + h, m and l at t and o at t * head_dim_v; one block's output [batch, rows, heads,
  // head_dim_v] and lse [batch, heads, rows].
  std::vector<std::byte> m_, l_, o_, block_out_, block_lse_;
};

}  // namespace attn::detail
