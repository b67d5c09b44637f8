// Ring attention's backward over MPI (include/attn/distributed.hpp). At step s rank r adds its blocks
// with the chunk of rank r - s to its dq and to the chunk's running dk, dv (ring_grad.hpp); the chunk's
// k and v move on to rank r + 1 while it computes, its dk and dv once the step's blocks are in; after
// the last step the gradients are one hop short of their owner, and that hop is the last transfer.
// Every sum runs in a fixed order (blocks in segment order, ranks in ring order), so the gradients are
// the same for any thread count.
#include <utility>
#include <vector>

#include "attn/distributed.hpp"
#include "core/backward_problem.hpp"
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
  const int R = at.ranks, r = at.rank, left = at.left, right = at.right;
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
  detail::RingGradAccumulator acc(p, detail::ring_segments(zigzag, len.q, r), len.total_q, len.total_k);
  detail::Chunk cur = detail::empty_chunk(p, p.seqlen_k, true);
  detail::convert_into(k, cur.k.view);
  detail::convert_into(v, cur.v.view);
  detail::BlockCounts blocks;
  std::vector<MPI_Request> reqs;
  for (int s = 0; s < R; ++s) {
    const int owner = (r - s + R) % R;
    detail::Chunk next;
    if (s + 1 < R) {
      next = detail::empty_chunk(p, len.k[static_cast<std::size_t>((owner + R - 1) % R)], true);
      detail::exchange(next.k, left, cur.k, right, 0, comm, reqs);
      detail::exchange(next.v, left, cur.v, right, 1, comm, reqs);
    }
    acc.add_chunk(cur.k.view, cur.v.view, cur.dk.view, cur.dv.view, detail::ring_segments(zigzag, len.k, owner),
                  blocks);
    if (s + 1 < R) {  // this chunk's gradients now hold every rank's blocks up to this one
      detail::exchange(next.dk, left, cur.dk, right, 2, comm, reqs);
      detail::exchange(next.dv, left, cur.dv, right, 3, comm, reqs);
    }
    detail::wait_all(reqs);
    if (s + 1 < R) cur = std::move(next);
  }
  if (R > 1) {  // cur holds rank r + 1's chunk; rank r - 1 holds ours
    detail::Chunk mine = detail::empty_chunk(p, p.seqlen_k, true);
    detail::exchange(mine.dk, left, cur.dk, right, 4, comm, reqs);
    detail::exchange(mine.dv, left, cur.dv, right, 5, comm, reqs);
    detail::wait_all(reqs);
    cur = std::move(mine);
  }
  acc.store_dq();
  detail::convert_into(cur.dk.view, dk);
  detail::convert_into(cur.dv.view, dv);
  if (dsink) ring_sink_gradient(comm, p, *dsink);
  if (stats) *stats = {blocks.computed, blocks.skipped};
}

}  // namespace attn
