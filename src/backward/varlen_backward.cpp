// The backward of a variable-length batch: validate the packed tensors as one [1, total, heads, d]
// backward problem and the cu_seqlens arrays, then give the backward kernel one problem per sequence
// (views into the packed tensors and gradients, no copies), scheduled together. A sequence without
// queries has no loss terms: its keys' dk and dv are written 0 here (after the kernel, which may still
// fail to allocate), since the kernel never visits it.
#include <algorithm>
#include <vector>

#include "attn/backward.hpp"
#include "backward/backward_kernel.hpp"
#include "validate/backward_problem.hpp"
#include "core/element.hpp"
#include "cpu/tile_ops.hpp"
#include "validate/varlen_rules.hpp"

namespace attn {
namespace {

template <class T>
void zero_rows(const TensorView& t) {
  for (std::int64_t s = 0; s < t.shape[1]; ++s)
    for (std::int64_t h = 0; h < t.shape[2]; ++h) {
      T* row = detail::row_ptr<T>(t, 0, s, h);
      for (std::int64_t c = 0; c < t.shape[3]; ++c) row[c * t.strides[3]] = detail::store<T>(0.0f);
    }
}

}  // namespace

void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const TensorView& dout, const TensorView& lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const VarlenBatch& varlen,
                               const AttentionOptions& opts, const TileOptions& tiles, const TensorView* dsink) {
  const char* who = "attn::attention_varlen_backward";
  const std::int64_t batch = varlen.batch;
  const detail::BackwardProblem all =
      detail::validate_packed_backward(who, q, k, v, out, dout, lse, dq, dk, dv, batch, opts, dsink);
  detail::validate_tiles(who, tiles);
  detail::check_varlen_offsets(who, varlen, all.seqlen_q, all.seqlen_k);

  std::vector<TensorView> lse_views(static_cast<std::size_t>(batch));
  std::vector<detail::BackwardProblem> problems, without_queries;
  problems.reserve(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    detail::BackwardProblem p = all;
    static_cast<detail::Problem&>(p) = detail::sequence_problem(all, varlen, b);
    const std::int64_t q0 = varlen.cu_seqlens_q[b], k0 = varlen.cu_seqlens_k[b];
    p.dout = detail::offset_rows(all.dout, 1, q0, p.seqlen_q);
    p.dq = detail::offset_rows(all.dq, 1, q0, p.seqlen_q);
    p.dk = detail::offset_rows(all.dk, 1, k0, p.seqlen_k);
    p.dv = detail::offset_rows(all.dv, 1, k0, p.seqlen_k);
    if (p.seqlen_q == 0) {
      without_queries.push_back(p);
      continue;
    }
    lse_views[static_cast<std::size_t>(b)] = detail::offset_rows(lse, 2, q0, p.seqlen_q);
    p.lse = &lse_views[static_cast<std::size_t>(b)];
    problems.push_back(p);
  }
  detail::run_backward(problems, tiles, detail::resolve_threads(opts.num_threads));
  if (dsink) detail::sink_gradient(problems, *dsink);  // sequences without queries add nothing
  for (const detail::BackwardProblem& p : without_queries)
    detail::dispatch_dtype(p.dtype, [&]<class T>() {
      zero_rows<T>(p.dk);
      zero_rows<T>(p.dv);
    });
}

}  // namespace attn
