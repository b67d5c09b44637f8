// GPU benchmark of attn's CUDA kernels with CUDA events (median of many repetitions after warm-up),
// next to the device-to-device copy bandwidth measured in the same run. One JSON object per line on
// stdout; bench/gpu/torch_bench.py measures the PyTorch side and bench/gpu/table.py prints the table.
// Decode runs on two cache layouts: flash-attn's [batch, keys, kv_heads, d] ("keys") and the
// kv-head-major [batch, kv_heads, keys, d] that torch's SDPA reads ("kv-heads"), as a strided view.
// Usage: attn_gpu_bench [--quick] [--sweep] [--variants] [--tiny]
//   --sweep:    decode also at num_splits 8 ... 1056 ("decode_sweep" lines, not in the table)
//   --variants: the kernel configurations of bench/gpu/variants.hpp (a build with ATTN_GPU_VARIANTS=ON),
//               each compared with the library's output and then timed ("forward_variant" and
//               "decode_variant" lines; bench/gpu/table.py lists them after the table); exits 3 if a
//               variant fails to launch (reported and skipped) or its output differs from the library's by
//               more than 0.05 (bf16 outputs in [-1, 1])
// The library's own output is checked against the f64 oracle on sampled rows of every benchmark shape
// ("oracle" lines); exits 4 if it is off by more than 0.02.
//   --tiny:     small shapes and one repetition: a dry run of this program on the CPU emulation of CUDA
//               (the test emulated.gpu_bench_dry_run), not a measurement
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/cuda.hpp"
#if defined(ATTN_GPU_VARIANTS)
#include "cuda/params.hpp"
#include "gpu/variants.hpp"
#endif

