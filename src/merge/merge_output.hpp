// An attention output and its log-sum-exp -- attention over one key set, normalized -- merged into a
// running state: the pair is the online softmax's state (m = lse, l = 1, o = out), or the neutral
// state when lse = -inf (the set had no visible key). merge_states and the distributed paths (ring
// blocks, a sharded cache's ranks) fold their parts with this, so the rule of online_softmax.hpp is
// applied as written there.
#pragma once

#include <cstdint>
#include <limits>

#include "attn/online_softmax.hpp"
#include "core/element.hpp"

namespace attn::detail {

// acc <- acc (+) (out, lse), out[c] = o[c * stride] for c < acc.dim; part is scratch of acc.dim.
template <class A, class T>
void merge_output(RowState<A> acc, PartialState<A>& part, A lse, const T* o, std::int64_t stride) {
  part.m = lse;
  part.l = lse == -std::numeric_limits<A>::infinity() ? A(0) : A(1);
  for (std::int64_t c = 0; c < acc.dim; ++c)
    part.o[static_cast<std::size_t>(c)] = part.l == A(0) ? A(0) : load<A>(o[c * stride]);
  merge(acc, part.view());
}

}  // namespace attn::detail
