// `attn explore`: serves the explorer page (docs/explorer.md), built by Emscripten into the build
// directory, on a loopback port, and prints the URL to open.
#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <string>

#include "commands.hpp"
#include "static_server.hpp"
#include "units.hpp"

#ifndef ATTN_EXPLORER_DIR
#define ATTN_EXPLORER_DIR ""
#endif

namespace attn::cli {

void add_explore_command(CLI::App& app) {
  struct Args {
    int port = 8000;
    std::string dir = ATTN_EXPLORER_DIR, host = "127.0.0.1";
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("explore", "Serve the interactive explorer page on localhost and print its URL");
  cmd->add_option("--port", a->port, "TCP port (0: any free one)")->capture_default_str();
  cmd->add_option("--dir", a->dir, "directory of the built page (index.html, attn_explorer.wasm)")
      ->capture_default_str();
  cmd->add_option("--host", a->host, "IPv4 address to listen on")->capture_default_str();
  cmd->callback([a] {
    if (a->port < 0 || a->port > 65535)
      throw UsageError("--port: must be in [0, 65535], got " + std::to_string(a->port));
    struct stat st {};
    const std::string index = a->dir + "/index.html", wasm = a->dir + "/attn_explorer.wasm";
    if (a->dir.empty() || ::stat(index.c_str(), &st) != 0 || ::stat(wasm.c_str(), &st) != 0)
      throw UsageError("--dir: no built explorer page in '" + a->dir +
                       "' (it is built with the library when Emscripten's em++ is found: apt-get install emscripten)");
    serve_static(a->dir, a->host, a->port, [&](int port) {
      std::printf("attn explore: serving %s\nOpen http://%s:%d/ in a browser (Ctrl-C stops the server)\n",
                  a->dir.c_str(), a->host.c_str(), port);
      std::fflush(stdout);
    });
  });
}

}  // namespace attn::cli
