// `attn bench prefill|decode|backward`: the performance tables. Each subcommand lives in its own file.
#include <CLI/CLI.hpp>

#include "commands.hpp"

namespace attn::cli {

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks against the machine's measured ceilings and baselines");
  bench->require_subcommand(1);
  add_bench_prefill(*bench);
  add_bench_decode(*bench);
  add_bench_mla(*bench);
  add_bench_ring(*bench);
  add_bench_backward(*bench);
}

}  // namespace attn::cli
