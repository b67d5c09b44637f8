// attention_varlen: packed variable-length batches (flash-attn's cu_seqlens layout) give, sequence by
// sequence, what the reference gives on each sequence alone, on every SIMD target of the tiled kernel
// it runs; bad cu_seqlens are rejected with the argument named and nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "attn/varlen.hpp"
#include "support.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

using test::random_tensor;

struct Packed {
  std::vector<std::int32_t> cu_q, cu_k;
  std::int64_t total_q() const { return cu_q.back(); }
  std::int64_t total_k() const { return cu_k.back(); }
};

Packed pack(const std::vector<std::pair<int, int>>& lens) {
  Packed p{{0}, {0}};
  for (auto [nq, nk] : lens) {
    p.cu_q.push_back(p.cu_q.back() + nq);
    p.cu_k.push_back(p.cu_k.back() + nk);
  }
  return p;
}

template <class T>
void check_varlen(const std::vector<std::pair<int, int>>& lens, std::int64_t H, std::int64_t HK, std::int64_t D,
                  bool causal, bool alibi, double tol_factor) {
  const Packed p = pack(lens);
  const std::int64_t B = static_cast<std::int64_t>(lens.size()), TQ = p.total_q(), TK = p.total_k();
  auto q = random_tensor<T>(1, TQ, H, D, 5, 2.0), k = random_tensor<T>(1, TK, HK, D, 6, 2.0),
       v = random_tensor<T>(1, TK, HK, D, 7);
  AttentionOptions o;
  o.causal = causal;
  std::vector<float> slopes;
  for (std::int64_t x = 0; x < B * H; ++x) slopes.push_back(0.3f / float(1 + x));
  if (alibi) {
    o.alibi_slopes = slopes;
    o.alibi_batch_stride = H;
  }
  auto q64 = test::to_f64(q), k64 = test::to_f64(k), v64 = test::to_f64(v);
  test::for_each_simd_target("tiled", detail::tiled_target, [&](std::int64_t) {
    using L = std::conditional_t<std::is_same_v<T, double>, double, float>;
    std::vector<T> got(q.data.size());
    std::vector<L> got_lse(static_cast<std::size_t>(H * TQ), L(42));
    TensorView gl = TensorView::contiguous(got_lse.data(), 1, H, TQ);
    attention_varlen(TensorView::contiguous(q.data.data(), TQ, H, D), TensorView::contiguous(k.data.data(), TK, HK, D),
                     TensorView::contiguous(v.data.data(), TK, HK, D), TensorView::contiguous(got.data(), TQ, H, D),
                     p.cu_q.data(), p.cu_k.data(), B, o, {}, &gl);
    // Each sequence alone, f64 oracle and same-precision textbook, through [1, n, H, D] views.
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t q0 = p.cu_q[b], nq = p.cu_q[b + 1] - q0, k0 = p.cu_k[b], nk = p.cu_k[b + 1] - k0;
      if (nq == 0) continue;
      AttentionOptions ob = o;
      if (alibi) ob.alibi_slopes = F32Array(slopes).from(b * H);
      std::vector<double> oracle(static_cast<std::size_t>(nq * H * D)), olse(static_cast<std::size_t>(H * nq));
      std::vector<T> textbook(oracle.size());
      TensorView ol = TensorView::contiguous(olse.data(), 1, H, nq);
      attention_reference(TensorView::contiguous(q64.data.data() + q0 * H * D, 1, nq, H, D),
                          TensorView::contiguous(k64.data.data() + k0 * HK * D, 1, nk, HK, D),
                          TensorView::contiguous(v64.data.data() + k0 * HK * D, 1, nk, HK, D),
                          TensorView::contiguous(oracle.data(), 1, nq, H, D), ob, &ol);
      attention_reference(TensorView::contiguous(q.data.data() + q0 * H * D, 1, nq, H, D),
                          TensorView::contiguous(k.data.data() + k0 * HK * D, 1, nk, HK, D),
                          TensorView::contiguous(v.data.data() + k0 * HK * D, 1, nk, HK, D),
                          TensorView::contiguous(textbook.data(), 1, nq, H, D), ob);
      const std::vector<T> mine(got.begin() + q0 * H * D, got.begin() + (q0 + nq) * H * D);
      const double base = test::max_abs_diff(textbook, oracle);
      const double slack = std::is_same_v<T, double> ? 1e-12 : std::is_same_v<T, float> ? 2e-7 : 1e-3;
      EXPECT_LE(test::max_abs_diff(mine, oracle), tol_factor * base + slack) << "sequence " << b;
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < nq; ++i) {
          const double want = olse[static_cast<std::size_t>(h * nq + i)];
          const double have = got_lse[static_cast<std::size_t>(h * TQ + q0 + i)];
          if (std::isinf(want))
            EXPECT_EQ(have, want);
          else
            EXPECT_NEAR(have, want, (std::is_same_v<T, double> ? 1e-12 : 1e-4))
                << "lse b" << b << " h" << h << " i" << i;
        }
    }
  });
}

TEST(Varlen, F64ExactPerSequence) {
  check_varlen<double>({{5, 9}, {1, 1}, {17, 40}, {0, 3}, {9, 0}, {33, 33}}, 4, 2, 16, true, false, 0);
}
TEST(Varlen, F64ExactWithAlibiPerSequence) {
  check_varlen<double>({{12, 20}, {30, 7}, {64, 64}}, 2, 1, 8, false, true, 0);
}
TEST(Varlen, F32WithinTwiceTheTextbookError) {
  check_varlen<float>({{70, 70}, {3, 200}, {130, 129}, {1, 1}}, 4, 2, 64, true, false, 2);
}
TEST(Varlen, Bf16WithinTwiceTheTextbookError) {
  check_varlen<bf16_t>({{70, 70}, {3, 200}, {130, 129}, {1, 1}}, 4, 2, 64, true, true, 2);
}
TEST(Varlen, F16WithinTwiceTheTextbookError) {
  check_varlen<f16_t>({{40, 90}, {65, 33}, {0, 5}, {17, 17}}, 6, 2, 24, false, false, 2);
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
    if (bad.arg.empty()) {
      EXPECT_NO_THROW(call());
      continue;
    }
    try {
      call();
      ADD_FAILURE() << "accepted bad " << bad.arg;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad.arg), std::string::npos) << e.what();
    }
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
