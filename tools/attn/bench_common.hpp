// Shared by the `attn bench` subcommands: robust timing, the machine's name, JSON-lines output.
// Every figure a benchmark prints is a median over repetitions measured in the same run as its
// baselines (the machine's probes, the textbook method), so ratios compare like with like.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <hwy/targets.h>

#include "amx/amx.hpp"
#include "cpu/dpbf16.hpp"

namespace attn::cli {

struct Timing {
  double median_s = 0;
  double min_s = 0;
  int reps = 0;
};

// Runs f once to warm up, then repeats it until both `min_reps` runs and `min_total_s` seconds have
// passed (capped at max_reps), and returns the median.
template <class F>
Timing time_it(F&& f, int min_reps = 5, double min_total_s = 0.5, int max_reps = 1000) {
  f();
  std::vector<double> t;
  double total = 0;
  while ((static_cast<int>(t.size()) < min_reps || total < min_total_s) && static_cast<int>(t.size()) < max_reps) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.push_back(s);
    total += s;
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), static_cast<int>(t.size())};
}

// "AMD EPYC 9R14 (2 cores)" from /proc/cpuinfo, for the header of every table.
inline std::string machine_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  int cpus = 0;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && model == "unknown CPU") model = line.substr(line.find(':') + 2);
    if (line.rfind("processor", 0) == 0) ++cpus;
  }
  return model + " (" + std::to_string(cpus) + " logical CPUs)";
}

// The kernel paths this CPU gets: the Highway target that runtime dispatch picks, whether the bf16
// forward and the bf16 decodes with 16 or more query rows per kv head ("wide": MLA) run on AMX tiles
// (amx/amx.hpp: ATTN_AMX, --amx), and whether the bf16 vector kernels take
// the VDPBF16PS dot products (AVX512-BF16, where they pay or --bf16-dots says so: cpu/dpbf16.hpp;
// otherwise they are widened to f32).
inline std::string kernel_paths() {
  const std::vector<std::int64_t> targets = hwy::SupportedAndGeneratedTargets();  // best first
  std::string s = std::string("SIMD ") + (targets.empty() ? "none" : hwy::TargetName(targets.front()));
  const bool dp =
      detail::bf16_dots() && !targets.empty() && (targets.front() == HWY_AVX3 || targets.front() == HWY_AVX3_DL);
  const bool has = detail::cpu_has_avx512bf16();
  const detail::amx::TileBackend tiles = detail::amx_backend();
  s += tiles == detail::amx::TileBackend::hardware ? ", bf16 forward, backward and wide decode on AMX tiles"
       : tiles == detail::amx::TileBackend::emulated
           ? ", bf16 forward, backward and wide decode on the AMX emulator (slow)"
           : "";
  return s + (dp    ? ", bf16 dot products (AVX512-BF16)"
              : has ? ", bf16 widened to f32 (AVX512-BF16 not used)"
                    : ", bf16 widened to f32");
}

}  // namespace attn::cli
