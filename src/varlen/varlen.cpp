// Variable-length batches: validate the packed tensors as one [1, total, heads, d] problem and the
// cu_seqlens arrays, then give attention_tiled's kernel one problem per sequence (views into the packed
// tensors, no copies), scheduled together.
#include "attn/varlen.hpp"

#include <string>
#include <vector>

#include "core/problem.hpp"
#include "core/tile_ops.hpp"
#include "core/varlen_rules.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

constexpr const char* kWho = "attn::attention_varlen";

// The rows [first, first + count) of dimension `dim`.
TensorView offset_rows(TensorView t, std::int64_t dim, std::int64_t first, std::int64_t count) {
  t.data =
      static_cast<unsigned char*>(t.data) + first * t.strides[dim] * static_cast<std::int64_t>(dtype_size(t.dtype));
  t.shape[dim] = count;
  return t;
}

}  // namespace

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k, std::int64_t batch,
                      const AttentionOptions& opts, const TileOptions& tiles, const TensorView* lse) {
  detail::check_varlen_batch(kWho, batch);
  const TensorView q4 = detail::packed_as_batch_of_one(kWho, "q", q), k4 = detail::packed_as_batch_of_one(kWho, "k", k),
                   v4 = detail::packed_as_batch_of_one(kWho, "v", v),
                   o4 = detail::packed_as_batch_of_one(kWho, "out", out);
  detail::check_varlen_lse(kWho, lse);
  detail::validate_tiles(kWho, tiles);
  const detail::Problem all = detail::validate(kWho, q4, k4, v4, &o4, opts, lse);
  detail::check_cu_seqlens(kWho, "cu_seqlens_q", cu_seqlens_q, batch, all.seqlen_q);
  detail::check_cu_seqlens(kWho, "cu_seqlens_k", cu_seqlens_k, batch, all.seqlen_k);
  // The problem's batch is 1; dropout's counter word b * heads + h needs the sequence count.
  detail::check_dropout_extent(kWho, all.dropout, batch, all.heads, all.seqlen_q, all.seqlen_k);
  const detail::ScoreRule rule = all.rule;  // slopes of sequence b: alibi_slopes + b * alibi_batch_stride

  std::vector<TensorView> lse_views(static_cast<std::size_t>(batch));
  std::vector<detail::Problem> problems;
  problems.reserve(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t q0 = cu_seqlens_q[b], nq = cu_seqlens_q[b + 1] - q0;
    const std::int64_t k0 = cu_seqlens_k[b], nk = cu_seqlens_k[b + 1] - k0;
    if (nq == 0) continue;
    detail::Problem p = all;
    p.seqlen_q = nq;
    p.seqlen_k = nk;
    p.q = offset_rows(all.q, 1, q0, nq);
    p.out = offset_rows(all.out, 1, q0, nq);
    p.k = offset_rows(all.k, 1, k0, nk);
    p.v = offset_rows(all.v, 1, k0, nk);
    if (lse) {
      lse_views[static_cast<std::size_t>(b)] = offset_rows(*lse, 2, q0, nq);
      p.lse = &lse_views[static_cast<std::size_t>(b)];
    }
    p.rule = rule.for_sequence(b);
    p.dropout = all.dropout.for_sequence(b);  // sequence b draws batch index b's mask
    problems.push_back(p);
  }
  detail::run_tiled(problems, tiles, detail::resolve_threads(opts.num_threads));
}

}  // namespace attn
