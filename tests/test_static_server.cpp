// attn explore's static-file server (tools/attn/static_server.cpp): which request targets map to which
// files, and the MIME types a browser needs (application/wasm for the explorer's module).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "static_server.hpp"

namespace attn::cli {
namespace {

struct Root {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "attn_static_server_test";
  Root() {
    std::filesystem::create_directories(dir / "sub");
    for (const char* f : {"index.html", "explorer.js", ".hidden", "sub/a.wasm"}) std::ofstream(dir / f) << "x";
  }
  ~Root() { std::filesystem::remove_all(dir); }
  std::string resolve(const std::string& target) const { return resolve_target(dir.string(), target); }
};

TEST(StaticServer, ServesFilesUnderTheRoot) {
  const Root r;
  EXPECT_EQ(r.resolve("/"), r.dir.string() + "/index.html");
  EXPECT_EQ(r.resolve("/index.html#drive"), r.dir.string() + "/index.html");
  EXPECT_EQ(r.resolve("/explorer.js?v=1"), r.dir.string() + "/explorer.js");
  EXPECT_EQ(r.resolve("/sub/a.wasm"), r.dir.string() + "/sub/a.wasm");
}

TEST(StaticServer, RefusesEverythingElse) {
  const Root r;
  for (const char* t :
       {"", "index.html", "/missing.html", "/sub", "/sub/", "/../index.html", "/sub/../index.html", "/./index.html",
        "/.hidden", "//index.html", "/%2e%2e/index.html", "/sub\\a.wasm", "http://host/index.html", "/index.html\r\n"})
    EXPECT_EQ(r.resolve(t), "") << t;
  EXPECT_EQ(r.resolve(std::string("/index.html") + '\0' + "x"), "");
}

TEST(StaticServer, MimeTypes) {
  EXPECT_EQ(mime_type("a/attn_explorer.wasm"), "application/wasm");
  EXPECT_EQ(mime_type("index.html"), "text/html; charset=utf-8");
  EXPECT_EQ(mime_type("explorer.js"), "text/javascript; charset=utf-8");
  EXPECT_EQ(mime_type("explorer.css"), "text/css; charset=utf-8");
  EXPECT_EQ(mime_type("x.bin"), "application/octet-stream");
}

}  // namespace
}  // namespace attn::cli
