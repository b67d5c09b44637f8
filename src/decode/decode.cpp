// attention_decode: split-K over KV caches (contiguous or paged), GQA-aware, deterministic.
//
// 1. Validate everything (decode_validate.cpp), then append k_new/v_new into the cache.
// 2. Plan: sequence b's queries see keys in the union [first_key(0), end_key(seqlen_q - 1)) of their
//    masks (both ends are non-decreasing in the query). That range is cut into W_b slices by the split
//    rule (core/split.hpp), W_b = num_splits, or decode_num_splits(...) when 0 (src/heuristics/cpu.cpp)
//    -- a function of the problem, never of the thread count. Empty slices are not materialised.
//    Then the queries are packed once in the accumulator type.
// 3. Work items (b, w) run in parallel; each covers all kv heads of its key range, so the hot loop
//    streams contiguous memory ([seqlen, kv_heads, head_dim] rows), and writes one partial state per
//    query row into its own slot of a buffer.
// 4. Each row merges its partials in slice order with attn::merge (core/slice_groups.hpp: groups of
//    bounded size, so any num_splits runs in bounded memory); 5. finalises with attn::finalize.
// Steps 3 and 4 never depend on which thread ran what, so the output is bitwise identical for any
// thread count.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "decode/run_decode.hpp"
#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "attn/online_softmax.hpp"
#include "core/element.hpp"
#include "validate/problem.hpp"
#include "core/quant.hpp"
#include "core/slice_groups.hpp"
#include "core/split.hpp"
#include "cpu/tile_ops.hpp"
#include "cpu/rotary.hpp"
#include "decode/decode_internal.hpp"

