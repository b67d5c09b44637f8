// `attn bench ring`: ring attention (include/attn/distributed.hpp) on this one machine -- R ranks of T
// threads each, under mpirun -- against one process of R x T threads running attention_tiled on the
// same problem, in the same run. On one machine the ring's transfers are shared-memory copies, so
// this measures what the decomposition itself costs: the blocks' smaller tiles, the merges, the
// copies of each k/v chunk, and the load balance (zigzag gives each rank the same causal work).
// Over a network the transfer has to hide behind the compute: `attn io --ring` models that.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "attn/attention.hpp"
#include "attn/ring_model.hpp"
#include "bench_common.hpp"
#include "bench_inputs.hpp"
#include "bench_isa.hpp"
#include "commands.hpp"
#include "probes.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

struct RingArgs {
  std::int64_t seq = 4096, heads = 16, kv_heads = 4, head_dim = 128;
  std::string dtype = "bf16", layout = "zigzag", ranks = "2", threads = "1";
  bool full = false, quick = false, json = false;
};

#ifdef ATTN_MPIEXEC
// The worker's JSON line, from `mpirun -n ranks attn-ring-worker ...`.
nlohmann::json run_worker(const RingArgs& a, std::int64_t ranks, std::int64_t threads) {
  const std::filesystem::path worker =
      std::filesystem::read_symlink("/proc/self/exe").parent_path() / "attn-ring-worker";
  if (!std::filesystem::exists(worker))
    throw UsageError("ring: " + worker.string() + " not found (built without MPI?)");
  if (geteuid() == 0) {  // Open MPI refuses root unless told twice
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  const std::string cmd = std::string(ATTN_MPIEXEC) + " -n " + std::to_string(ranks) +
                          " --bind-to none --oversubscribe " + worker.string() + " --seq " + std::to_string(a.seq) +
                          " --heads " + std::to_string(a.heads) + " --kv-heads " + std::to_string(a.kv_heads) +
                          " --head-dim " + std::to_string(a.head_dim) + " --dtype " + a.dtype + " --layout " +
                          a.layout + " --threads " + std::to_string(threads) + " --reps " + (a.quick ? "3" : "7") +
                          (a.full ? " --full" : "") + (pinned_isa().empty() ? "" : " --isa " + pinned_isa());
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("ring: cannot run " + cmd);
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) text += buf;
  const int status = pclose(pipe);
  if (status != 0 || text.find('{') == std::string::npos)
    throw std::runtime_error("ring: the worker failed (" + cmd + "): " + text);
  return nlohmann::json::parse(text.substr(text.find('{')));
}
#endif

