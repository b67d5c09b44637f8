// `attn bench prefill`: forward attention over long prompts (attention_tiled), against the machine's
// measured FMA peak and the textbook method (OpenBLAS sgemm + vectorised softmax + sgemm), both
// measured in the same run. One table row, or with --json one JSON object per line, per case.
//
// GFLOP/s counts 4 seq_q seq_k head_dim heads (two matrix products), halved for causal: the useful work,
// the same count for attn and the textbook method (which computes the masked half and throws it away).
// --dropout 0,0.1 times the forward without and with dropout (seed 1) in the same run: its cost.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "attn/attention.hpp"
#include "bench_common.hpp"
#include "bench_inputs.hpp"
#include "bench_textbook.hpp"
#include "commands.hpp"
#include "probes.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

struct Args {
  std::string seq = "512,1024,2048,4096,8192", seq_q, head_dim = "64,128", causal = "0,1", dtype = "f32,bf16", threads,
              heads = "16", kv_heads, batch = "1", dropout = "0";
  std::string q_tile, k_tile;  // empty: attn's own tile plan
  bool json = false, quick = false, no_textbook = false;
};

void run(const Args& a) {
  Args args = a;
  if (args.quick) {
    if (args.seq == Args{}.seq) args.seq = "512,1024";
    if (args.dtype == Args{}.dtype) args.dtype = "f32";
  }
  const auto seqs = parse_counts(args.seq, "--seq", 1);
  const auto seq_qs = args.seq_q.empty() ? std::vector<std::int64_t>{} : parse_counts(args.seq_q, "--seq-q", 1);
  const auto dims = parse_counts(args.head_dim, "--head-dim", 1);
  const auto heads = parse_counts(args.heads, "--heads", 1).front();
  const auto kv_heads = args.kv_heads.empty() ? heads : parse_counts(args.kv_heads, "--kv-heads", 1).front();
  const auto batch = parse_counts(args.batch, "--batch", 1).front();
  if (heads % kv_heads != 0) throw UsageError("--kv-heads: must divide --heads");
  std::vector<bool> causals;
  for (const auto& c : split_list(args.causal)) {
    if (c == "0" || c == "off" || c == "false")
      causals.push_back(false);
    else if (c == "1" || c == "on" || c == "true")
      causals.push_back(true);
    else
      throw UsageError("--causal: list of 0/1, got " + c);
  }
  std::vector<DType> dtypes;
  for (const auto& s : split_list(args.dtype)) dtypes.push_back(parse_dtype(s));
  std::vector<double> dropouts;  // checked by attn itself (dropout_p in [0, 1))
  for (const auto& s : split_list(args.dropout)) {
    try {
      std::size_t used = 0;
      dropouts.push_back(std::stod(s, &used));
      if (used != s.size()) throw std::invalid_argument(s);
    } catch (const std::exception&) {
      throw UsageError("--dropout: list of numbers in [0, 1), got " + s);
    }
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::int64_t> threads =
      args.threads.empty() ? std::vector<std::int64_t>{cores} : parse_counts(args.threads, "--threads", 1);

  std::map<int, double> peak;
  for (auto t : threads) peak[static_cast<int>(t)] = fma_peak_gflops(static_cast<int>(t));
  if (!args.json) {
    std::printf("attn bench prefill: %s; %s; batch %lld, %lld heads, %lld kv heads\n", machine_name().c_str(),
                kernel_paths().c_str(), static_cast<long long>(batch), static_cast<long long>(heads),
                static_cast<long long>(kv_heads));
    for (auto [t, g] : peak)
      std::printf("  measured FMA peak (f32): %.1f GFLOP/s with %d thread%s\n", g, t, t > 1 ? "s" : "");
    std::printf("  textbook = OpenBLAS sgemm + vectorised softmax + sgemm (f32), same run; x = textbook s / attn s\n");
    if (std::find(dtypes.begin(), dtypes.end(), DType::bf16) != dtypes.end())
      std::printf(
          "  peak = GFLOP/s / f32 FMA peak; on AVX512-BF16 CPUs bf16 scores run on VDPBF16PS, two products\n"
          "  per lane per instruction, so bf16 rows can pass 100%%\n");
    std::printf("\n");
    std::printf("%7s %7s %4s %6s %5s %4s %3s %11s %9s %6s %11s %7s\n", "seq_q", "seq_k", "d", "causal", "dtype", "drop",
                "thr", "seconds", "GFLOP/s", "peak", "textbook s", "x");
  }
  const int min_reps = args.quick ? 2 : 3;
  for (auto d : dims)
    for (std::size_t si = 0; si < seqs.size(); ++si)
      for (bool causal : causals)
        for (auto t : threads) {
          const std::int64_t sk = seqs[si];
          const std::int64_t sq = seq_qs.empty() ? sk : seq_qs[std::min(si, seq_qs.size() - 1)];
          const double flops = 4.0 * static_cast<double>(batch * heads * d) * static_cast<double>(sq) *
                               static_cast<double>(sk) / (causal ? 2.0 : 1.0);
          const bool big = static_cast<double>(sq) * static_cast<double>(sk) > 2e8;
          double textbook = 0;
          if (!args.no_textbook) {
            Buffer q(sq * heads * d, DType::f32, 1), k(sk * kv_heads * d, DType::f32, 2),
                v(sk * kv_heads * d, DType::f32, 3);
            std::vector<float> out(static_cast<std::size_t>(sq * heads * d));
            auto f = [&] {
              for (std::int64_t b = 0; b < batch; ++b)  // the same inputs per batch entry: time only
                textbook_attention(reinterpret_cast<const float*>(q.bytes.data()),
                                   reinterpret_cast<const float*>(k.bytes.data()),
                                   reinterpret_cast<const float*>(v.bytes.data()), out.data(), sq, sk, heads, kv_heads,
                                   d, causal, static_cast<int>(t));
            };
            textbook = time_it(f, big ? 1 : min_reps, big ? 0.0 : 0.3).median_s;
          }
          for (DType dt : dtypes)
            for (double dropout : dropouts) {
              Buffer q(batch * sq * heads * d, dt, 1), k(batch * sk * kv_heads * d, dt, 2),
                  v(batch * sk * kv_heads * d, dt, 3), out(batch * sq * heads * d, dt, 4);
              AttentionOptions o;
              o.causal = causal;
              o.num_threads = static_cast<int>(t);
              o.dropout_p = dropout;
              o.dropout_seed = 1;
              TileOptions tiles;
              if (!args.q_tile.empty()) tiles.q_tile = parse_count(args.q_tile, "--q-tile");
              if (!args.k_tile.empty()) tiles.k_tile = parse_count(args.k_tile, "--k-tile");
              auto f = [&] {
                attention_tiled(q.view(batch, sq, heads, d), k.view(batch, sk, kv_heads, d),
                                v.view(batch, sk, kv_heads, d), out.view(batch, sq, heads, d), o, tiles);
              };
              const Timing tm = time_it(f, big ? 1 : min_reps, big ? 0.0 : 0.3);
              const double gf = flops / tm.median_s / 1e9, pk = peak[static_cast<int>(t)];
              if (args.json) {
                nlohmann::json j{{"kind", "prefill"},
                                 {"batch", batch},
                                 {"seq_q", sq},
                                 {"seq_k", sk},
                                 {"heads", heads},
                                 {"kv_heads", kv_heads},
                                 {"head_dim", d},
                                 {"dtype", std::string(dtype_name(dt))},
                                 {"causal", causal},
                                 {"dropout_p", dropout},
                                 {"threads", t},
                                 {"seconds", tm.median_s},
                                 {"reps", tm.reps},
                                 {"gflops", gf},
                                 {"peak_gflops", pk},
                                 {"peak_fraction", gf / pk},
                                 {"machine", machine_name()},
                                 {"kernels", kernel_paths()}};
                if (textbook > 0) {
                  j["textbook_seconds"] = textbook;
                  j["textbook_gflops"] = flops / textbook / 1e9;
                  j["speedup_vs_textbook"] = textbook / tm.median_s;
                }
                std::printf("%s\n", j.dump().c_str());
              } else {
                char tb[32] = "-", x[32] = "-";
                if (textbook > 0) {
                  std::snprintf(tb, sizeof tb, "%.4g", textbook);
                  std::snprintf(x, sizeof x, "%.2f", textbook / tm.median_s);
                }
                std::printf("%7lld %7lld %4lld %6s %5s %4.2g %3lld %11.4g %9.1f %5.0f%% %11s %7s\n",
                            static_cast<long long>(sq), static_cast<long long>(sk), static_cast<long long>(d),
                            causal ? "yes" : "no", std::string(dtype_name(dt)).c_str(), dropout,
                            static_cast<long long>(t), tm.median_s, gf, 100 * gf / pk, tb, x);
              }
              std::fflush(stdout);
            }
        }
}

}  // namespace

