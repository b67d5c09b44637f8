// Decode on the AMX tiles. A decode whose query rows per kv head fill a tile (MLA: 128 query heads over
// one kv head of 576 dims; GQA with several query tokens) has the shape of a small prefill: its scores
// are a [rows x keys] matrix product, which the tiled forward on the tiles (src/tiled/amx_kernel.cpp)
// already computes with the whole score rule. So each sequence's keys are cut into slices, each slice
// runs as a forward problem of its own (its keys a view of the cache, its diagonal shifted to the
// slice's place in the sequence, its output and lse in f32), all slices of a group of them in one
// parallel run_tiled, and every query row folds its slices' outputs in slice order (merge_output), then
// the sink, once. The slices depend on the sequence and the options alone, never on the thread count
// or the batch: the result is the same bits for any thread count, and keys_per_split keeps it
// batch-invariant.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include <omp.h>

#include "amx/amx.hpp"
#include "attn/online_softmax.hpp"
#include "core/slice_groups.hpp"
#include "cpu/tile_ops.hpp"
#include "decode/run_decode.hpp"
#include "merge/merge_output.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn::detail {
namespace {

constexpr std::int64_t kTileRows = 16;  // a tile's rows: fewer query rows per kv head leave it mostly empty
// Default slices: a sixteenth of the sequence's keys, within [kMinSliceKeys, kMaxSliceKeys]: 8k keys give
// 8 slices to share the cores, a longer cache pays for fewer merges (MLA at 32k keys on 2 threads: 12.3 ms
// in 16 slices, 14.6 ms in 32), and a slice's packed K and V (9 MB of MLA at 4k keys) stay a few
// slices per group.
constexpr std::int64_t kMinSliceKeys = 1024, kMaxSliceKeys = 4096, kSlicesPerSequence = 16;
// The packed K and V of a group's slices (the tiled forward packs every problem's before it starts).
constexpr std::int64_t kPackBudgetBytes = std::int64_t{64} << 20;
constexpr std::int64_t kBudget = std::int64_t{1} << 22;  // f32 partial values held at once

struct Slice {
  std::int64_t b, begin, end;  // sequence b's keys [begin, end)
};

// Keys per slice: keys_per_split, or the seen keys cut into num_splits, or the default above; a whole
// number of pages, so that a slice of a paged cache starts at a page.
std::int64_t slice_length(const DecodeProblem& p, std::int64_t seen) {
  std::int64_t keys = std::clamp((seen + kSlicesPerSequence - 1) / kSlicesPerSequence, kMinSliceKeys, kMaxSliceKeys);
  if (p.keys_per_split > 0)
    keys = p.keys_per_split;
  else if (p.num_splits > 0)
    keys = std::max<std::int64_t>(1, (seen + p.num_splits - 1) / p.num_splits);
  const std::int64_t page = p.index.pages.page_size;
  return (keys + page - 1) / page * page;
}

// The slices of every sequence, sequence by sequence, each sequence's in key order: its seen keys
// [first_key(0), end_key(last query)), from the page holding the first.
std::vector<Slice> plan_slices(const DecodeProblem& p) {
  std::vector<Slice> slices;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Mask m = p.mask(b);
    const std::int64_t seen = m.seen_count();
    if (seen == 0) continue;
    const std::int64_t first = m.first_key(0), end = first + seen;
    const std::int64_t begin = first / p.index.pages.page_size * p.index.pages.page_size;
    const std::int64_t length = slice_length(p, seen);
    for (std::int64_t j = begin; j < end; j += length) slices.push_back({b, j, std::min(end, j + length)});
  }
  return slices;
}

// Slice s as a forward problem: batch 1, sequence b's queries over keys [s.begin, s.end) of its cache
// row, the score rule of sequence b without the sink (folded once, after the merge), and a diagonal
// moved so that query i still sits at its position in the whole sequence.
Problem slice_problem(const DecodeProblem& p, const Slice& s, float* out, const TensorView* lse) {
  Problem sp;
  static_cast<ResolvedOptions&>(sp) = p;
  const Mask m = p.mask(s.b);
  sp.rule = m.rule;
  sp.rule.sinks = nullptr;
  sp.rule.diagonal_shift = m.rule.diagonal_shift + (m.seqlen_k - s.end);
  sp.batch = 1;
  sp.seqlen_q = p.seqlen_q;
  sp.seqlen_k = s.end - s.begin;
  sp.heads = p.heads;
  sp.kv_heads = p.kv_heads;
  sp.head_dim = p.head_dim;
  sp.head_dim_v = p.head_dim_v;
  sp.dtype = p.q_dtype;
  sp.q = p.q;
  sp.q.data = static_cast<bf16_t*>(p.q.data) + s.b * p.q.strides[0];
  sp.q.shape[0] = 1;
  sp.k = p.k;
  sp.v = p.v;
  if (p.index.pages.paged()) {  // the whole cache, read through this slice's part of the table row
    sp.pages = p.index.pages.row(p.index.cache_row(s.b));
    sp.pages.table += s.begin / sp.pages.page_size;
  } else {
    sp.k.data = static_cast<bf16_t*>(p.k.data) + p.key_offset(p.k, s.b, s.begin);
    sp.v.data = static_cast<bf16_t*>(p.v.data) + p.key_offset(p.v, s.b, s.begin);
    sp.k.shape[0] = sp.v.shape[0] = 1;
    sp.k.shape[1] = sp.v.shape[1] = sp.seqlen_k;
  }
  sp.out = TensorView::contiguous(out, 1, p.seqlen_q, p.heads, p.head_dim_v);
  sp.lse = lse;
  return sp;
}

