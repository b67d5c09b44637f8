// The explorer page's only computations: thin C entry points, compiled to WebAssembly, over attn's own
// traffic model (attn::io), its counted schedules, and the CLI's tiled and split-K checks (checks.hpp).
// Each returns one JSON object as text (JSON.parse on the page); a bad input returns {"error": "..."}
// with the library's own message. Figures come formatted too (format_mb, format_seconds: the CLI's
// units.cpp), so the page shows the CLI's text and does no arithmetic of its own.
//
// Integers arrive as doubles: Emscripten 3.1.6 without WASM_BIGINT splits int64 arguments in two, and
// every count the page sends fits a double exactly. to_count() rejects fractions and out-of-range
// values instead of truncating them.
#include <emscripten/emscripten.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>

#include "attn/io_model.hpp"
#include "attn/online_softmax.hpp"
#include "checks.hpp"
#include "units.hpp"

namespace {

using json = nlohmann::ordered_json;
using attn::cli::format_mb;
using attn::cli::format_seconds;

std::int64_t to_count(double v, const char* name) {
  if (!(v >= 0 && v <= 9.0e15 && v == std::floor(v)))
    throw std::invalid_argument(std::string(name) + ": must be a whole number >= 0");
  return static_cast<std::int64_t>(v);
}

// The text handed back to JavaScript: valid until the next call (the page copies it at once).
const char* reply(const json& j) {
  static std::string text;
  text = j.dump();
  return text.c_str();
}

template <class F>
const char* guarded(F&& f) {
  try {
    return reply(f());
  } catch (const std::exception& e) {
    return reply(json{{"error", e.what()}});
  }
}

// The reduction as `attn io` prints it: 7.3x, and two significant digits below 1 (0.52x).
std::string format_ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, r >= 1 ? "%.1f×" : "%.2g×", r);
  return buf;
}

json traffic_json(const attn::io::Traffic& t) {
  return {{"elements", t.elements},
          {"bytes", t.bytes},
          {"seconds", t.seconds},
          {"text_bytes", format_mb(t.bytes)},
          {"text_time", format_seconds(t.seconds)},
          {"block_rows", t.block_rows},
          {"block_cols", t.block_cols},
          {"passes", t.passes}};
}

attn::io::ModelParams params(double seq, double d, double sram, double elem, double bw, double derate) {
  attn::io::ModelParams p;
  p.seqlen = to_count(seq, "seq");
  p.head_dim = to_count(d, "head_dim");
  p.sram_bytes = sram;
  p.element_bytes = elem;
  p.bandwidth = bw;
  p.derate = derate;
  return p;
}

json break_even_json(std::int64_t n, std::int64_t d, double elem, bool fa2) {
  const std::int64_t m = attn::io::break_even_sram_elements(n, d, fa2);
  if (m == 0) return {{"elements", 0}, {"bytes", nullptr}, {"text", "never"}};
  const double bytes = static_cast<double>(m) * elem;
  return {{"elements", m}, {"bytes", bytes}, {"text", attn::cli::format_bytes(bytes)}};
}

}  // namespace

