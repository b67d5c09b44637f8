// attention_decode: split-K over KV caches (contiguous or paged), GQA-aware, deterministic.
//
// 1. Validate everything (decode_validate.cpp), then append k_new/v_new into the cache.
// 2. Sequence b's queries see keys in the union [first_key(0), end_key(seqlen_q - 1)) of their masks
//    (both ends are non-decreasing in the query). That range is cut into W_b slices by splitk_slice,
//    W_b = num_splits, or decode_num_splits(...) when 0 -- a function of the problem, never of the thread
//    count. Slices past the first n keys are empty; their state is the neutral element, and merging it is
//    a bitwise no-op, so they are not materialised (as in src/splitk/splitk.cpp).
// 3. Work items (b, w) run in parallel; each covers all kv heads of its key range, so the hot loop
//    streams contiguous memory ([seqlen, kv_heads, head_dim] rows), and writes one partial state per
//    query row into its own slot of a buffer.
// 4. Each row merges its partials in slice order with attn::merge and finalises with attn::finalize.
//    Partials live in groups of bounded size (any num_splits runs in bounded memory).
// Steps 3 and 4 never depend on which thread ran what, so the output is bitwise identical for any
// thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "attn/online_softmax.hpp"
#include "core/element.hpp"
#include "core/problem.hpp"
#include "decode/decode_internal.hpp"

namespace attn {
namespace detail {
namespace {

// The portable chunk kernel (f64 caches): pack, score with the mask's rule, fold with attn::fold.
void decode_chunk_f64(const ChunkArgs<double>& a) {
  const std::int64_t d = a.head_dim, R = a.group * a.seqlen_q;
  double* scores = a.scratch;
  double* vpack = a.scratch + 2 * R * kChunk;
  for (std::int64_t g = 0; g < a.kv_heads; ++g) {
    for (std::int64_t c = 0; c < a.n; ++c) {
      const double* vr = static_cast<const double*>(a.v_rows[c]) + g * a.v_head_stride;
      std::copy(vr, vr + d, vpack + c * d);
    }
    for (std::int64_t r = 0; r < R; ++r) {
      const std::int64_t i = r % a.seqlen_q;
      const double* q = a.q + (g * R + r) * d;
      const double slope = a.slopes[g * a.group + r / a.seqlen_q];
      for (std::int64_t c = 0; c < a.n; ++c) {
        const std::int64_t j = a.j0 + c;
        if (j < a.first_key[i] || j >= a.end_key[i]) {
          scores[c] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const double* kr = static_cast<const double*>(a.k_rows[c]) + g * a.k_head_stride;
        double dot = 0;
        for (std::int64_t x = 0; x < d; ++x) dot += q[x] * kr[x];
        scores[c] = a.mask->score(dot, i, j, slope);
      }
      double* st = a.states + (g * R + r) * a.state_stride;
      fold(RowState<double>{st + a.state_stride - 2, st + a.state_stride - 1, st, d}, scores, a.n, vpack, d);
    }
  }
}

template <class A>
RowState<A> state_view(A* st, std::int64_t stride, std::int64_t d) {
  return {st + stride - 2, st + stride - 1, st, d};
}

template <class A>
void run(const DecodeProblem& p) {
  const std::int64_t d = p.head_dim, R = p.group() * p.seqlen_q, rows = p.kv_heads * R;
  const std::int64_t S = state_stride_for(d);

  // Per sequence: its mask, the union of its queries' key ranges, its slices.
  struct Seq {
    Mask mask;
    std::int64_t lo, n, splits, first_item;
  };
  std::vector<Seq> seqs(static_cast<std::size_t>(p.batch));
  std::vector<std::int64_t> first_key(static_cast<std::size_t>(p.batch * p.seqlen_q)), end_key(first_key.size());
  std::int64_t items = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    Seq& s = seqs[static_cast<std::size_t>(b)];
    s.mask = p.mask(b);
    for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
      first_key[static_cast<std::size_t>(b * p.seqlen_q + i)] = s.mask.first_key(i);
      end_key[static_cast<std::size_t>(b * p.seqlen_q + i)] = s.mask.end_key(i);
    }
    s.lo = s.mask.first_key(0);
    s.n = std::max<std::int64_t>(0, s.mask.end_key(p.seqlen_q - 1) - s.lo);
    const std::int64_t W =
        p.num_splits > 0 ? p.num_splits : decode_num_splits(s.n, p.batch, p.kv_heads, d, p.cache_dtype);
    s.splits = W;
    s.first_item = items;
    items += std::max<std::int64_t>(1, std::min(W, s.n));  // non-empty slices (one empty when n = 0)
  }