namespace attn {
namespace detail {
namespace {

// The portable chunk kernel (f64 caches): pack, score with the mask's rule, fold with attn::fold.
void decode_chunk_f64(const ChunkArgs<double>& a) {
  const std::int64_t d = a.head_dim, dv = a.head_dim_v, R = a.group * a.seqlen_q;
  double* scores = a.scratch;
  double* vpack = a.scratch + 2 * R * kChunk;
  for (std::int64_t hk = 0; hk < a.kv_heads; ++hk) {
    for (std::int64_t c = 0; c < a.n; ++c) {
      const double* vr = static_cast<const double*>(a.v_rows[c]) + hk * a.v_head_stride;
      std::copy(vr, vr + dv, vpack + c * dv);
    }
    for (std::int64_t r = 0; r < R; ++r) {
      const std::int64_t i = r % a.seqlen_q;
      const double* q = a.q + (hk * R + r) * d;
      const double slope = a.slopes[hk * a.group + r / a.seqlen_q];
      for (std::int64_t c = 0; c < a.n; ++c) {
        const std::int64_t j = a.j0 + c;
        if (j < a.first_key[i] || j >= a.end_key[i]) {
          scores[c] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const double* kr = static_cast<const double*>(a.k_rows[c]) + hk * a.k_head_stride;
        double dot = 0;
        for (std::int64_t x = 0; x < d; ++x) dot += q[x] * kr[x];
        scores[c] = a.mask->score(dot, i, j, slope);
      }
      double* st = a.states + (hk * R + r) * a.state_stride;
      fold(RowState<double>{st + a.state_stride - 2, st + a.state_stride - 1, st, dv}, scores, a.n, vpack, dv);
    }
  }
}

template <class A>
RowState<A> state_view(A* st, std::int64_t stride, std::int64_t d) {
  return {st + stride - 2, st + stride - 1, st, d};
}

// Step 1, the plan: per sequence its mask, the union of its queries' key ranges and its slices; the
// work items (b, w) numbered sequence by sequence, slices in order.
struct SeqPlan {
  Mask mask;
  std::int64_t lo, n, splits, first_item;
  std::int64_t items() const { return nonempty_slices(n, splits); }  // one empty item when n = 0
};
struct DecodePlan {
  std::vector<SeqPlan> seqs;
  std::vector<std::int64_t> first_key, end_key;  // [batch][seqlen_q]
  std::int64_t items = 0;
  // The sequence of item `it` (items are numbered sequence by sequence).
  std::int64_t seq_of(std::int64_t it) const {
    return std::upper_bound(seqs.begin(), seqs.end(), it,
                            [](std::int64_t x, const SeqPlan& s) { return x < s.first_item; }) -
           seqs.begin() - 1;
  }
};

// The slices of a sequence of n keys: ceil(n / keys_per_split) when set (a function of the sequence
// alone: batch-invariant), else num_splits, else the automatic count (which depends on the batch).
std::int64_t splits_of(const DecodeProblem& p, std::int64_t n) {
  if (p.keys_per_split > 0) return slices_for_keys_per_split(n, p.keys_per_split);
  return p.num_splits > 0 ? p.num_splits : decode_num_splits(n, p.batch, p.kv_heads, p.head_dim, p.cache_dtype);
}

DecodePlan plan_decode(const DecodeProblem& p) {
  DecodePlan plan;
  plan.seqs.resize(static_cast<std::size_t>(p.batch));
  plan.first_key.resize(static_cast<std::size_t>(p.batch * p.seqlen_q));
  plan.end_key.resize(plan.first_key.size());
  for (std::int64_t b = 0; b < p.batch; ++b) {
    SeqPlan& s = plan.seqs[static_cast<std::size_t>(b)];
    s.mask = p.mask(b);
    for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
      plan.first_key[static_cast<std::size_t>(b * p.seqlen_q + i)] = s.mask.first_key(i);
      plan.end_key[static_cast<std::size_t>(b * p.seqlen_q + i)] = s.mask.end_key(i);
    }
    s.lo = s.mask.first_key(0);
    s.n = s.mask.seen_count();
    s.splits = splits_of(p, s.n);
    s.first_item = plan.items;
    plan.items += s.items();
  }
  return plan;
}

// Step 2, the queries in the accumulator type, [batch][heads][seqlen_q][d] = per kv head
// [group * seqlen_q][d], and the ALiBi slopes [batch][heads]. For the bf16 dot-product kernel (bf16 and
// quantized caches) also q = q_hi + q_lo in bf16 (q_lo dropped when every q is a bf16 value): a bf16 q
// is its own q_hi, and an f16 q (11 significant bits) is hi + lo exactly. An f32 q (24 bits; also a
// rotated q, computed in f32) is not split: hi + lo keeps 16 of its bits, which put the scores' error
// past twice the f32 textbook method's (the differential test's quantized targets found it), and a
// third bf16 part would cost more VDPBF16PS than the widening kernel's FMAs; without q_hi the generic
// kernel runs (UseDp).
template <class A>
struct PackedQueries {
  std::vector<A> q, slopes;
  std::vector<std::uint16_t> q_hi, q_lo;
  bool q_exact = true;  // q_lo is all zeros (not stored)
  // quantized_query: each row's int8 codes and scale (quantize_query_rows)
  std::vector<std::int8_t> q_codes;
  std::vector<float> q_code_scales;
};

// quantized_query (llama.cpp's quantization of the activations, per row): scale = max |q| / 127 and
// codes round(q / scale), to nearest even, so |q - code x scale| <= scale / 2. A row whose scale would
// be below f32's normal range (all |q| < 127 x 2^-126, zero included) gets scale 0 and codes 0; a row
// with a NaN or infinite q gets a NaN scale (and codes 0), so its scores are NaN, as the exact kernel's
// would be or lead to.
void quantize_query_rows(const std::vector<float>& q, std::int64_t d, std::vector<std::int8_t>& codes,
                         std::vector<float>& scales) {
  const std::int64_t rows = static_cast<std::int64_t>(q.size()) / d;
  codes.assign(q.size(), 0);
  scales.assign(static_cast<std::size_t>(rows), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* src = q.data() + r * d;
    float amax = 0;
    for (std::int64_t x = 0; x < d; ++x) amax = std::isfinite(src[x]) ? std::max(amax, std::fabs(src[x])) : NAN;
    float& scale = scales[static_cast<std::size_t>(r)];
    scale = amax / 127.0f;
    if (!std::isfinite(scale)) continue;
    if (scale < FLT_MIN) {
      scale = 0;
      continue;
    }
    std::int8_t* dst = codes.data() + r * d;
    for (std::int64_t x = 0; x < d; ++x)
      dst[x] = static_cast<std::int8_t>(std::clamp(std::nearbyint(src[x] / scale), -127.0f, 127.0f));
  }
}

template <class A>
PackedQueries<A> pack_queries(const DecodeProblem& p) {
  const std::int64_t d = p.head_dim;
  const std::size_t q_size = static_cast<std::size_t>(p.batch * p.heads * p.seqlen_q * d);
  const bool split_q = std::is_same_v<A, float> && dots_in_bf16(p.cache_dtype) && !p.rotary.enabled() &&
                       (p.q_dtype == DType::bf16 || p.q_dtype == DType::f16);
  PackedQueries<A> pq;
  pq.q.resize(q_size);
  pq.q_hi.resize(split_q ? q_size : 0);
  pq.slopes.resize(static_cast<std::size_t>(p.batch * p.heads));
  dispatch_dtype(p.q_dtype, [&]<class Q>() {
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads; ++h)
        for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
          const Q* src = row_ptr<const Q>(p.q, b, i, h);
          const std::int64_t at = ((b * p.heads + h) * p.seqlen_q + i) * d;
          for (std::int64_t c = 0; c < d; ++c)
            pq.q[static_cast<std::size_t>(at + c)] = load<A>(src[c * p.q.strides[3]]);
          if (p.rotary.enabled()) rotate_row(pq.q.data() + at, p.rotary, p.rotary.query_position(p.index, b, i));
          if constexpr (std::is_same_v<Q, bf16_t>)
            if (split_q)
              for (std::int64_t c = 0; c < d; ++c)
                pq.q_hi[static_cast<std::size_t>(at + c)] = src[c * p.q.strides[3]].bits;
        }
  });
  if constexpr (std::is_same_v<A, float>) {
    if (p.quantized_query) quantize_query_rows(pq.q, d, pq.q_codes, pq.q_code_scales);
    if (split_q && p.q_dtype == DType::f16) {
      pq.q_lo.resize(q_size);
      std::uint32_t inexact = 0;  // any q_lo other than +-0 (a NaN q gives a NaN q_lo)
      for (std::size_t e = 0; e < q_size; ++e) {
        const bf16_t hi = float_to_bf16(pq.q[e]);
        const bf16_t lo = float_to_bf16(pq.q[e] - bf16_to_float(hi));
        pq.q_hi[e] = hi.bits;
        pq.q_lo[e] = lo.bits;
        inexact |= lo.bits & 0x7fffu;
      }
      pq.q_exact = inexact == 0;
    }
  }
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads; ++h)
      pq.slopes[static_cast<std::size_t>(b * p.heads + h)] = static_cast<A>(p.rule.alibi_slope(b, h));
  return pq;
}

