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

struct RestoreLaunchers {
  ~RestoreLaunchers() { cuda_detail::launchers() = {}; }
};

TEST(CudaVariants, EveryForwardVariantMatchesTheOracle) {
  ASSERT_GE(cuda_detail::forward_variants().size(), 2u);
  for (const auto& v : cuda_detail::forward_variants()) {
    SCOPED_TRACE(v.name);
    RestoreLaunchers restore;
    cuda_detail::launchers().forward = v.launch;
    check_forward<bf16_t>(Case{{1, 150, 200, 4, 2, 128, false}});
    check_forward<bf16_t>(Case{{1, 200, 200, 2, 1, 128, true}});  // causal: masked tiles and skipped ones
  }
}

TEST(CudaVariants, EveryDecodeVariantMatchesTheOracle) {
  ASSERT_GE(cuda_detail::decode_variants().size(), 2u);
  for (const auto& v : cuda_detail::decode_variants()) {
    SCOPED_TRACE(v.name);
    RestoreLaunchers restore;
    cuda_detail::launchers().decode = v.launch;
    check_decode<bf16_t>(DecodeCase{1, 1, 32, 8, 128, 3000, false, false, 0});            // automatic splits
    check_decode<bf16_t>(DecodeCase{2, 2, 16, 8, 128, 900, true, true, 5, 0, 16});        // paged, causal, 2 queries
    check_decode<bf16_t>(DecodeCase{1, 1, 32, 8, 128, 1000, false, false, 3, 0, 64, true});  // kv-head-major
  }
}

}  // namespace
}  // namespace attn