  // q in the accumulator type, [batch][heads][seqlen_q][d] = per kv head [group * seqlen_q][d]; slopes.
  // For the bf16 dot-product kernel also q = q_hi + q_lo in bf16 (q_lo dropped when every q is a bf16
  // value): a bf16 q is its own q_hi.
  const std::size_t q_size = static_cast<std::size_t>(p.batch * p.heads * p.seqlen_q * d);
  const bool split_q = std::is_same_v<A, float> && p.cache_dtype == DType::bf16;
  std::vector<A> q(q_size);
  std::vector<std::uint16_t> q_hi(split_q ? q_size : 0), q_lo;
  std::vector<A> slopes(static_cast<std::size_t>(p.batch * p.heads), A(0));
  dispatch_dtype(p.q_dtype, [&]<class Q>() {
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads; ++h)
        for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
          const Q* src = row_ptr<const Q>(p.q, b, i, h);
          const std::int64_t at = ((b * p.heads + h) * p.seqlen_q + i) * d;
          A* dst = q.data() + at;
          for (std::int64_t c = 0; c < d; ++c) dst[c] = load<A>(src[c * p.q.strides[3]]);
          if constexpr (std::is_same_v<Q, bf16_t>)
            if (split_q)
              for (std::int64_t c = 0; c < d; ++c)
                q_hi[static_cast<std::size_t>(at + c)] = src[c * p.q.strides[3]].bits;
        }
  });
  bool q_exact = true;
  if constexpr (std::is_same_v<A, float>) {
    if (split_q && p.q_dtype != DType::bf16) {
      q_lo.resize(q.size());
      std::uint32_t inexact = 0;  // any q_lo other than +-0 (a NaN q gives a NaN q_lo)
      for (std::size_t e = 0; e < q.size(); ++e) {
        const bf16_t hi = float_to_bf16(q[e]);
        const bf16_t lo = float_to_bf16(q[e] - bf16_to_float(hi));
        q_hi[e] = hi.bits;
        q_lo[e] = lo.bits;
        inexact |= lo.bits & 0x7fffu;
      }
      q_exact = inexact == 0;
    }
  }
  if (p.alibi_slopes)
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads; ++h)
        slopes[static_cast<std::size_t>(b * p.heads + h)] =
            static_cast<A>(p.alibi_slopes[b * p.alibi_batch_stride + h]);

  // Partial states in flight: items [i0, i0 + G), one state per (item, row), bounded to ~2^22
  // accumulator values so that any num_splits works in bounded memory. After each group every row
  // merges that group's states into its running state in slice order -- one left fold over the slices
  // whatever G is, so the grouping never changes a bit. Uninitialised: every item resets its own.
  constexpr std::int64_t kBudget = std::int64_t{1} << 22;
  const std::int64_t G = std::clamp<std::int64_t>(kBudget / (rows * S), 1, items);
  const std::unique_ptr<A[]> partial(new A[static_cast<std::size_t>(G * rows * S)]);
  std::vector<A> running(static_cast<std::size_t>(p.batch * rows * S));
  for (std::int64_t t = 0; t < p.batch * rows; ++t) reset(state_view(running.data() + t * S, S, d));
  const int threads = p.num_threads > 0 ? p.num_threads : omp_get_max_threads();
  const std::size_t es = dtype_size(p.cache_dtype);
  const auto* kbase = static_cast<const unsigned char*>(p.k.data);
  const auto* vbase = static_cast<const unsigned char*>(p.v.data);