extern "C" {

// The figures of `attn io --json` for one point, plus the break-even SRAM of both tiled orders.
EMSCRIPTEN_KEEPALIVE const char* explorer_io(double seq, double d, double sram, double elem, double bw, double derate) {
  return guarded([&] {
    const attn::io::Report r = attn::io::model(params(seq, d, sram, elem, bw, derate));
    return json{{"sram_elements", r.sram_elements},
                {"standard", traffic_json(r.standard)},
                {"tiled", traffic_json(r.tiled)},
                {"fa2", traffic_json(r.fa2)},
                {"reduction", r.reduction},
                {"text_reduction", format_ratio(r.reduction)},
                {"score_matrix_bytes", r.score_matrix_bytes},
                {"text_score_matrix", format_mb(r.score_matrix_bytes)},
                {"break_even_tiled", break_even_json(r.params.seqlen, r.params.head_dim, elem, false)},
                {"break_even_fa2", break_even_json(r.params.seqlen, r.params.head_dim, elem, true)}};
  });
}

// The three curves against one parameter (0 = N, 1 = d, 2 = SRAM bytes), `steps` points evenly spaced
// in log space from `from` to `to`, the others held at the given values.
EMSCRIPTEN_KEEPALIVE const char* explorer_sweep(double var, double from, double to, double steps, double seq, double d,
                                                double sram, double elem, double bw, double derate) {
  return guarded([&] {
    const std::int64_t n = to_count(steps, "steps"), which = to_count(var, "var");
    if (n < 2 || n > 1000) throw std::invalid_argument("steps: must be in [2, 1000]");
    if (which > 2) throw std::invalid_argument("var: must be 0 (seq), 1 (head_dim) or 2 (sram)");
    if (!(from > 0 && to > from)) throw std::invalid_argument("from, to: need 0 < from < to");
    json points = json::array();
    for (std::int64_t i = 0; i < n; ++i) {
      double x = from * std::pow(to / from, static_cast<double>(i) / static_cast<double>(n - 1));
      if (which < 2) x = std::round(x);  // N and d are counts
      const attn::io::Report r =
          attn::io::model(params(which == 0 ? x : seq, which == 1 ? x : d, which == 2 ? x : sram, elem, bw, derate));
      points.push_back({x, r.standard.bytes, r.tiled.bytes, r.fa2.bytes});
    }
    return json{{"points", points}};
  });
}

// Both schedules run on random f64 data through the counting HBM (`attn io --count`).
EMSCRIPTEN_KEEPALIVE const char* explorer_count(double seq, double d, double sram, double elem) {
  return guarded([&] {
    const attn::io::Report r = attn::io::model(params(seq, d, sram, elem, 1, 1));
    const std::int64_t n = r.params.seqlen, hd = r.params.head_dim, m = r.sram_elements;
    const auto one = [](const attn::io::Counted& c, const attn::io::Traffic& t) {
      return json{{"counted_elements", c.elements},
                  {"closed_form", t.elements},
                  {"reads", c.reads},
                  {"writes", c.writes},
                  {"sram_peak_elements", c.sram_peak_elements},
                  {"max_abs_diff", c.max_abs_diff},
                  {"match", c.elements == t.elements && c.max_abs_diff <= 1e-12}};
    };
    return json{{"tiled", one(attn::io::count_algorithm1(n, hd, m), r.tiled)},
                {"fa2", one(attn::io::count_fa2(n, hd, m), r.fa2)}};
  });
}

// `attn check tiled`: seq x seq, head dim d, tiles of `tile`, against the textbook method.
EMSCRIPTEN_KEEPALIVE const char* explorer_tiled(double seq, double d, double tile, double seed) {
  return guarded([&] {
    const auto c = attn::cli::check_tiled(to_count(seq, "seq"), to_count(d, "head_dim"), to_count(tile, "tile"),
                                          static_cast<std::uint64_t>(to_count(seed, "seed")));
    return json{{"max_abs_diff", c.max_abs_diff}, {"passed", c.max_abs_diff <= attn::cli::kExactTolerance}};
  });
}

// `attn check splitk`: one query over `keys` keys in `workers` slices; each slice's (m, l) and their
// merge by attn::merged, the rule split-K itself uses.
EMSCRIPTEN_KEEPALIVE const char* explorer_splitk(double keys, double workers, double d, double seed) {
  return guarded([&] {
    const auto c = attn::cli::check_splitk(to_count(keys, "keys"), to_count(workers, "workers"),
                                           to_count(d, "head_dim"), static_cast<std::uint64_t>(to_count(seed, "seed")));
    json parts = json::array();
    attn::PartialState<double> total;  // neutral: m = -inf, l = 0, no o (only m and l are shown)
    for (const auto& p : c.partials) {
      parts.push_back({{"m", std::isinf(p.m) ? json(nullptr) : json(p.m)}, {"l", p.l}, {"keys", p.keys}});
      attn::PartialState<double> s;
      s.m = p.m;
      s.l = p.l;
      total = attn::merged(total, s);
    }
    return json{{"max_abs_diff", c.max_abs_diff},
                {"passed", c.max_abs_diff <= attn::cli::kExactTolerance},
                {"partials", parts},
                {"merged", {{"m", total.m}, {"l", total.l}}}};
  });
}

// One decode step over a KV cache (attn::io::decode_traffic).
EMSCRIPTEN_KEEPALIVE const char* explorer_decode(double cache_len, double heads, double kv_heads, double d, double elem,
                                                 double bw, double derate) {
  return guarded([&] {
    attn::io::DecodeParams p;
    p.cache_len = to_count(cache_len, "cache_len");
    p.heads = to_count(heads, "heads");
    p.kv_heads = to_count(kv_heads, "kv_heads");
    p.head_dim = to_count(d, "head_dim");
    p.element_bytes = elem;
    p.bandwidth = bw;
    p.derate = derate;
    const attn::io::DecodeTraffic t = attn::io::decode_traffic(p);
    return json{{"kv_bytes", t.kv_bytes},
                {"read_bytes", t.read_bytes},
                {"write_bytes", t.write_bytes},
                {"bytes", t.bytes},
                {"seconds", t.seconds},
                {"text_read", format_mb(t.read_bytes)},
                {"text_time", format_seconds(t.seconds)}};
  });
}

}  // extern "C"
