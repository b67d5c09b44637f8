// `attn io`: the HBM traffic model of FlashAttention for one head — the seed widget's figures, the
// counted check of the closed forms (--count), and sweeps with an SVG plot (--sweep ... --svg).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/io_model.hpp"
#include "commands.hpp"
#include "io_ring.hpp"
#include "svg_plot.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

using json = nlohmann::ordered_json;

struct IoArgs {
  std::string seq, head_dim, sram, bytes, bandwidth, derate;
  std::string sweep, from, to, steps, svg;
  bool count = false;
  bool json = false;
  RingIoArgs ring;  // --ring and its options (cmd_io_ring.cpp)
};

// Pads to `width` columns counting UTF-8 code points, not bytes (µ and × are two bytes each).
std::string pad(const std::string& s, std::size_t width, bool right = false) {
  std::size_t cols = 0;
  for (unsigned char c : s) cols += (c & 0xC0) != 0x80;
  const std::string fill(cols < width ? width - cols : 0, ' ');
  return right ? fill + s : s + fill;
}

// 7.3× as the seed prints it; below 1 (tiling loses) two significant digits, so it is not "0.0×".
std::string format_reduction(double r) { return printf_str(r >= 1 ? "%.1f" : "%.2g", r) + "×"; }

std::string format_rate(double r) {
  return r >= 1e12 ? printf_str("%g TB/s", r / 1e12) : printf_str("%g GB/s", r / 1e9);
}

std::string format_count(double v) {  // 4096, 16K, 1M (K = 1024, as --seq accepts)
  if (v >= 16384 && std::fmod(v, 1048576) == 0) return printf_str("%gM", v / 1048576);
  if (v >= 16384 && std::fmod(v, 1024) == 0) return printf_str("%gK", v / 1024);
  return printf_str("%.0f", v);
}

std::string format_tick_bytes(double b) {  // x-axis ticks at powers of 2: 512 B, 1 KiB, 256 KiB, 1 MiB
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) {
    b /= 1024;
    ++u;
  }
  return printf_str("%g ", b) + units[u];
}

std::string format_si_bytes(double b) {  // y-axis ticks: 1 MB, 10 GB (10^3 steps, as format_mb)
  const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (b >= 999.5 && u < 5) {
    b /= 1000;
    ++u;
  }
  return printf_str("%g ", b) + units[u];
}

io::ModelParams params_from(const IoArgs& a) {
  io::ModelParams p;
  if (!a.seq.empty()) p.seqlen = parse_count(a.seq, "--seq");
  if (!a.head_dim.empty()) p.head_dim = parse_count(a.head_dim, "--head-dim");
  if (!a.sram.empty()) p.sram_bytes = parse_bytes(a.sram, "--sram");
  if (!a.bytes.empty()) p.element_bytes = parse_bytes(a.bytes, "--bytes");
  if (!a.bandwidth.empty()) p.bandwidth = parse_rate(a.bandwidth, "--bandwidth");
  if (!a.derate.empty()) p.derate = parse_number(a.derate, "--derate");
  // The model would reject these too, but the user typed flags, so name the flags.
  if (p.seqlen < 1) throw UsageError("--seq: must be >= 1, got " + a.seq);
  if (p.head_dim < 1) throw UsageError("--head-dim: must be >= 1, got " + a.head_dim);
  if (!(p.derate > 0 && p.derate <= 1)) throw UsageError("--derate: must be in (0, 1], got " + a.derate);
  if (p.sram_bytes < p.element_bytes)
    throw UsageError("--sram: must hold at least one element of --bytes " + format_bytes(p.element_bytes) + ", got " +
                     format_bytes(p.sram_bytes));
  return p;
}

json params_json(const io::ModelParams& p) {
  return {{"seqlen", p.seqlen},         {"head_dim", p.head_dim},
          {"sram_bytes", p.sram_bytes}, {"element_bytes", p.element_bytes},
          {"bandwidth", p.bandwidth},   {"derate", p.derate}};
}

