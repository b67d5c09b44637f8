// attention_backward's entry point: validation, then the SIMD tiled kernel (backward_kernel.cpp).
#include "attn/backward.hpp"
#include "backward/backward_kernel.hpp"
#include "validate/backward_problem.hpp"
#include "cpu/tile_ops.hpp"
#include "validate/validate.hpp"

namespace attn {

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& opts, const TileOptions& tiles,
                        const TensorView* dsink) {
  const char* who = "attn::attention_backward";
  const detail::BackwardProblem p = detail::validate_backward(who, q, k, v, out, dout, lse, dq, dk, dv, opts, dsink);
  detail::validate_tiles(who, tiles);
  detail::run_backward({p}, tiles, detail::resolve_threads(p.num_threads));
  if (dsink) detail::sink_gradient({p}, *dsink);
}

}  // namespace attn
