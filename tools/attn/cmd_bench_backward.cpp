// `attn bench backward`: the backward pass (attention_backward) over long sequences against the
// machine's FMA peak measured in the same run (bf16 on the AMX tiles: their AMX-BF16 peak), and with
// --step the whole training step (the forward with lse, then the backward). One table row, or with --json one JSON
// object per line, per case.
//
// GFLOP/s counts the backward as 2.5x the forward's useful work: 10 seq_q seq_k head_dim heads (the
// five matrix products of FlashAttention-2's Algorithm 2), halved for causal; the step counts 14 (the
// forward's 4 plus the backward's 10). The same counts as bench/peers/peers.py --mode backward/train.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "amx/amx.hpp"
#include "bench_common.hpp"
#include "bench_inputs.hpp"
#include "bench_shapes.hpp"
#include "commands.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

struct Args {
  std::string seq = "1024,4096,8192";
  ShapeArgs shape{.head_dim = "128"};
  bool step = false;
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

void print_header(const Args& args, const Shapes& s) {
  print_intro("backward", s);
  std::printf("  GFLOP/s: backward 10 sq sk d heads, step (forward with lse + backward) 14, halved for causal\n");
  if (detail::amx_backend() == detail::amx::TileBackend::hardware &&
      std::find(s.dtypes.begin(), s.dtypes.end(), DType::bf16) != s.dtypes.end())
    std::printf("  peak = GFLOP/s / f32 FMA peak; bf16 rows run on the AMX tiles: GFLOP/s / AMX-BF16 peak\n");
  std::printf("\n");
  print_case_heads();
  std::printf(" %3s %10s", "thr", "bwd s");
  print_rate_heads();
  if (args.step) {
    std::printf(" %10s", "step s");
    print_rate_heads();
  }
  std::printf("\n");
}

// One measured case's times and rates (the step's only with --step).
struct Row {
  Timing bwd, step;
  double gflops, step_gflops;
};

void print_row(const Args& args, const Shapes& s, const BenchCase& c, const Row& r) {
  // bf16 on the AMX tiles against their own ceiling (the forward and the backward both run there).
  const int t = static_cast<int>(c.threads);
  const bool tiles =
      c.dtype == DType::bf16 && detail::amx_backend() == detail::amx::TileBackend::hardware && s.amx_peak.at(t) > 0;
  const double peak = (tiles ? s.amx_peak : s.peak).at(t);
  if (args.shape.json) {
    nlohmann::json j = case_json("backward", s, c, r.bwd, r.gflops);
    if (args.step) {
      j["step_seconds"] = r.step.median_s;
      j["step_gflops"] = r.step_gflops;
      j["step_peak_fraction"] = r.step_gflops / peak;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    print_case_cells(c);
    std::printf(" %3lld %10.4g", static_cast<long long>(c.threads), r.bwd.median_s);
    print_rate_cells(r.gflops, peak);
    if (args.step) {
      std::printf(" %10.4g", r.step.median_s);
      print_rate_cells(r.step_gflops, peak);
    }
    std::printf("\n");
  }
  std::fflush(stdout);
}

void run(const Args& args) {
  const auto seqs = parse_counts(args.seq, "--seq", 1);
  Shapes s = parse_shapes(args.shape);
  measure_peaks(s);
  if (!args.shape.json) print_header(args, s);
  for (auto d : s.dims)
    for (auto seq : seqs)
      for (bool causal : s.causals)
        for (auto t : s.threads)
          for (DType dt : s.dtypes) {
            const double work = static_cast<double>(s.batch * s.heads * d) * static_cast<double>(seq) *
                                static_cast<double>(seq) / (causal ? 2.0 : 1.0);
            const bool big = static_cast<double>(seq) * static_cast<double>(seq) > 2e8;
            Case c(s.batch, seq, seq, s.heads, s.kv_heads, d, dt);
            AttentionOptions o;
            o.causal = causal;
            o.num_threads = static_cast<int>(t);
            c.forward(o, TileOptions{});
            Row r{};
            r.bwd = time_it([&] { c.backward(o, s.tiles); }, big ? 1 : 3, big ? 0.0 : 0.3);
            if (args.step)
              r.step = time_it(
                  [&] {
                    c.forward(o, TileOptions{});
                    c.backward(o, s.tiles);
                  },
                  big ? 1 : 3, big ? 0.0 : 0.3);
            r.gflops = 10 * work / r.bwd.median_s / 1e9;
            r.step_gflops = args.step ? 14 * work / r.step.median_s / 1e9 : 0;
            print_row(args, s, BenchCase{seq, seq, d, causal, dt, t}, r);
          }
}

}  // namespace

void add_bench_backward(CLI::App& bench) {
  auto* c = bench.add_subcommand("backward", "The backward pass (and with --step the training step) vs the FMA peak");
  auto a = std::make_shared<Args>();
  c->add_option("--seq", a->seq, "sequence lengths, seq_q = seq_k (comma list; 16k, 64k accepted)")
      ->capture_default_str();
  add_shape_options(*c, a->shape);
  add_tile_options(*c, a->shape, "the backward's query tile B_r (default: attn's plan)",
                   "the backward's key tile B_c (default: attn's plan)");
  c->add_flag("--step", a->step, "also time the training step: the forward with lse, then the backward");
  add_json_flag(*c, a->shape);
  c->callback([a] { run(*a); });
}

}  // namespace attn::cli
