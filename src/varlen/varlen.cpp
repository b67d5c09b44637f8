// Variable-length batches: validate the packed tensors as one [1, total, heads, d] problem and the
// cu_seqlens arrays, then give attention_tiled's kernel one problem per sequence (views into the packed
// tensors, no copies), scheduled together.
#include "attn/varlen.hpp"

#include <string>
#include <vector>

#include "core/problem.hpp"
#include "core/tile_ops.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

constexpr const char* kWho = "attn::attention_varlen";

// [total, heads, d] as [1, total, heads, d].
TensorView as_batch_of_one(const TensorView& t, const char* arg) {
  if (t.rank != 3) detail::fail(kWho, arg, "rank must be 3 ([total, heads, head_dim]), got " + std::to_string(t.rank));
  TensorView r = t;
  r.rank = 4;
  r.shape = {1, t.shape[0], t.shape[1], t.shape[2]};
  r.strides = {0, t.strides[0], t.strides[1], t.strides[2]};
  return r;
}

void check_cu(const std::int32_t* cu, const char* arg, std::int64_t batch, std::int64_t total) {
  if (cu == nullptr) detail::fail(kWho, arg, "pointer is null");
  if (cu[0] != 0) detail::fail(kWho, arg, "[0] must be 0, got " + std::to_string(cu[0]));
  for (std::int64_t b = 0; b < batch; ++b)
    if (cu[b + 1] < cu[b])
      detail::fail(kWho, arg,
                   "must be non-decreasing, but [" + std::to_string(b + 1) + "] = " + std::to_string(cu[b + 1]) +
                       " < [" + std::to_string(b) + "] = " + std::to_string(cu[b]));
  if (cu[batch] != total)
    detail::fail(
        kWho, arg,
        "[batch] must equal the packed length " + std::to_string(total) + ", got " + std::to_string(cu[batch]));
}

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
  if (batch < 1) detail::fail(kWho, "batch", "must be >= 1, got " + std::to_string(batch));
  if (batch > (std::int64_t{1} << 31)) detail::fail(kWho, "batch", "must be < 2^31, got " + std::to_string(batch));
  const TensorView q4 = as_batch_of_one(q, "q"), k4 = as_batch_of_one(k, "k"), v4 = as_batch_of_one(v, "v"),
                   o4 = as_batch_of_one(out, "out");
  if (lse && (lse->rank != 3 || lse->shape[0] != 1))
    detail::fail(kWho, "lse", "must be a rank-3 view [1, heads, total_q]");
  if (tiles.q_tile && *tiles.q_tile < 1) detail::fail(kWho, "tiles.q_tile", "must be >= 1");
  if (tiles.k_tile && *tiles.k_tile < 1) detail::fail(kWho, "tiles.k_tile", "must be >= 1");
  AttentionOptions whole = opts;
  whole.alibi_slopes = nullptr;  // checked per sequence below
  const detail::Problem all = detail::validate(kWho, q4, k4, v4, &o4, whole, lse);
  check_cu(cu_seqlens_q, "cu_seqlens_q", batch, all.seqlen_q);
  check_cu(cu_seqlens_k, "cu_seqlens_k", batch, all.seqlen_k);
  if (opts.alibi_slopes && opts.alibi_batch_stride < 0)
    detail::fail(kWho, "alibi_batch_stride", "must be >= 0, got " + std::to_string(opts.alibi_batch_stride));

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
    p.alibi_slopes = opts.alibi_slopes ? opts.alibi_slopes + b * opts.alibi_batch_stride : nullptr;
    p.alibi_batch_stride = 0;
    problems.push_back(p);
  }
  detail::run_tiled(problems, tiles, detail::resolve_threads(opts.num_threads));
}

}  // namespace attn
