// What the ring's forward (ring.cpp) and backward (ring_backward.cpp) share: the per-rank rules the
// ranks check before agreeing, the fields they must agree on, and the chunks they pass around.
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <utility>
#include <vector>

#include "attn/distributed.hpp"
#include "validate/problem.hpp"
#include "validate/validate.hpp"
#include "distributed/agreement.hpp"
#include "distributed/collective.hpp"
#include "distributed/ring_block.hpp"
#include "distributed/ring_grad.hpp"

namespace attn::detail {

inline MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f32:
      return MPI_FLOAT;
    default:
      return MPI_UINT16_T;  // bf16, f16: bits only
  }
}

// The ring's own rules on one rank's validated problem: no dropout, even halves for zigzag
// (check_ring_layout, agreement.hpp), and a chunk that fits one MPI message.
inline void check_ring_rules(const char* who, const Problem& p, bool zigzag) {
  check_ring_layout(who, p, zigzag);
  if (p.batch * p.seqlen_k * p.kv_heads * std::max(p.head_dim, p.head_dim_v) > INT_MAX)
    fail(who, "k", "a chunk must hold at most 2^31 - 1 elements (one MPI message)");
}

inline std::vector<SharedField> ring_fields(const Problem& p, const RingOptions& ring) {
  static_assert(static_cast<int>(RingLayout::zigzag) == 1, "ring_shared_fields sends zigzag as 1");
  return ring_shared_fields(p, ring.layout == RingLayout::zigzag);
}

// One chunk as it travels: its k and v (dense, the inputs' dtype) and, in the backward, its running
// dk and dv (dense, the accumulator type).
struct Chunk {
  DenseCopy k, v, dk, dv;
};

// An empty chunk of `rows` rows of problem p, with gradients when `grads`.
inline Chunk empty_chunk(const Problem& p, std::int64_t rows, bool grads) {
  const DType acc = p.dtype == DType::f64 ? DType::f64 : DType::f32;
  Chunk c{dense_zeros({p.batch, rows, p.kv_heads, p.head_dim}, p.dtype),
          dense_zeros({p.batch, rows, p.kv_heads, p.head_dim_v}, p.dtype),
          {},
          {}};
  if (grads) {
    c.dk = dense_zeros({p.batch, rows, p.kv_heads, p.head_dim}, acc);
    c.dv = dense_zeros({p.batch, rows, p.kv_heads, p.head_dim_v}, acc);
  }
  return c;
}

// This rank's own chunk: its k and v rows, dense, with zeroed gradients when `grads`.
inline Chunk own_chunk(const Problem& p, const TensorView& k, const TensorView& v, bool grads) {
  Chunk c = empty_chunk(p, p.seqlen_k, grads);
  convert_into(k, c.k.view);
  convert_into(v, c.v.view);
  return c;
}

// This rank's place in the ring: R ranks, rank r, sending to r + 1 and receiving from r - 1.
struct RingPlace {
  int ranks = 1, rank = 0, left = 0, right = 0;
};
inline RingPlace ring_place(MPI_Comm comm) {
  RingPlace p;
  MPI_Comm_size(comm, &p.ranks);
  MPI_Comm_rank(comm, &p.rank);
  p.right = (p.rank + 1) % p.ranks;
  p.left = (p.rank + p.ranks - 1) % p.ranks;
  return p;
}

inline int elements(const DenseCopy& x) { return static_cast<int>(x.bytes.size() / dtype_size(x.view.dtype)); }

// Posts the receive of x from `from` and the send of y to `to` (tag `tag`), appending both requests.
inline void exchange(DenseCopy& x, int from, DenseCopy& y, int to, int tag, MPI_Comm comm,
                     std::vector<MPI_Request>& reqs) {
  reqs.emplace_back();
  MPI_Irecv(x.bytes.data(), elements(x), mpi_type(x.view.dtype), from, tag, comm, &reqs.back());
  reqs.emplace_back();
  MPI_Isend(y.bytes.data(), elements(y), mpi_type(y.view.dtype), to, tag, comm, &reqs.back());
}

inline void wait_all(std::vector<MPI_Request>& reqs) {
  MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
  reqs.clear();
}

// The ring's R steps on this rank, from its own chunk `cur`: at step s, compute(chunk, owner) on the
// chunk of rank owner = r - s. The chunk's k and v go on to rank r + 1 (and the next chunk's come
// from r - 1) while it computes, posted before the compute so that the transfer can overlap it; with
// grads, its dk and dv go on once the step's blocks are in them. Returns the last step's chunk (rank
// r + 1's; r's own when R = 1).
template <class F>
Chunk ring_steps(MPI_Comm comm, const Problem& p, const std::vector<std::int64_t>& rows_k, const RingPlace& at,
                 Chunk cur, bool grads, F&& compute) {
  const int R = at.ranks;
  std::vector<MPI_Request> reqs;
  for (int s = 0; s < R; ++s) {
    const int owner = (at.rank - s + R) % R;
    const bool pass = s + 1 < R;
    Chunk next;
    if (pass) {
      next = empty_chunk(p, rows_k[static_cast<std::size_t>((owner + R - 1) % R)], grads);
      exchange(next.k, at.left, cur.k, at.right, 0, comm, reqs);
      exchange(next.v, at.left, cur.v, at.right, 1, comm, reqs);
    }
    compute(cur, owner);
    if (pass && grads) {
      exchange(next.dk, at.left, cur.dk, at.right, 2, comm, reqs);
      exchange(next.dv, at.left, cur.dv, at.right, 3, comm, reqs);
    }
    wait_all(reqs);
    if (pass) cur = std::move(next);
  }
  return cur;
}

// The whole sequence's lengths from every rank's (allgathered).
struct RingLengths {
  std::vector<std::int64_t> q, k;
  std::int64_t total_q = 0, total_k = 0;
};
inline RingLengths ring_lengths(MPI_Comm comm, const Problem& p) {
  RingLengths l{all_ranks(comm, p.seqlen_q), all_ranks(comm, p.seqlen_k)};
  for (std::size_t r = 0; r < l.q.size(); ++r) l.total_q += l.q[r], l.total_k += l.k[r];
  return l;
}

}  // namespace attn::detail