// Slices run together: their partial outputs within kBudget values and their packed keys and values
// within kPackBudgetBytes, a multiple of the thread count where that leaves one (the grouping never
// changes a bit of the result: each row folds its slices in order whatever the groups).
std::int64_t slices_per_group(const DecodeProblem& p, const std::vector<Slice>& slices, std::int64_t per_slice,
                              int threads) {
  const auto n = static_cast<std::int64_t>(slices.size());
  std::int64_t longest = 1;
  for (const Slice& s : slices) longest = std::max(longest, s.end - s.begin);
  const std::int64_t pack_bytes = longest * (p.head_dim + p.head_dim_v + 64) * 2;
  std::int64_t group =
      std::min(items_per_group(kBudget, per_slice, n), std::max<std::int64_t>(1, kPackBudgetBytes / pack_bytes));
  if (group >= threads && group < n) group = group / threads * threads;
  return group;
}

}  // namespace

bool amx_decode_takes(const DecodeProblem& p) {
  return p.cache_dtype == DType::bf16 && p.q_dtype == DType::bf16 && !p.rotary.enabled() &&
         p.group() * p.seqlen_q >= kTileRows && amx_backend() != amx::TileBackend::none;
}

void run_decode_amx(const DecodeProblem& p) {
  const std::int64_t rows = p.heads * p.seqlen_q, dv = p.head_dim_v;  // per sequence; row = h * seqlen_q + i
  const std::int64_t per_slice = rows * (dv + 1);  // out [seqlen_q][heads][dv], lse [heads][seqlen_q]
  const std::vector<Slice> slices = plan_slices(p);
  const auto n = static_cast<std::int64_t>(slices.size());
  const int threads = resolve_threads(p.num_threads);
  const std::int64_t group = slices_per_group(p, slices, per_slice, threads);
  std::vector<float> partial(static_cast<std::size_t>(std::min(group, std::max<std::int64_t>(n, 1)) * per_slice));
  // The running state of every row: o[dv], m, l.
  const std::int64_t stride = dv + 2;
  std::vector<float> running(static_cast<std::size_t>(p.batch * rows * stride));
  auto state = [&](std::int64_t t) {
    float* base = running.data() + t * stride;
    return RowState<float>{base + dv, base + dv + 1, base, dv};
  };
  for (std::int64_t t = 0; t < p.batch * rows; ++t) reset(state(t));
  std::vector<TensorView> lse(static_cast<std::size_t>(group));
  std::vector<Problem> problems;
  for (std::int64_t begin = 0; begin < n; begin += group) {
    const std::int64_t end = std::min(n, begin + group);
    problems.clear();
    for (std::int64_t it = begin; it < end; ++it) {
      float* out = partial.data() + (it - begin) * per_slice;
      TensorView& l = lse[static_cast<std::size_t>(it - begin)];
      l = TensorView::contiguous(out + rows * dv, 1, p.heads, p.seqlen_q);
      problems.push_back(slice_problem(p, slices[static_cast<std::size_t>(it)], out, &l));
    }
    run_tiled(problems, TileOptions{}, threads);
    // Each row folds the group's slices of its sequence, in slice order.
#pragma omp parallel num_threads(threads)
    {
      PartialState<float> part(dv);
#pragma omp for schedule(static)
      for (std::int64_t t = 0; t < p.batch * rows; ++t) {
        const std::int64_t b = t / rows, h = t % rows / p.seqlen_q, i = t % p.seqlen_q;
        for (std::int64_t it = begin; it < end; ++it) {
          if (slices[static_cast<std::size_t>(it)].b != b) continue;
          const float* out = partial.data() + (it - begin) * per_slice;
          merge_output(state(t), part, out[rows * dv + h * p.seqlen_q + i], out + (i * p.heads + h) * dv, 1);
        }
      }
    }
  }
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> tmp(static_cast<std::size_t>(dv));
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < p.batch * rows; ++t) finalize_row(p, state(t), t / rows, t % rows, tmp.data());
  }
}

}  // namespace attn::detail