#pragma omp parallel num_threads(threads)
  {
    // Per-thread buffers kept across calls (OpenMP reuses its threads): a short cache's call would
    // otherwise spend a fifth of its time allocating and zeroing them.
    static thread_local std::vector<const void*> ptrs;
    static thread_local std::vector<A> scratch;
    ptrs.resize(2 * kChunk);
    const auto scratch_size = static_cast<std::size_t>(chunk_scratch_size(p.kv_heads, R, d));
    if (scratch.size() < scratch_size) scratch.resize(scratch_size);
    ChunkArgs<A> a{};
    a.k_head_stride = p.k.strides[2];
    a.v_head_stride = p.v.strides[2];
    a.kv_heads = p.kv_heads;
    a.group = p.group();
    a.seqlen_q = p.seqlen_q;
    a.head_dim = d;
    a.state_stride = S;
    a.bf16_out = p.q_dtype == DType::bf16;
    a.scratch = scratch.data();
    // Pointers to kv head 0's K and V rows of keys [j, j + n) of sequence b (any layout, any page size).
    auto fill = [&](std::int64_t b, std::int64_t j, std::int64_t n) {
      for (std::int64_t c = 0; c < n; ++c) {
        ptrs[static_cast<std::size_t>(c)] = kbase + p.row_offset(p.k, b, j + c) * static_cast<std::int64_t>(es);
        ptrs[static_cast<std::size_t>(kChunk + c)] =
            vbase + p.row_offset(p.v, b, j + c) * static_cast<std::int64_t>(es);
      }
    };
    for (std::int64_t i0 = 0; i0 < items; i0 += G) {  // every thread walks the same groups
      const std::int64_t i1 = std::min(items, i0 + G);
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t it = i0; it < i1; ++it) {
        const auto sit = std::upper_bound(seqs.begin(), seqs.end(), it,
                                          [](std::int64_t x, const Seq& s) { return x < s.first_item; }) -
                         1;
        const Seq& s = *sit;
        const std::int64_t b = sit - seqs.begin(), w = it - s.first_item;
        A* states = partial.get() + (it - i0) * rows * S;
        for (std::int64_t r = 0; r < rows; ++r) reset(state_view(states + r * S, S, d));
        if (s.n == 0) continue;
        const KeyRange range = splitk_slice(s.n, s.splits, w);
        a.mask = &s.mask;
        a.first_key = first_key.data() + b * p.seqlen_q;
        a.end_key = end_key.data() + b * p.seqlen_q;
        a.q = q.data() + b * p.heads * p.seqlen_q * d;
        a.slopes = slopes.data() + b * p.heads;
        a.states = states;
        if (!q_hi.empty()) {
          a.q_hi = q_hi.data() + b * p.heads * p.seqlen_q * d;
          a.q_lo = q_exact ? nullptr : q_lo.data() + b * p.heads * p.seqlen_q * d;
        }
        const std::int64_t lo = s.lo + range.begin, hi = s.lo + range.end;
        for (std::int64_t j0 = lo; j0 < hi; j0 += kChunk) {
          const std::int64_t n = std::min(kChunk, hi - j0);
          fill(b, j0, n);
          a.n = n;
          a.j0 = j0;
          a.k_rows = ptrs.data();
          a.v_rows = ptrs.data() + kChunk;
          if constexpr (std::is_same_v<A, double>)
            decode_chunk_f64(a);
          else
            decode_chunk_simd(a, p.cache_dtype);
        }
        if constexpr (std::is_same_v<A, float>) decode_finish_simd(a, p.cache_dtype);
      }
      // Each row merges this group's slices of its sequence, in slice order.
#pragma omp for schedule(static)
      for (std::int64_t t = 0; t < p.batch * rows; ++t) {
        const std::int64_t b = t / rows, row = t % rows;
        const Seq& s = seqs[static_cast<std::size_t>(b)];
        const std::int64_t slices = std::max<std::int64_t>(1, std::min(s.splits, s.n));
        const std::int64_t first = std::max(s.first_item, i0), last = std::min(s.first_item + slices, i1);
        for (std::int64_t it = first; it < last; ++it)
          merge(state_view(running.data() + t * S, S, d),
                state_view(partial.get() + ((it - i0) * rows + row) * S, S, d));
      }
    }

    // Finalise.
    std::vector<A> tmp(static_cast<std::size_t>(d));
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < p.batch * rows; ++t) {
      const std::int64_t b = t / rows, row = t % rows;
      const A lse = finalize(state_view(running.data() + t * S, S, d), tmp.data());
      // row = g * R + hh * seqlen_q + i  ->  query head g * group + hh, query i.
      const std::int64_t h = row / p.seqlen_q, i = row % p.seqlen_q;
      dispatch_dtype(p.q_dtype, [&]<class O>() {
        O* dst = row_ptr<O>(p.out, b, i, h);
        for (std::int64_t c = 0; c < d; ++c) dst[c * p.out.strides[3]] = store<O>(tmp[static_cast<std::size_t>(c)]);
      });
      if (p.lse)
        static_cast<A*>(p.lse->data)[b * p.lse->strides[0] + h * p.lse->strides[1] + i * p.lse->strides[2]] = lse;
    }
  }
}

}  // namespace
}  // namespace detail

std::int64_t decode_num_splits(std::int64_t keys, std::int64_t batch, std::int64_t kv_heads, std::int64_t head_dim,
                               DType cache_dtype) {
  if (keys <= 0) return 1;
  constexpr double kSliceBytes = 2.0 * 1024 * 1024;  // K and V read per slice, all kv heads
  constexpr std::int64_t kMinItems = 32, kMinKeys = 128;
  const double bytes = 2.0 * static_cast<double>(keys) * static_cast<double>(kv_heads * head_dim) *
                       static_cast<double>(dtype_size(cache_dtype));
  const auto by_bytes = static_cast<std::int64_t>(std::min(1e15, std::ceil(bytes / kSliceBytes)));
  const std::int64_t for_items =
      std::min((kMinItems + batch - 1) / std::max<std::int64_t>(1, batch), std::max<std::int64_t>(1, keys / kMinKeys));
  return std::clamp<std::int64_t>(std::max(by_bytes, for_items), 1, keys);
}

void attention_decode(const TensorView& q, const KVCache& cache, const TensorView& out, const AttentionOptions& opts,
                      const DecodeOptions& decode, const TensorView* lse) {
  const detail::DecodeProblem p = detail::validate_decode("attn::attention_decode", q, cache, out, opts, decode, lse);
  detail::append_kv(p);
  if (p.cache_dtype == DType::f64)
    detail::run<double>(p);
  else
    detail::run<float>(p);
}

}  // namespace attn
