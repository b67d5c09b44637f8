#include "units.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

namespace attn::cli {
namespace {

struct Split {
  double value;
  std::string unit;  // lower-cased, spaces removed
};

Split split_number(std::string_view text, std::string_view flag, std::string_view expect) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  double value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr == s.data() || !std::isfinite(value))
    throw UsageError(std::string(flag) + ": '" + std::string(text) + "' is not a number (expected " +
                     std::string(expect) + ")");
  std::string unit(ptr, static_cast<std::size_t>(s.data() + s.size() - ptr));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return {value, unit};
}

[[noreturn]] void bad_unit(std::string_view text, std::string_view flag, std::string_view expect) {
  throw UsageError(std::string(flag) + ": '" + std::string(text) + "' has an unknown unit (expected " +
                   std::string(expect) + ")");
}

double binary_multiplier(const std::string& u) {
  if (u.empty() || u == "b") return 1;
  if (u == "k" || u == "kb" || u == "kib") return 1024.0;
  if (u == "m" || u == "mb" || u == "mib") return 1024.0 * 1024;
  if (u == "g" || u == "gb" || u == "gib") return 1024.0 * 1024 * 1024;
  return -1;
}

}  // namespace

double parse_bytes(std::string_view text, std::string_view flag) {
  constexpr std::string_view expect = "a size such as 192KB, 192KiB or 196608";
  auto [v, u] = split_number(text, flag, expect);
  const double mult = binary_multiplier(u);
  if (mult < 0) bad_unit(text, flag, expect);
  if (v <= 0) throw UsageError(std::string(flag) + ": '" + std::string(text) + "' must be positive");
  return v * mult;
}

double parse_rate(std::string_view text, std::string_view flag) {
  constexpr std::string_view expect = "a rate such as 3.35TB/s, 900GB/s or 2.68e12";
  auto [v, u] = split_number(text, flag, expect);
  if (u.size() >= 2 && u.substr(u.size() - 2) == "/s") u.resize(u.size() - 2);
  double mult = -1;
  if (u.empty() || u == "b")
    mult = 1;
  else if (u == "kb")
    mult = 1e3;
  else if (u == "mb")
    mult = 1e6;
  else if (u == "gb")
    mult = 1e9;
  else if (u == "tb")
    mult = 1e12;
  else if (u == "kib")
    mult = 1024.0;
  else if (u == "mib")
    mult = 1024.0 * 1024;
  else if (u == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (u == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  if (mult < 0) bad_unit(text, flag, expect);
  if (v <= 0) throw UsageError(std::string(flag) + ": '" + std::string(text) + "' must be positive");
  return v * mult;
}

std::int64_t parse_count(std::string_view text, std::string_view flag) {
  constexpr std::string_view expect = "a whole number such as 4096 or 4k";
  auto [v, u] = split_number(text, flag, expect);
  double mult = 1;
  if (u == "k")
    mult = 1024.0;
  else if (u == "m")
    mult = 1024.0 * 1024;
  else if (!u.empty())
    bad_unit(text, flag, expect);
  const double n = v * mult;
  if (n != std::floor(n) || n < 0 || n > 9.0e15)
    throw UsageError(std::string(flag) + ": '" + std::string(text) + "' is not " + std::string(expect));
  return static_cast<std::int64_t>(n);
}

double parse_number(std::string_view text, std::string_view flag) {
  auto [v, u] = split_number(text, flag, "a number such as 0.8 or 80%");
  if (u == "%") return v / 100;
  if (!u.empty()) bad_unit(text, flag, "a number such as 0.8 or 80%");
  return v;
}

}  // namespace attn::cli