void add_bench_prefill(CLI::App& bench) {
  auto* c =
      bench.add_subcommand("prefill", "Forward attention over long prompts vs the FMA peak and the textbook method");
  auto a = std::make_shared<Args>();
  c->add_option("--seq", a->seq, "key lengths (comma list; 16k, 64k accepted)")->capture_default_str();
  c->add_option("--seq-q", a->seq_q, "query lengths, paired with --seq (default: = seq; 1 = decode shape)");
  c->add_option("--head-dim", a->head_dim, "head dims (comma list)")->capture_default_str();
  c->add_option("--causal", a->causal, "0, 1 or both (comma list)")->capture_default_str();
  c->add_option("--dtype", a->dtype, "f32, bf16, f16, f64 (comma list)")->capture_default_str();
  c->add_option("--threads", a->threads, "thread counts (comma list; default all cores)");
  c->add_option("--heads", a->heads, "query heads")->capture_default_str();
  c->add_option("--kv-heads", a->kv_heads, "kv heads (default = heads)");
  c->add_option("--batch", a->batch, "batch size")->capture_default_str();
  c->add_option("--dropout", a->dropout, "dropout_p values (comma list; 0 = off; e.g. 0,0.1)")->capture_default_str();
  c->add_flag("--quick", a->quick, "seq 512,1024, f32 only, fewer repetitions (seconds)");
  c->add_flag("--no-textbook", a->no_textbook, "skip the OpenBLAS textbook baseline");
  c->add_option("--q-tile", a->q_tile, "query tile B_r (default: attn's plan from the cache sizes)");
  c->add_option("--k-tile", a->k_tile, "key tile B_c (default: attn's plan from the cache sizes)");
  c->add_flag("--json", a->json, "one JSON object per line per case");
  c->callback([a] { run(*a); });
}

}  // namespace attn::cli
