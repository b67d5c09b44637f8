// The benchmark's kernel variants (bench/gpu/variants.hpp) against the f64 oracle, each swapped in
// through cuda_detail::launchers() and run through the public entry points with the checks of
// cuda_checks.hpp. Built against the CPU emulation of CUDA (test_cuda_variants_emulated), so that a
// variant is known to compute the right thing before GPU time is spent timing it; on a GPU,
// attn_gpu_bench --variants compares each with the library's output again before timing it.
#include "cuda_checks.hpp"
#include "cuda/params.hpp"
#include "gpu/variants.hpp"

namespace attn {
namespace {

using namespace test;

// check(variant) once per variant of `variants` (at least two), with launchers().*slot set to it; the
// library's own launchers afterwards.
template <class Variants, class Slot, class F>
void for_each_variant(const Variants& variants, Slot slot, F&& check) {
  struct RestoreLaunchers {
    ~RestoreLaunchers() { cuda_detail::launchers() = {}; }
  };
  ASSERT_GE(variants.size(), 2u);
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    RestoreLaunchers restore;
    cuda_detail::launchers().*slot = v.launch;
    check(v);
  }
}

TEST(CudaVariants, EveryForwardVariantMatchesTheOracle) {
  for_each_variant(cuda_detail::forward_variants(), &cuda_detail::Launchers::forward, [](const auto&) {
    check_forward<bf16_t>(Case{{1, 150, 200, 4, 2, 128, false}});
    check_forward<bf16_t>(Case{{1, 200, 200, 2, 1, 128, true}});  // causal: masked tiles and skipped ones
  });
}

TEST(CudaVariants, EveryDecodeVariantMatchesTheOracle) {
  for_each_variant(cuda_detail::decode_variants(), &cuda_detail::Launchers::decode, [](const auto&) {
    check_decode<bf16_t>(DecodeCase{1, 1, 32, 8, 128, 3000, false, false, 0});               // automatic splits
    check_decode<bf16_t>(DecodeCase{2, 2, 16, 8, 128, 900, true, true, 5, 0, 16});           // paged, causal, 2 queries
    check_decode<bf16_t>(DecodeCase{1, 1, 32, 8, 128, 1000, false, false, 3, 0, 64, true});  // kv-head-major
  });
}

// Bank conflicts cost speed, not correctness, so only the emulator's count shows them (cuda_runtime.h,
// smem_stats): every ldmatrix of every kernel -- the library's at each head dim, and every variant --
// must read its four matrices in four wavefronts. A tile without the swizzle would read each matrix's 8
// rows from the same 4 banks (8 wavefronts) and still compute the right answer.
void expect_conflict_free_ldmatrix(const char* what) {
  SCOPED_TRACE(what);
  EXPECT_GT(smem_stats().ldmatrix, 0u);
  EXPECT_EQ(smem_stats().ldmatrix_wavefronts, 4 * smem_stats().ldmatrix);
  smem_stats() = {};
}

TEST(CudaVariants, EveryKernelReadsSharedMemoryWithoutBankConflicts) {
  smem_stats() = {};
  for (std::int64_t d : {64, 128, 256}) {
    check_forward<f16_t>(Case{{1, 70, 90, 2, 1, d, true}});
    expect_conflict_free_ldmatrix("library forward");
    check_decode<f16_t>(DecodeCase{1, 2, 4, 2, d, 700, true, true, 0, 0, 16});
    expect_conflict_free_ldmatrix("library decode");
  }
  for_each_variant(cuda_detail::forward_variants(), &cuda_detail::Launchers::forward, [](const auto& v) {
    check_forward<bf16_t>(Case{{1, 150, 200, 4, 2, 128, false}});
    expect_conflict_free_ldmatrix(v.name);
  });
  for_each_variant(cuda_detail::decode_variants(), &cuda_detail::Launchers::decode, [](const auto& v) {
    check_decode<bf16_t>(DecodeCase{1, 1, 32, 8, 128, 1000, false, false, 3});
    expect_conflict_free_ldmatrix(v.name);
  });
}

}  // namespace
}  // namespace attn
