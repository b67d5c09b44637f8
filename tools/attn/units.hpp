// Numbers with units on the command line, and the one-line error a bad one gets.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace attn::cli {

// A bad command-line value: main() prints "attn: <message>" on one line and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Memory sizes in bytes: "196608", "192KB", "192KiB", "1.5MiB", "2MB", "64k". K/M/G are powers of 1024
// with or without the "i" (SRAM and cache sizes are quoted that way: the A100's "192 KB" is 192 x 1024).
double parse_bytes(std::string_view text, std::string_view flag);
// Rates in bytes/s, decimal as vendors quote them: "3.35TB/s", "900GB/s", "2.68e12", "20GiB/s".
double parse_rate(std::string_view text, std::string_view flag);
// Counts: "4096", "4k" (= 4096), "64K", "1M" (= 1048576). Must be an integer.
std::int64_t parse_count(std::string_view text, std::string_view flag);
// A fraction or plain number: "0.8", "80%".
double parse_number(std::string_view text, std::string_view flag);

// Human formatting: 136.3 MB (10^6 bytes), 50.9 µs, 7.3×.
std::string printf_str(const char* format, double v);  // one number through a printf format, e.g. "%g"
std::string format_mb(double bytes);
std::string format_seconds(double s);
std::string format_bytes(double bytes);  // B, KiB, MiB, GiB

}  // namespace attn::cli
