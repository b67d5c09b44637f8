// attention_varlen: packed variable-length batches (flash-attn's cu_seqlens layout) give, sequence by
// sequence, what the reference gives on each sequence alone, on every SIMD target of the tiled kernel
// it runs; bad cu_seqlens are rejected with the argument named and nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "attn/varlen.hpp"
#include "support.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

using test::max_error;

// Each sequence of the packed batch `lens` ((queries, keys) pairs) against the reference on that sequence
// alone: in f64 to kF64Tolerance, otherwise within the accuracy rule of its f64 oracle (common/accuracy.hpp).
template <class T>
void check_varlen(const std::vector<std::pair<int, int>>& lens, std::int64_t H, std::int64_t HK, std::int64_t D,
                  bool causal, bool alibi) {
  const test::CuSeqlens p(lens);
  const std::int64_t B = p.batch(), TQ = p.total_q(), TK = p.total_k();
  const auto in = test::random_qkv<T>(1, TQ, TK, H, HK, D, 5);
  const test::Tensor<T>&q = in.q, &k = in.k, &v = in.v;
  AttentionOptions o;
  o.causal = causal;
  std::vector<float> slopes;
  for (std::int64_t x = 0; x < B * H; ++x) slopes.push_back(0.3f / float(1 + x));
  if (alibi) {
    o.alibi_slopes = slopes;
    o.alibi_batch_stride = H;
  }
  test::for_each_simd_target("tiled", detail::tiled_target, [&](std::int64_t) {
    using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
    std::vector<T> got(q.data.size());
    std::vector<L> got_lse(static_cast<std::size_t>(H * TQ), L(42));
    TensorView gl = TensorView::contiguous(got_lse.data(), 1, H, TQ);
    attention_varlen(q.packed(), k.packed(), v.packed(), TensorView::contiguous(got.data(), TQ, H, D), p.varlen(), o,
                     {}, &gl);
    // Each sequence alone, as [1, n, H, D] tensors: the f64 oracle and the same-precision textbook.
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t q0 = p.cu_q[b], nq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], nk = p.cu_k[b + 1] - k0;
      if (nq == 0) continue;
      AttentionOptions ob = o;
      if (alibi) ob.alibi_slopes = F32Array(slopes).from(b * H);
      const test::Tensor<T> qb = q.copy_rows(q0, nq), kb = k.copy_rows(k0, nk), vb = v.copy_rows(k0, nk);
      std::vector<double> olse;
      const std::vector<double> oracle = test::oracle_forward(qb, kb, vb, ob, &olse);
      const std::vector<T> mine(got.begin() + q0 * H * D, got.begin() + (q0 + nq) * H * D);
      std::vector<L> mine_lse(olse.size());
      for (std::int64_t h = 0; h < H; ++h) std::copy_n(got_lse.begin() + h * TQ + q0, nq, mine_lse.begin() + h * nq);
      if constexpr (std::is_same_v<T, double>) {
        EXPECT_LE(max_error(mine, oracle), test::kF64Tolerance) << "sequence " << b;
        EXPECT_LE(max_error(mine_lse, olse), test::kF64Tolerance) << "lse, sequence " << b;
      } else {
        const double base = max_error(test::textbook_forward(qb, kb, vb, ob), oracle);
        EXPECT_TRUE(
            test::meets_textbook_rule(max_error(mine, oracle), base, test::kForwardFactor, test::textbook_floor<T>()))
            << "sequence " << b;
        EXPECT_LE(max_error(mine_lse, olse), 1e-4) << "lse, sequence " << b;
      }
    }
  });
}

TEST(Varlen, F64ExactPerSequence) {
  check_varlen<double>({{5, 9}, {1, 1}, {17, 40}, {0, 3}, {9, 0}, {33, 33}}, 4, 2, 16, true, false);
}
TEST(Varlen, F64ExactWithAlibiPerSequence) {
  check_varlen<double>({{12, 20}, {30, 7}, {64, 64}}, 2, 1, 8, false, true);
}
TEST(Varlen, F32WithinTwiceTheTextbookError) {
  check_varlen<float>({{70, 70}, {3, 200}, {130, 129}, {1, 1}}, 4, 2, 64, true, false);
}
TEST(Varlen, Bf16WithinTwiceTheTextbookError) {
  check_varlen<bf16_t>({{70, 70}, {3, 200}, {130, 129}, {1, 1}}, 4, 2, 64, true, true);
}
TEST(Varlen, F16WithinTwiceTheTextbookError) {
  check_varlen<f16_t>({{40, 90}, {65, 33}, {0, 5}, {17, 17}}, 6, 2, 24, false, false);
}

struct Bad {
  std::vector<std::int32_t> cu_q, cu_k;
  std::int64_t batch;
  std::string arg;
};

TEST(Varlen, BadCuSeqlensAreRejectedAndNothingIsWritten) {
  const std::int64_t TQ = 10, TK = 12, H = 2, D = 4;
  std::vector<float> q(TQ * H * D, 0.5f), k(TK * H * D, 0.5f), v(TK * H * D, 0.5f);
  for (const Bad& bad : {Bad{{0, 4, 10}, {0, 6, 12}, 2, ""},                    // valid, as a control
                         Bad{{1, 4, 10}, {0, 6, 12}, 2, "cu_seqlens_q"},        // does not start at 0
                         Bad{{0, 6, 4, 10}, {0, 6, 6, 12}, 3, "cu_seqlens_q"},  // decreasing
                         Bad{{0, 4, 9}, {0, 6, 12}, 2, "cu_seqlens_q"},         // last != total_q
                         Bad{{0, 4, 10}, {0, 6, 13}, 2, "cu_seqlens_k"},        // last beyond total_k
                         Bad{{0, 4, 10}, {0, 7, 5}, 2, "cu_seqlens_k"},         // decreasing
                         Bad{{0, 10}, {0, 12}, 0, "batch"}}) {
    std::vector<float> out(TQ * H * D, -3.0f);
    auto call = [&] {
      attention_varlen(TensorView::contiguous(q.data(), TQ, H, D), TensorView::contiguous(k.data(), TK, H, D),
                       TensorView::contiguous(v.data(), TK, H, D), TensorView::contiguous(out.data(), TQ, H, D),
                       bad.cu_q.data(), bad.cu_k.data(), bad.batch);
    };
    test::expect_invalid_argument(call, bad.arg);
    if (bad.arg.empty()) continue;  // the valid control
    for (float x : out) ASSERT_EQ(x, -3.0f) << "wrote output for bad " << bad.arg;
  }
  std::vector<float> out(TQ * H * D);
  const std::vector<std::int32_t> cu_k{0, 12};
  EXPECT_THROW(attention_varlen(TensorView::contiguous(q.data(), TQ, H, D), TensorView::contiguous(k.data(), TK, H, D),
                                TensorView::contiguous(v.data(), TK, H, D),
                                TensorView::contiguous(out.data(), TQ, H, D), nullptr, cu_k.data(), 1),
               std::invalid_argument);
  // Rank-4 views are not packed tensors.
  EXPECT_THROW(attention_varlen(TensorView::contiguous(q.data(), 1, TQ, H, D),
                                TensorView::contiguous(k.data(), TK, H, D), TensorView::contiguous(v.data(), TK, H, D),
                                TensorView::contiguous(out.data(), TQ, H, D), cu_k.data(), cu_k.data(), 1),
               std::invalid_argument);
}

}  // namespace
}  // namespace attn