json traffic_json(const io::Traffic& t, bool tiled) {
  json j = {{"elements", t.elements}, {"bytes", t.bytes}, {"seconds", t.seconds}};
  if (tiled) {
    j["block_rows"] = t.block_rows;
    j["block_cols"] = t.block_cols;
    j["passes"] = t.passes;
  }
  return j;
}

// Counted elements must equal the closed form exactly, and the output must match the reference.
constexpr double kMaxDiff = 1e-12;
bool counted_ok(const io::Counted& c, const io::Traffic& t) {
  return c.elements == t.elements && c.max_abs_diff <= kMaxDiff;
}

void add_counted(json& j, const io::Counted& c) {
  j["counted_elements"] = c.elements;
  j["counted_reads"] = c.reads;
  j["counted_writes"] = c.writes;
  j["sram_peak_elements"] = c.sram_peak_elements;
  j["max_abs_diff"] = c.max_abs_diff;
}

void print_counted(const char* name, const io::Counted& c, const io::Traffic& t) {
  std::printf("  %s%s %s closed form, max |Δ| vs reference %.1e, SRAM peak %lld elements\n", pad(name, 24).c_str(),
              pad(std::to_string(c.elements), 13, true).c_str(), c.elements == t.elements ? "==" : "!=", c.max_abs_diff,
              static_cast<long long>(c.sram_peak_elements));
}

