// Split-K (Flash-Decoding), portable C++.
//
// Query row i sees keys [first_key(i), end_key(i)), n_i of them. They are cut into W slices by the split
// rule of core/split.hpp, so slice boundaries depend only on n and W (never on the thread count), the
// same boundaries as decode's and the CUDA kernels'. Each slice is folded into its
// own partial state (m, l, o) and the partials are merged in slice order, 0 then 1 then 2..., by the
// shared merge. With W > n some slices are empty: their state is the neutral element, and merging the
// neutral element is a bitwise no-op (factor exp(0) = 1 on one side, 0 on the other), so they are not
// stored at all -- the result is the one the W-slice definition gives, bit for bit.
//
// Parallel work: (row, slice) pairs, computed in groups of bounded memory and merged into each row's
// running state in slice order (core/slice_groups.hpp), so the result is identical for any thread count.
#include <algorithm>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "core/slice_groups.hpp"
#include "core/split.hpp"
#include "cpu/tile_ops.hpp"

namespace attn {
namespace {

constexpr std::int64_t kChunk = 64;  // keys scored at a time inside one slice

// Folds keys [lo, hi) of row (b, i, h) into `s`. Scratch: q (d), k and v chunks (kChunk d, kChunk dv),
// scores.
template <class T, class A>
void fold_slice(const detail::Problem& p, RowState<A> s, std::int64_t b, std::int64_t i, std::int64_t h,
                std::int64_t lo, std::int64_t hi, A* scratch) {
  const std::int64_t d = p.head_dim, dv = p.head_dim_v, hk = p.kv_head_of(h);
  A* q = scratch;
  A* K = q + d;
  A* V = K + kChunk * d;
  A* S = V + kChunk * dv;
  detail::pack_rows<T>(q, p.q, b, i, 1, h, d);
  for (std::int64_t j0 = lo; j0 < hi; j0 += kChunk) {
    const std::int64_t n = std::min(kChunk, hi - j0);
    detail::pack_rows<T>(K, p.k, b, j0, n, hk, d);
    detail::pack_rows<T>(V, p.v, b, j0, n, hk, dv);
    detail::score_row(p, S, q, K, n, j0, i, static_cast<A>(p.rule.alibi_slope(b, h)));
    fold(s, S, n, V, dv);
  }
}

std::int64_t slice_scratch(const detail::Problem& p) {
  return p.head_dim + kChunk * (p.head_dim + p.head_dim_v) + kChunk;
}

template <class T>
void run(const detail::Problem& p, std::int64_t W) {
  using A = detail::Acc<T>;
  const std::int64_t d = p.head_dim_v, state = d + 2;  // a state holds m, l and out's dv accumulators
  const std::int64_t rows = p.batch * p.seqlen_q * p.heads;
  // At most min(W, seqlen_k) slices of a row are non-empty.
  const std::int64_t slots = detail::nonempty_slices(p.seqlen_k, W);
  // Partials in flight: G slices for each of R rows, bounded to ~2^21 accumulator values.
  constexpr std::int64_t kBudget = std::int64_t(1) << 21;
  const std::int64_t G = detail::items_per_group(kBudget, state, slots);
  const std::int64_t R = detail::items_per_group(kBudget, G * state, rows);
  const int threads = detail::resolve_threads(p.num_threads);

  std::vector<A> partial(static_cast<std::size_t>(R * G * state));
  std::vector<A> running(static_cast<std::size_t>(R * state));
  std::vector<std::vector<A>> scratch(static_cast<std::size_t>(threads));
  for (auto& s : scratch) s.resize(static_cast<std::size_t>(slice_scratch(p) + d));
  auto view = [d](A* base) { return RowState<A>{base, base + 1, base + 2, d}; };
  auto coords = [&](std::int64_t row, std::int64_t& b, std::int64_t& i, std::int64_t& h) {
    h = row % p.heads;
    i = (row / p.heads) % p.seqlen_q;
    b = row / (p.heads * p.seqlen_q);
  };

#pragma omp parallel num_threads(threads)
  for (std::int64_t r0 = 0; r0 < rows; r0 += R) {  // blocks of R rows; items slice-major: w * nr + r
    const std::int64_t nr = std::min(R, rows - r0);
#pragma omp for
    for (std::int64_t r = 0; r < nr; ++r) reset(view(running.data() + r * state));
    auto compute = [&](std::int64_t it, std::int64_t slot) {
      const std::int64_t w = it / nr;
      std::int64_t b, i, h;
      coords(r0 + it % nr, b, i, h);
      const std::int64_t n = p.visible_count(i), first = p.first_key(i);
      RowState<A> s = view(partial.data() + slot * state);
      reset(s);
      if (w < detail::nonempty_slices(n, W) && n > 0) {
        const KeyRange range = detail::split_slice(n, W, w);
        fold_slice<T>(p, s, b, i, h, first + range.begin, first + range.end,
                      scratch[static_cast<std::size_t>(omp_get_thread_num())].data());
      }
    };
    auto merge_group = [&](std::int64_t r, std::int64_t begin, std::int64_t end) {
      for (std::int64_t it = begin + r; it < end; it += nr)
        merge(view(running.data() + r * state), view(partial.data() + (it - begin) * state));
    };
    detail::run_slice_groups(slots * nr, G * nr, nr, compute, merge_group);
#pragma omp for
    for (std::int64_t r = 0; r < nr; ++r) {
      std::int64_t b, i, h;
      coords(r0 + r, b, i, h);
      detail::store_row<T>(p, view(running.data() + r * state),
                           scratch[static_cast<std::size_t>(omp_get_thread_num())].data(), b, i, h);
    }
  }
}

void check_splits(const char* who, const SplitKOptions& split) {
  if (split.num_splits < 1)
    detail::fail(who, "split.num_splits", "must be >= 1, got " + std::to_string(split.num_splits));
}

}  // namespace

KeyRange splitk_slice(std::int64_t keys, std::int64_t num_splits, std::int64_t w) {
  const char* who = "attn::splitk_slice";
  if (keys < 0) detail::fail(who, "keys", "must be >= 0, got " + std::to_string(keys));
  if (num_splits < 1) detail::fail(who, "num_splits", "must be >= 1, got " + std::to_string(num_splits));
  if (w < 0 || w >= num_splits) detail::fail(who, "w", "must be in [0, num_splits), got " + std::to_string(w));
  return detail::split_slice(keys, num_splits, w);
}

void attention_splitk(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const AttentionOptions& opts, const SplitKOptions& split, const TensorView* lse) {
  const char* who = "attn::attention_splitk";
  const detail::Problem p = detail::validate(who, q, k, v, &out, opts, lse);
  check_splits(who, split);
  detail::reject_dropout(who, p.dropout, "split-K is an inference path");
  detail::dispatch_dtype(p.dtype, [&]<class T>() { run<T>(p, split.num_splits); });
}

std::vector<PartialState<double>> splitk_partials(const TensorView& q, const TensorView& k, const TensorView& v,
                                                  const AttentionOptions& opts, const SplitKOptions& split,
                                                  std::int64_t b, std::int64_t i, std::int64_t h) {
  const char* who = "attn::splitk_partials";
  const detail::Problem p = detail::validate(who, q, k, v, nullptr, opts, nullptr);
  check_splits(who, split);
  detail::reject_dropout(who, p.dropout, "split-K is an inference path");
  constexpr std::int64_t kMaxReturned = 1 << 20;
  if (split.num_splits > kMaxReturned)
    detail::fail(who, "split.num_splits",
                 "must be <= 2^20 when the partials are returned, got " + std::to_string(split.num_splits));
  if (b < 0 || b >= p.batch) detail::fail(who, "b", "must be in [0, batch), got " + std::to_string(b));
  if (i < 0 || i >= p.seqlen_q) detail::fail(who, "i", "must be in [0, seqlen_q), got " + std::to_string(i));
  if (h < 0 || h >= p.heads) detail::fail(who, "h", "must be in [0, heads), got " + std::to_string(h));
  const std::int64_t W = split.num_splits, n = p.visible_count(i), first = p.first_key(i);
  std::vector<double> scratch(static_cast<std::size_t>(slice_scratch(p)));
  std::vector<PartialState<double>> parts;
  parts.reserve(static_cast<std::size_t>(W));
  for (std::int64_t w = 0; w < W; ++w) {
    parts.emplace_back(p.head_dim_v);
    if (n > 0 && w < detail::nonempty_slices(n, W))
      detail::dispatch_dtype(p.dtype, [&]<class T>() {
        const KeyRange range = detail::split_slice(n, W, w);
        fold_slice<T>(p, parts.back().view(), b, i, h, first + range.begin, first + range.end, scratch.data());
      });
  }
  return parts;
}

}  // namespace attn
