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
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "bench_common.hpp"
#include "amx/amx.hpp"
#include "bench_inputs.hpp"
#include "bench_shapes.hpp"
#include "bench_textbook.hpp"
#include "commands.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

struct Args {
  std::string seq = "512,1024,2048,4096,8192", seq_q, dropout = "0";
  ShapeArgs shape{.head_dim = "64,128"};
  bool quick = false, no_textbook = false;
};

std::vector<double> parse_dropouts(const std::string& text) {
  std::vector<double> dropouts;  // checked by attn itself (dropout_p in [0, 1))
  for (const auto& s : split_list(text)) {
    try {
      std::size_t used = 0;
      dropouts.push_back(std::stod(s, &used));
      if (used != s.size()) throw std::invalid_argument(s);
    } catch (const std::exception&) {
      throw UsageError("--dropout: list of numbers in [0, 1), got " + s);
    }
  }
  return dropouts;
}

void print_header(const Shapes& s) {
  print_intro("prefill", s);
  std::printf("  textbook = OpenBLAS sgemm + vectorised softmax + sgemm (f32), same run; x = textbook s / attn s\n");
  if (std::find(s.dtypes.begin(), s.dtypes.end(), DType::bf16) != s.dtypes.end()) {
    if (detail::amx_backend() == detail::amx::TileBackend::hardware)
      std::printf("  peak = GFLOP/s / f32 FMA peak; bf16 rows run on the AMX tiles: GFLOP/s / AMX-BF16 peak\n");
    else
      std::printf(
          "  peak = GFLOP/s / f32 FMA peak; on AVX512-BF16 CPUs bf16 scores run on VDPBF16PS, two products\n"
          "  per lane per instruction, so bf16 rows can pass 100%%\n");
  }
  if (std::find(s.dtypes.begin(), s.dtypes.end(), DType::f32) != s.dtypes.end() && kernel_info().f32_on_tiles)
    std::printf(
        "  f32 rows run on the AMX tiles by bf16 parts (ATTN_AMX_F32=bf16x3: six tile products per product);\n"
        "  peak = GFLOP/s / f32 FMA peak, the vector kernel's ceiling\n");
  std::printf("\n");
  print_case_heads();
  std::printf(" %4s %3s %11s", "drop", "thr", "seconds");
  print_rate_heads();
  std::printf(" %11s %7s\n", "textbook s", "x");
}

// The textbook method's median seconds for one case (f32 whatever the dtype: its baseline).
double time_textbook(const Shapes& s, const BenchCase& c, int min_reps, bool big) {
  const std::int64_t sq = c.seq_q, sk = c.seq_k, h = s.heads, hk = s.kv_heads, d = c.head_dim;
  Buffer q(sq * h * d, DType::f32, 1), k(sk * hk * d, DType::f32, 2), v(sk * hk * d, DType::f32, 3);
  std::vector<float> out(static_cast<std::size_t>(sq * h * d));
  auto f = [&] {
    for (std::int64_t b = 0; b < s.batch; ++b)  // the same inputs per batch entry: time only
      textbook_attention(reinterpret_cast<const float*>(q.bytes.data()), reinterpret_cast<const float*>(k.bytes.data()),
                         reinterpret_cast<const float*>(v.bytes.data()), out.data(), sq, sk, h, hk, d, c.causal,
                         static_cast<int>(c.threads));
  };
  return time_it(f, big ? 1 : min_reps, big ? 0.0 : 0.3).median_s;
}

void print_row(const Args& args, const Shapes& s, const BenchCase& c, double dropout, const Timing& tm, double flops,
               double textbook) {
  const double gf = flops / tm.median_s / 1e9;
  if (args.shape.json) {
    nlohmann::json j = case_json("prefill", s, c, tm, gf);
    j["dropout_p"] = dropout;
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
    print_case_cells(c);
    std::printf(" %4.2g %3lld %11.4g", dropout, static_cast<long long>(c.threads), tm.median_s);
    // bf16 on the AMX tiles against their own ceiling (the forward's dropout runs on the vectors).
    const bool tiles = c.dtype == DType::bf16 && dropout == 0 &&
                       detail::amx_backend() == detail::amx::TileBackend::hardware &&
                       s.amx_peak.at(static_cast<int>(c.threads)) > 0;
    print_rate_cells(gf, (tiles ? s.amx_peak : s.peak).at(static_cast<int>(c.threads)));
    std::printf(" %11s %7s\n", tb, x);
  }
  std::fflush(stdout);
}

void run(const Args& a) {
  Args args = a;
  if (args.quick) {
    if (args.seq == Args{}.seq) args.seq = "512,1024";
    if (args.shape.dtype == ShapeArgs{}.dtype) args.shape.dtype = "f32";
  }
  const auto seqs = parse_counts(args.seq, "--seq", 1);
  const auto seq_qs = args.seq_q.empty() ? std::vector<std::int64_t>{} : parse_counts(args.seq_q, "--seq-q", 1);
  Shapes s = parse_shapes(args.shape);
  const std::vector<double> dropouts = parse_dropouts(args.dropout);
  measure_peaks(s);
  if (!args.shape.json) print_header(s);
  const int min_reps = args.quick ? 2 : 3;
  for (auto d : s.dims)
    for (std::size_t si = 0; si < seqs.size(); ++si)
      for (bool causal : s.causals)
        for (auto t : s.threads) {
          const std::int64_t sk = seqs[si];
          const std::int64_t sq = seq_qs.empty() ? sk : seq_qs[std::min(si, seq_qs.size() - 1)];
          const double flops = 4.0 * static_cast<double>(s.batch * s.heads * d) * static_cast<double>(sq) *
                               static_cast<double>(sk) / (causal ? 2.0 : 1.0);
          const bool big = static_cast<double>(sq) * static_cast<double>(sk) > 2e8;
          BenchCase c{sq, sk, d, causal, DType::f32, t};
          const double textbook = args.no_textbook ? 0 : time_textbook(s, c, min_reps, big);
          for (DType dt : s.dtypes)
            for (double dropout : dropouts) {
              c.dtype = dt;
              const std::int64_t b = s.batch, h = s.heads, hk = s.kv_heads;
              Buffer q(b * sq * h * d, dt, 1), k(b * sk * hk * d, dt, 2), v(b * sk * hk * d, dt, 3),
                  out(b * sq * h * d, dt, 4);
              AttentionOptions o;
              o.causal = causal;
              o.num_threads = static_cast<int>(t);
              o.dropout_p = dropout;
              o.dropout_seed = 1;
              auto f = [&] {
                attention_tiled(q.view(b, sq, h, d), k.view(b, sk, hk, d), v.view(b, sk, hk, d), out.view(b, sq, h, d),
                                o, s.tiles);
              };
              print_row(args, s, c, dropout, time_it(f, big ? 1 : min_reps, big ? 0.0 : 0.3), flops, textbook);
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
  add_shape_options(*c, a->shape);
  c->add_option("--dropout", a->dropout, "dropout_p values (comma list; 0 = off; e.g. 0,0.1)")->capture_default_str();
  c->add_flag("--quick", a->quick, "seq 512,1024, f32 only, fewer repetitions (seconds)");
  c->add_flag("--no-textbook", a->no_textbook, "skip the OpenBLAS textbook baseline");
  add_tile_options(*c, a->shape, "query tile B_r (default: attn's plan from the cache sizes)",
                   "key tile B_c (default: attn's plan from the cache sizes)");
  add_json_flag(*c, a->shape);
  c->callback([a] { run(*a); });
}

}  // namespace attn::cli
