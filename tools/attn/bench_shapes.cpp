#include "bench_shapes.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "bench_inputs.hpp"
#include "probes.hpp"
#include "units.hpp"

namespace attn::cli {

void add_shape_options(CLI::App& c, ShapeArgs& a) {
  c.add_option("--head-dim", a.head_dim, "head dims (comma list)")->capture_default_str();
  c.add_option("--causal", a.causal, "0, 1 or both (comma list)")->capture_default_str();
  c.add_option("--dtype", a.dtype, "f32, bf16, f16, f64 (comma list)")->capture_default_str();
  c.add_option("--threads", a.threads, "thread counts (comma list; default all cores)");
  c.add_option("--heads", a.heads, "query heads")->capture_default_str();
  c.add_option("--kv-heads", a.kv_heads, "kv heads (default = heads)");
  c.add_option("--batch", a.batch, "batch size")->capture_default_str();
}

void add_tile_options(CLI::App& c, ShapeArgs& a, const std::string& q_help, const std::string& k_help) {
  c.add_option("--q-tile", a.q_tile, q_help);
  c.add_option("--k-tile", a.k_tile, k_help);
}

void add_json_flag(CLI::App& c, ShapeArgs& a) { c.add_flag("--json", a.json, "one JSON object per line per case"); }

Shapes parse_shapes(const ShapeArgs& a) {
  Shapes s;
  s.dims = parse_counts(a.head_dim, "--head-dim", 1);
  s.heads = parse_counts(a.heads, "--heads", 1).front();
  s.kv_heads = a.kv_heads.empty() ? s.heads : parse_counts(a.kv_heads, "--kv-heads", 1).front();
  s.batch = parse_counts(a.batch, "--batch", 1).front();
  if (s.heads % s.kv_heads != 0) throw UsageError("--kv-heads: must divide --heads");
  for (const auto& c : split_list(a.causal)) {
    if (c == "0" || c == "off" || c == "false")
      s.causals.push_back(false);
    else if (c == "1" || c == "on" || c == "true")
      s.causals.push_back(true);
    else
      throw UsageError("--causal: list of 0/1, got " + c);
  }
  for (const auto& d : split_list(a.dtype)) s.dtypes.push_back(parse_dtype(d));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  s.threads = a.threads.empty() ? std::vector<std::int64_t>{cores} : parse_counts(a.threads, "--threads", 1);
  if (!a.q_tile.empty()) s.tiles.q_tile = parse_count(a.q_tile, "--q-tile");
  if (!a.k_tile.empty()) s.tiles.k_tile = parse_count(a.k_tile, "--k-tile");
  return s;
}

void measure_peaks(Shapes& s) {
  for (auto t : s.threads) {
    s.peak[static_cast<int>(t)] = fma_peak_gflops(static_cast<int>(t));
    s.amx_peak[static_cast<int>(t)] = amx_bf16_peak_gflops(static_cast<int>(t));
  }
}

void print_intro(const char* command, const Shapes& s) {
  std::printf("attn bench %s: %s; %s; batch %lld, %lld heads, %lld kv heads\n", command, machine_name().c_str(),
              kernel_paths().c_str(), static_cast<long long>(s.batch), static_cast<long long>(s.heads),
              static_cast<long long>(s.kv_heads));
  for (auto [t, g] : s.peak)
    std::printf("  measured FMA peak (f32): %.1f GFLOP/s with %d thread%s\n", g, t, t > 1 ? "s" : "");
  for (auto [t, g] : s.amx_peak)  // the ceiling of the AMX kernels to come, where AMX can run
    if (g > 0) std::printf("  measured AMX-BF16 peak: %.1f GFLOP/s with %d thread%s\n", g, t, t > 1 ? "s" : "");
}

void print_case_heads() { std::printf("%7s %7s %4s %6s %5s", "seq_q", "seq_k", "d", "causal", "dtype"); }

void print_case_cells(const BenchCase& c) {
  std::printf("%7lld %7lld %4lld %6s %5s", static_cast<long long>(c.seq_q), static_cast<long long>(c.seq_k),
              static_cast<long long>(c.head_dim), c.causal ? "yes" : "no", std::string(dtype_name(c.dtype)).c_str());
}

void print_rate_heads() { std::printf(" %9s %6s", "GFLOP/s", "peak"); }

void print_rate_cells(double gflops, double peak) { std::printf(" %9.1f %5.0f%%", gflops, 100 * gflops / peak); }

nlohmann::json case_json(const char* kind, const Shapes& s, const BenchCase& c, const Timing& t, double gflops) {
  const double peak = s.peak.at(static_cast<int>(c.threads));
  return nlohmann::json{
      {"kind", kind},
      {"batch", s.batch},
      {"seq_q", c.seq_q},
      {"seq_k", c.seq_k},
      {"heads", s.heads},
      {"kv_heads", s.kv_heads},
      {"head_dim", c.head_dim},
      {"dtype", std::string(dtype_name(c.dtype))},
      {"causal", c.causal},
      {"threads", c.threads},
      {"seconds", t.median_s},
      {"reps", t.reps},
      {"gflops", gflops},
      {"peak_gflops", peak},
      {"peak_fraction", gflops / peak},
      {"amx_bf16_peak_gflops", s.amx_peak.at(static_cast<int>(c.threads))},
      {"amx_peak_fraction",
       s.amx_peak.at(static_cast<int>(c.threads)) > 0 ? gflops / s.amx_peak.at(static_cast<int>(c.threads)) : 0.0},
      {"machine", machine_name()},
      {"kernels", kernel_paths()}};
}

}  // namespace attn::cli
