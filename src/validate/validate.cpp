// Argument validation shared by every entry point. The rules, each with the message it produces:
//   <arg>: data pointer is null                       (a non-empty view with no data)
//   <arg>: rank must be R                             (4 for q/k/v/out, 3 for lse)
//   <arg>: dtype must be f64, f32, bf16 or f16        (a quantized type, or a DType value outside the enum)
//   <arg>: <dim> must be >= 1                         (seqlen of k and v may be 0: every row is masked)
//   <arg>: stride[i] must be >= 0
//   <arg>: sizes overflow                             (element count or byte extent beyond int64)
//   <arg>: dtype must match q's                       (lse: f64 for f64 inputs, else f32)
//   <arg>: <dim> must equal <other>'s                 (shape relations; v's head_dim may differ from k's,
//                                                      out's is v's)
//   heads must be a multiple of kv_heads
//   <arg>: strides make elements alias                (outputs only)
//   <arg>: overlaps <input>                           (outputs must not overlap any input or each other)
//   softmax_scale must be finite; num_threads must be >= 0
//   dropout_p must be in [0, 1); dropout_offset must be < 2^32; with dropout, the sizes of
//   check_dropout_extent; entry points without dropout: dropout_p must be 0 (reject_dropout)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "core/checked.hpp"
#include "validate/problem.hpp"
#include "validate/validate.hpp"