namespace {

#define CHECK(x)                                                                              \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
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
bool g_tiny = false;  // --tiny: one call per measurement

template <class F>
double median_ms(F&& f, int warmup, int reps, int inner = 1) {
  if (g_tiny) warmup = 0, reps = 1, inner = 1;
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

float bf16_value(std::uint16_t b) {
  const std::uint32_t u = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Largest |a - b| over two bf16 device buffers of n elements (infinity if either holds a NaN).
double max_diff_bf16(const void* a, const void* b, std::size_t n) {
  std::vector<std::uint16_t> x(n), y(n);
  CHECK(cudaMemcpy(x.data(), a, n * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(y.data(), b, n * 2, cudaMemcpyDeviceToHost));
  double m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(bf16_value(x[i])) - double(bf16_value(y[i])));
    if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
  }
  return m;
}

// s with the characters JSON strings cannot hold raw replaced by spaces.
std::string json_text(std::string s) {
  for (char& c : s)
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
  return s;
}

std::vector<std::uint16_t> host_bf16(const void* dev, std::size_t n) {
  std::vector<std::uint16_t> h(n);
  CHECK(cudaMemcpy(h.data(), dev, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

// The f64 oracle for one query row: softmax(q . k_j / sqrt(d)) over keys j < keys, times v, against the
// row the library wrote; returns the largest |out - oracle| (infinity for a NaN). Element x of key j is
// key(j, x), and so on.
template <class Q, class K, class V, class O>
double row_error(Q q, K key, V value, O out, std::int64_t keys, std::int64_t d) {
  std::vector<double> s(static_cast<std::size_t>(keys)), o(static_cast<std::size_t>(d), 0.0);
  double m = -INFINITY, l = 0;
  for (std::int64_t j = 0; j < keys; ++j) {
    double dot = 0;
    for (std::int64_t x = 0; x < d; ++x) dot += q(x) * key(j, x);
    s[j] = dot / std::sqrt(static_cast<double>(d));
    m = std::max(m, s[j]);
  }
  for (std::int64_t j = 0; j < keys; ++j) {
    const double p = std::exp(s[j] - m);
    l += p;
    for (std::int64_t x = 0; x < d; ++x) o[x] += p * value(j, x);
  }
  double err = 0;
  for (std::int64_t x = 0; x < d; ++x) {
    const double e = std::fabs(out(x) - o[x] / l);
    if (!(e <= err)) err = std::isnan(e) ? INFINITY : e;
  }
  return err;
}

// The library's output is checked against the f64 oracle at the benchmark's shapes too, on a sample of
// rows (the tests cover every row at smaller shapes): bf16 outputs of rows that average values in
// [-1, 1) are within a few bf16 steps of it.
constexpr double kOracleTolerance = 0.02;
bool g_oracle_ok = true;
void report_oracle(const char* what, std::int64_t rows, double err) {
  std::printf("{\"what\":\"oracle\",\"case\":\"%s\",\"rows\":%lld,\"max_err\":%.3g,\"tolerance\":%g}\n", what,
              static_cast<long long>(rows), err, kOracleTolerance);
  std::fflush(stdout);
  g_oracle_ok = g_oracle_ok && err <= kOracleTolerance;
}

// The f64 oracle's dq for one query row i that sees keys [0, keys): P from the scores, dP = dout . v_j,
// D = sum_j P_j dP_j (= dout . out), dS = P (dP - D), dq = sum_j dS_j k_j / sqrt(d); the largest |dq - that|.
template <class Q, class K, class V, class G, class DQ>
double dq_row_error(Q q, K key, V value, G dout, DQ dq, std::int64_t keys, std::int64_t d) {
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  std::vector<double> p(static_cast<std::size_t>(keys)), dp(p.size()), want(static_cast<std::size_t>(d), 0.0);
  double m = -INFINITY, l = 0, sum = 0;
  for (std::int64_t j = 0; j < keys; ++j) {
    double dot = 0, g = 0;
    for (std::int64_t x = 0; x < d; ++x) dot += q(x) * key(j, x), g += dout(x) * value(j, x);
    p[j] = dot * scale;
    dp[j] = g;
    m = std::max(m, p[j]);
  }
  for (std::int64_t j = 0; j < keys; ++j) l += p[j] = std::exp(p[j] - m);
  for (std::int64_t j = 0; j < keys; ++j) sum += (p[j] /= l) * dp[j];
  for (std::int64_t j = 0; j < keys; ++j)
    for (std::int64_t x = 0; x < d; ++x) want[x] += p[j] * (dp[j] - sum) * scale * key(j, x);
  double err = 0;
  for (std::int64_t x = 0; x < d; ++x) {
    const double e = std::fabs(dq(x) - want[x]);
    if (!(e <= err)) err = std::isnan(e) ? INFINITY : e;
  }
  return err;
}

// Backward: bf16, d = 128, seq 4096, batch 4 x 32 heads, after a forward for out and lse; FLOPs 2.5x the
// forward's (FlashAttention's count: five block products to the forward's two). dq's rows of the first
// and last (batch, head) sampled against the f64 oracle.
void bench_backward(bool quick, bool tiny) {
  for (bool causal : {false, true}) {
    const std::int64_t B = tiny ? 1 : 4, S = tiny ? 128 : 4096, H = tiny ? 2 : 32, D = 128;
    const std::size_t n = static_cast<std::size_t>(B * S * H * D);
    void *q = random_bf16(n, 12), *k = random_bf16(n, 13), *v = random_bf16(n, 14), *g = random_bf16(n, 15);
    void *o = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *lse = nullptr;
    for (void** p : {&o, &dq, &dk, &dv}) CHECK(cudaMalloc(p, n * 2));
    CHECK(cudaMalloc(&lse, static_cast<std::size_t>(B * H * S) * 4));
    attn::AttentionOptions opts;
    opts.causal = causal;
    auto view = [&](void* p) { return attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(p), B, S, H, D); };
    const auto lv = attn::TensorView::contiguous(static_cast<const float*>(lse), B, H, S);
    attn::cuda::attention(view(q), view(k), view(v), view(o), opts, &lv);
    const double flops = 2.5 * 4.0 * B * H * S * S * D * (causal ? 0.5 : 1.0);
    const double ms = median_ms(
        [&] {
          attn::cuda::attention_backward(view(q), view(k), view(v), view(o), view(g), lv, view(dq), view(dk), view(dv),
                                         opts);
        },
        2, quick ? 3 : 10);
    std::printf("{\"what\":\"backward\",\"causal\":%s,\"impl\":\"attn\",\"ms\":%.4f,\"tflops\":%.1f}\n",
                causal ? "true" : "false", ms, flops / ms / 1e9);
    const auto hq = host_bf16(q, n), hk = host_bf16(k, n), hv = host_bf16(v, n), hg = host_bf16(g, n),
               hdq = host_bf16(dq, n);
    double err = 0;
    std::int64_t rows = 0;
    for (std::int64_t bh : {std::int64_t{0}, B * H - 1})
      for (std::int64_t i = 0; i < S; i += std::max<std::int64_t>(1, S / 8), ++rows) {
        auto at = [&](const std::vector<std::uint16_t>& t, std::int64_t row, std::int64_t x) {
          return double(bf16_value(t[static_cast<std::size_t>(((bh / H * S + row) * H + bh % H) * D + x)]));
        };
        err = std::max(err, dq_row_error([&](std::int64_t x) { return at(hq, i, x); },
                                         [&](std::int64_t j, std::int64_t x) { return at(hk, j, x); },
                                         [&](std::int64_t j, std::int64_t x) { return at(hv, j, x); },
                                         [&](std::int64_t x) { return at(hg, i, x); },
                                         [&](std::int64_t x) { return at(hdq, i, x); }, causal ? i + 1 : S, D));
      }
    report_oracle(causal ? "backward dq causal" : "backward dq", rows, err);
    for (void* p : {q, k, v, g, o, dq, dk, dv, lse}) CHECK(cudaFree(p));
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, sweep = false, variants = false, tiny = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    quick = quick || a == "--quick";
    sweep = sweep || a == "--sweep";
    variants = variants || a == "--variants";
    tiny = tiny || a == "--tiny";
    if (a != "--quick" && a != "--sweep" && a != "--variants" && a != "--tiny") {
      std::fprintf(stderr, "attn_gpu_bench: unknown argument %s (use --quick, --sweep, --variants, --tiny)\n", argv[i]);
      return 2;
    }
  }
  g_tiny = tiny;
  bool variants_agree = true;  // every variant's output within kVariantTolerance of the library's
  constexpr double kVariantTolerance = 0.05;
#if !defined(ATTN_GPU_VARIANTS)
  if (variants) {
    std::fprintf(stderr, "attn_gpu_bench: --variants needs a build with -DATTN_GPU_VARIANTS=ON\n");
    return 2;
  }
#endif
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"what\":\"device\",\"name\":\"%s\",\"sms\":%d}\n", prop.name, prop.multiProcessorCount);

  // Copy bandwidth: 1 GiB device to device; bytes = read + write.
  {
    const std::size_t n = std::size_t{1} << (tiny ? 20 : 30);
    void *x = random_bf16(n / 2, 1), *y = nullptr;
    CHECK(cudaMalloc(&y, n));
    const double ms = median_ms([&] { CHECK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice)); }, 3, quick ? 5 : 30);
    std::printf("{\"what\":\"copy\",\"impl\":\"attn-bench cudaMemcpy\",\"ms\":%.5f,\"gbps\":%.1f}\n", ms,
                2.0 * n / ms / 1e6);
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
  }

  // Forward: bf16, d = 128, seq 8192, batch 4 x 32 heads (4096 blocks of 128 rows: ~31 per SM).
  for (bool causal : {false, true}) {
    const std::int64_t B = tiny ? 1 : 4, S = tiny ? 256 : 8192, H = tiny ? 2 : 32, D = 128;
    const std::size_t n = static_cast<std::size_t>(B * S * H * D);
    void *q = random_bf16(n, 2), *k = random_bf16(n, 3), *v = random_bf16(n, 4), *o = nullptr, *o2 = nullptr;
    CHECK(cudaMalloc(&o, n * 2));
    attn::AttentionOptions opts;
    opts.causal = causal;
    auto view = [&](void* p) { return attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(p), B, S, H, D); };
    const double flops = 4.0 * B * H * S * S * D * (causal ? 0.5 : 1.0);
    const double ms =
        median_ms([&] { attn::cuda::attention(view(q), view(k), view(v), view(o), opts); }, 3, quick ? 3 : 15);
    std::printf("{\"what\":\"forward\",\"causal\":%s,\"impl\":\"attn\",\"ms\":%.4f,\"tflops\":%.1f}\n",
                causal ? "true" : "false", ms, flops / ms / 1e9);
    {  // rows i of the first and last (batch, head), spread over the sequence
      const auto hq = host_bf16(q, n), hk = host_bf16(k, n), hv = host_bf16(v, n), ho = host_bf16(o, n);
      double err = 0;
      std::int64_t rows = 0;
      for (std::int64_t bh : {std::int64_t{0}, B * H - 1})
        for (std::int64_t i = 0; i < S; i += std::max<std::int64_t>(1, S / 16), ++rows) {
          const std::int64_t b = bh / H, h = bh % H;
          auto at = [&](const std::vector<std::uint16_t>& t, std::int64_t row, std::int64_t x) {
            return double(bf16_value(t[static_cast<std::size_t>(((b * S + row) * H + h) * D + x)]));
          };
          err = std::max(err, row_error([&](std::int64_t x) { return at(hq, i, x); },
                                        [&](std::int64_t j, std::int64_t x) { return at(hk, j, x); },
                                        [&](std::int64_t j, std::int64_t x) { return at(hv, j, x); },
                                        [&](std::int64_t x) { return at(ho, i, x); }, causal ? i + 1 : S, D));
        }
      report_oracle(causal ? "forward causal" : "forward", rows, err);
    }
#if defined(ATTN_GPU_VARIANTS)
    // Each configuration: its output against the library's (the same bf16 inputs), then its time.
    if (variants) {
      CHECK(cudaMalloc(&o2, n * 2));
      for (const auto& var : attn::cuda_detail::forward_variants()) {
        attn::cuda_detail::launchers().forward = var.launch;
        try {  // a variant that fails to launch is reported and skipped
          CHECK(cudaMemset(o2, 0xFF, n * 2));
          attn::cuda::attention(view(q), view(k), view(v), view(o2), opts);
          CHECK(cudaDeviceSynchronize());
          const double diff = max_diff_bf16(o, o2, n);
          variants_agree = variants_agree && diff <= kVariantTolerance;
          const double t =
              median_ms([&] { attn::cuda::attention(view(q), view(k), view(v), view(o2), opts); }, 2, quick ? 3 : 7);
          std::printf(
              "{\"what\":\"forward_variant\",\"causal\":%s,\"name\":\"%s\",\"max_diff_vs_library\":%.3g,\"ms\":%.4f,"
              "\"tflops\":%.1f}\n",
              causal ? "true" : "false", var.name, diff, t, flops / t / 1e9);
        } catch (const std::exception& e) {
          variants_agree = false;
          std::printf("{\"what\":\"forward_variant\",\"causal\":%s,\"name\":\"%s\",\"error\":\"%s\"}\n",
                      causal ? "true" : "false", var.name, json_text(e.what()).c_str());
        }
        std::fflush(stdout);
      }
      attn::cuda_detail::launchers() = {};
    }
#endif
    for (void* p : {q, k, v, o, o2}) CHECK(cudaFree(p));
  }

