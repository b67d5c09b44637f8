// Each subcommand of `attn` registers itself on the app; its callback prints text or, with --json,
// one JSON object (one per line for tables).
#pragma once

namespace CLI { class App; }

namespace attn::cli {
void add_io_command(CLI::App& app);
void add_check_command(CLI::App& app);
void add_demo_command(CLI::App& app);
}  // namespace attn::cli
