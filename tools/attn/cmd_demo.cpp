// `attn demo`: the tour `make demo` runs, in a screenful. The memory-traffic model at the seed's
// defaults, the two exactness checks, and the textbook method against tiled attention on one real
// problem, timed, with the heap each one needed.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <omp.h>
#include <random>
#include <vector>

#include "alloc_tracker.hpp"
#include "attn/attention.hpp"
#include "attn/io_model.hpp"
#include "checks.hpp"
#include "commands.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

struct Timed {
  double median_s;
  std::size_t peak_heap;
};

template <class F>
Timed time_median(F&& f, int reps) {
  std::vector<double> t;
  std::size_t peak = 0;
  for (int r = 0; r < reps; ++r) {
    tools::HeapPeakScope scope;
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    peak = std::max(peak, scope.peak_growth());
  }
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], peak};
}

struct DemoResult {
  io::Report io;
  TiledCheck tiled_check;
  SplitKCheck splitk_check;
  Timed textbook, tiled;
  double max_abs_diff;
  int threads;
};

DemoResult measure(std::int64_t seq, std::int64_t heads, std::int64_t d) {
  DemoResult r{io::model({}),        check_tiled(48, 16, 8, 1), check_splitk(4096, 4, 16, 1), {}, {}, 0,
               omp_get_max_threads()};
  const auto n = static_cast<std::size_t>(seq * heads * d);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> dist;
  std::vector<float> q(n), k(n), v(n), out_ref(n), out_tiled(n);
  for (auto* x : {&q, &k, &v})
    for (auto& e : *x) e = dist(rng);
  const auto view = [&](const std::vector<float>& x) { return TensorView::contiguous(x.data(), 1, seq, heads, d); };
  r.textbook = time_median([&] { attention_reference(view(q), view(k), view(v), view(out_ref)); }, 3);
  r.tiled = time_median([&] { attention_tiled(view(q), view(k), view(v), view(out_tiled)); }, 3);
  for (std::size_t i = 0; i < n; ++i)
    r.max_abs_diff = std::max(r.max_abs_diff, static_cast<double>(std::abs(out_ref[i] - out_tiled[i])));
  return r;
}

void print_json(const DemoResult& r, std::int64_t seq, std::int64_t heads, std::int64_t d) {
  const double flops = 4.0 * seq * seq * d * heads;
  auto timed = [&](const Timed& t) {
    return nlohmann::json{
        {"seconds", t.median_s}, {"gflops", flops / t.median_s / 1e9}, {"peak_heap_bytes", t.peak_heap}};
  };
  nlohmann::json j{{"io",
                    {{"standard_bytes", r.io.standard.bytes},
                     {"standard_seconds", r.io.standard.seconds},
                     {"tiled_bytes", r.io.tiled.bytes},
                     {"tiled_seconds", r.io.tiled.seconds},
                     {"reduction", r.io.reduction},
                     {"score_matrix_bytes", r.io.score_matrix_bytes}}},
                   {"check_tiled", {{"max_abs_diff", r.tiled_check.max_abs_diff}}},
                   {"check_splitk", {{"max_abs_diff", r.splitk_check.max_abs_diff}}},
                   {"timed",
                    {{"dtype", "f32"},
                     {"seq", seq},
                     {"heads", heads},
                     {"head_dim", d},
                     {"threads", r.threads},
                     {"textbook", timed(r.textbook)},
                     {"tiled", timed(r.tiled)},
                     {"max_abs_diff", r.max_abs_diff}}}};
  std::printf("%s\n", j.dump().c_str());
}

void print_text(const DemoResult& dr, std::int64_t seq, std::int64_t heads, std::int64_t d) {
  std::printf("attn demo: exact, IO-aware attention\n\n");

  const io::Report& r = dr.io;
  std::printf("1. Memory traffic for one head, N=%lld, d=%lld, %s SRAM, 16-bit, %.2f TB/s x %.0f%%  (attn io)\n",
              static_cast<long long>(r.params.seqlen), static_cast<long long>(r.params.head_dim),
              format_bytes(r.params.sram_bytes).c_str(), r.params.bandwidth / 1e12, r.params.derate * 100);
  std::printf("   standard %s (%s)   tiled %s (%s)   reduction %.1f×   N×N matrix %s, never written when tiled\n\n",
              format_mb(r.standard.bytes).c_str(), format_seconds(r.standard.seconds).c_str(),
              format_mb(r.tiled.bytes).c_str(), format_seconds(r.tiled.seconds).c_str(), r.reduction,
              format_mb(r.score_matrix_bytes).c_str());

  std::printf("2. Tiling is exact  (attn check tiled)\n   ");
  print(dr.tiled_check);
  std::printf("\n3. Split-K is exact  (attn check splitk)\n   ");
  print(dr.splitk_check, 4);

  std::printf("\n4. Textbook vs tiled, f32, batch 1, %lld heads, N=%lld, d=%lld, %d threads\n",
              static_cast<long long>(heads), static_cast<long long>(seq), static_cast<long long>(d), dr.threads);
  const Timed& ref = dr.textbook;
  const Timed& tiled = dr.tiled;
  const double diff = dr.max_abs_diff;
  const double flops = 4.0 * seq * seq * d * heads;
  std::printf("   %-9s %10s %9s  %s\n", "", "median", "GFLOP/s", "peak heap");
  std::printf("   %-9s %10s %9.2f  %s  (S and P: N×N per head in flight)\n", "textbook",
              format_seconds(ref.median_s).c_str(), flops / ref.median_s / 1e9,
              format_bytes(static_cast<double>(ref.peak_heap)).c_str());
  std::printf("   %-9s %10s %9.2f  %s  (tiles only)\n", "tiled", format_seconds(tiled.median_s).c_str(),
              flops / tiled.median_s / 1e9, format_bytes(static_cast<double>(tiled.peak_heap)).c_str());
  std::printf("   speed-up %.2f×, memory %.0f× less, max |Δ| = %.1e (f32)\n", ref.median_s / tiled.median_s,
              static_cast<double>(ref.peak_heap) / static_cast<double>(std::max<std::size_t>(tiled.peak_heap, 1)),
              diff);
  std::printf("\nNext: attn io --help, attn check --help, README.md\n");
}

}  // namespace

void add_demo_command(CLI::App& app) {
  struct Args {
    std::string seq = "2048", heads = "4", d = "64";
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  auto* demo = app.add_subcommand("demo", "A tour: the traffic model, both exactness checks, textbook vs tiled timed");
  demo->add_option("--seq", a->seq, "sequence length for the timed comparison")->capture_default_str();
  demo->add_option("--heads", a->heads, "heads for the timed comparison")->capture_default_str();
  demo->add_option("--head-dim", a->d, "head dimension for the timed comparison")->capture_default_str();
  demo->add_flag("--json", a->json, "print one JSON object");
  demo->callback([a] {
    const std::int64_t seq = parse_count(a->seq, "--seq"), heads = parse_count(a->heads, "--heads"),
                       d = parse_count(a->d, "--head-dim");
    if (seq < 1 || heads < 1 || d < 1) throw UsageError("--seq, --heads, --head-dim: must be >= 1");
    const DemoResult r = measure(seq, heads, d);
    if (a->json)
      print_json(r, seq, heads, d);
    else
      print_text(r, seq, heads, d);
  });
}

}  // namespace attn::cli
