// Sharded KV decode over MPI (include/attn/distributed.hpp): each rank decodes its slice of every
// sequence with the whole sequence's masks (DecodeProblem::key_shift: the keys later ranks hold), the
// partial (lse, out) records are merged across ranks (shard_merge.hpp), the sinks folded once, and
// every rank writes the whole result. Traffic: each rank reads its slice once; the ranks exchange
// batch * seqlen_q * heads * (1 + d_v) accumulator values, which is nothing beside the cache.
#include <cstring>
#include <vector>

#include "decode/run_decode.hpp"
#include "attn/distributed.hpp"
#include "validate/decode_problem.hpp"
#include "validate/problem.hpp"
#include "cpu/tile_ops.hpp"
#include "distributed/collective.hpp"
#include "distributed/ring_block.hpp"
#include "distributed/shard_merge.hpp"
#include "distributed/shard_slice.hpp"

namespace attn {
namespace {

constexpr const char* kWho = "attn::sharded_decode";

std::vector<detail::SharedField> shared_fields(const detail::DecodeProblem& p, ShardMerge merge) {
  std::vector<detail::SharedField> f = detail::decode_shared_fields(p);
  f.push_back({"merge", "mode", static_cast<std::int64_t>(merge)});
  detail::append_rule_fields(f, p.rule, p.batch, p.heads);
  return f;
}

void reject_unsupported(const KVCache& slice, const DecodeOptions& dec) {
  if (dec.k_new || dec.v_new)
    detail::fail(kWho, "decode.k_new", "appending is not supported: a sharded cache's slices are the ranks' own");
  if (dec.rotary) detail::fail(kWho, "decode.rotary", "is not supported (it rotates at a slice's own positions)");
  if (slice.leftpad) detail::fail(kWho, "cache.leftpad", "is not supported: a slice's keys start at its position 0");
}

// This rank's partial records [batch * seqlen_q * heads][1 + d_v] of its slice.
template <class A>
std::vector<A> slice_records(const detail::DecodeProblem& p, const TensorView& q, const KVCache& slice,
                             const AttentionOptions& opts, const DecodeOptions& dec, const std::int64_t* key_shift) {
  const std::int64_t rows = p.batch * p.seqlen_q * p.heads, dv = p.head_dim_v;
  std::vector<A> out(static_cast<std::size_t>(rows * dv)), lse(static_cast<std::size_t>(rows));
  const TensorView ov = TensorView::contiguous(out.data(), p.batch, p.seqlen_q, p.heads, dv);
  const TensorView lv = TensorView::contiguous(lse.data(), p.batch, p.heads, p.seqlen_q);
  detail::decode_slice_partial(kWho, q, slice, opts, dec, key_shift, ov, lv);
  std::vector<A> rec(static_cast<std::size_t>(rows * (1 + dv)));
  for (std::int64_t t = 0; t < rows; ++t) {  // t = (b * seqlen_q + i) * heads + h
    const std::int64_t b = t / (p.seqlen_q * p.heads), i = t / p.heads % p.seqlen_q, h = t % p.heads;
    A* r = rec.data() + t * (1 + dv);
    r[0] = lse[static_cast<std::size_t>((b * p.heads + h) * p.seqlen_q + i)];
    std::memcpy(r + 1, out.data() + t * dv, static_cast<std::size_t>(dv) * sizeof(A));
  }
  return rec;
}

// Merges every rank's records into `merged` (one per row) by the chosen mode.
template <class A>
std::vector<A> merge_ranks(MPI_Comm comm, std::vector<A> rec, std::int64_t width, ShardMerge merge) {
  MPI_Datatype element = std::is_same_v<A, double> ? MPI_DOUBLE : MPI_FLOAT, record;
  MPI_Type_contiguous(static_cast<int>(width), element, &record);
  MPI_Type_commit(&record);
  const auto count = static_cast<int>(static_cast<std::int64_t>(rec.size()) / width);
  if (merge == ShardMerge::allreduce) {
    MPI_Op op;
    MPI_Op_create(&detail::merge_records_op<A>, 1, &op);
    MPI_Allreduce(MPI_IN_PLACE, rec.data(), count, record, op, comm);
    MPI_Op_free(&op);
  } else {
    int R = 0;
    MPI_Comm_size(comm, &R);
    std::vector<A> all(rec.size() * static_cast<std::size_t>(R));
    MPI_Allgather(rec.data(), count, record, all.data(), count, record, comm);
    // Rank order, each row's parts folded left to right, as merge_states does.
    PartialState<A> acc(width - 1), part(width - 1);
    for (std::int64_t t = 0; t < count; ++t) {
      reset(acc.view());
      for (int x = 0; x < R; ++x)
        detail::merge_record(acc.view(), part, all.data() + (static_cast<std::int64_t>(x) * count + t) * width);
      A* r = rec.data() + t * width;
      r[0] = finalize(acc.view(), r + 1);
    }
  }
  MPI_Type_free(&record);
  return rec;
}

template <class A>
void run(MPI_Comm comm, const detail::DecodeProblem& p, const TensorView& q, const KVCache& slice,
         const AttentionOptions& opts, const DecodeOptions& dec, ShardMerge merge) {
  int R = 0, r = 0;
  MPI_Comm_size(comm, &R);
  MPI_Comm_rank(comm, &r);
  std::vector<std::int64_t> mine(static_cast<std::size_t>(p.batch)), all(mine.size() * static_cast<std::size_t>(R));
  for (std::int64_t b = 0; b < p.batch; ++b) mine[static_cast<std::size_t>(b)] = p.seqlen_k(b);
  MPI_Allgather(mine.data(), static_cast<int>(p.batch), MPI_INT64_T, all.data(), static_cast<int>(p.batch), MPI_INT64_T,
                comm);
  const std::vector<std::int64_t> shift = detail::slice_key_shift(all, p.batch, r);

  const std::int64_t width = 1 + p.head_dim_v;
  const std::vector<A> merged = merge_ranks(comm, slice_records<A>(p, q, slice, opts, dec, shift.data()), width, merge);
  // The sinks and the store: store_row's, through a problem holding just what it reads.
  detail::Problem shell{};
  shell.out = p.out;
  shell.lse = p.lse;
  shell.rule = p.rule;
  shell.head_dim_v = p.head_dim_v;
  detail::dispatch_dtype(p.q_dtype, [&]<class T>() {
    if constexpr (std::is_same_v<detail::Acc<T>, A>) {
      PartialState<A> acc(width - 1), part(width - 1);
      std::vector<A> tmp(static_cast<std::size_t>(width - 1));
      for (std::int64_t t = 0; t < p.batch * p.seqlen_q * p.heads; ++t) {
        reset(acc.view());
        detail::merge_record(acc.view(), part, merged.data() + t * width);
        detail::store_row<T>(shell, acc.view(), tmp.data(), t / (p.seqlen_q * p.heads), t / p.heads % p.seqlen_q,
                             t % p.heads);
      }
    }
  });
}

}  // namespace

void sharded_decode(MPI_Comm comm, const TensorView& q, const KVCache& slice, const TensorView& out,
                    const AttentionOptions& opts, const DecodeOptions& decode, ShardMerge merge,
                    const TensorView* lse) {
  detail::DecodeProblem p{};
  detail::agree_collectively(
      comm, kWho,
      [&] {
        reject_unsupported(slice, decode);
        p = detail::validate_decode(kWho, q, slice, out, opts, decode, lse);
      },
      [&] { return shared_fields(p, merge); });
  if (p.cache_dtype == DType::f64)
    run<double>(comm, p, q, slice, opts, decode, merge);
  else
    run<float>(comm, p, q, slice, opts, decode, merge);
}

}  // namespace attn
