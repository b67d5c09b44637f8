// The ring's per-rank arithmetic (ring_block.hpp).
#include "distributed/ring_block.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "attn/online_softmax.hpp"
#include "core/element.hpp"
#include "merge/merge_output.hpp"
#include "cpu/tile_ops.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn::detail {

std::vector<Segment> ring_segments(bool zigzag, const std::vector<std::int64_t>& lengths, int rank) {
  const auto R = static_cast<int>(lengths.size());
  const auto r = static_cast<std::size_t>(rank);
  if (!zigzag) {
    std::int64_t start = 0;
    for (int s = 0; s < rank; ++s) start += lengths[static_cast<std::size_t>(s)];
    return {{0, lengths[r], start}};
  }
  // Chunk c of the 2R holds half of rank c's rows (c < R) or half of rank 2R-1-c's (c >= R).
  auto chunk_rows = [&](int c) { return lengths[static_cast<std::size_t>(c < R ? c : 2 * R - 1 - c)] / 2; };
  auto chunk_start = [&](int c) {
    std::int64_t start = 0;
    for (int x = 0; x < c; ++x) start += chunk_rows(x);
    return start;
  };
  const std::int64_t half = lengths[r] / 2;
  return {{0, half, chunk_start(rank)}, {half, half, chunk_start(2 * R - 1 - rank)}};
}

bool block_visible(const ScoreRule& rule, std::int64_t total_q, std::int64_t total_k, const Segment& qs,
                   const Segment& ks) {
  if (qs.length == 0 || ks.length == 0) return false;
  ScoreRule whole = rule;
  whole.diagonal_shift = 0;
  const Mask mask = whole.mask(total_q, total_k);
  // Both ends are non-decreasing in the query, so the segment's queries see keys within these two.
  const std::int64_t lo = std::max(mask.first_key(qs.global_begin), ks.global_begin);
  const std::int64_t hi = std::min(mask.end_key(qs.global_begin + qs.length - 1), ks.global_begin + ks.length);
  return lo < hi;
}

void convert_into(const TensorView& src, const TensorView& dst) {
  const auto& sh = src.shape;
  dispatch_dtype(dst.dtype, [&]<class D>() {
    dispatch_dtype(src.dtype, [&]<class S>() {
      for (std::int64_t b = 0; b < sh[0]; ++b)
        for (std::int64_t s = 0; s < sh[1]; ++s)
          for (std::int64_t h = 0; h < sh[2]; ++h) {
            const S* from = row_ptr<const S>(src, b, s, h);
            D* to = row_ptr<D>(dst, b, s, h);
            if constexpr (std::is_same_v<S, D>)
              if (src.strides[3] == 1 && dst.strides[3] == 1) {  // rows copied whole
                std::memcpy(to, from, static_cast<std::size_t>(sh[3]) * sizeof(D));
                continue;
              }
            for (std::int64_t x = 0; x < sh[3]; ++x)
              to[x * dst.strides[3]] = store<D>(load<double>(from[x * src.strides[3]]));
          }
    });
  });
}

TensorView dense_view(std::vector<std::byte>& bytes, std::array<std::int64_t, 4> shape, DType dtype) {
  TensorView v = TensorView::contiguous(reinterpret_cast<float*>(bytes.data()), shape[0], shape[1], shape[2], shape[3]);
  v.dtype = dtype;
  return v;
}

DenseCopy dense_zeros(std::array<std::int64_t, 4> shape, DType dtype) {
  DenseCopy c;
  c.bytes.assign(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]) * dtype_size(dtype), std::byte{0});
  c.view = dense_view(c.bytes, shape, dtype);
  return c;
}

DenseCopy dense_copy(const TensorView& src, DType dtype) {
  DenseCopy c = dense_zeros(src.shape, dtype);
  convert_into(src, c.view);
  return c;
}

TensorView rows_of(const TensorView& t, const Segment& seg, int dim) {
  TensorView v = t;
  v.data = static_cast<std::byte*>(t.data) +
           seg.local_begin * t.strides[dim] * static_cast<std::int64_t>(dtype_size(t.dtype));
  v.shape[dim] = seg.length;
  return v;
}

namespace {

template <class A>
A* as(std::vector<std::byte>& bytes) {
  return reinterpret_cast<A*>(bytes.data());
}

}  // namespace

