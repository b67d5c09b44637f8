// Decode's argument checks, for the CPU and CUDA entry points alike. The rules, each with the argument it names:
//   q, out, lse, cache.k, cache.v, k_new, v_new: the view rules of validate.cpp (rank, sizes, strides,
//       overflow, null data)
//   cache.k: dtype must be f64, f32, bf16 or f16, or i8 / fp8 (quantized: the rules of
//       decode_quant_validate.cpp); cache.v: cache.k's; k_new, v_new: cache.k's (unquantized caches)
//   q: dtype must be cache.k's or f32 (unquantized caches); out: dtype must match q's; lse: f64 for an
//       f64 cache, else f32
//   cache.k / cache.v: last dimension must be contiguous (stride[3] = 1)
//   shapes: cache.v = cache.k but for head_dim; head_dim of q, k_new = cache.k's; of out, v_new =
//       cache.v's; heads a multiple of kv_heads; contiguous cache: batch = q's; out = q but for
//       head_dim; lse = [batch, heads, seqlen_q]; v_new = k_new but for head_dim
//   k_new and v_new: both or neither; with cache.v viewing cache.k's rows (MLA: the same data and
//       strides), cache.v's head_dim <= cache.k's, k_new alone (and not into a quantized cache), no rotary
//   cache.seqlens: not null; each >= 0 and seqlens[b] + seqlen_new <= capacity (max_seqlen, or
//       block_table's max_pages x page_size)
//   cache.batch_idx / cache.leftpad: contiguous caches only; batch_idx entries in [0, cache rows), distinct
//       when appending (the cache's batch may then differ from q's); 0 <= leftpad[b] <= seqlens[b]
//   cache.block_table: max_pages >= 1, block_table_stride >= max_pages; the entries of the pages that
//       hold keys [0, seqlens[b] + seqlen_new) in [0, num_pages); appended slots written once
//   out, lse: no self-aliasing, no overlap with any input or each other; when appending, the cache must
//       not alias itself or overlap k_new, v_new, q, seqlens, block_table or the scales, and cache.k and
//       cache.v must not overlap; scales the append writes must not overlap any other input
//   options: as validate.cpp (scale, threads, window, softcap, ALiBi, the arrays' lengths); dropout_p must be 0;
//       num_splits >= 0; keys_per_split >= 0
//   rotary: only with k_new/v_new; cos, sin not null; dtype f32 or f64; rotary_dim even in [2, head_dim];
//       positions cover every position used
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/checked.hpp"
#include "core/element.hpp"
#include "validate/page_rules.hpp"
#include "cpu/rotary.hpp"
#include "validate/problem.hpp"
#include "validate/validate.hpp"
#include "validate/decode_problem.hpp"

