// `attn bench backward`: the backward pass (attention_backward) over long sequences against the
// machine's FMA peak measured in the same run, and with --step the whole training step (the forward
// with lse, then the backward). One table row, or with --json one JSON object per line, per case.
//
// GFLOP/s counts the backward as 2.5x the forward's useful work: 10 seq_q seq_k head_dim heads (the
// five matrix products of FlashAttention-2's Algorithm 2), halved for causal; the step counts 14 (the
// forward's 4 plus the backward's 10). The same counts as bench/peers/peers.py --mode backward/train.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "bench_common.hpp"
#include "bench_inputs.hpp"
#include "commands.hpp"
#include "probes.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

struct Args {
  std::string seq = "1024,4096,8192", head_dim = "128", causal = "0,1", dtype = "f32,bf16", threads, heads = "16",
              kv_heads, batch = "1", q_tile, k_tile;
  bool json = false, step = false;
};

// One case's tensors: inputs, the forward's out and lse, dout, and the gradients.
struct Case {
  std::int64_t b, sq, sk, h, hk, d;
  DType dt;
  Buffer q, k, v, out, dout, dq, dk, dv;
  std::vector<double> lse;  // f64 lse for f64 inputs, f32 otherwise (uses the first half)
  Case(std::int64_t b_, std::int64_t sq_, std::int64_t sk_, std::int64_t h_, std::int64_t hk_, std::int64_t d_, DType t)
      : b(b_),
        sq(sq_),
        sk(sk_),
        h(h_),
        hk(hk_),
        d(d_),
        dt(t),
        q(b * sq * h * d, t, 1),
        k(b * sk * hk * d, t, 2),
        v(b * sk * hk * d, t, 3),
        out(b * sq * h * d, t, 4),
        dout(b * sq * h * d, t, 5),
        dq(b * sq * h * d, t, 6),
        dk(b * sk * hk * d, t, 7),
        dv(b * sk * hk * d, t, 8),
        lse(static_cast<std::size_t>(b * h * sq)) {}
  TensorView lse_view() const {
    if (dt == DType::f64) return TensorView::contiguous(lse.data(), b, h, sq);
    return TensorView::contiguous(reinterpret_cast<const float*>(lse.data()), b, h, sq);
  }
  void forward(const AttentionOptions& o, const TileOptions& fwd_tiles) {
    const TensorView l = lse_view();
    attention_tiled(q.view(b, sq, h, d), k.view(b, sk, hk, d), v.view(b, sk, hk, d), out.view(b, sq, h, d), o,
                    fwd_tiles, &l);
  }
  void backward(const AttentionOptions& o, const TileOptions& tiles) {
    attention_backward(q.view(b, sq, h, d), k.view(b, sk, hk, d), v.view(b, sk, hk, d), out.view(b, sq, h, d),
                       dout.view(b, sq, h, d), lse_view(), dq.view(b, sq, h, d), dk.view(b, sk, hk, d),
                       dv.view(b, sk, hk, d), o, tiles);
  }
};

void print_header(const Args& args, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                  const std::map<int, double>& peak) {
  std::printf("attn bench backward: %s; %s; batch %lld, %lld heads, %lld kv heads\n", machine_name().c_str(),
              kernel_paths().c_str(), static_cast<long long>(batch), static_cast<long long>(heads),
              static_cast<long long>(kv_heads));
  for (auto [t, g] : peak)
    std::printf("  measured FMA peak (f32): %.1f GFLOP/s with %d thread%s\n", g, t, t > 1 ? "s" : "");
  std::printf("  GFLOP/s: backward 10 sq sk d heads, step (forward with lse + backward) 14, halved for causal\n\n");
  std::printf("%7s %7s %4s %6s %5s %3s %10s %9s %6s", "seq_q", "seq_k", "d", "causal", "dtype", "thr", "bwd s",
              "GFLOP/s", "peak");
  if (args.step) std::printf(" %10s %9s %6s", "step s", "GFLOP/s", "peak");
  std::printf("\n");
}

// One measured case, printed as a table row or a JSON line.
struct Row {
  std::int64_t batch, seq, heads, kv_heads, d;
  DType dt;
  bool causal;
  std::int64_t threads;
  Timing bwd, step;
  double gflops, step_gflops, peak;
};

void print_row(const Args& args, const Row& r) {
  if (args.json) {
    nlohmann::json j{{"kind", "backward"},
                     {"batch", r.batch},
                     {"seq_q", r.seq},
                     {"seq_k", r.seq},
                     {"heads", r.heads},
                     {"kv_heads", r.kv_heads},
                     {"head_dim", r.d},
                     {"dtype", std::string(dtype_name(r.dt))},
                     {"causal", r.causal},
                     {"threads", r.threads},
                     {"seconds", r.bwd.median_s},
                     {"reps", r.bwd.reps},
                     {"gflops", r.gflops},
                     {"peak_gflops", r.peak},
                     {"peak_fraction", r.gflops / r.peak},
                     {"machine", machine_name()},
                     {"kernels", kernel_paths()}};
    if (args.step) {
      j["step_seconds"] = r.step.median_s;
      j["step_gflops"] = r.step_gflops;
      j["step_peak_fraction"] = r.step_gflops / r.peak;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%7lld %7lld %4lld %6s %5s %3lld %10.4g %9.1f %5.0f%%", static_cast<long long>(r.seq),
                static_cast<long long>(r.seq), static_cast<long long>(r.d), r.causal ? "yes" : "no",
                std::string(dtype_name(r.dt)).c_str(), static_cast<long long>(r.threads), r.bwd.median_s, r.gflops,
                100 * r.gflops / r.peak);
    if (args.step) std::printf(" %10.4g %9.1f %5.0f%%", r.step.median_s, r.step_gflops, 100 * r.step_gflops / r.peak);
    std::printf("\n");
  }
  std::fflush(stdout);
}