RingAccumulator::RingAccumulator(const Problem& local, std::vector<Segment> q_segs, std::int64_t total_q,
                                 std::int64_t total_k)
    : local_(local), q_segs_(std::move(q_segs)), total_q_(total_q), total_k_(total_k) {
  acc_ = local.dtype == DType::f64 ? DType::f64 : DType::f32;
  const std::int64_t rows = local.batch * local.seqlen_q * local.heads, a = dtype_size(acc_);
  std::int64_t longest = 0;
  for (const Segment& s : q_segs_) longest = std::max(longest, s.length);
  m_.resize(static_cast<std::size_t>(rows * a));
  l_.resize(m_.size());
  o_.resize(static_cast<std::size_t>(rows * local.head_dim_v * a));
  block_out_.resize(static_cast<std::size_t>(local.batch * longest * local.heads * local.head_dim_v * a));
  block_lse_.resize(static_cast<std::size_t>(local.batch * local.heads * longest * a));
  auto neutral = [&]<class A>() {
    for (std::int64_t t = 0; t < rows; ++t)
      reset(RowState<A>{as<A>(m_) + t, as<A>(l_) + t, as<A>(o_) + t * local.head_dim_v, local.head_dim_v});
  };
  if (acc_ == DType::f64)
    neutral.template operator()<double>();
  else
    neutral.template operator()<float>();
}

void RingAccumulator::fold_chunk(const TensorView& k, const TensorView& v, const std::vector<Segment>& k_segs,
                                 BlockCounts& counts) {
  for_each_visible_block(local_.rule, total_q_, total_k_, q_segs_, k_segs, counts,
                         [&](const Segment& qs, const Segment& ks) {
                           if (acc_ == DType::f64)
                             fold_block<double>(k, v, qs, ks);
                           else
                             fold_block<float>(k, v, qs, ks);
                         });
}

template <class A>
void RingAccumulator::fold_block(const TensorView& k, const TensorView& v, const Segment& qs, const Segment& ks) {
  const std::int64_t B = local_.batch, H = local_.heads, dv = local_.head_dim_v, n = qs.length;
  Problem block = local_;  // q, k, v in the inputs' dtype; out and lse in the accumulator type
  block.seqlen_q = n;
  block.seqlen_k = ks.length;
  block.q = rows_of(local_.q, qs);
  block.k = rows_of(k, ks);
  block.v = rows_of(v, ks);
  block.out = TensorView::contiguous(as<A>(block_out_), B, n, H, dv);
  const TensorView lse = TensorView::contiguous(as<A>(block_lse_), B, H, n);
  block.lse = &lse;
  block.pages = {};
  block.rule.sinks = nullptr;  // folded once, in finish()
  block.rule.diagonal_shift = block_shift(total_q_, total_k_, qs, ks);
  run_tiled({block}, {}, resolve_threads(local_.num_threads));

  const A* out = as<A>(block_out_);
  const A* lse_of = as<A>(block_lse_);
#pragma omp parallel num_threads(resolve_threads(local_.num_threads))
  {
    PartialState<A> part(dv);
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < B * n * H; ++r) {
      const std::int64_t b = r / (n * H), i = r / H % n, h = r % H;
      const std::int64_t t = (b * local_.seqlen_q + qs.local_begin + i) * H + h;
      merge_output(RowState<A>{as<A>(m_) + t, as<A>(l_) + t, as<A>(o_) + t * dv, dv}, part, lse_of[(b * H + h) * n + i],
                   out + r * dv, 1);
    }
  }
}

void RingAccumulator::finish() {
  if (acc_ == DType::f64)
    finish_rows<double>();
  else
    finish_rows<float>();
}

template <class A>
void RingAccumulator::finish_rows() {
  const std::int64_t H = local_.heads, dv = local_.head_dim_v, rows = local_.batch * local_.seqlen_q * H;
  dispatch_dtype(local_.dtype, [&]<class T>() {
    if constexpr (std::is_same_v<Acc<T>, A>) {
#pragma omp parallel num_threads(resolve_threads(local_.num_threads))
      {
        std::vector<A> tmp(static_cast<std::size_t>(dv));
#pragma omp for schedule(static)
        for (std::int64_t t = 0; t < rows; ++t)
          store_row<T>(local_, RowState<A>{as<A>(m_) + t, as<A>(l_) + t, as<A>(o_) + t * dv, dv}, tmp.data(),
                       t / (local_.seqlen_q * H), t / H % local_.seqlen_q, t % H);
      }
    }
  });
}

}  // namespace attn::detail