namespace attn::detail {

void fail(std::string_view who, std::string_view arg, const std::string& rule) {
  throw std::invalid_argument(std::string(who) + ": " + std::string(arg) + ": " + rule);
}

namespace {

constexpr const char* kDimNames4[] = {"batch", "seqlen", "heads", "head_dim"};
constexpr const char* kDimNamesLse[] = {"batch", "heads", "seqlen_q"};
constexpr double kF32Max = 3.4028234663852886e38;

// %g, not std::to_string's %f: 1e300 as "1e+300", 1e-9 as "1e-09" instead of 0.000000.
std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

}  // namespace

// Checks one view on its own and returns its byte span.
Span check_view(std::string_view who, std::string_view arg, const TensorView& t, int rank, bool allow_empty_seqlen,
                bool allow_quantized) {
  if (t.rank != rank) fail(who, arg, "rank must be " + std::to_string(rank) + ", got " + std::to_string(t.rank));
  if (is_quantized(t.dtype) && !allow_quantized)
    fail(who, arg,
         "dtype must be f64, f32, bf16 or f16, got " + std::string(dtype_name(t.dtype)) +
             " (quantized types are for attention_decode's cache.k and cache.v only)");
  if (static_cast<unsigned>(t.dtype) > static_cast<unsigned>(DType::fp8_e5m2))
    fail(who, arg, "dtype must be f64, f32, bf16 or f16, got code " + std::to_string(static_cast<unsigned>(t.dtype)));
  const char* const* names = rank == 4 ? kDimNames4 : kDimNamesLse;
  bool empty = false;
  std::int64_t numel = 1, max_offset = 0;
  for (int i = 0; i < rank; ++i) {
    const bool may_be_zero = allow_empty_seqlen && i == 1;
    if (t.shape[i] < (may_be_zero ? 0 : 1))
      fail(who, arg,
           std::string(names[i]) + " must be >= " + (may_be_zero ? "0" : "1") + ", got " + std::to_string(t.shape[i]));
    if (t.strides[i] < 0)
      fail(who, arg, "stride[" + std::to_string(i) + "] must be >= 0, got " + std::to_string(t.strides[i]));
    if (t.shape[i] == 0) empty = true;
    std::int64_t term = 0;
    if (!checked_mul(numel, t.shape[i], numel) ||
        !checked_mul(t.shape[i] > 0 ? t.shape[i] - 1 : 0, t.strides[i], term) ||
        !checked_add(max_offset, term, max_offset))
      fail(who, arg, "sizes overflow (shape x strides exceeds 2^63 elements)");
  }
  std::int64_t bytes = 0;
  std::int64_t extent = 0;  // elements from the first to one past the last
  if (!checked_add(max_offset, 1, extent) ||
      !checked_mul(extent, static_cast<std::int64_t>(dtype_size(t.dtype)), bytes))
    fail(who, arg, "sizes overflow (extent exceeds 2^63 bytes)");
  if (empty) return {};
  if (t.data == nullptr) fail(who, arg, "data pointer is null");
  const auto lo = reinterpret_cast<std::uintptr_t>(t.data);
  if (lo + static_cast<std::uintptr_t>(bytes) < lo) fail(who, arg, "sizes overflow (extent wraps the address space)");
  return {lo, lo + static_cast<std::uintptr_t>(bytes)};
}

// An output's strides must give every element its own address: sorted by stride, each stride must
// step over the whole extent of the smaller ones (a sufficient rule that accepts every dense or
// padded layout).
void check_no_self_alias(std::string_view who, std::string_view arg, const TensorView& t) {
  if (const int i = aliasing_dim(t); i >= 0)
    fail(who, arg,
         "strides make elements alias (stride[" + std::to_string(i) + "] = " + std::to_string(t.strides[i]) +
             "); outputs need distinct addresses");
}

int aliasing_dim(const TensorView& t) {
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return -1;  // no elements, nothing to alias (a dense [b, 0, h, d] view has stride[0] 0)
  int order[TensorView::kMaxRank];
  int n = 0;
  for (int i = 0; i < t.rank; ++i)
    if (t.shape[i] > 1) order[n++] = i;
  for (int a = 1; a < n; ++a)  // insertion sort of at most 4 dims by stride
    for (int b = a; b > 0 && t.strides[order[b]] < t.strides[order[b - 1]]; --b) std::swap(order[b], order[b - 1]);
  std::int64_t reach = 0;  // largest offset covered by the dims so far
  for (int j = 0; j < n; ++j) {
    const int i = order[j];
    if (t.strides[i] <= reach) return i;
    reach += (t.shape[i] - 1) * t.strides[i];
  }
  return -1;
}

bool overlaps(Span a, Span b) { return !a.empty() && !b.empty() && a.lo < b.hi && b.lo < a.hi; }

void require_equal(std::string_view who, std::string_view arg, const char* dim, std::int64_t got,
                   std::string_view other, std::int64_t want) {
  if (got != want)
    fail(who, arg,
         std::string(dim) + " must equal " + std::string(other) + "'s (" + std::to_string(want) + "), got " +
             std::to_string(got));
}

ResolvedOptions resolve_options(std::string_view who, const AttentionOptions& opts, std::int64_t head_dim) {
  const double scale = opts.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)));
  // Every kernel may apply the scale and the cap in f32, so both must be f32 values: beyond the f32
  // maximum they would become inf, and 0 x inf a NaN where the exact score is 0.
  if (!std::isfinite(scale) || std::fabs(scale) > kF32Max)
    fail(who, "softmax_scale", "must be finite and within the f32 range (|x| <= 3.4e38), got " + number(scale));
  if (opts.num_threads < 0)
    fail(who, "num_threads", "must be >= 0 (0 = all cores), got " + std::to_string(opts.num_threads));
  if (opts.window_left < -1)
    fail(who, "window_left", "must be >= 0, or -1 for unbounded, got " + std::to_string(opts.window_left));
  if (opts.window_right < -1)
    fail(who, "window_right", "must be >= 0, or -1 for unbounded, got " + std::to_string(opts.window_right));
  if (!(opts.softcap >= 0) || !(opts.softcap <= kF32Max))
    fail(who, "softcap",
         "must be finite and >= 0 (0 = off), at most 3.4e38 (the f32 maximum), got " + number(opts.softcap));
  if (opts.alibi_slopes && opts.alibi_batch_stride < 0)
    fail(who, "alibi_batch_stride", "must be >= 0, got " + std::to_string(opts.alibi_batch_stride));
  // NaN fails both comparisons. p = 1 would scale by 1/0 and drop everything: not a valid rate.
  if (!(opts.dropout_p >= 0) || !(opts.dropout_p < 1))
    fail(who, "dropout_p", "must be in [0, 1) (0 = off), got " + number(opts.dropout_p));
  if (opts.dropout_offset > 0xffffffffu)
    fail(who, "dropout_offset",
         "must be < 2^32 (the Philox counter's last word), got " + std::to_string(opts.dropout_offset));
  ScoreRule rule;
  rule.scale = scale;
  rule.softcap = opts.softcap;
  rule.window_left = opts.window_left;
  rule.window_right = opts.causal ? 0 : opts.window_right;
  rule.alibi_slopes = opts.alibi_slopes.data;
  rule.alibi_batch_stride = opts.alibi_batch_stride;
  rule.sinks = opts.sinks.data;
  DropoutRule dropout;
  if (opts.dropout_p > 0) {
    dropout.p = opts.dropout_p;
    dropout.scale = 1 / (1 - opts.dropout_p);
    // (1 - p) 2^32 is below 2^32 for p > 0 except where 1 - p rounds to 1 (p < 2^-53): keep all but 1 in 2^32.
    const double t = std::floor((1 - opts.dropout_p) * 4294967296.0);
    dropout.threshold = t >= 4294967295.0 ? 0xffffffffu : static_cast<std::uint32_t>(t);
    dropout.seed = opts.dropout_seed;
    dropout.offset = static_cast<std::uint32_t>(opts.dropout_offset);
  }
  return {rule, dropout, opts.num_threads};
}

