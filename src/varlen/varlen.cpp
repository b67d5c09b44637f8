// Variable-length batches: validate the packed tensors as one [1, total, heads, d] problem and the
// cu_seqlens arrays, then give attention_tiled's kernel one problem per sequence (views into the packed
// tensors, no copies), scheduled together. The paged form (attention_varlen_paged) is validated with the
// cache's first page standing for the keys (shapes, dtypes, options), plus the cache's own rules
// (validate/page_rules.hpp); its problems read their keys through their row of the block table.
#include "attn/varlen.hpp"

#include <vector>

#include "validate/problem.hpp"
#include "cpu/tile_ops.hpp"
#include "validate/validate.hpp"
#include "validate/varlen_rules.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

constexpr const char* kWho = "attn::attention_varlen";
constexpr const char* kWhoPaged = "attn::attention_varlen_paged";

// One problem per sequence that has queries (views into the packed tensors; with `pages`, reading the
// paged cache), scheduled together on the tiled kernel.
void run_sequences(const detail::Problem& all, const VarlenBatch& varlen, const TileOptions& tiles,
                   const TensorView* lse, const VarlenPages* pages) {
  std::vector<TensorView> lse_views(static_cast<std::size_t>(varlen.batch));
  std::vector<detail::Problem> problems;
  problems.reserve(static_cast<std::size_t>(varlen.batch));
  for (std::int64_t b = 0; b < varlen.batch; ++b) {
    detail::Problem p = detail::sequence_problem(all, varlen, b, pages);
    if (p.seqlen_q == 0) continue;
    if (lse) {
      lse_views[static_cast<std::size_t>(b)] = detail::offset_rows(*lse, 2, varlen.cu_seqlens_q[b], p.seqlen_q);
      p.lse = &lse_views[static_cast<std::size_t>(b)];
    }
    problems.push_back(p);
  }
  detail::run_tiled(problems, tiles, detail::resolve_threads(all.num_threads));
}

}  // namespace

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const VarlenBatch& varlen, const AttentionOptions& opts, const TileOptions& tiles,
                      const TensorView* lse) {
  detail::validate_tiles(kWho, tiles);
  const detail::Problem all = detail::validate_packed(kWho, q, k, v, out, varlen.batch, opts, lse);
  detail::check_varlen_offsets(kWho, varlen, all.seqlen_q, all.seqlen_k);
  run_sequences(all, varlen, tiles, lse, nullptr);
}

void attention_varlen_paged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            const VarlenBatch& varlen, const VarlenPages& pages, const AttentionOptions& opts,
                            const TileOptions& tiles, const TensorView* lse) {
  detail::validate_tiles(kWhoPaged, tiles);
  const detail::Problem all = detail::validate_packed_paged(kWhoPaged, q, k, v, out, varlen, pages, opts, lse);
  run_sequences(all, varlen, tiles, lse, &pages);
}

}  // namespace attn
