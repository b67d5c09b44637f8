// The small pieces the portable kernels share: packing strided rows of any dtype into contiguous
// accumulator-typed tiles, the masked score tile, and storing a finished row.
#pragma once

#include <cstdint>
#include <limits>

#include <omp.h>

#include "attn/online_softmax.hpp"
#include "core/element.hpp"
#include "validate/problem.hpp"

namespace attn::detail {

// dst[r * d + c] = t[b, s0 + r, h, c] for r in [0, rows).
template <class T, class A>
inline void pack_rows(A* dst, const TensorView& t, std::int64_t b, std::int64_t s0, std::int64_t rows, std::int64_t h,
                      std::int64_t d) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* src = row_ptr<const T>(t, b, s0 + r, h);
    const std::int64_t cs = t.strides[3];
    A* out = dst + r * d;
    for (std::int64_t c = 0; c < d; ++c) out[c] = load<A>(src[c * cs]);
  }
}

// x . y over d elements, in index order (the portable kernels' one summation order).
template <class A>
inline A dot(const A* x, const A* y, std::int64_t d) {
  A s = 0;
  for (std::int64_t c = 0; c < d; ++c) s += x[c] * y[c];
  return s;
}

// scores[c] = the score of query i against key j0 + c of a packed tile (scaled, soft-capped, ALiBi),
// or -inf where query i does not see that key (Mask::tile_keys).
template <class A>
inline void score_row(const Problem& p, A* scores, const A* q, const A* k_tile, std::int64_t n, std::int64_t j0,
                      std::int64_t i, A slope) {
  const Mask mask = p.mask();
  const auto [lo, hi] = mask.tile_keys(i, j0, n);
  const std::int64_t d = p.head_dim;
  for (std::int64_t c = 0; c < n; ++c)
    scores[c] = c < lo || c >= hi ? -std::numeric_limits<A>::infinity()
                                  : mask.score(dot(q, k_tile + c * d, d), i, j0 + c, slope);
}

// Finalises one row's state, the state of all its keys, into out[b, i, h, :] (converted to T) and
// lse[b, h, i] when requested, with head h's sink folded in first (the one place the tiled, split-K and
// varlen paths add it). `tmp` holds d accumulator values.
template <class T, class A>
inline void store_row(const Problem& p, RowState<A> s, A* tmp, std::int64_t b, std::int64_t i, std::int64_t h) {
  fold_sink(s, static_cast<A>(p.rule.sink(h)));
  const A lse = finalize(s, tmp);
  T* dst = row_ptr<T>(p.out, b, i, h);
  const std::int64_t cs = p.out.strides[3];
  for (std::int64_t c = 0; c < p.head_dim_v; ++c) dst[c * cs] = store<T>(tmp[c]);
  if (p.lse) {
    A* l = static_cast<A*>(p.lse->data) + b * p.lse->strides[0] + h * p.lse->strides[1] + i * p.lse->strides[2];
    *l = lse;
  }
}

// Threads for one call: the caller's request, or OpenMP's default (all cores).
inline int resolve_threads(int requested) { return requested > 0 ? requested : omp_get_max_threads(); }

}  // namespace attn::detail
