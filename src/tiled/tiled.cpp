// FlashAttention in FlashAttention-2's loop order: the entry point (its tile rule, plan_tiles, is in
// src/heuristics/cpu.cpp). The kernel itself (Highway SIMD, runtime dispatch, one template over the element types) is
// in tiled_kernel.cpp; docs/prefill.md describes both.
#include <vector>

#include "attn/attention.hpp"
#include "cpu/tile_ops.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {

void attention_tiled(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                     const AttentionOptions& opts, const TileOptions& tiles, const TensorView* lse) {
  const char* who = "attn::attention_tiled";
  const detail::Problem p = detail::validate(who, q, k, v, &out, opts, lse);
  detail::validate_tiles(who, tiles);
  detail::run_tiled({p}, tiles, detail::resolve_threads(p.num_threads));
}

}  // namespace attn