void check_dropout_extent(std::string_view who, const DropoutRule& dropout, std::int64_t batch, std::int64_t heads,
                          std::int64_t seqlen_q, std::int64_t seqlen_k) {
  if (!dropout.enabled()) return;
  constexpr std::int64_t k32 = std::int64_t{1} << 32, k34 = std::int64_t{1} << 34;
  std::int64_t bh = 0;
  if (seqlen_q > k32) fail(who, "q", "seqlen must be <= 2^32 with dropout, got " + std::to_string(seqlen_q));
  if (seqlen_k > k34) fail(who, "k", "seqlen must be <= 2^34 with dropout, got " + std::to_string(seqlen_k));
  if (!checked_mul(batch, heads, bh) || bh > k32)
    fail(who, "q",
         "batch x heads must be <= 2^32 with dropout, got " + std::to_string(batch) + " x " + std::to_string(heads));
}

void check_option_arrays(std::string_view who, const AttentionOptions& opts, std::int64_t batch, std::int64_t heads) {
  if (opts.alibi_slopes) {
    std::int64_t rows = 0, needed = 0;
    if (!checked_mul(batch - 1, opts.alibi_batch_stride, rows) || !checked_add(rows, heads, needed))
      fail(who, "alibi_batch_stride",
           "(batch - 1) x alibi_batch_stride overflows, got " + std::to_string(opts.alibi_batch_stride));
    if (opts.alibi_slopes.size < needed)
      fail(who, "alibi_slopes",
           "must hold (batch - 1) x alibi_batch_stride + heads = " + std::to_string(needed) + " values (batch " +
               std::to_string(batch) + ", alibi_batch_stride " + std::to_string(opts.alibi_batch_stride) + ", heads " +
               std::to_string(heads) + "), got " + std::to_string(opts.alibi_slopes.size));
  }
  if (opts.sinks && opts.sinks.size != heads)
    fail(who, "sinks",
         "must hold one value per query head (" + std::to_string(heads) + "), got " + std::to_string(opts.sinks.size));
}

void reject_dropout(std::string_view who, const DropoutRule& dropout, std::string_view what) {
  if (dropout.enabled())
    fail(who, "dropout_p", "must be 0 (" + std::string(what) + " without dropout), got " + number(dropout.p));
}

void validate_tiles(std::string_view who, const TileOptions& tiles) {
  if (tiles.q_tile && *tiles.q_tile < 1)
    fail(who, "tiles.q_tile", "must be >= 1, got " + std::to_string(*tiles.q_tile));
  if (tiles.k_tile && *tiles.k_tile < 1)
    fail(who, "tiles.k_tile", "must be >= 1, got " + std::to_string(*tiles.k_tile));
}

