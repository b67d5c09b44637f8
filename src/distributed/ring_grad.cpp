// Ring attention's per-rank backward (ring_grad.hpp).
#include "distributed/ring_grad.hpp"

#include <algorithm>
#include <utility>

#include "backward/backward_kernel.hpp"
#include "core/element.hpp"
#include "cpu/tile_ops.hpp"

namespace attn::detail {
namespace {

// dst[b, s, h, :] += src[b, s, h, :] over the rows of `seg` of dst (src holds exactly those rows).
template <class A>
void add_rows(const TensorView& dst, const TensorView& src, const Segment& seg) {
  for (std::int64_t b = 0; b < src.shape[0]; ++b)
    for (std::int64_t i = 0; i < seg.length; ++i)
      for (std::int64_t h = 0; h < src.shape[2]; ++h) {
        A* to = row_ptr<A>(dst, b, seg.local_begin + i, h);
        const A* from = row_ptr<const A>(src, b, i, h);
        for (std::int64_t x = 0; x < src.shape[3]; ++x) to[x] += from[x];
      }
}

}  // namespace

RingGradAccumulator::RingGradAccumulator(const BackwardProblem& local, std::vector<Segment> q_segs,
                                         std::int64_t total_q, std::int64_t total_k)
    : local_(local), q_segs_(std::move(q_segs)), total_q_(total_q), total_k_(total_k) {
  acc_ = local.dtype == DType::f64 ? DType::f64 : DType::f32;
  dq_ = dense_zeros({local.batch, local.seqlen_q, local.heads, local.head_dim}, acc_);
}

void RingGradAccumulator::add_chunk(const TensorView& k, const TensorView& v, const TensorView& dk,
                                    const TensorView& dv, const std::vector<Segment>& k_segs, BlockCounts& counts) {
  for_each_visible_block(local_.rule, total_q_, total_k_, q_segs_, k_segs, counts,
                         [&](const Segment& qs, const Segment& ks) {
                           if (acc_ == DType::f64)
                             add_block<double>(k, v, dk, dv, qs, ks);
                           else
                             add_block<float>(k, v, dk, dv, qs, ks);
                         });
}

template <class A>
void RingGradAccumulator::add_block(const TensorView& k, const TensorView& v, const TensorView& dk,
                                    const TensorView& dv, const Segment& qs, const Segment& ks) {
  const std::int64_t B = local_.batch, n = qs.length, m = ks.length, a = dtype_size(acc_);
  BackwardProblem block = local_;  // inputs in their dtype, the block's gradients in the accumulator type
  block.seqlen_q = n;
  block.seqlen_k = m;
  block.q = rows_of(local_.q, qs);
  block.out = rows_of(local_.out, qs);
  block.dout = rows_of(local_.dout, qs);
  const TensorView lse = rows_of(*local_.lse, qs, 2);
  block.lse = &lse;
  block.k = rows_of(k, ks);
  block.v = rows_of(v, ks);
  blk_dq_.resize(static_cast<std::size_t>(B * n * local_.heads * local_.head_dim * a));
  blk_dk_.resize(static_cast<std::size_t>(B * m * local_.kv_heads * local_.head_dim * a));
  blk_dv_.resize(static_cast<std::size_t>(B * m * local_.kv_heads * local_.head_dim_v * a));
  block.dq = dense_view(blk_dq_, {B, n, local_.heads, local_.head_dim}, acc_);
  block.dk = dense_view(blk_dk_, {B, m, local_.kv_heads, local_.head_dim}, acc_);
  block.dv = dense_view(blk_dv_, {B, m, local_.kv_heads, local_.head_dim_v}, acc_);
  block.dsink = nullptr;  // the sinks need nothing in dq, dk, dv: lse includes them
  block.rule.sinks = nullptr;
  block.pages = {};
  block.rule.diagonal_shift = block_shift(total_q_, total_k_, qs, ks);
  run_backward({block}, {}, resolve_threads(local_.num_threads));
  add_rows<A>(dq_.view, block.dq, qs);
  add_rows<A>(dk, block.dk, ks);
  add_rows<A>(dv, block.dv, ks);
}

void RingGradAccumulator::store_dq() const { convert_into(dq_.view, local_.dq); }

}  // namespace attn::detail
