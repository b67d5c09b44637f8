#include "cpu/dpbf16.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace attn::detail {
namespace {

std::atomic<int> forced{-1};

bool from_environment() {
  const char* v = std::getenv("ATTN_BF16_DOTS");
  const std::string s = v == nullptr ? "auto" : v;
  if (s == "on") return true;
  if (s == "off") return false;
  if (s != "auto" && !s.empty())  // kernels ask inside their parallel loops, where nothing may throw
    std::fprintf(stderr, "attn: ATTN_BF16_DOTS: must be on, off or auto, not '%s'; using auto\n", s.c_str());
  return bf16_dots_pay();
}

}  // namespace

bool cpu_has_avx512bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni") &&
                          __builtin_cpu_supports("avx512vbmi");
  return has;
#else
  return false;
#endif
}

bool bf16_dots_pay() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return cpu_has_avx512bf16() && __builtin_cpu_is("amd");
#else
  return false;
#endif
}

bool bf16_dots() {
  if (!cpu_has_avx512bf16()) return false;
  const int f = forced.load(std::memory_order_relaxed);
  if (f >= 0) return f == 1;
  static const bool chosen = from_environment();
  return chosen;
}

void force_bf16_dots(int mode) { forced.store(mode < 0 ? -1 : mode > 0 ? 1 : 0, std::memory_order_relaxed); }

}  // namespace attn::detail
