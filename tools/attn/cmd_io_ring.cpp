// `attn io --ring`: the ring's time model (include/attn/ring_model.hpp) for a sequence over R ranks
// and a list of links: per step, one rank's compute against one k/v chunk's transfer, the chunk size
// above which the transfer hides, and the parallel efficiency; --svg plots the efficiency against R
// for every link.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "attn/ring_model.hpp"
#include "bench_inputs.hpp"
#include "io_ring.hpp"
#include "svg_plot.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2"};

io::RingParams params_for(const RingIoArgs& a, double link_gbps, std::int64_t ranks) {
  io::RingParams p;
  p.seqlen = a.seq.empty() ? p.seqlen : parse_count(a.seq, "--seq");
  p.head_dim = a.head_dim.empty() ? p.head_dim : parse_count(a.head_dim, "--head-dim");
  p.element_bytes = a.bytes.empty() ? p.element_bytes : parse_number(a.bytes, "--bytes");
  p.heads = parse_count(a.heads, "--heads");
  p.kv_heads = parse_count(a.kv_heads, "--kv-heads");
  p.flop_rate = parse_number(a.rate, "--rate") * 1e9;
  p.latency = parse_number(a.latency, "--latency") * 1e-6;
  p.causal = !a.full;
  p.ranks = ranks;
  p.link_bandwidth = link_gbps * 1e9 / 8;
  return p;
}

std::vector<double> links_of(const RingIoArgs& a) {
  std::vector<double> out;
  for (const std::string& s : split_list(a.links)) out.push_back(parse_number(s, "--link"));
  if (out.empty()) throw UsageError("--link: empty list");
  return out;
}

void write_plot(const RingIoArgs& a, const std::vector<double>& links) {
  svg::Plot plot;
  const io::RingParams p0 = params_for(a, links[0], 1);
  plot.title = "Ring attention, modelled: N = " + std::to_string(p0.seqlen) + ", " + std::to_string(p0.heads) + "/" +
               std::to_string(p0.kv_heads) + " heads, d " + std::to_string(p0.head_dim) + ", " + a.rate +
               " GFLOP/s per rank";
  plot.x = {"ranks R", true, 2, {}};
  plot.y = {"parallel efficiency T_1 / (R T)", true, 10, {}};
  for (std::size_t i = 0; i < links.size(); ++i) {
    svg::Series s;
    s.name = printf_str("%g", links[i]) + " Gb/s";
    s.color = kColors[i % 7];
    for (std::int64_t R = 1; R <= 1024; R *= 2) {
      s.x.push_back(static_cast<double>(R));
      s.y.push_back(io::ring_model(params_for(a, links[i], R)).efficiency);
    }
    plot.series.push_back(s);
  }
  svg::write_file(plot, a.svg);
}

}  // namespace

void add_ring_options(CLI::App& io, RingIoArgs& a) {
  io.add_flag("--ring", a.ring, "the ring's time model across machines (docs/distributed.md)");
  io.add_option("--ranks", a.ranks, "--ring: comma-separated rank counts (default 8)")->type_name("R");
  io.add_option("--heads", a.heads, "--ring: query heads (default 32)")->type_name("H");
  io.add_option("--kv-heads", a.kv_heads, "--ring: kv heads (default 8)")->type_name("H");
  io.add_option("--rate", a.rate, "--ring: sustained GFLOP/s of one rank (default 2000)")->type_name("GFLOPS");
  io.add_option("--link", a.links, "--ring: comma-separated link speeds in Gb/s (default 10,25,100,200,400)")
      ->type_name("GBPS");
  io.add_option("--latency", a.latency, "--ring: link latency per message in microseconds (default 5)")
      ->type_name("US");
  io.add_flag("--full", a.full, "--ring: no causal mask");
}

void run_io_ring(const RingIoArgs& a) {
  const std::vector<double> links = links_of(a);
  const std::vector<std::int64_t> ranks = parse_counts(a.ranks, "--ranks", 1);
  if (!a.json) {
    const io::RingParams p = params_for(a, links[0], ranks[0]);
    std::printf(
        "ring model: N = %lld, %lld/%lld heads, d %lld, %g bytes/element, %s, %g GFLOP/s per rank, latency %g us\n",
        static_cast<long long>(p.seqlen), static_cast<long long>(p.heads), static_cast<long long>(p.kv_heads),
        static_cast<long long>(p.head_dim), p.element_bytes, p.causal ? "causal (zigzag)" : "full", p.flop_rate / 1e9,
        p.latency * 1e6);
    std::printf("%6s %9s %11s %11s %11s %7s %11s %10s %12s\n", "ranks", "link", "chunk", "compute", "transfer",
                "hidden", "efficiency", "hides at", "(sequence)");
  }
  for (const std::int64_t R : ranks)
    for (const double link : links) {
      const io::RingReport r = io::ring_model(params_for(a, link, R));
      if (a.json) {
        std::printf("%s\n", nlohmann::json{{"kind", "ring_model"},
                                           {"ranks", R},
                                           {"link_gbps", link},
                                           {"seqlen", r.params.seqlen},
                                           {"heads", r.params.heads},
                                           {"kv_heads", r.params.kv_heads},
                                           {"head_dim", r.params.head_dim},
                                           {"causal", r.params.causal},
                                           {"flop_rate", r.params.flop_rate},
                                           {"latency_s", r.params.latency},
                                           {"chunk_rows", r.chunk_rows},
                                           {"chunk_bytes", r.chunk_bytes},
                                           {"compute_s", r.compute_s},
                                           {"transfer_s", r.transfer_s},
                                           {"hidden", r.hidden},
                                           {"ring_s", r.ring_s},
                                           {"one_rank_s", r.one_rank_s},
                                           {"efficiency", r.efficiency},
                                           {"hide_rows", r.hide_rows},
                                           {"hide_seqlen", r.hide_seqlen}}
                                .dump()
                                .c_str());
      } else {
        std::printf("%6lld %5g Gb/s %11s %11s %11s %7s %10.0f%% %5.0f rows %12.0f\n", static_cast<long long>(R), link,
                    format_mb(r.chunk_bytes).c_str(), format_seconds(r.compute_s).c_str(),
                    format_seconds(r.transfer_s).c_str(), r.hidden ? "yes" : "no", 100 * r.efficiency, r.hide_rows,
                    r.hide_seqlen);
      }
    }
  if (!a.svg.empty()) {
    write_plot(a, links);
    if (!a.json) std::printf("wrote %s\n", a.svg.c_str());
  }
}

}  // namespace attn::cli
