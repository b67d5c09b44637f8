// Ring attention's backward, per rank and without the transport (ring_backward.cpp moves the chunks):
// the same blocks as the forward (ring_block.hpp), each run through the tiled backward as a problem of
// its own with the whole sequence's lse, out and dout rows, so P = exp(S - lse) and D = rowsum(dout *
// out) are the whole problem's. A block's dq is added to the rank's dq; its dk and dv to the running
// gradients of the chunk it came with, which travel with the chunk and return to its owner. All sums
// are in the accumulator type (f32 for bf16 and f16) and in a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "validate/backward_problem.hpp"
#include "distributed/ring_block.hpp"

namespace attn::detail {

class RingGradAccumulator {
 public:
  // `local`: the validated backward problem of this rank's rows (q, k, v, out, dout, lse and the
  // gradients it will write); q_segs, total_q, total_k as for RingAccumulator.
  RingGradAccumulator(const BackwardProblem& local, std::vector<Segment> q_segs, std::int64_t total_q,
                      std::int64_t total_k);

  DType acc_dtype() const { return acc_; }

  // Adds the blocks of one key chunk: k, v of the local dtype, whose rows form k_segs; dk, dv: that
  // chunk's running gradients, dense [batch, rows, kv_heads, head_dim / head_dim_v] of acc_dtype().
  void add_chunk(const TensorView& k, const TensorView& v, const TensorView& dk, const TensorView& dv,
                 const std::vector<Segment>& k_segs, BlockCounts& counts);

  // Writes the local problem's dq.
  void store_dq() const;

 private:
  template <class A>
  void add_block(const TensorView& k, const TensorView& v, const TensorView& dk, const TensorView& dv,
                 const Segment& qs, const Segment& ks);

  BackwardProblem local_;
  std::vector<Segment> q_segs_;
  std::int64_t total_q_, total_k_;
  DType acc_;
  DenseCopy dq_;                                     // [batch, seqlen_q, heads, head_dim], acc_dtype()
  std::vector<std::byte> blk_dq_, blk_dk_, blk_dv_;  // one block's gradients
};

}  // namespace attn::detail