// Step 3, one work item: the keys of slice w of sequence b, in chunks of kChunk keys, folded into one
// partial state per query row of the sequence (`states`, reset first). One thread's worker: its
// chunk arguments and the K/V row pointers of a chunk.
template <class A>
class ItemWorker {
 public:
  // rows: 3 kChunk pointers; scales (quantized caches): scales_size(p) floats.
  ItemWorker(const DecodeProblem& p, const DecodePlan& plan, const PackedQueries<A>& pq, A* scratch, const void** rows,
             float* scales)
      : p_(p), plan_(plan), pq_(pq), rows_(rows), scales_(scales) {
    a_.k_head_stride = p.k.strides[2];
    a_.v_head_stride = p.v.strides[2];
    a_.kv_heads = p.kv_heads;
    a_.group = p.group();
    a_.seqlen_q = p.seqlen_q;
    a_.head_dim = p.head_dim;
    a_.head_dim_v = p.head_dim_v;
    a_.state_stride = state_stride_for(p.head_dim_v);
    a_.bf16_out = p.q_dtype == DType::bf16;
    a_.scratch = scratch;
    if (p.quantized())
      conv_.resize(
          static_cast<std::size_t>(kChunk * p.kv_heads * std::max(p.k_scale.shape[3], p.v_scale.shape[3])) * 3 / 2 + 1);
    a_.k_rows = rows;
    a_.v_rows = rows + kChunk;
    a_.next_k_rows = rows + 2 * kChunk;
  }

