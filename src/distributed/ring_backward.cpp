// Ring attention's backward over MPI (include/attn/distributed.hpp). At step s rank r adds its blocks
// with the chunk of rank r - s to its dq and to the chunk's running dk, dv (ring_grad.hpp); the chunk's
// k and v move on to rank r + 1 while it computes, its dk and dv once the step's blocks are in; after
// the last step the gradients are one hop short of their owner, and that hop is the last transfer.
// Every sum runs in a fixed order (blocks in segment order, ranks in ring order), so the gradients are
// the same for any thread count.
#include <utility>
#include <vector>

#include "attn/distributed.hpp"
#include "validate/backward_problem.hpp"
#include "distributed/ring_common.hpp"

namespace attn {
namespace {

constexpr const char* kWho = "attn::ring_attention_backward";

// dsink: this rank's part (sink_gradient over its rows), then the ranks' parts summed in rank order.
void ring_sink_gradient(MPI_Comm comm, const detail::BackwardProblem& p, const TensorView& dsink) {
  detail::sink_gradient({p}, dsink);
  std::vector<double> mine(static_cast<std::size_t>(p.heads));
  const bool f64 = dsink.dtype == DType::f64;
  for (std::int64_t h = 0; h < p.heads; ++h)
    mine[static_cast<std::size_t>(h)] = f64 ? static_cast<const double*>(dsink.data)[h * dsink.strides[1]]
                                            : static_cast<const float*>(dsink.data)[h * dsink.strides[1]];
  int R = 0;
  MPI_Comm_size(comm, &R);
  std::vector<double> all(mine.size() * static_cast<std::size_t>(R));
  MPI_Allgather(mine.data(), static_cast<int>(p.heads), MPI_DOUBLE, all.data(), static_cast<int>(p.heads), MPI_DOUBLE,
                comm);
  for (std::int64_t h = 0; h < p.heads; ++h) {
    double sum = 0;
    for (int x = 0; x < R; ++x) sum += all[static_cast<std::size_t>(x * p.heads + h)];
    if (f64)
      static_cast<double*>(dsink.data)[h * dsink.strides[1]] = sum;
    else
      static_cast<float*>(dsink.data)[h * dsink.strides[1]] = static_cast<float>(sum);
  }
}

}  // namespace

void ring_attention_backward(MPI_Comm comm, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& dout, const TensorView& lse, const TensorView& dq,
                             const TensorView& dk, const TensorView& dv, const AttentionOptions& opts,
                             const RingOptions& ring, const TensorView* dsink, RingStats* stats) {
  const detail::RingPlace at = detail::ring_place(comm);
  const bool zigzag = ring.layout == RingLayout::zigzag;
  detail::BackwardProblem p{};
  detail::agree_collectively(
      comm, kWho,
      [&] {
        p = detail::validate_backward(kWho, q, k, v, out, dout, lse, dq, dk, dv, opts, dsink);
        detail::check_ring_rules(kWho, p, zigzag);
      },
      [&] { return detail::ring_fields(p, ring); });

  const detail::RingLengths len = detail::ring_lengths(comm, p);
  detail::RingGradAccumulator acc(p, detail::ring_segments(zigzag, len.q, at.rank), len.total_q, len.total_k);
  detail::BlockCounts blocks;
  detail::Chunk cur =
      detail::ring_steps(comm, p, len.k, at, detail::own_chunk(p, k, v, true), true, [&](detail::Chunk& c, int owner) {
        acc.add_chunk(c.k.view, c.v.view, c.dk.view, c.dv.view, detail::ring_segments(zigzag, len.k, owner), blocks);
      });
  if (at.ranks > 1) {  // cur holds rank r + 1's chunk and its finished gradients; rank r - 1 holds ours
    std::vector<MPI_Request> reqs;
    detail::DenseCopy mine_dk = detail::dense_zeros({p.batch, p.seqlen_k, p.kv_heads, p.head_dim}, cur.dk.view.dtype),
                      mine_dv = detail::dense_zeros({p.batch, p.seqlen_k, p.kv_heads, p.head_dim_v}, cur.dv.view.dtype);
    detail::exchange(mine_dk, at.left, cur.dk, at.right, 4, comm, reqs);
    detail::exchange(mine_dv, at.left, cur.dv, at.right, 5, comm, reqs);
    detail::wait_all(reqs);
    cur.dk = std::move(mine_dk);
    cur.dv = std::move(mine_dv);
  }
  acc.store_dq();
  detail::convert_into(cur.dk.view, dk);
  detail::convert_into(cur.dv.view, dv);
  if (dsink) ring_sink_gradient(comm, p, *dsink);
  if (stats) *stats = {blocks.computed, blocks.skipped};
}

}  // namespace attn
