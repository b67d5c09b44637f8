// The online-softmax state (m, l, o) and the two operations every algorithm in attn is built from.
//
// For one query row with scores s_i = q . k_i * scale over some set of keys, the partial state is
//   m = max_i s_i,   l = sum_i exp(s_i - m),   o = sum_i exp(s_i - m) v_i      (o unnormalised)
// and the attention output over that set is o / l, its log-sum-exp m + log(l).
//
// * fold:  add a tile of keys to a state (FlashAttention's inner loop). When the tile raises the
//          maximum, what was accumulated is rescaled by exp(m_old - m_new) first.
// * merge: combine the states of two disjoint key sets (split-K, threads, later GPUs and machines):
//            m = max(m_a, m_b), l = l_a e^{m_a-m} + l_b e^{m_b-m}, o = o_a e^{m_a-m} + o_b e^{m_b-m}.
//          It is commutative and associative, with the neutral element (m = -inf, l = 0, o = 0): an
//          empty key set, a fully masked tile, a split-K worker that got no keys.
//
// Both use one rescale rule, `rescale_factor`, whose only subtlety is the neutral element: when
// m_old = -inf nothing was accumulated, and exp(-inf - (-inf)) would be NaN, so the factor is 0.
// Nothing else in attn writes these formulas; tiled, split-K and the counted IO simulation call them.
//
// Non-finite scores: a NaN score (from a NaN in q or in a visible key) poisons the state -- m, l and
// o become NaN and stay NaN through later folds and merges -- so the row's output and lse are NaN
// whatever the tiling or the split, as in the textbook method. A score of -inf counts as masked.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/host_device.hpp"