  void run(std::int64_t it, A* states) {
    const std::int64_t b = plan_.seq_of(it), rows = p_.kv_heads * p_.group() * p_.seqlen_q;
    const SeqPlan& s = plan_.seqs[static_cast<std::size_t>(b)];
    for (std::int64_t r = 0; r < rows; ++r)
      reset(state_view(states + r * a_.state_stride, a_.state_stride, p_.head_dim_v));
    if (s.n == 0) return;
    const KeyRange range = split_slice(s.n, s.splits, it - s.first_item);
    const std::int64_t q_at = b * p_.heads * p_.seqlen_q * p_.head_dim;
    a_.mask = &s.mask;
    a_.first_key = plan_.first_key.data() + b * p_.seqlen_q;
    a_.end_key = plan_.end_key.data() + b * p_.seqlen_q;
    a_.q = pq_.q.data() + q_at;
    a_.slopes = pq_.slopes.data() + b * p_.heads;
    a_.states = states;
    if (!pq_.q_codes.empty()) {
      a_.q_codes = pq_.q_codes.data() + q_at;
      a_.q_code_scales = pq_.q_code_scales.data() + q_at / p_.head_dim;
    }
    if (!pq_.q_hi.empty()) {
      a_.q_hi = pq_.q_hi.data() + q_at;
      a_.q_lo = pq_.q_exact ? nullptr : pq_.q_lo.data() + q_at;
    }
    const std::int64_t lo = s.lo + range.begin, hi = s.lo + range.end;
    for (std::int64_t j0 = lo; j0 < hi; j0 += kChunk) {
      a_.n = std::min(kChunk, hi - j0);
      a_.j0 = j0;
      a_.next_n = std::min(kChunk, std::max<std::int64_t>(hi - j0 - kChunk, 0));
      p_.index.locate_keys(b, j0, a_.n + a_.next_n, key_row_, key_slot_);
      point_at_rows();
      if constexpr (std::is_same_v<A, double>) {
        decode_chunk_f64(a_);
      } else {
        if (p_.quantized()) point_at_scales();
        decode_chunk_simd(a_, p_.cache_dtype);
      }
    }
    if constexpr (std::is_same_v<A, float>) decode_finish_simd(a_, p_.cache_dtype);
  }

 private:
  // A quantized cache's scales for the chunk's keys, [kChunk][kv_heads][groups] for K and
  // [kv_heads][groups][kChunk] for V (one per key and kv head: [kv_heads][kChunk] for both), in the scale buffer (the
  // kernel applies them: decode_internal.hpp).
  void point_at_scales() {
    float* dst = scales_;
    for (int side = 0; side < 2; ++side) {
      const TensorView& sv = side == 0 ? p_.k_scale : p_.v_scale;
      const std::int64_t groups = sv.shape[3];
      (side == 0 ? a_.k_scales : a_.v_scales) = dst;
      (side == 0 ? a_.k_groups : a_.v_groups) = groups;
      if (sv.dtype == DType::f16)
        gather_scales(static_cast<const f16_t*>(sv.data), sv, side == 0, dst);
      else
        gather_scales(static_cast<const float*>(sv.data), sv, side == 0, dst);
      dst += p_.kv_heads * kChunk * groups;
    }
  }

