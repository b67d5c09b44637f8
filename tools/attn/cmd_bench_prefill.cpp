// `attn bench prefill` (placeholder until the CPU prefill issue lands: registers the command only).
#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "units.hpp"

namespace attn::cli {
void add_bench_prefill(CLI::App& bench) {
  auto* c = bench.add_subcommand("prefill", "Forward attention over long prompts (not implemented yet)");
  c->callback([] { throw UsageError("bench prefill: not implemented yet"); });
}
}  // namespace attn::cli
