// attn: the command-line tool. `attn --help` lists the subcommands; each has --help and --json.
// Exit codes: 0 success, 1 a check failed, 2 bad usage or bad input (one line on stderr).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <stdexcept>

#include "commands.hpp"
#include "units.hpp"

int main(int argc, char** argv) {
  CLI::App app{"attn: exact, IO-aware attention kernels (FlashAttention tiling, split-K decode)"};
  app.require_subcommand(1);
  attn::cli::add_io_command(app);
  attn::cli::add_check_command(app);
  attn::cli::add_demo_command(app);
  attn::cli::add_bench_command(app);
  attn::cli::add_explore_command(app);
  attn::cli::add_info_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {  // a command's own exit code, e.g. a failed check
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "attn: %s\n", e.what());
    return 2;
  } catch (const attn::cli::UsageError& e) {
    std::fprintf(stderr, "attn: %s\n", e.what());
    return 2;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "attn: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