Problem validate(std::string_view who, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView* out_or_null, const AttentionOptions& opts, const TensorView* lse) {
  const Span sq = check_view(who, "q", q, 4, false);
  const Span sk = check_view(who, "k", k, 4, true);
  const Span sv = check_view(who, "v", v, 4, true);
  // Read-only callers validate as if writing a dense output that overlaps nothing.
  const TensorView out = out_or_null
                             ? *out_or_null
                             : TensorView::contiguous<double>(nullptr, q.shape[0], q.shape[1], q.shape[2], v.shape[3]);
  const Span so = out_or_null ? check_view(who, "out", out, 4, false) : Span{};
  const Span sl = lse ? check_view(who, "lse", *lse, 3, false) : Span{};

  for (auto [name, t] : {std::pair<const char*, const TensorView*>{"k", &k}, {"v", &v}, {"out", out_or_null}})
    if (t && t->dtype != q.dtype)
      fail(who, name,
           "dtype must match q's (" + std::string(dtype_name(q.dtype)) + "), got " + std::string(dtype_name(t->dtype)));
  const DType lse_dtype = q.dtype == DType::f64 ? DType::f64 : DType::f32;
  if (lse && lse->dtype != lse_dtype)
    fail(who, "lse",
         "dtype must be " + std::string(dtype_name(lse_dtype)) + " for " + std::string(dtype_name(q.dtype)) +
             " inputs, got " + std::string(dtype_name(lse->dtype)));

  require_equal(who, "k", "batch", k.shape[0], "q", q.shape[0]);
  require_equal(who, "k", "head_dim", k.shape[3], "q", q.shape[3]);
  for (int i = 0; i < 3; ++i) require_equal(who, "v", kDimNames4[i], v.shape[i], "k", k.shape[i]);
  if (out_or_null) {
    for (int i = 0; i < 3; ++i) require_equal(who, "out", kDimNames4[i], out.shape[i], "q", q.shape[i]);
    require_equal(who, "out", "head_dim", out.shape[3], "v", v.shape[3]);
  }
  if (q.shape[2] % k.shape[2] != 0)
    fail(who, "q",
         "heads (" + std::to_string(q.shape[2]) + ") must be a multiple of k's kv_heads (" +
             std::to_string(k.shape[2]) + ")");
  if (lse) {
    require_equal(who, "lse", "batch", lse->shape[0], "q", q.shape[0]);
    require_equal(who, "lse", "heads", lse->shape[1], "q", q.shape[2]);
    require_equal(who, "lse", "seqlen_q", lse->shape[2], "q", q.shape[1]);
  }

  if (out_or_null) check_no_self_alias(who, "out", out);
  if (lse) check_no_self_alias(who, "lse", *lse);
  for (auto [name, s] : {std::pair<const char*, Span>{"q", sq}, {"k", sk}, {"v", sv}}) {
    if (overlaps(so, s)) fail(who, "out", std::string("overlaps input ") + name);
    if (overlaps(sl, s)) fail(who, "lse", std::string("overlaps input ") + name);
  }
  if (overlaps(so, sl)) fail(who, "lse", "overlaps out");

  Problem p{};
  static_cast<ResolvedOptions&>(p) = resolve_options(who, opts, q.shape[3]);
  p.batch = q.shape[0];
  p.seqlen_q = q.shape[1];
  p.seqlen_k = k.shape[1];
  p.heads = q.shape[2];
  p.kv_heads = k.shape[2];
  p.head_dim = q.shape[3];
  p.head_dim_v = v.shape[3];
  p.dtype = q.dtype;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.lse = lse;
  p.dropout.heads = p.heads;
  check_dropout_extent(who, p.dropout, p.batch, p.heads, p.seqlen_q, p.seqlen_k);
  check_option_arrays(who, opts, p.batch, p.heads);
  return p;
}

}  // namespace attn::detail
