// `attn bench decode` (placeholder until the decode issue lands: registers the command only).
#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "units.hpp"

namespace attn::cli {
void add_bench_decode(CLI::App& bench) {
  auto* c = bench.add_subcommand("decode", "One query per sequence over a KV cache (not implemented yet)");
  c->callback([] { throw UsageError("bench decode: not implemented yet"); });
}
}  // namespace attn::cli
