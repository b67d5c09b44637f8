#include "validate/varlen_rules.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "validate/page_rules.hpp"
#include "validate/problem.hpp"
#include "validate/validate.hpp"

namespace attn::detail {

TensorView packed_as_batch_of_one(std::string_view who, std::string_view arg, const TensorView& t) {
  if (t.rank != 3) fail(who, arg, "rank must be 3 ([total, heads, head_dim]), got " + std::to_string(t.rank));
  TensorView r = t;
  r.rank = 4;
  r.shape = {1, t.shape[0], t.shape[1], t.shape[2]};
  r.strides = {0, t.strides[0], t.strides[1], t.strides[2]};
  return r;
}

void check_varlen_batch(std::string_view who, std::int64_t batch) {
  if (batch < 1) fail(who, "batch", "must be >= 1, got " + std::to_string(batch));
  if (batch > (std::int64_t{1} << 31)) fail(who, "batch", "must be < 2^31, got " + std::to_string(batch));
}

void check_varlen_offsets(std::string_view who, const VarlenBatch& varlen, std::int64_t total_q, std::int64_t total_k) {
  check_cu_seqlens(who, "cu_seqlens_q", varlen.cu_seqlens_q, varlen.batch, total_q);
  check_cu_seqlens(who, "cu_seqlens_k", varlen.cu_seqlens_k, varlen.batch, total_k);
}

void check_cu_seqlens(std::string_view who, std::string_view arg, const std::int32_t* cu, std::int64_t batch,
                      std::int64_t total) {
  if (cu == nullptr) fail(who, arg, "pointer is null");
  if (cu[0] != 0) fail(who, arg, "[0] must be 0, got " + std::to_string(cu[0]));
  for (std::int64_t b = 0; b < batch; ++b)
    if (cu[b + 1] < cu[b])
      fail(who, arg,
           "must be non-decreasing, but [" + std::to_string(b + 1) + "] = " + std::to_string(cu[b + 1]) + " < [" +
               std::to_string(b) + "] = " + std::to_string(cu[b]));
  if (total >= 0 && cu[batch] != total)
    fail(who, arg,
         "[batch] must equal the packed length " + std::to_string(total) + ", got " + std::to_string(cu[batch]));
}

void check_varlen_lse(std::string_view who, const TensorView* lse) {
  if (lse && (lse->rank != 3 || lse->shape[0] != 1)) fail(who, "lse", "must be a rank-3 view [1, heads, total_q]");
}

Problem validate_packed(std::string_view who, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, std::int64_t batch, const AttentionOptions& opts,
                        const TensorView* lse) {
  check_varlen_batch(who, batch);
  const TensorView q4 = packed_as_batch_of_one(who, "q", q), k4 = packed_as_batch_of_one(who, "k", k),
                   v4 = packed_as_batch_of_one(who, "v", v), o4 = packed_as_batch_of_one(who, "out", out);
  check_varlen_lse(who, lse);
  Problem p = validate(who, q4, k4, v4, &o4, opts, lse);
  // The packed problem's batch is 1; dropout's counter word b * heads + h and the ALiBi slopes of
  // sequence b need the sequence count.
  check_dropout_extent(who, p.dropout, batch, p.heads, p.seqlen_q, p.seqlen_k);
  check_option_arrays(who, opts, batch, p.heads);
  return p;
}

BackwardProblem validate_packed_backward(std::string_view who, const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out, const TensorView& dout,
                                         const TensorView& lse, const TensorView& dq, const TensorView& dk,
                                         const TensorView& dv, std::int64_t batch, const AttentionOptions& opts,
                                         const TensorView* dsink) {
  check_varlen_batch(who, batch);
  // In argument order, so that of several views of the wrong rank the first is named.
  const TensorView q4 = packed_as_batch_of_one(who, "q", q), k4 = packed_as_batch_of_one(who, "k", k),
                   v4 = packed_as_batch_of_one(who, "v", v), o4 = packed_as_batch_of_one(who, "out", out),
                   do4 = packed_as_batch_of_one(who, "dout", dout), dq4 = packed_as_batch_of_one(who, "dq", dq),
                   dk4 = packed_as_batch_of_one(who, "dk", dk), dv4 = packed_as_batch_of_one(who, "dv", dv);
  check_varlen_lse(who, &lse);
  BackwardProblem p = validate_backward(who, q4, k4, v4, o4, do4, lse, dq4, dk4, dv4, opts, dsink);
  check_dropout_extent(who, p.dropout, batch, p.heads, p.seqlen_q, p.seqlen_k);  // as validate_packed
  check_option_arrays(who, opts, batch, p.heads);
  return p;
}

TensorView offset_rows(TensorView t, std::int64_t dim, std::int64_t first, std::int64_t count) {
  t.data =
      static_cast<unsigned char*>(t.data) + first * t.strides[dim] * static_cast<std::int64_t>(dtype_size(t.dtype));
  t.shape[dim] = count;
  return t;
}

Problem sequence_problem(const Problem& packed, const VarlenBatch& varlen, std::int64_t b, const VarlenPages* pages) {
  const std::int32_t *cu_q = varlen.cu_seqlens_q, *cu_k = varlen.cu_seqlens_k;
  const std::int64_t q0 = cu_q[b], nq = cu_q[b + 1] - q0;
  const std::int64_t k0 = cu_k[b], nk = cu_k[b + 1] - k0;
  Problem p = packed;
  p.seqlen_q = nq;
  p.seqlen_k = nk;
  p.q = offset_rows(packed.q, 1, q0, nq);
  p.out = offset_rows(packed.out, 1, q0, nq);
  if (pages) {
    const std::int64_t stride = pages->block_table_stride == 0 ? pages->max_pages : pages->block_table_stride;
    p.pages = PageTable{pages->block_table, stride, packed.k.shape[1]}.row(b);
  } else {
    p.k = offset_rows(packed.k, 1, k0, nk);
    p.v = offset_rows(packed.v, 1, k0, nk);
  }
  p.lse = nullptr;
  p.rule = packed.rule.for_sequence(b);
  p.dropout = packed.dropout.for_sequence(b);  // sequence b draws batch index b's mask
  return p;
}

// The paged varlen forward's rules (varlen_rules.hpp).
Problem validate_packed_paged(std::string_view who, const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const VarlenBatch& varlen, const VarlenPages& pages,
                              const AttentionOptions& opts, const TensorView* lse, const std::int32_t* table_address) {
  const std::int64_t batch = varlen.batch;
  const Span sk = check_view(who, "k", k, 4, false), sv = check_view(who, "v", v, 4, false);
  static constexpr const char* kDims[] = {"num_pages", "page_size", "heads", "head_dim"};
  for (int i = 0; i < 3; ++i) require_equal(who, "v", kDims[i], v.shape[i], "k", k.shape[i]);
  TensorView k0 = k, v0 = v;
  k0.shape[0] = v0.shape[0] = 1;
  TensorView k3 = k0, v3 = v0;  // as the packed rank-3 form validate_packed takes: [page_size, heads, d]
  for (TensorView* t : {&k3, &v3}) {
    t->rank = 3;
    t->shape = {t->shape[1], t->shape[2], t->shape[3], 1};
    t->strides = {t->strides[1], t->strides[2], t->strides[3], 1};
  }
  Problem all = validate_packed(who, q, k3, v3, out, batch, opts, lse);
  all.k = k0, all.v = v0;
  check_varlen_offsets(who, varlen, all.seqlen_q, -1);

  const std::int64_t page_size = k.shape[1], num_pages = k.shape[0];
  const BlockTableShape table = check_block_table(who, "pages.block_table", pages.block_table, pages.max_pages,
                                                  pages.block_table_stride, batch, page_size);
  std::int64_t max_keys = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t keys = std::int64_t{varlen.cu_seqlens_k[b + 1]} - varlen.cu_seqlens_k[b];
    if (keys > table.capacity)
      fail(who, "cu_seqlens_k",
           "sequence " + std::to_string(b) + " has " + std::to_string(keys) + " keys, more than the cache holds (" +
               std::to_string(table.capacity) + " = block_table's max_pages x page_size)");
    check_block_table_entries(who, "pages.block_table", pages.block_table, table.stride, b, keys, page_size, num_pages);
    max_keys = std::max(max_keys, keys);
  }
  check_dropout_extent(who, all.dropout, batch, all.heads, all.seqlen_q, max_keys);
  const Span so = check_view(who, "out", packed_as_batch_of_one(who, "out", out), 4, false);
  const Span sl = lse ? check_view(who, "lse", *lse, 3, false) : Span{};
  Span table_span = table.span;  // where the table lives: the device's copy on the CUDA backend
  if (table_address)
    table_span = check_block_table(who, "pages.block_table", table_address, pages.max_pages, pages.block_table_stride,
                                   batch, page_size)
                     .span;
  for (auto [name, s] : {std::pair<const char*, Span>{"k", sk}, {"v", sv}, {"pages.block_table", table_span}}) {
    if (overlaps(so, s)) fail(who, "out", std::string("overlaps input ") + name);
    if (overlaps(sl, s)) fail(who, "lse", std::string("overlaps input ") + name);
  }
  return all;
}

}  // namespace attn::detail
