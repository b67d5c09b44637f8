// The CLI's human formatting (units.hpp), apart from the parsing in units.cpp: the explorer's
// WebAssembly build (explorer/explorer_api.cpp) shows the same text, and its libc++ has no
// floating-point std::from_chars for the parsers.
#include <cstdio>
#include <string>

#include "units.hpp"

namespace attn::cli {

std::string printf_str(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string format_mb(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

std::string format_seconds(double s) {
  char buf[64];
  if (s < 1e-3)
    std::snprintf(buf, sizeof buf, "%.1f µs", s * 1e6);
  else if (s < 1)
    std::snprintf(buf, sizeof buf, "%.2f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

std::string format_bytes(double bytes) {
  char buf[64];
  if (bytes < 1024)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else if (bytes < 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024);
  else if (bytes < 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

}  // namespace attn::cli