  // point_at_scales for one side. One f32 scale per key and kv head (int8) goes straight to the [g][c]
  // layout. Other scales are gathered a key at a time (one copy when a key's scales of every kv head are
  // adjacent, as in a contiguous scale tensor), f16 ones widened in one vector pass (decode_widen_f16),
  // into K's layout when it has scales per block of dims (it is the gathered one), else into a buffer
  // transposed after. Element by element with strided stores in both layouts, this step cost a third of a
  // q8_0 decode on Zen 4.
  template <class S>
  void gather_scales(const S* base, const TensorView& sv, bool keys, float* dst) {
    const std::int64_t groups = sv.shape[3], hs = sv.strides[2], xs = sv.strides[3], per_key = p_.kv_heads * groups;
    if constexpr (std::is_same_v<S, float>)
      if (groups == 1) {  // one scale per key and kv head: both sides' layout is [g][c]
        for (std::int64_t c = 0; c < a_.n; ++c) {
          const S* src = base + key_at(sv, c);
          for (std::int64_t g = 0; g < p_.kv_heads; ++g) dst[g * kChunk + c] = src[g * hs];
        }
        return;
      }
    const bool in_place = keys && groups > 1;     // K's layout is the gathered one
    float* flat = in_place ? dst : conv_.data();  // [c][g][x]
    S* staged = reinterpret_cast<S*>(flat);
    if constexpr (std::is_same_v<S, f16_t>) staged = reinterpret_cast<S*>(conv_.data() + kChunk * per_key);
    const bool adjacent = xs == 1 && hs == groups;
    for (std::int64_t c = 0; c < a_.n; ++c) {
      const S* src = base + key_at(sv, c);
      S* to = staged + c * per_key;
      if (adjacent) {
        std::memcpy(to, src, sizeof(S) * static_cast<std::size_t>(per_key));
        continue;
      }
      for (std::int64_t g = 0; g < p_.kv_heads; ++g)
        for (std::int64_t x = 0; x < groups; ++x) to[g * groups + x] = src[g * hs + x * xs];
    }
    if constexpr (std::is_same_v<S, f16_t>)
      decode_widen_f16(reinterpret_cast<const std::uint16_t*>(staged), a_.n * per_key, flat);
    if (in_place) return;
    for (std::int64_t e = 0; e < per_key; ++e)
      for (std::int64_t c = 0; c < a_.n; ++c) dst[e * kChunk + c] = flat[c * per_key + e];
  }

  // Element offset of the chunk's key c (c >= n: the next chunk's) in a view of the cache (K, V, scales).
  std::int64_t key_at(const TensorView& t, std::int64_t c) const {
    return key_row_[c] * t.strides[0] + key_slot_[c] * t.strides[1];
  }

  // Pointers to kv head 0's K and V rows of the chunk's keys, and to the K rows of the next chunk's.
  void point_at_rows() {
    const auto es = static_cast<std::int64_t>(dtype_size(p_.cache_dtype));
    const auto* kbase = static_cast<const unsigned char*>(p_.k.data);
    const auto* vbase = static_cast<const unsigned char*>(p_.v.data);
    for (std::int64_t c = 0; c < a_.n; ++c) {
      rows_[c] = kbase + key_at(p_.k, c) * es;
      rows_[kChunk + c] = vbase + key_at(p_.v, c) * es;
    }
    for (std::int64_t c = 0; c < a_.next_n; ++c) rows_[2 * kChunk + c] = kbase + key_at(p_.k, a_.n + c) * es;
  }

  const DecodeProblem& p_;
  const DecodePlan& plan_;
  const PackedQueries<A>& pq_;
  const void** rows_;
  float* scales_;
  // Where the chunk's keys, then the next chunk's, are in the cache (CacheIndex::locate_keys).
  std::int64_t key_row_[2 * kChunk], key_slot_[2 * kChunk];
  std::vector<float> conv_;  // a chunk's scales of one side, widened, then their f16 bits (gather_scales)
  ChunkArgs<A> a_{};
};
// A quantized cache's scales of one chunk, K's then V's (see point_at_scales).
std::int64_t scales_size(const DecodeProblem& p) {
  return p.quantized() ? p.kv_heads * kChunk * (p.k_scale.shape[3] + p.v_scale.shape[3]) : 0;
}

