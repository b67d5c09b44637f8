// Ring attention over MPI (include/attn/distributed.hpp): validation agreed by all ranks, then R steps;
// at step s rank r folds the k/v chunk of rank r - s while it passes that chunk on to rank r + 1 and
// receives the next from rank r - 1. The arithmetic is ring_block.hpp's.
//
// Traffic, per rank and step: one k/v chunk of B * rows * kv_heads * (d + d_v) elements each way,
// against B * rows_q * rows * heads * (d + d_v) * 2 flops of compute, so the transfer hides behind the
// compute once rows_q * heads / kv_heads exceeds the ratio of flop rate to link bandwidth per element
// (`attn io --ring` works it out for a link; docs/distributed.md).
#include <utility>
#include <vector>

#include "attn/distributed.hpp"
#include "distributed/ring_common.hpp"

namespace attn {

void ring_attention(MPI_Comm comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const AttentionOptions& opts, const RingOptions& ring, const TensorView* lse, RingStats* stats) {
  constexpr const char* kWho = "attn::ring_attention";
  const detail::RingPlace at = detail::ring_place(comm);
  const bool zigzag = ring.layout == RingLayout::zigzag;
  detail::Problem p{};
  detail::agree_collectively(
      comm, kWho,
      [&] {
        p = detail::validate(kWho, q, k, v, &out, opts, lse);
        detail::check_ring_rules(kWho, p, zigzag);
      },
      [&] { return detail::ring_fields(p, ring); });

  const detail::RingLengths len = detail::ring_lengths(comm, p);
  detail::RingAccumulator acc(p, detail::ring_segments(zigzag, len.q, at.rank), len.total_q, len.total_k);
  detail::BlockCounts blocks;
  detail::ring_steps(comm, p, len.k, at, detail::own_chunk(p, k, v, false), false, [&](detail::Chunk& c, int owner) {
    acc.fold_chunk(c.k.view, c.v.view, detail::ring_segments(zigzag, len.k, owner), blocks);
  });
  acc.finish();
  if (stats) *stats = {blocks.computed, blocks.skipped};
}

}  // namespace attn
