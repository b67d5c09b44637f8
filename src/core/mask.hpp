// The mask and score transform of one (seqlen_q, seqlen_k) pair: which keys each query sees, and the
// score of a visible key. Problem uses it for its single pair; decode builds one per sequence because
// each sequence has its own cache length.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attn/online_softmax.hpp"  // ATTN_HOST_DEVICE: the CUDA kernels apply these rules too

namespace attn::detail {

struct Mask {
  std::int64_t seqlen_q, seqlen_k;
  std::int64_t window_left, window_right;  // -1 = unbounded; causal folded into window_right = 0
  double scale;
  double softcap;  // 0 = off

  // Query i sees exactly the keys [first_key(i), end_key(i)); both are non-decreasing in i. Masks are
  // aligned to the bottom-right corner (flash-attn >= 2.1): query i sits at key position
  // i + seqlen_k - seqlen_q. A fully masked row has first_key(i) >= end_key(i).
  ATTN_HOST_DEVICE std::int64_t diagonal(std::int64_t i) const { return i + seqlen_k - seqlen_q; }
  ATTN_HOST_DEVICE std::int64_t first_key(std::int64_t i) const {
    return window_left < 0 ? 0 : std::clamp<std::int64_t>(diagonal(i) - window_left, 0, seqlen_k);
  }
  ATTN_HOST_DEVICE std::int64_t end_key(std::int64_t i) const {
    return window_right < 0 ? seqlen_k : std::clamp<std::int64_t>(diagonal(i) + window_right + 1, 0, seqlen_k);
  }
  ATTN_HOST_DEVICE std::int64_t visible_count(std::int64_t i) const {
    return std::max<std::int64_t>(0, end_key(i) - first_key(i));
  }

  // The score of a visible key from its raw dot product q . k: scaled, soft-capped, ALiBi-biased.
  template <class A>
  ATTN_HOST_DEVICE A score(A dot, std::int64_t i, std::int64_t j, A slope) const {
    A s = dot * static_cast<A>(scale);
    if (softcap > 0) s = static_cast<A>(softcap) * std::tanh(s / static_cast<A>(softcap));
    if (slope != A(0)) {
      const std::int64_t dist = diagonal(i) - j;
      s -= slope * static_cast<A>(dist < 0 ? -dist : dist);
    }
    return s;
  }
};

}  // namespace attn::detail
