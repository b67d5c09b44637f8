// `attn info`: what this machine and this build give the kernels: the CPU, the Highway targets compiled
// and the one runtime dispatch picks, the bf16 path, and whether AMX can run here and is switched on
// (ATTN_AMX) -- with the step that failed when it cannot (amx/amx.hpp). --peaks adds the measured FMA
// and AMX-BF16 ceilings, the same probes `attn bench` prints beside its tables.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <hwy/targets.h>

#include "bench_common.hpp"
#include "bench_inputs.hpp"
#include "commands.hpp"
#include "amx/amx.hpp"
#include "cpu/target_names.hpp"
#include "probes.hpp"

namespace attn::cli {
namespace {

struct InfoArgs {
  bool json = false, peaks = false;
  std::string threads;  // empty: 1 and all cores
};

// "AMX-TILE AMX-BF16 AMX-INT8": the AMX features CPUID lists, whether or not the OS lets them run.
std::string amx_features(const detail::AmxSupport& s) {
  std::string f;
  for (auto [has, name] : {std::pair{s.cpu_tile, "AMX-TILE"}, std::pair{s.cpu_bf16, "AMX-BF16"},
                           std::pair{s.cpu_int8, "AMX-INT8"}, std::pair{s.cpu_fp16, "AMX-FP16"}})
    if (has) f += (f.empty() ? "" : " ") + std::string(name);
  return f.empty() ? "none" : f;
}

// Where the f32 forward runs, for the text of `attn info`.
const char* f32_path(const KernelInfo& k, bool amx_on) {
  if (k.f32_on_tiles)
    return amx_on ? "the AMX tiles, by bf16 parts (ATTN_AMX_F32=bf16x3)"
                  : "the AMX emulator, by bf16 parts (ATTN_AMX_F32=bf16x3)";
  return k.amx == "none" ? "the vector kernels"
                         : "the vector kernels (ATTN_AMX_F32=bf16x3 would send it to the tiles, by bf16 parts)";
}

void run_info(const InfoArgs& a) {
  // Read first: a bad ATTN_AMX, or ATTN_AMX=on where AMX cannot run, is the one line the user gets.
  const detail::AmxMode mode = detail::amx_mode_from_env();
  const bool amx_on = detail::amx_enabled();
  const detail::AmxSupport& amx = detail::amx_support();
  const KernelInfo k = kernel_info();
  const std::string compiled = detail::target_names(HWY_TARGETS);
  const std::string supported = detail::target_names(hwy::SupportedTargets() & HWY_TARGETS);
  nlohmann::json j{{"machine", machine_name()},
                   {"kernels", k.summary},
                   {"simd_compiled", compiled.empty() ? "" : compiled.substr(1)},
                   {"simd_supported", supported.empty() ? "" : supported.substr(1)},
                   {"amx_features", amx_features(amx)},
                   {"amx_os_enabled", amx.os_enabled},
                   {"amx_permitted", amx.permitted},
                   {"amx_usable", amx.usable()},
                   {"amx_reason", amx.reason()},
                   {"amx_mode", detail::amx_mode_name(mode)},
                   {"amx_enabled", amx_on},
                   {"amx_f16", k.f16_on_tiles},
                   {"amx_f32", k.f32_on_tiles}};
  if (!a.json)
    std::printf(
        "attn info: %s\nkernels: %s\nSIMD targets compiled:%s; this CPU runs:%s\n"
        "AMX: %s (CPU: %s); ATTN_AMX=%s, so the bf16 forward and backward (and a bf16 decode with 16 or more\n"
        "query rows per kv head) run on %s; the f16 forward and backward on %s; the f32 forward on %s\n",
        machine_name().c_str(), k.summary.c_str(), compiled.c_str(), supported.c_str(), amx.reason().c_str(),
        amx_features(amx).c_str(), detail::amx_mode_name(mode),
        amx_on                                                        ? "the AMX tiles"
        : detail::amx_backend() == detail::amx::TileBackend::emulated ? "the AMX emulator (slow)"
                                                                      : "the vector kernels",
        !k.f16_on_tiles ? "the vector kernels"
        : amx_on        ? "the AMX tiles (AMX-FP16)"
                        : "the AMX emulator",
        f32_path(k, amx_on));
  if (a.peaks) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const auto threads =
        a.threads.empty() ? std::vector<std::int64_t>{1, cores} : parse_counts(a.threads, "--threads", 1);
    for (std::size_t i = 0; i < threads.size(); ++i) {
      if (i > 0 && threads[i] == threads[i - 1]) continue;  // 1 and 1 on a one-core machine
      const int t = static_cast<int>(threads[i]);
      const double fma = fma_peak_gflops(t), tiles = amx_bf16_peak_gflops(t);
      j["peaks"].push_back({{"threads", t}, {"fma_peak_gflops", fma}, {"amx_bf16_peak_gflops", tiles}});
      if (!a.json)
        std::printf("  measured peaks with %d thread%s: FMA (f32) %.1f GFLOP/s, AMX-BF16 %.1f GFLOP/s (%.1fx)\n", t,
                    t > 1 ? "s" : "", fma, tiles, tiles / fma);
    }
  }
  if (a.json) std::printf("%s\n", j.dump().c_str());
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto args = std::make_shared<InfoArgs>();
  auto* c = app.add_subcommand("info", "The CPU, the SIMD targets and bf16 path the kernels take, and AMX (ATTN_AMX)");
  c->add_flag("--json", args->json, "one JSON object");
  c->add_flag("--peaks", args->peaks, "also measure the FMA and AMX-BF16 peaks (about a second per thread count)");
  c->add_option("--threads", args->threads, "thread counts for --peaks (comma list; default 1 and all cores)");
  c->callback([args] { run_info(*args); });
}

}  // namespace attn::cli