void run(const Args& args) {
  const auto seqs = parse_counts(args.seq, "--seq", 1);
  const auto dims = parse_counts(args.head_dim, "--head-dim", 1);
  const auto heads = parse_counts(args.heads, "--heads", 1).front();
  const auto kv_heads = args.kv_heads.empty() ? heads : parse_counts(args.kv_heads, "--kv-heads", 1).front();
  const auto batch = parse_counts(args.batch, "--batch", 1).front();
  if (heads % kv_heads != 0) throw UsageError("--kv-heads: must divide --heads");
  std::vector<bool> causals;
  for (const auto& c : split_list(args.causal)) {
    if (c != "0" && c != "1") throw UsageError("--causal: list of 0/1, got " + c);
    causals.push_back(c == "1");
  }
  std::vector<DType> dtypes;
  for (const auto& s : split_list(args.dtype)) dtypes.push_back(parse_dtype(s));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto threads =
      args.threads.empty() ? std::vector<std::int64_t>{cores} : parse_counts(args.threads, "--threads", 1);
  TileOptions tiles;
  if (!args.q_tile.empty()) tiles.q_tile = parse_count(args.q_tile, "--q-tile");
  if (!args.k_tile.empty()) tiles.k_tile = parse_count(args.k_tile, "--k-tile");

  std::map<int, double> peak;
  for (auto t : threads) peak[static_cast<int>(t)] = fma_peak_gflops(static_cast<int>(t));
  if (!args.json) print_header(args, batch, heads, kv_heads, peak);
  for (auto d : dims)
    for (auto s : seqs)
      for (bool causal : causals)
        for (auto t : threads)
          for (DType dt : dtypes) {
            const double work = static_cast<double>(batch * heads * d) * static_cast<double>(s) *
                                static_cast<double>(s) / (causal ? 2.0 : 1.0);
            const bool big = static_cast<double>(s) * static_cast<double>(s) > 2e8;
            Case c(batch, s, s, heads, kv_heads, d, dt);
            AttentionOptions o;
            o.causal = causal;
            o.num_threads = static_cast<int>(t);
            c.forward(o, TileOptions{});
            const Timing bwd = time_it([&] { c.backward(o, tiles); }, big ? 1 : 3, big ? 0.0 : 0.3);
            Timing step;
            if (args.step)
              step = time_it(
                  [&] {
                    c.forward(o, TileOptions{});
                    c.backward(o, tiles);
                  },
                  big ? 1 : 3, big ? 0.0 : 0.3);
            const double pk = peak[static_cast<int>(t)], gf = 10 * work / bwd.median_s / 1e9;
            const double step_gf = args.step ? 14 * work / step.median_s / 1e9 : 0;
            print_row(args, Row{batch, s, heads, kv_heads, d, dt, causal, t, bwd, step, gf, step_gf, pk});
          }
}

}  // namespace

void add_bench_backward(CLI::App& bench) {
  auto* c = bench.add_subcommand("backward", "The backward pass (and with --step the training step) vs the FMA peak");
  auto a = std::make_shared<Args>();
  c->add_option("--seq", a->seq, "sequence lengths, seq_q = seq_k (comma list; 16k, 64k accepted)")
      ->capture_default_str();
  c->add_option("--head-dim", a->head_dim, "head dims (comma list)")->capture_default_str();
  c->add_option("--causal", a->causal, "0, 1 or both (comma list)")->capture_default_str();
  c->add_option("--dtype", a->dtype, "f32, bf16, f16, f64 (comma list)")->capture_default_str();
  c->add_option("--threads", a->threads, "thread counts (comma list; default all cores)");
  c->add_option("--heads", a->heads, "query heads")->capture_default_str();
  c->add_option("--kv-heads", a->kv_heads, "kv heads (default = heads)");
  c->add_option("--batch", a->batch, "batch size")->capture_default_str();
  c->add_option("--q-tile", a->q_tile, "the backward's query tile B_r (default: attn's plan)");
  c->add_option("--k-tile", a->k_tile, "the backward's key tile B_c (default: attn's plan)");
  c->add_flag("--step", a->step, "also time the training step: the forward with lse, then the backward");
  c->add_flag("--json", a->json, "one JSON object per line per case");
  c->callback([a] { run(*a); });
}

}  // namespace attn::cli