template <class A>
void run(const DecodeProblem& p) {
  const std::int64_t d = p.head_dim_v, rows = p.kv_heads * p.group() * p.seqlen_q;  // states hold o[d_v]
  const std::int64_t state_stride = state_stride_for(d);
  const DecodePlan plan = plan_decode(p);
  const PackedQueries<A> pq = pack_queries<A>(p);

  // Step 4: items in groups whose partial states (one per item and row) fit ~2^22 accumulator values,
  // merged into each row's running state in slice order (core/slice_groups.hpp). Partials are
  // uninitialised: every item resets its own.
  constexpr std::int64_t kBudget = std::int64_t{1} << 22;
  const std::int64_t G = items_per_group(kBudget, rows * state_stride, plan.items);
  const std::unique_ptr<A[]> partial(new A[static_cast<std::size_t>(G * rows * state_stride)]);
  std::vector<A> running(static_cast<std::size_t>(p.batch * rows * state_stride));
  for (std::int64_t t = 0; t < p.batch * rows; ++t)
    reset(state_view(running.data() + t * state_stride, state_stride, d));
  auto merge_group = [&](std::int64_t t, std::int64_t begin, std::int64_t end) {
    const SeqPlan& s = plan.seqs[static_cast<std::size_t>(t / rows)];
    const std::int64_t first = std::max(s.first_item, begin), last = std::min(s.first_item + s.items(), end);
    for (std::int64_t it = first; it < last; ++it)
      merge(state_view(running.data() + t * state_stride, state_stride, d),
            state_view(partial.get() + ((it - begin) * rows + t % rows) * state_stride, state_stride, d));
  };

#pragma omp parallel num_threads(resolve_threads(p.num_threads))
  {
    // Per-thread buffers kept across calls (OpenMP reuses its threads): a short cache's call would
    // otherwise spend a fifth of its time allocating and zeroing them.
    static thread_local std::vector<const void*> row_ptrs;
    static thread_local std::vector<A> scratch;
    static thread_local std::vector<float> scales;
    row_ptrs.resize(3 * kChunk);
    const auto scratch_size =
        static_cast<std::size_t>(chunk_scratch_size(p.kv_heads, p.group() * p.seqlen_q, p.head_dim, d));
    if (scratch.size() < scratch_size) scratch.resize(scratch_size);
    if (scales.size() < static_cast<std::size_t>(scales_size(p)))
      scales.resize(static_cast<std::size_t>(scales_size(p)));
    ItemWorker<A> worker(p, plan, pq, scratch.data(), row_ptrs.data(), scales.data());
    run_slice_groups(
        plan.items, G, p.batch * rows,
        [&](std::int64_t it, std::int64_t slot) { worker.run(it, partial.get() + slot * rows * state_stride); },
        merge_group);
    std::vector<A> tmp(static_cast<std::size_t>(d));
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < p.batch * rows; ++t)
      finalize_row(p, state_view(running.data() + t * state_stride, state_stride, d), t / rows, t % rows, tmp.data());
  }
}

}  // namespace

void run_decode(const DecodeProblem& p) {
  if (amx_decode_takes(p)) return run_decode_amx(p);
  if (p.cache_dtype == DType::f64)
    run<double>(p);
  else
    run<float>(p);
}

}  // namespace detail

void attention_decode(const TensorView& q, const KVCache& cache, const TensorView& out, const AttentionOptions& opts,
                      const DecodeOptions& decode, const TensorView* lse) {
  const detail::DecodeProblem p = detail::validate_decode("attn::attention_decode", q, cache, out, opts, decode, lse);
  detail::append_kv(p);
  detail::run_decode(p);
}

}  // namespace attn
