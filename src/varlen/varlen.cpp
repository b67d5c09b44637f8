// Variable-length batches: validate the packed tensors as one [1, total, heads, d] problem and the
// cu_seqlens arrays, then give attention_tiled's kernel one problem per sequence (views into the packed
// tensors, no copies), scheduled together. The paged form (attention_varlen_paged) is validated with the
// cache's first page standing for the keys (shapes, dtypes, options), plus the cache's own rules
// (core/page_rules.hpp); its problems read their keys through their row of the block table.
#include "attn/varlen.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/page_rules.hpp"
#include "core/problem.hpp"
#include "core/tile_ops.hpp"
#include "core/validate.hpp"
#include "core/varlen_rules.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

constexpr const char* kWho = "attn::attention_varlen";
constexpr const char* kWhoPaged = "attn::attention_varlen_paged";
std::string str(std::int64_t x) { return std::to_string(x); }

// One problem per sequence that has queries (views into the packed tensors; with `pages`, reading the
// paged cache), scheduled together on the tiled kernel.
void run_sequences(const detail::Problem& all, const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k,
                   std::int64_t batch, const TileOptions& tiles, const TensorView* lse, const VarlenPages* pages) {
  std::vector<TensorView> lse_views(static_cast<std::size_t>(batch));
  std::vector<detail::Problem> problems;
  problems.reserve(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    detail::Problem p = detail::sequence_problem(all, cu_seqlens_q, cu_seqlens_k, b, pages);
    if (p.seqlen_q == 0) continue;
    if (lse) {
      lse_views[static_cast<std::size_t>(b)] = detail::offset_rows(*lse, 2, cu_seqlens_q[b], p.seqlen_q);
      p.lse = &lse_views[static_cast<std::size_t>(b)];
    }
    problems.push_back(p);
  }
  detail::run_tiled(problems, tiles, detail::resolve_threads(all.num_threads));
}

// q, out, lse and the options as attention_varlen checks them, with page 0 of k and v as the keys; then
// the cache views whole, the block table, each sequence's key count against the capacity, and no
// output overlapping the cache or the table. Returns the packed problem (k and v: page 0's views, whose
// strides are the cache's).
detail::Problem validate_paged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k, std::int64_t batch,
                               const VarlenPages& pages, const AttentionOptions& opts, const TensorView* lse) {
  const detail::Span sk = detail::check_view(kWhoPaged, "k", k, 4, false),
                     sv = detail::check_view(kWhoPaged, "v", v, 4, false);
  static constexpr const char* kDims[] = {"num_pages", "page_size", "heads", "head_dim"};
  for (int i = 0; i < 3; ++i) detail::require_equal(kWhoPaged, "v", kDims[i], v.shape[i], "k", k.shape[i]);
  TensorView k0 = k, v0 = v;
  k0.shape[0] = v0.shape[0] = 1;
  TensorView k3 = k0, v3 = v0;  // as the packed rank-3 form validate_packed takes: [page_size, heads, d]
  for (TensorView* t : {&k3, &v3}) {
    t->rank = 3;
    t->shape = {t->shape[1], t->shape[2], t->shape[3], 1};
    t->strides = {t->strides[1], t->strides[2], t->strides[3], 1};
  }
  detail::Problem all = detail::validate_packed(kWhoPaged, q, k3, v3, out, batch, opts, lse);
  all.k = k0, all.v = v0;
  detail::check_cu_seqlens(kWhoPaged, "cu_seqlens_q", cu_seqlens_q, batch, all.seqlen_q);
  detail::check_cu_seqlens(kWhoPaged, "cu_seqlens_k", cu_seqlens_k, batch, -1);

  const std::int64_t page_size = k.shape[1], num_pages = k.shape[0];
  const detail::BlockTableShape table = detail::check_block_table(
      kWhoPaged, "pages.block_table", pages.block_table, pages.max_pages, pages.block_table_stride, batch, page_size);
  std::int64_t max_keys = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t keys = std::int64_t{cu_seqlens_k[b + 1]} - cu_seqlens_k[b];
    if (keys > table.capacity)
      detail::fail(kWhoPaged, "cu_seqlens_k",
                   "sequence " + str(b) + " has " + str(keys) + " keys, more than the cache holds (" +
                       str(table.capacity) + " = max_pages x page_size)");
    detail::check_block_table_entries(kWhoPaged, "pages.block_table", pages.block_table, table.stride, b, keys,
                                      page_size, num_pages);
    max_keys = std::max(max_keys, keys);
  }
  detail::check_dropout_extent(kWhoPaged, all.dropout, batch, all.heads, all.seqlen_q, max_keys);
  const detail::Span so =
      detail::check_view(kWhoPaged, "out", detail::packed_as_batch_of_one(kWhoPaged, "out", out), 4, false);
  const detail::Span sl = lse ? detail::check_view(kWhoPaged, "lse", *lse, 3, false) : detail::Span{};
  for (auto [name, s] : {std::pair<const char*, detail::Span>{"k", sk}, {"v", sv}, {"pages.block_table", table.span}}) {
    if (detail::overlaps(so, s)) detail::fail(kWhoPaged, "out", std::string("overlaps input ") + name);
    if (detail::overlaps(sl, s)) detail::fail(kWhoPaged, "lse", std::string("overlaps input ") + name);
  }
  return all;
}

}  // namespace

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k, std::int64_t batch,
                      const AttentionOptions& opts, const TileOptions& tiles, const TensorView* lse) {
  detail::validate_tiles(kWho, tiles);
  const detail::Problem all = detail::validate_packed(kWho, q, k, v, out, batch, opts, lse);
  detail::check_cu_seqlens(kWho, "cu_seqlens_q", cu_seqlens_q, batch, all.seqlen_q);
  detail::check_cu_seqlens(kWho, "cu_seqlens_k", cu_seqlens_k, batch, all.seqlen_k);

  run_sequences(all, cu_seqlens_q, cu_seqlens_k, batch, tiles, lse, nullptr);
}

void attention_varlen_paged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            const std::int32_t* cu_seqlens_q, const std::int32_t* cu_seqlens_k, std::int64_t batch,
                            const VarlenPages& pages, const AttentionOptions& opts, const TileOptions& tiles,
                            const TensorView* lse) {
  detail::validate_tiles(kWhoPaged, tiles);
  const detail::Problem all = validate_paged(q, k, v, out, cu_seqlens_q, cu_seqlens_k, batch, pages, opts, lse);
  run_sequences(all, cu_seqlens_q, cu_seqlens_k, batch, tiles, lse, &pages);
}

}  // namespace attn
