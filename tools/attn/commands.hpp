// Each subcommand of `attn` registers itself on the app; its callback prints text or, with --json,
// one JSON object (one per line for tables).
#pragma once

namespace CLI {
class App;
}

namespace attn::cli {
void add_io_command(CLI::App& app);
void add_check_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_explore_command(CLI::App& app);  // cmd_explore.cpp
void add_info_command(CLI::App& app);     // cmd_info.cpp
// Registered under `bench` by add_bench_command.
void add_bench_prefill(CLI::App& bench);   // cmd_bench_prefill.cpp
void add_bench_backward(CLI::App& bench);  // cmd_bench_backward.cpp
void add_bench_decode(CLI::App& bench);    // cmd_bench_decode.cpp
void add_bench_mla(CLI::App& bench);       // cmd_bench_mla.cpp
void add_bench_ring(CLI::App& bench);      // cmd_bench_ring.cpp
}  // namespace attn::cli