void run_point(const IoArgs& a) {
  const io::ModelParams p = params_from(a);
  const io::Report r = io::model(p);
  io::Counted c1, c2;
  if (a.count) {
    // The two simulations are independent and each single-threaded: run them side by side.
    auto fa2 = std::async(std::launch::async, [&] { return io::count_fa2(p.seqlen, p.head_dim, r.sram_elements); });
    c1 = io::count_algorithm1(p.seqlen, p.head_dim, r.sram_elements);
    c2 = fa2.get();
  }
  const bool ok = !a.count || (counted_ok(c1, r.tiled) && counted_ok(c2, r.fa2));

  if (a.json) {
    json j = {{"params", params_json(p)},
              {"sram_elements", r.sram_elements},
              {"standard", traffic_json(r.standard, false)},
              {"tiled", traffic_json(r.tiled, true)},
              {"fa2", traffic_json(r.fa2, true)},
              {"reduction", r.reduction},
              {"score_matrix_bytes", r.score_matrix_bytes}};
    if (a.count) {
      add_counted(j["tiled"], c1);
      add_counted(j["fa2"], c2);
      j["counted_match"] = ok;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("HBM traffic for one attention head (FlashAttention §3.2, Theorem 2)\n");
    std::printf("  N = %lld, d = %lld, SRAM %s = %lld elements of %g B, %s x %g = %s\n\n",
                static_cast<long long>(p.seqlen), static_cast<long long>(p.head_dim),
                format_bytes(p.sram_bytes).c_str(), static_cast<long long>(r.sram_elements), p.element_bytes,
                format_rate(p.bandwidth).c_str(), p.derate, format_rate(p.bandwidth * p.derate).c_str());
    auto row = [](const std::string& name, const std::string& elements, const std::string& mb, const std::string& time,
                  const std::string& note) {
      std::printf("  %s%s%s%s%s\n", pad(name, 24).c_str(), pad(elements, 13, true).c_str(), pad(mb, 11, true).c_str(),
                  pad(time, 10, true).c_str(), note.empty() ? "" : ("   " + note).c_str());
    };
    auto traffic_row = [&](const char* name, const io::Traffic& t, const std::string& note) {
      row(name, std::to_string(t.elements), format_mb(t.bytes), format_seconds(t.seconds), note);
    };
    row("", "elements", "HBM bytes", "time", "");
    traffic_row("Standard (Algorithm 0)", r.standard, "S and P written and read back");
    traffic_row("Tiled (Algorithm 1)", r.tiled,
                "B_c = " + std::to_string(r.tiled.block_cols) + ", B_r = " + std::to_string(r.tiled.block_rows) +
                    ", T_c = " + std::to_string(r.tiled.passes) + " passes");
    traffic_row(
        "FA2 order", r.fa2,
        "B_r = B_c = " + std::to_string(r.fa2.block_cols) + ", T_r = " + std::to_string(r.fa2.passes) + " query tiles");
    row("Reduction", "", format_reduction(r.reduction), "", "standard / tiled");
    row("N×N matrix", "", format_mb(r.score_matrix_bytes), "", "never written when tiled");
    if (a.count) {
      std::printf("\nCounted on random f64 data through an instrumented HBM:\n");
      print_counted("Tiled (Algorithm 1)", c1, r.tiled);
      print_counted("FA2 order", c2, r.fa2);
      std::printf("%s\n", ok ? "  ok: counts equal the closed forms, outputs match attention_reference"
                             : "  FAILED: a count differs from its closed form or the output is wrong");
    }
  }
  if (!ok) throw CLI::RuntimeError(1);
}

// ---- sweeps -------------------------------------------------------------------------------------

struct SweepVar {
  std::string name;   // seq | head-dim | sram
  std::string label;  // column / axis text
  bool is_bytes;
};

std::vector<double> sweep_points(double from, double to, std::int64_t steps) {
  std::vector<double> v;
  if (steps < 2) {  // factor 2: from, 2 from, 4 from, ... up to `to`
    for (double x = from; x <= to * (1 + 1e-12) && v.size() < 100000; x *= 2) v.push_back(std::round(x));
  } else {
    for (std::int64_t i = 0; i < steps; ++i)
      v.push_back(std::round(from * std::pow(to / from, double(i) / double(steps - 1))));
  }
  v.erase(std::unique(v.begin(), v.end()), v.end());  // rounding can merge neighbours
  return v;
}

struct Crossing {
  double x;
  double y;         // bytes at the crossing (both series agree there)
  bool wins_above;  // the tiled series moves less for x above the crossing
};

// Where `tiled` and `standard` cross, interpolated in log space between the two points around it.
std::vector<Crossing> crossings(const std::vector<double>& x, const std::vector<double>& std_b,
                                const std::vector<double>& tiled_b) {
  std::vector<Crossing> out;
  for (std::size_t k = 0; k + 1 < x.size(); ++k) {
    const double r0 = std::log(tiled_b[k] / std_b[k]), r1 = std::log(tiled_b[k + 1] / std_b[k + 1]);
    // A strict sign change, or touching zero at the interval's end (then the next interval, which
    // starts at zero, is skipped so the point is not reported twice).
    if (r0 == 0 || !((r0 < 0 && r1 >= 0) || (r0 > 0 && r1 <= 0))) continue;
    const double f = r0 / (r0 - r1);
    const double lx = std::log(x[k]) + f * (std::log(x[k + 1]) - std::log(x[k]));
    const double ly = std::log(std_b[k]) + f * (std::log(std_b[k + 1]) - std::log(std_b[k]));
    out.push_back({std::exp(lx), std::exp(ly), r0 > 0});
  }
  return out;
}

void run_sweep(const IoArgs& a) {
  SweepVar var;
  if (a.sweep == "seq")
    var = {"seq", "N", false};
  else if (a.sweep == "head-dim")
    var = {"head-dim", "d", false};
  else if (a.sweep == "sram")
    var = {"sram", "SRAM", true};
  else
    throw UsageError("--sweep: '" + a.sweep + "' is not one of seq, head-dim, sram");
  if (a.from.empty()) throw UsageError("--from: required with --sweep");
  if (a.to.empty()) throw UsageError("--to: required with --sweep");
  const double from = var.is_bytes ? parse_bytes(a.from, "--from") : double(parse_count(a.from, "--from"));
  const double to = var.is_bytes ? parse_bytes(a.to, "--to") : double(parse_count(a.to, "--to"));
  if (from < 1) throw UsageError("--from: must be >= 1, got " + a.from);
  if (from > to) throw UsageError("--from: " + a.from + " must not exceed --to " + a.to);
  std::int64_t steps = 0;
  if (!a.steps.empty()) {
    steps = parse_count(a.steps, "--steps");
    if (steps < 2 || steps > 10000) throw UsageError("--steps: must be from 2 to 10000, got " + a.steps);
  }
  const std::string& fixed_flag = var.name == "seq" ? a.seq : var.name == "head-dim" ? a.head_dim : a.sram;
  if (!fixed_flag.empty()) throw UsageError("--" + var.name + ": cannot be set while sweeping it");
  const io::ModelParams base = params_from(a);
  if (var.is_bytes && from < base.element_bytes)
    throw UsageError("--from: SRAM must hold at least one element of --bytes, got " + a.from);

  const std::vector<double> xs = sweep_points(from, to, steps);
  std::vector<double> sb, tb, fb;
  auto x_text = [&](double x) { return var.is_bytes ? format_bytes(x) : format_count(x); };
  // What stays fixed, for the table's header and the plot's title.
  const std::string fixed = (var.name != "seq" ? "N = " + std::to_string(base.seqlen) + ", " : "") +
                            (var.name != "head-dim" ? "d = " + std::to_string(base.head_dim) + ", " : "") +
                            (var.name != "sram" ? "SRAM " + format_tick_bytes(base.sram_bytes) + ", " : "") +
                            printf_str("%g-bit", base.element_bytes * 8);
  if (!a.json) {
    std::printf("HBM traffic per head, sweeping %s (%s)\n\n", var.name.c_str(), fixed.c_str());
    std::printf("%10s %14s %14s %14s %11s\n", var.label.c_str(), "standard MB", "tiled MB", "FA2 MB", "reduction");
  }
  for (double x : xs) {
    io::ModelParams p = base;
    if (var.name == "seq")
      p.seqlen = static_cast<std::int64_t>(x);
    else if (var.name == "head-dim")
      p.head_dim = static_cast<std::int64_t>(x);
    else
      p.sram_bytes = x;
    const io::Report r = io::model(p);
    sb.push_back(r.standard.bytes);
    tb.push_back(r.tiled.bytes);
    fb.push_back(r.fa2.bytes);
    if (a.json) {
      const json value = var.is_bytes ? json(x) : json(static_cast<std::int64_t>(x));
      json j = {{"sweep", var.name},
                {"value", value},
                {"params", params_json(p)},
                {"standard", traffic_json(r.standard, false)},
                {"tiled", traffic_json(r.tiled, true)},
                {"fa2", traffic_json(r.fa2, true)},
                {"reduction", r.reduction}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      const std::string red = format_reduction(r.reduction);
      std::printf("%10s %14.1f %14.1f %14.1f %s\n", x_text(x).c_str(), r.standard.bytes / 1e6, r.tiled.bytes / 1e6,
                  r.fa2.bytes / 1e6, pad(red, 11, true).c_str());
    }
  }

  const auto cross_tiled = crossings(xs, sb, tb), cross_fa2 = crossings(xs, sb, fb);
  auto describe = [&](const char* name, const std::vector<Crossing>& cs, const std::vector<double>& t) {
    std::string s;
    for (const Crossing& c : cs)
      s += std::string(s.empty() ? "" : "\n") + name + " breaks even with standard at " + var.label + " ≈ " +
           x_text(c.x) + " (" + format_mb(c.y) + ") and moves less " + (c.wins_above ? "above" : "below") + " it";
    if (cs.empty())
      s = std::string(name) + (t.front() < sb.front() ? " moves less than" : " moves more than") +
          " standard over the whole range";
    return s;
  };
  if (a.json) {
    json cj = json::array();
    for (auto [name, cs] : {std::pair{"tiled", &cross_tiled}, std::pair{"fa2", &cross_fa2}})
      for (const Crossing& c : *cs)
        cj.push_back({{"series", name}, {"value", c.x}, {"bytes", c.y}, {"wins", c.wins_above ? "above" : "below"}});
    std::printf("%s\n", json{{"sweep", var.name}, {"crossings", cj}}.dump().c_str());
  } else {
    std::printf("\n%s\n%s\n", describe("Tiled (Algorithm 1)", cross_tiled, tb).c_str(),
                describe("FA2 order", cross_fa2, fb).c_str());
  }

  if (!a.svg.empty()) {
    svg::Plot plot;
    const char* what = var.name == "seq" ? "sequence length" : var.name == "head-dim" ? "head dim" : "on-chip SRAM";
    plot.title = std::string("HBM traffic per head vs ") + what + " (" + fixed + ")";
    plot.x = {var.name == "seq"        ? "Sequence length N"
              : var.name == "head-dim" ? "Head dim d"
                                       : "On-chip SRAM per multiprocessor",
              true, 2, var.is_bytes ? format_tick_bytes : format_count};
    plot.y = {"HBM traffic (bytes, log scale)", true, 10, format_si_bytes};
    plot.series.push_back({"Standard (Algorithm 0)", xs, sb, "#d62728", false, true});
    plot.series.push_back({"Tiled (Algorithm 1)", xs, tb, "#1f77b4", false, true});
    plot.series.push_back({"FA2 order", xs, fb, "#2ca02c", true, true});
    for (const Crossing& c : cross_tiled)
      plot.markers.push_back({c.x, c.y, "Algorithm 1 = standard at " + x_text(c.x), "#1f77b4"});
    for (const Crossing& c : cross_fa2)
      plot.markers.push_back({c.x, c.y, "FA2 order = standard at " + x_text(c.x), "#2ca02c"});
    try {
      svg::write_file(plot, a.svg);
    } catch (const std::runtime_error& e) {
      throw UsageError(std::string("--svg: ") + e.what());
    }
    if (!a.json) std::printf("wrote %s\n", a.svg.c_str());
  }
}

}  // namespace

void add_io_command(CLI::App& app) {
  auto a = std::make_shared<IoArgs>();
  CLI::App* sub = app.add_subcommand(
      "io", "HBM traffic of standard vs tiled attention (FlashAttention's IO model), counted or swept");
  sub->add_option("--seq", a->seq, "sequence length N (default 4096; 4k accepted)")->type_name("N");
  sub->add_option("--head-dim", a->head_dim, "head dimension d (default 64)")->type_name("D");
  sub->add_option("--sram", a->sram, "on-chip SRAM per multiprocessor (default 192KB = 196608 bytes)")
      ->type_name("SIZE");
  sub->add_option("--bytes", a->bytes, "bytes per element (default 2, 16-bit)")->type_name("B");
  sub->add_option("--bandwidth", a->bandwidth, "HBM bandwidth (default 3.35TB/s, H100 SXM)")->type_name("RATE");
  sub->add_option("--derate", a->derate, "fraction of the bandwidth achieved (default 0.8)")->type_name("F");
  sub->add_flag("--count", a->count,
                "also run Algorithm 1 and the FA2 order on random data through a counting HBM "
                "and check the counts equal the closed forms (slow above N ~ 8k)");
  sub->add_flag("--json", a->json, "print JSON (sweeps: one object per line)");
  sub->add_option("--sweep", a->sweep, "sweep one variable: seq, head-dim or sram")->type_name("VAR");
  sub->add_option("--from", a->from, "first value of the sweep")->type_name("A");
  sub->add_option("--to", a->to, "last value of the sweep")->type_name("B");
  sub->add_option("--steps", a->steps, "number of sweep points, geometric (default: factor 2)")->type_name("K");
  sub->add_option("--svg", a->svg, "with --sweep: write a log-log plot of the sweep to this file")->type_name("FILE");
  add_ring_options(*sub, a->ring);
  sub->callback([a] {
    if (a->ring.ring) {
      if (!a->sweep.empty() || a->count) throw UsageError("--ring: not available with --sweep or --count");
      a->ring.seq = a->seq, a->ring.head_dim = a->head_dim, a->ring.bytes = a->bytes, a->ring.svg = a->svg;
      a->ring.json = a->json;
      return run_io_ring(a->ring);
    }
    if (a->sweep.empty()) {
      for (auto [flag, val] : {std::pair{"--from", &a->from}, std::pair{"--to", &a->to},
                               std::pair{"--steps", &a->steps}, std::pair{"--svg", &a->svg}})
        if (!val->empty()) throw UsageError(std::string(flag) + ": only valid with --sweep");
      run_point(*a);
    } else {
      if (a->count) throw UsageError("--count: not available with --sweep (count single points)");
      run_sweep(*a);
    }
  });
}

}  // namespace attn::cli
