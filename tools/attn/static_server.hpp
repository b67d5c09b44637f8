// A small static-file HTTP server for `attn explore`: GET and HEAD of the regular files under one
// directory, on one loopback port, one request at a time. Enough for a browser to load the explorer
// page (application/wasm for the module, which WebAssembly.instantiateStreaming insists on), nothing
// more: no directory listings, no paths outside the directory, no keep-alive.
#pragma once

#include <functional>
#include <string>

namespace attn::cli {

// The Content-Type for a file name, by its extension (application/octet-stream when unknown).
std::string mime_type(const std::string& path);

// The file a request target names under `root`, or "" when it names none that may be served: only
// "/" (index.html) and paths of [A-Za-z0-9._-] segments, none of them "." or "..", none hidden.
std::string resolve_target(const std::string& root, const std::string& target);

// Binds host:port (port 0: a free one), calls `ready` with the port bound, then serves until the
// process ends. Throws std::runtime_error when it cannot bind.
void serve_static(const std::string& root, const std::string& host, int port, const std::function<void(int)>& ready);

}  // namespace attn::cli