void run_ring(const RingArgs& a) {
#ifndef ATTN_MPIEXEC
  (void)a;
  throw UsageError("ring: this attn was built without MPI (docs/distributed.md)");
#else
  const DType t = parse_dtype(a.dtype);
  const Buffer q(a.seq * a.heads * a.head_dim, t, 1), k(a.seq * a.kv_heads * a.head_dim, t, 2),
      v(a.seq * a.kv_heads * a.head_dim, t, 3), out(a.seq * a.heads * a.head_dim, t, 0);
  const double flops =
      4.0 * static_cast<double>(a.seq) * static_cast<double>(a.seq) * a.heads * a.head_dim * (a.full ? 1.0 : 0.5);
  // The model's link on one machine: a shared-memory copy, which reads and writes each byte.
  const double link = read_bandwidth_gbps(1) * 1e9 / 2;
  if (!a.json)
    std::printf(
        "attn bench ring: %s; %s; 1 x %lld tokens, %lld/%lld heads, d %lld, %s, %s, %s layout\n"
        "model (attn io --ring): each rank at the one process's rate / R, link = half the 1-thread read bandwidth "
        "(%.1f GB/s)\n%-16s %14s %14s %9s %9s %12s\n",
        machine_name().c_str(), kernel_paths().c_str(), static_cast<long long>(a.seq), static_cast<long long>(a.heads),
        static_cast<long long>(a.kv_heads), static_cast<long long>(a.head_dim), a.dtype.c_str(),
        a.full ? "full" : "causal", a.layout.c_str(), link / 1e9, "ranks x threads", "one process", "ring", "vs one",
        "GFLOP/s", "model");
  for (const std::int64_t R : parse_counts(a.ranks, "--ranks", 1))
    for (const std::int64_t T : parse_counts(a.threads, "--threads", 1)) {
      if (a.seq % (2 * R)) throw UsageError("--seq: must be a multiple of 2 x ranks, got " + std::to_string(a.seq));
      AttentionOptions o;
      o.causal = !a.full;
      o.num_threads = static_cast<int>(R * T);
      const Timing one = time_it(
          [&] {
            attention_tiled(q.view(1, a.seq, a.heads, a.head_dim), k.view(1, a.seq, a.kv_heads, a.head_dim),
                            v.view(1, a.seq, a.kv_heads, a.head_dim), out.view(1, a.seq, a.heads, a.head_dim), o);
          },
          a.quick ? 3 : 7, 0.0, 50);
      const nlohmann::json w = run_worker(a, R, T);
      const double ring_s = w["median_s"], ratio = one.median_s / ring_s;
      io::RingParams mp;
      mp.seqlen = a.seq, mp.heads = a.heads, mp.kv_heads = a.kv_heads, mp.head_dim = a.head_dim, mp.ranks = R;
      mp.element_bytes = static_cast<double>(dtype_size(t)), mp.causal = !a.full, mp.latency = 1e-6;
      mp.flop_rate = flops / one.median_s / static_cast<double>(R), mp.link_bandwidth = link;
      const double model_s = io::ring_model(mp).ring_s;
      if (a.json) {
        nlohmann::json j = w;
        j.update({{"kind", "ring"},
                  {"seq", a.seq},
                  {"heads", a.heads},
                  {"kv_heads", a.kv_heads},
                  {"head_dim", a.head_dim},
                  {"dtype", a.dtype},
                  {"causal", !a.full},
                  {"layout", a.layout},
                  {"one_process_s", one.median_s},
                  {"ring_s", ring_s},
                  {"model_s", model_s},
                  {"speed_vs_one_process", ratio},
                  {"machine", machine_name()}});
        std::printf("%s\n", j.dump().c_str());
      } else {
        const std::string rt = std::to_string(R) + " x " + std::to_string(T);
        std::printf("%-16s %11.2f ms %11.2f ms %8.2fx %9.1f %9.2f ms\n", rt.c_str(), one.median_s * 1e3, ring_s * 1e3,
                    ratio, flops / ring_s / 1e9, model_s * 1e3);
      }
    }
#endif
}

}  // namespace

void add_bench_ring(CLI::App& bench) {
  auto args = std::make_shared<RingArgs>();
  auto* c = bench.add_subcommand("ring", "Ring attention: R MPI ranks x T threads vs one process of R x T threads");
  c->add_option("--seq", args->seq, "whole sequence length (a multiple of 2 x ranks)")->capture_default_str();
  c->add_option("--heads", args->heads, "query heads")->capture_default_str();
  c->add_option("--kv-heads", args->kv_heads, "kv heads")->capture_default_str();
  c->add_option("--head-dim", args->head_dim, "head dim")->capture_default_str();
  c->add_option("--dtype", args->dtype, "f32, bf16, f16 or f64")->capture_default_str();
  c->add_option("--layout", args->layout, "zigzag or contiguous")
      ->check(CLI::IsMember({"zigzag", "contiguous"}))
      ->capture_default_str();
  c->add_option("--ranks", args->ranks, "comma-separated rank counts")->capture_default_str();
  c->add_option("--threads", args->threads, "comma-separated threads per rank")->capture_default_str();
  c->add_flag("--full", args->full, "no causal mask");
  c->add_flag("--quick", args->quick, "2048 tokens, 8/2 heads, 3 runs");
  c->add_flag("--json", args->json, "one JSON object per line");
  c->callback([args] {
    if (args->quick) args->seq = 2048, args->heads = 8, args->kv_heads = 2;
    for (const std::int64_t x : {args->seq, args->heads, args->kv_heads, args->head_dim})
      if (x < 1 || x > (std::int64_t{1} << 20)) throw UsageError("ring: sizes must be in [1, 2^20]");
    if (args->heads % args->kv_heads) throw UsageError("--heads: must be a multiple of --kv-heads");
    parse_dtype(args->dtype);
    run_ring(*args);
  });
}

}  // namespace attn::cli
