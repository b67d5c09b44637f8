// Spreading a whole sequence over ranks, for the distributed tests (test_ring_block.cpp without MPI,
// mpi/test_distributed.cpp under mpirun): which rows each rank holds, and copies to and from them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "distributed/ring_block.hpp"
#include "support.hpp"

namespace attn::test {

// Lengths of `total` rows over R ranks, each a multiple of `unit` (2 for zigzag) and at least `unit`:
// near-equal, or uneven (rank r's share in proportion to r + 1), the remainder to the last rank.
// Needs total % unit == 0 and total >= R * unit.
inline std::vector<std::int64_t> split_rows(std::int64_t total, int R, bool uneven, std::int64_t unit) {
  std::vector<std::int64_t> len(static_cast<std::size_t>(R));
  const std::int64_t weights = uneven ? R * (R + 1) / 2 : R;
  std::int64_t given = 0;
  for (int r = 0; r + 1 < R; ++r) {
    const std::int64_t share = total * (uneven ? r + 1 : 1) / weights;
    len[static_cast<std::size_t>(r)] = std::max(unit, share - share % unit);
    given += len[static_cast<std::size_t>(r)];
  }
  len[static_cast<std::size_t>(R - 1)] = total - given;
  return len;
}

// The rows of `whole` ([b, S, h, d]) that the segments name, in local order.
template <class T>
Tensor<T> rank_rows(const Tensor<T>& whole, const std::vector<detail::Segment>& segs) {
  std::int64_t n = 0;
  for (const auto& s : segs) n += s.length;
  Tensor<T> t(whole.b, n, whole.h, whole.d);
  for (std::int64_t b = 0; b < whole.b; ++b)
    for (const auto& s : segs)
      for (std::int64_t i = 0; i < s.length; ++i)
        for (std::int64_t h = 0; h < whole.h; ++h)
          for (std::int64_t c = 0; c < whole.d; ++c)
            t.at(b, s.local_begin + i, h, c) =
                whole.data[static_cast<std::size_t>(((b * whole.s + s.global_begin + i) * whole.h + h) * whole.d + c)];
  return t;
}

// The same rows of a whole lse [b, h, S] as a rank's lse [b, h, n].
inline std::vector<double> rank_lse(const std::vector<double>& whole, std::int64_t b, std::int64_t h, std::int64_t S,
                                    const std::vector<detail::Segment>& segs) {
  std::int64_t n = 0;
  for (const auto& s : segs) n += s.length;
  std::vector<double> r(static_cast<std::size_t>(b * h * n));
  for (std::int64_t x = 0; x < b * h; ++x)
    for (const auto& s : segs)
      for (std::int64_t i = 0; i < s.length; ++i)
        r[static_cast<std::size_t>(x * n + s.local_begin + i)] =
            whole[static_cast<std::size_t>(x * S + s.global_begin + i)];
  return r;
}

}  // namespace attn::test