namespace attn::detail {
namespace {

void require_dtype(std::string_view who, std::string_view arg, DType got, DType want, std::string_view whose) {
  if (got != want)
    fail(who, arg,
         "dtype must match " + std::string(whose) + "'s (" + std::string(dtype_name(want)) + "), got " +
             std::string(dtype_name(got)));
}

// cache.batch_idx and cache.leftpad (contiguous caches): batch_idx[b] in [0, rows of the cache), distinct
// when appending; 0 <= leftpad[b] <= seqlens[b] (seqlens checked before). Returns the arrays' span (one
// of them: they are inputs that out and lse must not overlap; both are checked against the cache).
Span check_row_maps(std::string_view who, const KVCache& cache, std::int64_t batch, bool paged, bool appending) {
  if (paged && (cache.batch_idx || cache.leftpad))
    fail(who, cache.batch_idx ? "cache.batch_idx" : "cache.leftpad",
         "only for contiguous caches (a paged cache maps sequences through block_table)");
  Span span{};
  if (cache.batch_idx) {
    std::vector<std::pair<std::int32_t, std::int64_t>> rows;
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t r = cache.batch_idx[b];
      if (r < 0 || r >= cache.k.shape[0])
        fail(who, "cache.batch_idx",
             "entry [" + std::to_string(b) + "] = " + std::to_string(r) +
                 " must be in [0, cache rows = " + std::to_string(cache.k.shape[0]) + ")");
      rows.emplace_back(cache.batch_idx[b], b);
    }
    std::sort(rows.begin(), rows.end());
    for (std::size_t i = 1; appending && i < rows.size(); ++i)
      if (rows[i].first == rows[i - 1].first)
        fail(who, "cache.batch_idx",
             "sequences " + std::to_string(rows[i - 1].second) + " and " + std::to_string(rows[i].second) +
                 " append into cache row " + std::to_string(rows[i].first));
    span = int32_span(cache.batch_idx, batch);
  }
  if (cache.leftpad) {
    for (std::int64_t b = 0; b < batch; ++b)
      if (cache.leftpad[b] < 0 || cache.leftpad[b] > cache.seqlens[b])
        fail(who, "cache.leftpad",
             "entry [" + std::to_string(b) + "] = " + std::to_string(cache.leftpad[b]) +
                 " must be in [0, seqlens[b] = " + std::to_string(cache.seqlens[b]) + "]");
    if (span.empty()) span = int32_span(cache.leftpad, batch);
  }
  return span;
}

// dec.rotary: tables present, f32 or f64, rotary_dim even in
// [2, head_dim], only with k_new/v_new, and every position used (keys up to seqlens[b] + seqlen_new - 1,
// queries up to seqlens[b] + seqlen_q - 1 or seqlens[b]) < positions.
void check_rotary(std::string_view who, const DecodeOptions& dec, const KVCache& cache, std::int64_t batch,
                  std::int64_t d, std::int64_t seqlen_q, std::int64_t seqlen_new, bool q_per_row) {
  const RotaryTables* r = dec.rotary;
  if (!r) return;
  if (!dec.k_new) fail(who, "rotary", "needs k_new (it rotates the appended keys and q)");
  if (!r->cos || !r->sin) fail(who, r->cos ? "rotary.sin" : "rotary.cos", "data pointer is null");
  if (r->dtype != DType::f32 && r->dtype != DType::f64)
    fail(who, "rotary.dtype", "must be f32 or f64, got " + std::string(dtype_name(r->dtype)));
  if (r->rotary_dim < 2 || r->rotary_dim % 2 != 0 || r->rotary_dim > d)
    fail(who, "rotary.rotary_dim",
         "must be even and in [2, head_dim = " + std::to_string(d) + "], got " + std::to_string(r->rotary_dim));
  std::int64_t need = 0;
  for (std::int64_t b = 0; b < batch; ++b)
    need = std::max(need, std::int64_t{cache.seqlens[b]} + std::max(seqlen_new, q_per_row ? seqlen_q : 1));
  if (r->positions < need)
    fail(who, "rotary.positions",
         "must cover every position used (" + std::to_string(need) + " = max seqlens[b] + max(seqlen_new, " +
             (q_per_row ? "seqlen_q" : "1") + ")), got " + std::to_string(r->positions));
  std::int64_t extent = 0;
  if (!checked_mul(r->positions, r->rotary_dim / 2, extent) || extent > (std::int64_t{1} << 60))
    fail(who, "rotary.positions", "sizes overflow");
}

}  // namespace

bool values_in_keys(const KVCache& cache) {
  if (cache.v.data == nullptr || cache.v.data != cache.k.data || cache.v.rank != 4 || cache.k.rank != 4) return false;
  for (int i = 0; i < 4; ++i)
    if (cache.v.strides[i] != cache.k.strides[i]) return false;
  return true;
}