  bench_backward(quick, tiny);

  // Decode: batch 1, 32 heads / 8 kv heads, d = 128, 128k cached keys; bytes = K + V. Two layouts of the
  // same cache: "keys" = [1, N, HK, D] (flash-attn's), "kv-heads" = [1, HK, N, D] (torch's), as strides.
  {
    const std::int64_t N = tiny ? 2048 : 131072, H = 32, HK = 8, D = 128;
    const std::size_t cache_n = static_cast<std::size_t>(N * HK * D);
    void *kc = random_bf16(cache_n, 5), *vc = random_bf16(cache_n, 6);
    void *q = random_bf16(static_cast<std::size_t>(H * D), 7), *o = nullptr, *o2 = nullptr;
    CHECK(cudaMalloc(&o, H * D * 2));
    CHECK(cudaMalloc(&o2, H * D * 2));
    const std::int32_t seqlen = static_cast<std::int32_t>(N);
    std::int32_t* dseq = nullptr;
    CHECK(cudaMalloc(&dseq, 4));
    CHECK(cudaMemcpy(dseq, &seqlen, 4, cudaMemcpyHostToDevice));
    attn::cuda::DecodeHostMirror mirror;
    mirror.seqlens = &seqlen;  // no device->host copy (and sync) per call
    const auto qv = attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(q), 1, 1, H, D);
    auto out_view = [&](void* p) {
      return attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(p), 1, 1, H, D);
    };
    const std::int64_t splits = attn::cuda::decode_num_splits(N, 1, H, HK, 1);
    const double bytes = 2.0 * N * HK * D * 2;
    for (const char* layout : {"keys", "kv-heads"}) {
      const bool head_major = std::string(layout) == "kv-heads";
      auto cache_view = [&](void* p) {
        return head_major ? attn::TensorView::strided(static_cast<const attn::bf16_t*>(p), {1, N, HK, D},
                                                      {HK * N * D, D, N * D, 1})
                          : attn::TensorView::contiguous(static_cast<const attn::bf16_t*>(p), 1, N, HK, D);
      };
      attn::KVCache cache;
      cache.k = cache_view(kc);
      cache.v = cache_view(vc);
      cache.seqlens = dseq;
      auto run = [&](void* out, std::int64_t sp) {
        attn::DecodeOptions dec;
        dec.num_splits = sp;
        attn::cuda::attention_decode(qv, cache, out_view(out), {}, dec, nullptr, nullptr, mirror);
      };
      const double ms = median_ms([&] { run(o, 0); }, 5, quick ? 5 : 30, 10);
      {  // every head of the one query against all N keys
        CHECK(cudaDeviceSynchronize());
        const auto hq = host_bf16(q, static_cast<std::size_t>(H * D)),
                   ho = host_bf16(o, static_cast<std::size_t>(H * D));
        const auto hk = host_bf16(kc, cache_n), hv = host_bf16(vc, cache_n);
        double err = 0;
        for (std::int64_t h = 0; h < H; ++h) {
          const std::int64_t g = h / (H / HK);
          auto at = [&](const std::vector<std::uint16_t>& t, std::int64_t j, std::int64_t x) {
            return double(
                bf16_value(t[static_cast<std::size_t>(head_major ? (g * N + j) * D + x : (j * HK + g) * D + x)]));
          };
          err = std::max(err, row_error([&](std::int64_t x) { return double(bf16_value(hq[h * D + x])); },
                                        [&](std::int64_t j, std::int64_t x) { return at(hk, j, x); },
                                        [&](std::int64_t j, std::int64_t x) { return at(hv, j, x); },
                                        [&](std::int64_t x) { return double(bf16_value(ho[h * D + x])); }, N, D));
        }
        report_oracle(head_major ? "decode kv-heads" : "decode keys", H, err);
      }
      std::printf(
          "{\"what\":\"decode\",\"layout\":\"%s\",\"impl\":\"attn\",\"splits\":%lld,\"ms\":%.5f,\"gbps\":%.1f}\n",
          layout, static_cast<long long>(splits), ms, bytes / ms / 1e6);
      if (sweep)
        for (std::int64_t sp : {8, 16, 33, 66, 132, 264, 528, 1056}) {
          const double t = median_ms([&] { run(o2, sp); }, 5, quick ? 5 : 30, 10);
          std::printf(
              "{\"what\":\"decode_sweep\",\"layout\":\"%s\",\"impl\":\"attn\",\"splits\":%lld,\"ms\":%.5f,\"gbps\":%."
              "1f}\n",
              layout, static_cast<long long>(sp), t, bytes / t / 1e6);
        }
#if defined(ATTN_GPU_VARIANTS)
      if (variants) {
        for (const auto& var : attn::cuda_detail::decode_variants()) {
          attn::cuda_detail::launchers().decode = var.launch;
          // The automatic split count assumes one kv head per block; a variant whose blocks read several
          // would leave SMs idle with it, so fixed counts are timed too (0 = automatic).
          for (std::int64_t sp : tiny ? std::vector<std::int64_t>{0, 5} : std::vector<std::int64_t>{0, 66, 132, 264}) {
            try {  // a variant that fails to launch is reported and skipped
              CHECK(cudaMemset(o2, 0xFF, H * D * 2));
              run(o2, sp);
              CHECK(cudaDeviceSynchronize());
              const double diff = max_diff_bf16(o, o2, static_cast<std::size_t>(H * D));
              variants_agree = variants_agree && diff <= kVariantTolerance;
              const double t = median_ms([&] { run(o2, sp); }, 5, quick ? 5 : 20, 10);
              std::printf(
                  "{\"what\":\"decode_variant\",\"layout\":\"%s\",\"name\":\"%s\",\"splits\":%lld,"
                  "\"max_diff_vs_library\":%.3g,\"ms\":%.5f,\"gbps\":%.1f}\n",
                  layout, var.name, static_cast<long long>(sp), diff, t, bytes / t / 1e6);
            } catch (const std::exception& e) {
              variants_agree = false;
              std::printf(
                  "{\"what\":\"decode_variant\",\"layout\":\"%s\",\"name\":\"%s\",\"splits\":%lld,\"error\":\"%s\"}\n",
                  layout, var.name, static_cast<long long>(sp), json_text(e.what()).c_str());
            }
            std::fflush(stdout);
          }
        }
        attn::cuda_detail::launchers() = {};
      }
#endif
    }
    for (void* p : {kc, vc, q, o, o2}) CHECK(cudaFree(p));
    CHECK(cudaFree(dseq));
  }
  if (!g_oracle_ok) {
    std::fprintf(stderr, "attn_gpu_bench: the library's output differs from the f64 oracle by more than %g\n",
                 kOracleTolerance);
    return 4;
  }
  if (!variants_agree) {
    std::fprintf(stderr, "attn_gpu_bench: a variant failed, or its output differs from the library's by more than %g\n",
                 kVariantTolerance);
    return 3;
  }
  return 0;
}
