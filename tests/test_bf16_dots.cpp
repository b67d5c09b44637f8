// The bf16 dot-product switch (cpu/dpbf16.hpp): its policy, and that forcing it reaches each kernel
// that has the path (the tiled forward, the backward, decode). Every accuracy test runs both paths on
// AVX-512 targets of a CPU with AVX512-BF16 (test::for_each_simd_target); these tests show that the
// two runs are different code, not one path run twice. The witness is VDPBF16PS's documented
// treatment of subnormal inputs as zero: q holds subnormal bf16 values, k values large enough that
// the scores are of order 1 when computed exactly (the widening path) and exactly 0 on the dot products.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "attn/decode.hpp"
#include "backward/backward_kernel.hpp"
#include "cpu/dpbf16.hpp"
#include "support.hpp"
#include "tiled/tiled_kernel.hpp"

namespace attn {
namespace {

constexpr std::int64_t B = 1, S = 40, H = 2, D = 64;

TEST(Bf16Dots, ForcingOverridesTheDefaultOnlyWhereTheCpuHasTheInstruction) {
  const bool has = detail::cpu_has_avx512bf16();
  EXPECT_TRUE(!detail::bf16_dots_pay() || has) << "the default cannot choose an instruction the CPU lacks";
  {
    const test::ForceBf16Dots on(true);
    EXPECT_EQ(detail::bf16_dots(), has);
  }
  {
    const test::ForceBf16Dots off(false);
    EXPECT_FALSE(detail::bf16_dots());
  }
  EXPECT_TRUE(!detail::bf16_dots() || has);
}

// q: the largest subnormal bf16, 127 x 2^-133, signs in a pattern; k: +-2^127, signs in another, so an
// exact q . k is a sum of D terms +-127/64 (scores of order 1 after the scale, each key its own).
struct SubnormalProblem {
  test::Tensor<bf16_t> q{B, S, H, D}, k{B, S, H, D}, v, dout;
  SubnormalProblem() : v(test::random_tensor<bf16_t>(B, S, H, D, 3)), dout(test::random_tensor<bf16_t>(B, S, H, D, 4)) {
    for (std::size_t i = 0; i < q.data.size(); ++i)
      q.data[i].bits = static_cast<std::uint16_t>(0x007fu | (i % 3 == 0 ? 0x8000u : 0u));
    for (std::size_t i = 0; i < k.data.size(); ++i)
      k.data[i].bits = static_cast<std::uint16_t>(0x7f00u | ((i * 7 + i / D) % 5 < 2 ? 0x8000u : 0u));
  }
};

// Sanitizer builds compile no AVX-512 target: there the kernels have one bf16 path only.
#define SKIP_WITHOUT_DOT_PATH(target)                                          \
  if (!test::has_bf16_dot_path(target))                                        \
  GTEST_SKIP() << "no AVX512-BF16, or no AVX-512 kernel built: one bf16 path " \
                  "only"

TEST(Bf16Dots, TheSwitchReachesTheTiledForwardAndTheBackward) {
  SKIP_WITHOUT_DOT_PATH(detail::tiled_target());
  SKIP_WITHOUT_DOT_PATH(detail::backward_target());
  const test::ScopedAmxEnv vector_kernels{std::string("off")};  // the switch is the vector kernel's
  const SubnormalProblem p;
  const std::size_t n = p.q.data.size();
  std::vector<float> lse[2];
  std::vector<bf16_t> out[2];
  for (const int on : {0, 1}) {
    const test::ForceBf16Dots force(on == 1);
    out[on].resize(n);
    lse[on].resize(static_cast<std::size_t>(B * H * S));
    const TensorView lv = TensorView::contiguous(lse[on].data(), B, H, S);
    attention_tiled(p.q.view(), p.k.view(), p.v.view(), TensorView::contiguous(out[on].data(), B, S, H, D), {}, {},
                    &lv);
  }
  // On the dot products every score is 0, so each row's lse is log(S) exactly (rounded to f32).
  for (const float l : lse[1]) EXPECT_NEAR(l, std::log(double(S)), 1e-6);
  EXPECT_TRUE(test::differ_by_more_than(lse[0], lse[1], 1e-3))
      << "the widening path computed the scores as the dot products did";
  // The backward from the same out and lse (the widening forward's): it recomputes the scores, so its
  // two paths give different P and so different dv.
  std::vector<bf16_t> dv[2];
  for (const int on : {0, 1}) {
    const test::ForceBf16Dots force(on == 1);
    std::vector<bf16_t> dq(n), dk(n);
    dv[on].resize(n);
    attention_backward(p.q.view(), p.k.view(), p.v.view(), TensorView::contiguous(out[0].data(), B, S, H, D),
                       p.dout.view(), TensorView::contiguous(lse[0].data(), B, H, S),
                       TensorView::contiguous(dq.data(), B, S, H, D), TensorView::contiguous(dk.data(), B, S, H, D),
                       TensorView::contiguous(dv[on].data(), B, S, H, D));
  }
  EXPECT_TRUE(test::differ_by_more_than(dv[0], dv[1], 1e-2))
      << "the backward's widening path recomputed the scores as the dot products did";
}

TEST(Bf16Dots, TheSwitchReachesDecode) {
  SKIP_WITHOUT_DOT_PATH(test::decode_dispatched());
  const SubnormalProblem p;
  const test::Tensor<bf16_t> q1 = [&] {  // one query per sequence: the first row of p.q
    test::Tensor<bf16_t> t(B, 1, H, D);
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t c = 0; c < D; ++c) t.at(0, 0, h, c) = p.q.data[static_cast<std::size_t>(h * D + c)];
    return t;
  }();
  const std::vector<std::int32_t> seqlens{S};
  KVCache cache;
  cache.k = p.k.view();
  cache.v = p.v.view();
  cache.seqlens = seqlens.data();
  std::vector<float> lse[2];
  for (const int on : {0, 1}) {
    const test::ForceBf16Dots force(on == 1);
    std::vector<bf16_t> out(q1.data.size());
    lse[on].resize(static_cast<std::size_t>(B * H));
    const TensorView lv = TensorView::contiguous(lse[on].data(), B, H, 1);
    attention_decode(q1.view(), cache, TensorView::contiguous(out.data(), B, 1, H, D), {}, {}, &lv);
  }
  for (const float l : lse[1]) EXPECT_NEAR(l, std::log(double(S)), 1e-6);
  EXPECT_TRUE(test::differ_by_more_than(lse[0], lse[1], 1e-3))
      << "decode's widening path computed the scores as the dot products did";
}

}  // namespace
}  // namespace attn
