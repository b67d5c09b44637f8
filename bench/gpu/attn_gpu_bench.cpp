// GPU benchmark of attn's CUDA kernels with CUDA events (median of many repetitions after warm-up),
// next to the device-to-device copy bandwidth measured in the same run. One JSON object per line on
// stdout; bench/gpu/torch_bench.py measures the PyTorch side and bench/gpu/table.py prints the table.
// Usage: attn_gpu_bench [--quick] [--sweep]   (--sweep: decode also at num_splits 8 ... 1056, as
// "decode_sweep" lines that the table ignores)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn/cuda.hpp"

namespace {

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// Random bf16 in [-1, 1) (never zeros: zeros can run faster than real data).
void* random_bf16(std::size_t n, unsigned seed) {
  std::vector<std::uint16_t> h(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (auto& x : h) {
    float f = d(rng);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    x = static_cast<std::uint16_t>(u >> 16);
  }
  void* p = nullptr;
  CHECK(cudaMalloc(&p, n * 2));
  CHECK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
  return p;
}

// Median time of one call of f; `inner` calls per timed repetition keep the device queue full, so
// host-side work per call (validation, launch) overlaps the previous call's kernels as in real use.
template <class F>
double median_ms(F&& f, int warmup, int reps, int inner = 1) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) f();
  CHECK(cudaDeviceSynchronize());
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CHECK(cudaEventRecord(a));
    for (int j = 0; j < inner; ++j) f();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / inner);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, sweep = false;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::string(argv[i]) == "--quick";
    sweep = sweep || std::string(argv[i]) == "--sweep";
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"what\":\"device\",\"name\":\"%s\",\"sms\":%d}\n", prop.name, prop.multiProcessorCount);

  // Copy bandwidth: 1 GiB device to device; bytes = read + write.
  {
    const std::size_t n = std::size_t{1} << 30;
    void *x = random_bf16(n / 2, 1), *y = nullptr;
    CHECK(cudaMalloc(&y, n));
    const double ms = median_ms([&] { CHECK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice)); }, 3, quick ? 5 : 30);
    std::printf("{\"what\":\"copy\",\"impl\":\"attn-bench cudaMemcpy\",\"ms\":%.5f,\"gbps\":%.1f}\n", ms, 2.0 * n / ms / 1e6);
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
  }

  // Forward: bf16, d = 128, seq 8192, batch 4 x 32 heads (4096 blocks of 128 rows: ~31 per SM).
  for (bool causal : {false, true}) {
    const std::int64_t B = 4, S = 8192, H = 32, D = 128;
    const std::size_t n = static_cast<std::size_t>(B * S * H * D);
    void *q = random_bf16(n, 2), *k = random_bf16(n, 3), *v = random_bf16(n, 4), *o = nullptr;
    CHECK(cudaMalloc(&o, n * 2));
    attn::AttentionOptions opts;
    opts.causal = causal;
    auto view = [&](void* p) {
      attn::TensorView t = attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(p), B, S, H, D);
      return t;
    };
    const double ms = median_ms([&] { attn::cuda::attention(view(q), view(k), view(v), view(o), opts); }, 3, quick ? 3 : 15);
    const double flops = 4.0 * B * H * S * S * D * (causal ? 0.5 : 1.0);
    std::printf("{\"what\":\"forward\",\"causal\":%s,\"impl\":\"attn\",\"ms\":%.4f,\"tflops\":%.1f}\n", causal ? "true" : "false",
                ms, flops / ms / 1e9);
    for (void* p : {q, k, v, o}) CHECK(cudaFree(p));
  }

  // Decode: batch 1, 32 heads / 8 kv heads, d = 128, 128k cached keys (contiguous); bytes = K + V.
  {
    const std::int64_t N = 131072, H = 32, HK = 8, D = 128;
    void *kc = random_bf16(static_cast<std::size_t>(N * HK * D), 5), *vc = random_bf16(static_cast<std::size_t>(N * HK * D), 6);
    void *q = random_bf16(static_cast<std::size_t>(H * D), 7), *o = nullptr;
    CHECK(cudaMalloc(&o, H * D * 2));
    const std::int32_t seqlen = static_cast<std::int32_t>(N);
    std::int32_t* dseq = nullptr;
    CHECK(cudaMalloc(&dseq, 4));
    CHECK(cudaMemcpy(dseq, &seqlen, 4, cudaMemcpyHostToDevice));
    attn::KVCache cache;
    cache.k = attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(kc), 1, N, HK, D);
    cache.v = attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(vc), 1, N, HK, D);
    cache.seqlens = dseq;
    attn::cuda::DecodeHostMirror mirror;
    mirror.seqlens = &seqlen;  // no device->host copy (and sync) per call
    const auto qv = attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(q), 1, 1, H, D);
    const auto ov = attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(o), 1, 1, H, D);
    const std::int64_t splits = attn::cuda::decode_num_splits(N, 1, H, HK, 1);
    const double ms = median_ms([&] { attn::cuda::attention_decode(qv, cache, ov, {}, {}, nullptr, nullptr, mirror); }, 5,
                                quick ? 5 : 30, 10);
    const double bytes = 2.0 * N * HK * D * 2;
    std::printf("{\"what\":\"decode\",\"impl\":\"attn\",\"splits\":%lld,\"ms\":%.5f,\"gbps\":%.1f}\n",
                static_cast<long long>(splits), ms, bytes / ms / 1e6);
    if (sweep)
      for (std::int64_t sp : {8, 16, 33, 66, 132, 264, 528, 1056}) {
        attn::DecodeOptions dec;
        dec.num_splits = sp;
        const double t = median_ms([&] { attn::cuda::attention_decode(qv, cache, ov, {}, dec, nullptr, nullptr, mirror); },
                                   5, quick ? 5 : 30, 10);
        std::printf("{\"what\":\"decode_sweep\",\"impl\":\"attn\",\"splits\":%lld,\"ms\":%.5f,\"gbps\":%.1f}\n",
                    static_cast<long long>(sp), t, bytes / t / 1e6);
      }
    for (void* p : {kc, vc, q, o}) CHECK(cudaFree(p));
    CHECK(cudaFree(dseq));
  }
  return 0;
}
