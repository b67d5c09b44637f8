// Shared by `attn bench prefill` and `attn bench backward`: the flags for the problem's shape, dtypes,
// threads and tiles, their parsing, and the parts of the header, table row and JSON line that the two
// print alike. Each command keeps --seq (the two mean different lengths by it) and what it measures.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "bench_common.hpp"

namespace CLI {
class App;
}

namespace attn::cli {

// The flags' text. Each command gives head_dim its default with a designated initializer, so every
// member has an initializer of its own (else -Wmissing-field-initializers).
struct ShapeArgs {
  std::string head_dim = "", causal = "0,1", dtype = "f32,bf16", threads = "", heads = "16", kv_heads = "", batch = "1";
  std::string q_tile = "", k_tile = "";  // empty: attn's own tile plan
  bool json = false;
};

// --head-dim, --causal, --dtype, --threads, --heads, --kv-heads, --batch (in this order in --help).
void add_shape_options(CLI::App& c, ShapeArgs& a);
// --q-tile and --k-tile, with the command's help text for each.
void add_tile_options(CLI::App& c, ShapeArgs& a, const std::string& q_help, const std::string& k_help);
void add_json_flag(CLI::App& c, ShapeArgs& a);

// The parsed flags (a bad one throws UsageError), and the FMA and AMX-BF16 peaks measured for each
// thread count.
struct Shapes {
  std::vector<std::int64_t> dims, threads;
  std::int64_t heads = 0, kv_heads = 0, batch = 0;
  std::vector<bool> causals;
  std::vector<DType> dtypes;
  TileOptions tiles;
  std::map<int, double> peak;      // GFLOP/s (f32) by thread count
  std::map<int, double> amx_peak;  // GFLOP/s (AMX-BF16) by thread count, 0 where AMX is not usable
};
Shapes parse_shapes(const ShapeArgs& a);
void measure_peaks(Shapes& s);

// One measured case of a table.
struct BenchCase {
  std::int64_t seq_q, seq_k, head_dim;
  bool causal;
  DType dtype;
  std::int64_t threads;
};

// "attn bench <command>: <machine>; <kernel paths>; batch, heads, kv heads" and a line per measured peak.
void print_intro(const char* command, const Shapes& s);
// The columns every table starts with (seq_q, seq_k, d, causal, dtype): heads and one row's cells.
void print_case_heads();
void print_case_cells(const BenchCase& c);
// A rate's two columns: GFLOP/s and the fraction of the FMA peak.
void print_rate_heads();
void print_rate_cells(double gflops, double peak);
// The JSON keys every line has: the case, the median time and its repetitions, the rate against the
// peak, the machine and its kernel paths.
nlohmann::json case_json(const char* kind, const Shapes& s, const BenchCase& c, const Timing& t, double gflops);

}  // namespace attn::cli