namespace attn {

// exp_of(m_old - m_new), or 0 for an empty state: the rule with the exponential a kernel computes it
// with (the CUDA kernels keep scores in base 2 and pass a fast exp2).
template <class Acc, class ExpFn>
ATTN_HOST_DEVICE inline Acc rescale_factor_with(Acc m_old, Acc m_new, ExpFn exp_of) {
  // m_new >= m_old always; m_old = -inf means an empty state whose l and o are 0.
  return m_old == -std::numeric_limits<Acc>::infinity() ? Acc(0) : exp_of(m_old - m_new);
}

template <class Acc>
ATTN_HOST_DEVICE inline Acc rescale_factor(Acc m_old, Acc m_new) {
  return rescale_factor_with(m_old, m_new, [](Acc x) { return std::exp(x); });
}

// A non-owning view of one row's state; `o` has `dim` elements.
template <class Acc>
struct RowState {
  Acc* m;
  Acc* l;
  Acc* o;
  std::int64_t dim;
};

// The neutral element.
template <class Acc>
ATTN_HOST_DEVICE inline void reset(RowState<Acc> s) {
  *s.m = -std::numeric_limits<Acc>::infinity();
  *s.l = Acc(0);
  for (std::int64_t c = 0; c < s.dim; ++c) s.o[c] = Acc(0);
}

// Marks the state as having seen a NaN score; absorbing under fold and merge.
template <class Acc>
ATTN_HOST_DEVICE inline void poison(RowState<Acc> s) {
  const Acc nan = std::numeric_limits<Acc>::quiet_NaN();
  *s.m = nan;
  *s.l = nan;
  for (std::int64_t c = 0; c < s.dim; ++c) s.o[c] = nan;
}

template <class Acc>
ATTN_HOST_DEVICE inline bool is_poisoned(const RowState<Acc>& s) {
  return *s.m != *s.m;
}

// Folds keys 0..n-1 of a tile into `s`: scores[i] is already scaled and masked (-inf = masked out),
// value row i is v[i * v_stride .. + dim). A tile whose scores are all -inf leaves `s` unchanged.
template <class Acc>
ATTN_HOST_DEVICE inline void fold(RowState<Acc> s, const Acc* scores, std::int64_t n, const Acc* v,
                                  std::int64_t v_stride) {
  if (is_poisoned(s)) return;
  Acc m_tile = -std::numeric_limits<Acc>::infinity();
  for (std::int64_t i = 0; i < n; ++i) {
    if (scores[i] != scores[i]) return poison(s);
    m_tile = scores[i] > m_tile ? scores[i] : m_tile;
  }
  if (m_tile == -std::numeric_limits<Acc>::infinity()) return;
  const Acc m_new = m_tile > *s.m ? m_tile : *s.m;
  const Acc alpha = rescale_factor(*s.m, m_new);
  if (alpha != Acc(1)) {
    *s.l *= alpha;
    for (std::int64_t c = 0; c < s.dim; ++c) s.o[c] *= alpha;
  }
  *s.m = m_new;
  for (std::int64_t i = 0; i < n; ++i) {
    if (scores[i] == -std::numeric_limits<Acc>::infinity()) continue;
    const Acc p = std::exp(scores[i] - m_new);
    *s.l += p;
    const Acc* vi = v + i * v_stride;
    for (std::int64_t c = 0; c < s.dim; ++c) s.o[c] += p * vi[c];
  }
}

// a <- a (+) b, for states of disjoint key sets.
template <class Acc>
ATTN_HOST_DEVICE inline void merge(RowState<Acc> a, const RowState<Acc>& b) {
  if (is_poisoned(a)) return;
  if (is_poisoned(b)) return poison(a);
  // Equal maxima that differ only in sign (+0 and -0) give +0, so that merge is bitwise commutative.
  const Acc m = *a.m > *b.m ? *a.m : *b.m > *a.m ? *b.m : *a.m == Acc(0) ? Acc(0) : *a.m;
  if (m == -std::numeric_limits<Acc>::infinity()) return;  // both neutral
  // A +inf score: e^{inf-inf} is NaN, so l and o are NaN, as fold makes them.
  if (m == std::numeric_limits<Acc>::infinity()) {
    const Acc nan = std::numeric_limits<Acc>::quiet_NaN();
    *a.m = m;
    *a.l = nan;
    for (std::int64_t c = 0; c < a.dim; ++c) a.o[c] = nan;
    return;
  }
  // The state with the larger maximum keeps its l and o (its factor is e^0 = 1, exactly) and only the
  // other one is rescaled: each element is x + y f, one product, x and y picked by value, not by
  // argument order. Where the compiler contracts that into an FMA (GCC does by default on AArch64),
  // merge(a, b) and merge(b, a) still compute the same fma(y, f, x); x e^{m_a-m} + y e^{m_b-m} would
  // contract one product or the other, depending on the order. Equal maxima: f = 1, x + y.
  const RowState<Acc>& hi = *b.m > *a.m ? b : a;
  const RowState<Acc>& lo = *b.m > *a.m ? a : b;
  const Acc f = rescale_factor(*lo.m, m);
  *a.m = m;
  *a.l = *hi.l + *lo.l * f;
  for (std::int64_t c = 0; c < a.dim; ++c) a.o[c] = hi.o[c] + lo.o[c] * f;
}

// An attention sink (gpt-oss): one logit per head that joins every row's softmax denominator and has
// no value row. Folding it is folding one key of score `sink` whose value row is zero, so o only
// rescales; -inf (no sink) leaves the state unchanged bitwise, NaN poisons it, +inf makes it NaN (as
// a +inf score does). Applied once, to the state of all of a row's keys (after every merge), right
// before finalize: partial states (split-K slices, decode splits, ranks) never hold it, or a merge
// would count it twice. The lse that finalize then returns includes the sink, so out = sum_i
// exp(s_i - lse) v_i still holds and the backward's P = exp(S - lse) are the true weights.
template <class Acc>
ATTN_HOST_DEVICE inline void fold_sink(RowState<Acc> s, Acc sink) {
  if (is_poisoned(s) || sink == -std::numeric_limits<Acc>::infinity()) return;
  if (sink != sink) return poison(s);
  const Acc m_new = sink > *s.m ? sink : *s.m;
  const Acc alpha = rescale_factor(*s.m, m_new);
  if (alpha != Acc(1)) {
    *s.l *= alpha;
    for (std::int64_t c = 0; c < s.dim; ++c) s.o[c] *= alpha;
  }
  *s.m = m_new;
  *s.l += std::exp(sink - m_new);
}

// The attention output o / l and the row's log-sum-exp m + log(l). A state that saw no unmasked key
// (l = 0) gives out = 0 and lse = -inf, as flash-attn does for fully masked rows; a poisoned state
// gives NaN.
template <class Acc>
ATTN_HOST_DEVICE inline Acc finalize(const RowState<Acc>& s, Acc* out) {
  if (*s.l == Acc(0)) {
    for (std::int64_t c = 0; c < s.dim; ++c) out[c] = Acc(0);
    return -std::numeric_limits<Acc>::infinity();
  }
  const Acc inv = Acc(1) / *s.l;
  for (std::int64_t c = 0; c < s.dim; ++c) out[c] = s.o[c] * inv;
  return *s.m + std::log(*s.l);
}

// An owning state, for callers that keep partial results (split-K partials, tests, tools).
template <class Acc>
struct PartialState {
  Acc m = -std::numeric_limits<Acc>::infinity();
  Acc l = 0;
  std::vector<Acc> o;

  PartialState() = default;
  explicit PartialState(std::int64_t dim) : o(static_cast<std::size_t>(dim), Acc(0)) {}
  RowState<Acc> view() { return {&m, &l, o.data(), static_cast<std::int64_t>(o.size())}; }
  RowState<Acc> view() const {
    auto* self = const_cast<PartialState*>(this);
    return {&self->m, &self->l, self->o.data(), static_cast<std::int64_t>(o.size())};
  }
};

template <class Acc>
PartialState<Acc> merged(const PartialState<Acc>& a, const PartialState<Acc>& b) {
  PartialState<Acc> r = a;
  merge(r.view(), b.view());
  return r;
}

}  // namespace attn
