// The CPU decode's entry after validation, for the public entry points (decode.cpp) and the sharded
// decode of src/distributed/.
#pragma once

#include "attn/online_softmax.hpp"
#include "core/element.hpp"
#include "validate/decode_problem.hpp"
#include "validate/problem.hpp"

namespace attn::detail {

// Attends every sequence of a validated problem over its cache (the append is append_kv's, before).
// Nothing here throws.
void run_decode(const DecodeProblem& p);

// Whether the decode runs on the AMX tiles (decode_amx.cpp): bf16 q and cache, not quantized, no
// rotary, and at least a tile's 16 query rows per kv head (group x seqlen_q: MLA's 128 heads, GQA with
// several query tokens), where amx_backend() names a tile unit.
bool amx_decode_takes(const DecodeProblem& p);
// That decode: the tiled forward on the tiles over slices of each sequence's keys, merged in slice order.
void run_decode_amx(const DecodeProblem& p);

// The merged state of query row `row` (= hk * R + hh * seqlen_q + i: query head hk * group + hh,
// query i) of sequence b, with head h's sink folded in once, finalised into out and lse. `tmp` holds
// head_dim_v values.
template <class A>
inline void finalize_row(const DecodeProblem& p, RowState<A> s, std::int64_t b, std::int64_t row, A* tmp) {
  const std::int64_t h = row / p.seqlen_q, i = row % p.seqlen_q;
  fold_sink(s, static_cast<A>(p.rule.sink(h)));
  const A lse = finalize(s, tmp);
  dispatch_dtype(p.q_dtype, [&]<class O>() {
    O* dst = row_ptr<O>(p.out, b, i, h);
    for (std::int64_t c = 0; c < p.head_dim_v; ++c) dst[c * p.out.strides[3]] = store<O>(tmp[c]);
  });
  if (p.lse) static_cast<A*>(p.lse->data)[b * p.lse->strides[0] + h * p.lse->strides[1] + i * p.lse->strides[2]] = lse;
}

}  // namespace attn::detail
