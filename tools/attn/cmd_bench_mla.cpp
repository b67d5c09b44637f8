// `attn bench mla`: MLA decode (DeepSeek's latent cache: one kv head of 576 dims, 128 query heads, the
// values the first 512 dims of each key row), V read through a view of K's rows against a separate V
// cache of the same 512 dims, in the same run.
//
// Per token, per key: 128 heads x (576 + 512) multiply-adds = 278528 flops, against 576 x 2 bytes of bf16
// cache read through the view (1088 x 2 with a separate V). At about 240 flops per byte, this decode is
// bound by arithmetic, not by the cache's bytes (a GQA decode at 32/8 heads and d = 128 does 8 flops per
// byte), so the floor is flops / the peak measured in the same run: the FMA peak, or on Intel AMX the tiles'
// (128 query rows over one kv head fill them: decode/decode_amx.cpp). What the view saves is the copy's
// memory (and its bytes, which matter where the kernel is bound by them: fewer query heads, or a GPU).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "amx/amx.hpp"
#include "attn/decode.hpp"
#include "bench_common.hpp"
#include "bench_inputs.hpp"
#include "commands.hpp"
#include "probes.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

constexpr std::int64_t kHeads = 128, kDim = 576, kDimV = 512;

struct MlaArgs {
  bool quick = false, json = false;
  std::int64_t cache = 0;  // keys; 0 = 8192 (2048 with --quick)
  int threads = 2;
};

void run_mla(const MlaArgs& a) {
  const std::int64_t n = a.cache > 0 ? a.cache : (a.quick ? 2048 : 8192);
  const Buffer latent(n * kDim, DType::bf16, 1), q(kHeads * kDim, DType::bf16, 2), out(kHeads * kDimV, DType::bf16, 3);
  Buffer values(n * kDimV, DType::bf16, 4);
  for (std::int64_t j = 0; j < n; ++j)  // the copy holds the same values as the view
    std::memcpy(values.bytes.data() + j * kDimV * 2, latent.bytes.data() + j * kDim * 2, kDimV * 2);
  const std::int32_t seqlens[] = {static_cast<std::int32_t>(n)};
  const TensorView qv = q.view(1, 1, kHeads, kDim), ov = out.view(1, 1, kHeads, kDimV);
  AttentionOptions o;
  o.num_threads = a.threads;
  const double flops = 2.0 * static_cast<double>(n) * kHeads * (kDim + kDimV);
  const double peak = fma_peak_gflops(a.threads), bw = read_bandwidth_gbps(a.threads);
  const double amx = amx_bf16_peak_gflops(a.threads);  // 0 where AMX cannot run
  // 128 query rows over one kv head fill the tiles: on AMX the decode runs there, measured against their peak.
  const bool on_tiles = detail::amx_backend() == detail::amx::TileBackend::hardware && amx > 0;
  const double ceiling = on_tiles ? amx : peak;
  if (!a.json)
    std::printf(
        "attn bench mla: %s; %s; 1 kv head, %lld heads, d_qk %lld, d_v %lld, bf16 cache of %lld keys, %d threads\n"
        "FMA peak %.1f GFLOP/s, AMX-BF16 peak %.1f GFLOP/s, read bandwidth %.1f GB/s; of peak: of the %s peak\n"
        "%-10s %12s %12s %9s %12s %10s %10s\n",
        machine_name().c_str(), kernel_paths().c_str(), static_cast<long long>(kHeads), static_cast<long long>(kDim),
        static_cast<long long>(kDimV), static_cast<long long>(n), a.threads, peak, amx, bw,
        on_tiles ? "AMX-BF16" : "FMA", "values", "median", "GFLOP/s", "of peak", "cache read", "tokens/s", "vs copy");
  double copy_s = 0;
  for (const bool view : {false, true}) {
    KVCache cache;
    cache.k = latent.view(1, n, 1, kDim);
    cache.v = values.view(1, n, 1, kDimV);
    if (view) cache.v = cache.k, cache.v.shape[3] = kDimV;  // the first 512 dims of K's own rows
    cache.seqlens = seqlens;
    const Timing t = time_it([&] { attention_decode(qv, cache, ov, o); }, a.quick ? 3 : 7, a.quick ? 0.1 : 1.0, 200);
    if (!view) copy_s = t.median_s;
    const double bytes = 2.0 * static_cast<double>(n) * (view ? kDim : kDim + kDimV);
    const double gflops = flops / t.median_s / 1e9;
    const char* name = view ? "K's view" : "own copy";
    if (a.json)
      std::printf("%s\n", nlohmann::json{{"kind", "mla_decode"},
                                         {"values", view ? "view" : "copy"},
                                         {"keys", n},
                                         {"heads", kHeads},
                                         {"head_dim", kDim},
                                         {"head_dim_v", kDimV},
                                         {"threads", a.threads},
                                         {"seconds", t.median_s},
                                         {"gflops", gflops},
                                         {"fma_peak_gflops", peak},
                                         {"amx_bf16_peak_gflops", amx},
                                         {"on_amx_tiles", on_tiles},
                                         {"peak_fraction", gflops / ceiling},
                                         {"gbps", bytes / t.median_s / 1e9},
                                         {"read_bandwidth_gbps", bw},
                                         {"tokens_per_s", 1 / t.median_s},
                                         {"speed_vs_copy", copy_s / t.median_s},
                                         {"machine", machine_name()},
                                         {"kernels", kernel_paths()}}
                              .dump()
                              .c_str());
    else
      std::printf("%-10s %9.3f ms %12.1f %8.0f%% %7.1f GB/s %10.1f %9.2fx\n", name, t.median_s * 1e3, gflops,
                  100 * gflops / ceiling, bytes / t.median_s / 1e9, 1 / t.median_s, copy_s / t.median_s);
  }
}

}  // namespace

void add_bench_mla(CLI::App& bench) {
  auto args = std::make_shared<MlaArgs>();
  auto* c = bench.add_subcommand("mla", "MLA decode (576 / 512, one kv head): V as a view of K's rows vs its own copy");
  c->add_flag("--quick", args->quick, "2048 keys, a few repetitions");
  c->add_flag("--json", args->json, "one JSON object per line");
  c->add_option("--cache", args->cache, "keys in the cache (default 8192)");
  c->add_option("--threads", args->threads, "threads")->capture_default_str();
  c->callback([args] {
    if (args->cache < 0 || args->cache > (std::int64_t{1} << 24))
      throw UsageError("--cache: must be in [1, 2^24], got " + std::to_string(args->cache));
    if (args->threads < 1 || args->threads > 1024)
      throw UsageError("--threads: must be in [1, 1024], got " + std::to_string(args->threads));
    run_mla(*args);
  });
}

}  // namespace attn::cli