namespace {

// The byte spans of the call's views, each checked on its own (validate.cpp's view rules): outputs must
// not overlap the inputs, and when appending the cache must not overlap anything else.
struct DecodeSpans {
  Span q, k, v, out, lse, k_new, v_new;
};

// The sizes of the call, from q, the cache and k_new, checked against each other.
struct DecodeSizes {
  std::int64_t batch, seqlen_q, heads, head_dim, kv_heads, seqlen_new;
};

// Where the sequences' keys live: the block table's row stride (paged), the keys a sequence may hold,
// the page size (a contiguous cache's max_seqlen), and the spans of the index arrays.
struct CacheExtent {
  std::int64_t bt_stride = 0, capacity = 0, page_size = 0, num_pages = 0;
  Span seqlens, block_table, row_maps;
};

// Each view alone, and the rules of an MLA cache (cache.v a view of cache.k's rows) and of an append.
DecodeSpans check_views(std::string_view who, const TensorView& q, const KVCache& cache, const TensorView& out,
                        const DecodeOptions& dec, const TensorView* lse, bool paged, bool v_in_k) {
  // With a quantized cache, q's and k_new's quantized dtypes are named by check_quantized_types, whose
  // message lists the types allowed there (not f64).
  const bool quantized = is_quantized(cache.k.dtype);
  DecodeSpans s;
  s.q = check_view(who, "q", q, 4, false, quantized);
  s.k = check_view(who, "cache.k", cache.k, 4, !paged, true);
  s.v = check_view(who, "cache.v", cache.v, 4, !paged, true);
  s.out = check_view(who, "out", out, 4, false);
  s.lse = lse ? check_view(who, "lse", *lse, 3, false) : Span{};
  if (v_in_k) {
    if (cache.v.shape[3] > cache.k.shape[3])
      fail(who, "cache.v",
           "head_dim (" + std::to_string(cache.v.shape[3]) + ") must be <= cache.k's (" +
               std::to_string(cache.k.shape[3]) + ") when cache.v views cache.k's rows (MLA)");
    if (dec.v_new) fail(who, "v_new", "must be null when cache.v views cache.k's rows (MLA): k_new holds the values");
    if (dec.k_new && quantized)
      fail(who, "cache.v",
           "must not view cache.k's rows (MLA) when appending into a quantized cache (k_new is quantized with "
           "cache.k_scale alone)");
  } else if ((dec.k_new == nullptr) != (dec.v_new == nullptr)) {
    fail(who, dec.k_new ? "v_new" : "k_new", "k_new and v_new must be given together");
  }
  s.k_new = dec.k_new ? check_view(who, "k_new", *dec.k_new, 4, true, quantized) : Span{};
  s.v_new = dec.v_new ? check_view(who, "v_new", *dec.v_new, 4, true, quantized) : Span{};
  return s;
}

void check_dtypes(std::string_view who, const TensorView& q, const KVCache& cache, const TensorView& out,
                  const DecodeOptions& dec, const TensorView* lse) {
  const DType ct = cache.k.dtype;
  require_dtype(who, "cache.v", cache.v.dtype, ct, "cache.k");
  if (dec.quantized_query && ct != DType::i8)
    fail(who, "quantized_query",
         "needs an int8 cache (int8 or q8_0 scales), got a " + std::string(dtype_name(ct)) + " cache");
  if (is_quantized(ct)) {
    check_quantized_types(who, ct, q, dec);
  } else if (dec.k_new) {
    require_dtype(who, "k_new", dec.k_new->dtype, ct, "cache.k");
    if (dec.v_new) require_dtype(who, "v_new", dec.v_new->dtype, ct, "cache.k");
  }
  if (!is_quantized(ct) && q.dtype != ct && q.dtype != DType::f32)
    fail(who, "q",
         "dtype must be cache.k's (" + std::string(dtype_name(ct)) + ") or f32, got " +
             std::string(dtype_name(q.dtype)));
  require_dtype(who, "out", out.dtype, q.dtype, "q");
  const DType lse_dtype = ct == DType::f64 ? DType::f64 : DType::f32;
  if (lse && lse->dtype != lse_dtype)
    fail(who, "lse",
         "dtype must be " + std::string(dtype_name(lse_dtype)) + " for a " + std::string(dtype_name(ct)) +
             " cache, got " + std::string(dtype_name(lse->dtype)));
}

DecodeSizes check_shapes(std::string_view who, const TensorView& q, const KVCache& cache, const TensorView& out,
                         const DecodeOptions& dec, const TensorView* lse, bool paged) {
  const std::int64_t batch = q.shape[0], sqn = q.shape[1], heads = q.shape[2], d = q.shape[3];
  const std::int64_t kv_heads = cache.k.shape[2];
  static constexpr const char* kDims[] = {"batch", "seqlen", "heads", "head_dim"};
  const char* kDimsPaged[] = {"num_pages", "page_size", "heads", "head_dim"};
  for (int i = 0; i < 3; ++i)  // cache.v's head_dim is the output's: it may differ from cache.k's
    require_equal(who, "cache.v", paged ? kDimsPaged[i] : kDims[i], cache.v.shape[i], "cache.k", cache.k.shape[i]);
  require_equal(who, "cache.k", "head_dim", cache.k.shape[3], "q", d);
  if (heads % kv_heads != 0)
    fail(who, "q",
         "heads (" + std::to_string(heads) + ") must be a multiple of cache.k's kv_heads (" + std::to_string(kv_heads) +
             ")");
  if (!paged && !cache.batch_idx) require_equal(who, "cache.k", "batch", cache.k.shape[0], "q", batch);
  for (auto [name, t] : {std::pair<const char*, const TensorView*>{"cache.k", &cache.k}, {"cache.v", &cache.v}})
    if (t->shape[3] > 1 && t->strides[3] != 1)
      fail(who, name, "last dimension must be contiguous (stride[3] = 1), got stride " + std::to_string(t->strides[3]));
  for (int i = 0; i < 3; ++i) require_equal(who, "out", kDims[i], out.shape[i], "q", q.shape[i]);
  require_equal(who, "out", "head_dim", out.shape[3], "cache.v", cache.v.shape[3]);
  if (lse) {
    require_equal(who, "lse", "batch", lse->shape[0], "q", batch);
    require_equal(who, "lse", "heads", lse->shape[1], "q", heads);
    require_equal(who, "lse", "seqlen_q", lse->shape[2], "q", sqn);
  }
  std::int64_t seqlen_new = 0;
  if (dec.k_new) {
    require_equal(who, "k_new", "batch", dec.k_new->shape[0], "q", batch);
    require_equal(who, "k_new", "heads", dec.k_new->shape[2], "cache.k", kv_heads);
    require_equal(who, "k_new", "head_dim", dec.k_new->shape[3], "cache.k", d);
    if (dec.v_new) {
      for (int i = 0; i < 3; ++i)
        require_equal(who, "v_new", kDims[i], dec.v_new->shape[i], "k_new", dec.k_new->shape[i]);
      require_equal(who, "v_new", "head_dim", dec.v_new->shape[3], "cache.v", cache.v.shape[3]);
    }
    seqlen_new = dec.k_new->shape[1];
  }
  return {batch, sqn, heads, d, kv_heads, seqlen_new};
}

// Sequence lengths against the capacity, the block table's shape and the entries every sequence uses,
// batch_idx and leftpad.
CacheExtent check_sequences(std::string_view who, const KVCache& cache, const DecodeSizes& n, bool paged) {
  if (!cache.seqlens) fail(who, "cache.seqlens", "data pointer is null");
  CacheExtent e;
  e.capacity = e.page_size = cache.k.shape[1];
  e.num_pages = cache.k.shape[0];
  if (paged) {
    const BlockTableShape t = check_block_table(who, "cache.block_table", cache.block_table, cache.max_pages,
                                                cache.block_table_stride, n.batch, e.page_size);
    e.bt_stride = t.stride;
    e.capacity = t.capacity;
    e.block_table = t.span;
  }
  e.seqlens = int32_span(cache.seqlens, n.batch);
  for (std::int64_t b = 0; b < n.batch; ++b) {
    const std::int64_t len = cache.seqlens[b];
    if (len < 0)
      fail(who, "cache.seqlens", "must be >= 0, got seqlens[" + std::to_string(b) + "] = " + std::to_string(len));
    if (saturating_add(len, n.seqlen_new) > e.capacity)
      fail(who, "cache.seqlens",
           "seqlens[" + std::to_string(b) + "] + seqlen_new (" + std::to_string(len) + " + " +
               std::to_string(n.seqlen_new) + ") exceeds the cache capacity (" + std::to_string(e.capacity) +
               (paged ? " = block_table's max_pages x page_size)" : " = max_seqlen)"));
    if (paged)  // len + seqlen_new <= capacity: no overflow
      check_block_table_entries(who, "cache.block_table", cache.block_table, e.bt_stride, b, len + n.seqlen_new,
                                e.page_size, e.num_pages);
  }
  e.row_maps = check_row_maps(who, cache, n.batch, paged, n.seqlen_new > 0);
  return e;
}

// Two sequences of a paged cache must not append into the same slot.
void check_append_slots(std::string_view who, const KVCache& cache, const DecodeSizes& n, const CacheExtent& e) {
  std::vector<std::pair<std::int64_t, std::int64_t>> slots;  // (page * page_size + slot, b)
  slots.reserve(static_cast<std::size_t>(n.batch * n.seqlen_new));
  const CacheIndex index = cache_index(cache, n.seqlen_new, e.bt_stride);
  for (std::int64_t b = 0; b < n.batch; ++b)
    for (std::int64_t t = 0; t < n.seqlen_new; ++t)  // strides (page_size, 1): the slot's number in the cache
      slots.emplace_back(index.position_offset(b, index.append_position(b, t), e.page_size, 1), b);
  std::sort(slots.begin(), slots.end());
  for (std::size_t i = 1; i < slots.size(); ++i)
    if (slots[i].first == slots[i - 1].first)
      fail(who, "cache.block_table",
           "sequences " + std::to_string(slots[i - 1].second) + " and " + std::to_string(slots[i].second) +
               " append into the same slot (page " + std::to_string(slots[i].first / e.page_size) + ", slot " +
               std::to_string(slots[i].first % e.page_size) + ")");
}

// Outputs distinct and apart from every input; when appending, the cache (and the scales it writes) apart
// from everything else too.
void check_overlaps(std::string_view who, const KVCache& cache, const TensorView& out, const TensorView* lse,
                    const DecodeSpans& s, const CacheExtent& e, const CacheScales& scales, const DecodeSizes& n,
                    bool paged, bool v_in_k) {
  check_no_self_alias(who, "out", out);
  if (lse) check_no_self_alias(who, "lse", *lse);
  const std::pair<const char*, Span> inputs[] = {{"q", s.q},
                                                 {"cache.k", s.k},
                                                 {"cache.v", s.v},
                                                 {"k_new", s.k_new},
                                                 {"v_new", s.v_new},
                                                 {"cache.seqlens", e.seqlens},
                                                 {"cache.block_table", e.block_table},
                                                 {"cache.batch_idx / leftpad", e.row_maps},
                                                 {"cache.k_scale", scales.k_span},
                                                 {"cache.v_scale", scales.v_span}};
  for (auto [name, span] : inputs) {
    if (overlaps(s.out, span)) fail(who, "out", std::string("overlaps input ") + name);
    if (overlaps(s.lse, span)) fail(who, "lse", std::string("overlaps input ") + name);
  }
  if (overlaps(s.out, s.lse)) fail(who, "lse", "overlaps out");
  if (n.seqlen_new == 0) return;
  check_no_self_alias(who, "cache.k", cache.k);
  check_no_self_alias(who, "cache.v", cache.v);
  if (!v_in_k && overlaps(s.k, s.v)) fail(who, "cache.v", "overlaps cache.k (both are written when appending)");
  for (std::size_t i = 0; i < std::size(inputs); ++i) {
    if (i == 1 || i == 2) continue;  // cache.k and cache.v themselves
    const auto [name, span] = inputs[i];
    if (overlaps(s.k, span)) fail(who, "cache.k", std::string("overlaps ") + name + " (written when appending)");
    if (overlaps(s.v, span)) fail(who, "cache.v", std::string("overlaps ") + name + " (written when appending)");
  }
  for (auto [arg, written, owned] : {std::tuple{"cache.k_scale", scales.k_span, scales.k_owned},
                                     std::tuple{"cache.v_scale", scales.v_span, scales.v_owned}})
    for (auto [name, span] : inputs)
      if (owned && std::string_view(name) != arg && overlaps(written, span))
        fail(who, arg, std::string("overlaps ") + name + " (the appended positions' scales are written)");
  if (paged) check_append_slots(who, cache, n, e);
}

// Whether query row i rotates at seqlens[b] + i (RotarySpec::q_per_row): when the mask is causal or
// windowed, so that each row sees the keys before its own position; else all rows at seqlens[b].
bool queries_rotate_per_row(const ScoreRule& rule) { return rule.window_left >= 0 || rule.window_right >= 0; }

// The shared options (validate.cpp) and decode's own: rotary, no dropout, split counts.
ResolvedOptions check_options(std::string_view who, const KVCache& cache, const AttentionOptions& opts,
                              const DecodeOptions& dec, const DecodeSizes& n, bool v_in_k) {
  const ResolvedOptions resolved = resolve_options(who, opts, n.head_dim);
  check_option_arrays(who, opts, n.batch, n.heads);
  check_rotary(who, dec, cache, n.batch, n.head_dim, n.seqlen_q, n.seqlen_new, queries_rotate_per_row(resolved.rule));
  if (dec.rotary && v_in_k)
    fail(who, "rotary",
         "must be null when cache.v views cache.k's rows (MLA): it rotates the first rotary_dim dims, which are "
         "values there; rotate k_new's rope dims before appending");
  reject_dropout(who, resolved.dropout, "decode is an inference path");
  if (dec.num_splits < 0)
    fail(who, "num_splits", "must be >= 0 (0 = automatic), got " + std::to_string(dec.num_splits));
  if (dec.keys_per_split < 0)
    fail(who, "keys_per_split", "must be >= 0 (0 = off), got " + std::to_string(dec.keys_per_split));
  return resolved;
}

DecodeProblem make_problem(const TensorView& q, const KVCache& cache, const TensorView& out, const DecodeOptions& dec,
                           const TensorView* lse, const ResolvedOptions& resolved, const DecodeSizes& n,
                           const CacheExtent& e, const CacheScales& scales, bool v_in_k) {
  DecodeProblem p{};
  static_cast<ResolvedOptions&>(p) = resolved;
  p.batch = n.batch;
  p.seqlen_q = n.seqlen_q;
  p.heads = n.heads;
  p.kv_heads = n.kv_heads;
  p.head_dim = n.head_dim;
  p.head_dim_v = cache.v.shape[3];
  p.v_in_k = v_in_k;
  p.cache_dtype = cache.k.dtype;
  p.q_dtype = q.dtype;
  p.num_splits = dec.num_splits;
  p.keys_per_split = dec.keys_per_split;
  p.quantized_query = dec.quantized_query;
  p.q = q;
  p.k = cache.k;
  p.v = cache.v;
  p.out = out;
  p.lse = lse;
  p.k_new = dec.k_new;
  p.v_new = dec.v_new;
  p.index = cache_index(cache, n.seqlen_new, e.bt_stride);
  p.rotary = rotary_spec(dec.rotary, queries_rotate_per_row(resolved.rule));
  p.k_scale = scales.k;
  p.v_scale = scales.v;
  p.k_scale_owned = scales.k_owned;
  p.v_scale_owned = scales.v_owned;
  return p;
}

}  // namespace

DecodeProblem validate_decode(std::string_view who, const TensorView& q, const KVCache& cache, const TensorView& out,
                              const AttentionOptions& opts, const DecodeOptions& dec, const TensorView* lse) {
  const bool paged = cache.block_table != nullptr, v_in_k = values_in_keys(cache);
  const DecodeSpans spans = check_views(who, q, cache, out, dec, lse, paged, v_in_k);
  check_dtypes(who, q, cache, out, dec, lse);
  const DecodeSizes sizes = check_shapes(who, q, cache, out, dec, lse, paged);
  const CacheScales scales = check_cache_scales(who, cache);
  const CacheExtent extent = check_sequences(who, cache, sizes, paged);
  check_overlaps(who, cache, out, lse, spans, extent, scales, sizes, paged, v_in_k);
  const ResolvedOptions resolved = check_options(who, cache, opts, dec, sizes, v_in_k);
  DecodeProblem p = make_problem(q, cache, out, dec, lse, resolved, sizes, extent, scales, v_in_k);
  check_quantized_append(who, p);
  return p;
}

}  // namespace attn::detail
