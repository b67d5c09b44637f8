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

#include "amx/amx.hpp"
#include "attn/info.hpp"

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

// The kernel paths this CPU gets, in one line (attn::kernel_info, include/attn/info.hpp).
inline std::string kernel_paths() { return kernel_info().summary; }

}  // namespace attn::cli
