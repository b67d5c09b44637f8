// Ring attention over MPI (include/attn/distributed.hpp): validation agreed by all ranks, then R steps;
// at step s rank r folds the k/v chunk of rank r - s while it passes that chunk on to rank r + 1 and
// receives the next from rank r - 1. The arithmetic is ring_block.hpp's.
//
// Traffic, per rank and step: one k/v chunk of B * rows * kv_heads * (d + d_v) elements each way,
// against B * rows_q * rows * heads * (d + d_v) * 2 flops of compute, so the transfer hides behind the
// compute once rows_q * heads / kv_heads exceeds the ratio of flop rate to link bandwidth per element
// (`attn io --ring` works it out for a link; docs/distributed.md).
#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "attn/distributed.hpp"
#include "core/problem.hpp"
#include "core/validate.hpp"
#include "distributed/collective.hpp"
#include "distributed/ring_block.hpp"

namespace attn {
namespace {

constexpr const char* kWho = "attn::ring_attention";

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f32:
      return MPI_FLOAT;
    default:
      return MPI_UINT16_T;  // bf16, f16: bits only
  }
}

std::vector<detail::SharedField> shared_fields(const detail::Problem& p, const RingOptions& ring) {
  const detail::ScoreRule& r = p.rule;
  return {{"q", "dtype", static_cast<std::int64_t>(p.dtype)},
          {"q", "batch", p.batch},
          {"q", "heads", p.heads},
          {"k", "kv_heads", p.kv_heads},
          {"q", "head_dim", p.head_dim},
          {"v", "head_dim_v", p.head_dim_v},
          {"ring", "layout", static_cast<std::int64_t>(ring.layout)},
          {"opts", "softmax_scale", detail::double_bits(r.scale)},
          {"opts", "softcap", detail::double_bits(r.softcap)},
          {"opts", "window_left (causal, window)", r.window_left},
          {"opts", "window_right (causal, window)", r.window_right},
          {"opts", "alibi_slopes (their values)",
           r.alibi_slopes ? detail::hash_floats(r.alibi_slopes, p.batch * p.heads) : 0},
          {"opts", "sinks (their values)", r.sinks ? detail::hash_floats(r.sinks, p.heads) : 0}};
}

// One chunk's k and v as they travel: dense, in the inputs' dtype.
struct Chunk {
  detail::DenseCopy k, v;
};

Chunk empty_chunk(const detail::Problem& p, std::int64_t rows) {
  Chunk c;
  const auto esz = static_cast<std::int64_t>(dtype_size(p.dtype));
  c.k.bytes.resize(static_cast<std::size_t>(p.batch * rows * p.kv_heads * p.head_dim * esz));
  c.v.bytes.resize(static_cast<std::size_t>(p.batch * rows * p.kv_heads * p.head_dim_v * esz));
  c.k.view = p.k;
  c.k.view.data = c.k.bytes.data();
  c.k.view.shape = {p.batch, rows, p.kv_heads, p.head_dim};
  c.v.view = c.k.view;
  c.v.view.data = c.v.bytes.data();
  c.v.view.shape[3] = p.head_dim_v;
  for (detail::DenseCopy* x : {&c.k, &c.v}) {  // dense strides
    auto& s = x->view.shape;
    x->view.strides = {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1};
  }
  return c;
}

int elements(const detail::DenseCopy& x) { return static_cast<int>(x.bytes.size() / dtype_size(x.view.dtype)); }

}  // namespace

void ring_attention(MPI_Comm comm, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                    const AttentionOptions& opts, const RingOptions& ring, const TensorView* lse, RingStats* stats) {
  int R = 0, r = 0;
  MPI_Comm_size(comm, &R);
  MPI_Comm_rank(comm, &r);
  const bool zigzag = ring.layout == RingLayout::zigzag;
  detail::Problem p{};
  detail::agree_collectively(
      comm, kWho,
      [&] {
        p = detail::validate(kWho, q, k, v, &out, opts, lse);
        detail::reject_dropout(kWho, p.dropout, "ring attention is a forward pass");
        if (zigzag && (p.seqlen_q % 2 || p.seqlen_k % 2))
          detail::fail(kWho, p.seqlen_q % 2 ? "q" : "k", "seqlen must be even with the zigzag layout (two halves)");
        for (const TensorView* t : {&k, &v})
          if (p.batch * p.seqlen_k * p.kv_heads * t->shape[3] > INT_MAX)
            detail::fail(kWho, t == &k ? "k" : "v", "a chunk must hold at most 2^31 - 1 elements (one MPI message)");
      },
      [&] { return shared_fields(p, ring); });

  const std::vector<std::int64_t> rows_q = detail::all_ranks(comm, p.seqlen_q),
                                  rows_k = detail::all_ranks(comm, p.seqlen_k);
  std::int64_t total_q = 0, total_k = 0;
  for (int x = 0; x < R; ++x)
    total_q += rows_q[static_cast<std::size_t>(x)], total_k += rows_k[static_cast<std::size_t>(x)];
  detail::RingAccumulator acc(p, detail::ring_segments(zigzag, rows_q, r), total_q, total_k);

  Chunk cur{detail::dense_copy(k, p.dtype), detail::dense_copy(v, p.dtype)};
  RingStats counts;
  detail::BlockCounts blocks;
  const int right = (r + 1) % R, left = (r + R - 1) % R;
  for (int s = 0; s < R; ++s) {
    const int owner = (r - s + R) % R;
    Chunk next;
    MPI_Request reqs[4];
    int nreq = 0;
    if (s + 1 < R) {  // posted before this step's compute, so the transfer overlaps it
      next = empty_chunk(p, rows_k[static_cast<std::size_t>((owner + R - 1) % R)]);
      MPI_Irecv(next.k.bytes.data(), elements(next.k), mpi_type(p.dtype), left, 0, comm, &reqs[nreq++]);
      MPI_Irecv(next.v.bytes.data(), elements(next.v), mpi_type(p.dtype), left, 1, comm, &reqs[nreq++]);
      MPI_Isend(cur.k.bytes.data(), elements(cur.k), mpi_type(p.dtype), right, 0, comm, &reqs[nreq++]);
      MPI_Isend(cur.v.bytes.data(), elements(cur.v), mpi_type(p.dtype), right, 1, comm, &reqs[nreq++]);
    }
    acc.fold_chunk(cur.k.view, cur.v.view, detail::ring_segments(zigzag, rows_k, owner), blocks);
    MPI_Waitall(nreq, reqs, MPI_STATUSES_IGNORE);
    if (s + 1 < R) cur = std::move(next);
  }
  acc.finish();
  counts.blocks_computed = blocks.computed;
  counts.blocks_skipped = blocks.skipped;
  if (stats) *stats = counts;
}

}  // namespace attn
