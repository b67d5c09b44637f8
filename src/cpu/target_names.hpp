// Highway target names (hwy::TargetName's spelling, any case: avx3_dl, avx3, avx2, sse4, emu128 ...)
// to target bits, for the two ways of pinning the kernels' runtime dispatch to some of the targets a
// machine has: the tests' ATTN_ISA environment variable (tests/support.hpp) and `attn bench --isa`
// (tools/attn/cmd_bench.cpp), so that an AVX-512 machine also runs and times the AVX2 code.
#pragma once

#include <hwy/targets.h>

#include <cctype>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace attn::detail {

// " AVX2 SSE4" for a mask of target bits, best first.
inline std::string target_names(std::int64_t mask) {
  std::string s;
  for (std::int64_t t = mask; t != 0; t &= t - 1) s += std::string(" ") + hwy::TargetName(t & -t);
  return s;
}

// The target bits a comma-separated list names, among `compiled` (e.g. HWY_TARGETS), restricted to
// `supported` (the CPU's). Throws std::invalid_argument, its message starting with `what`, for a name
// that is no compiled target or a list the CPU runs none of.
inline std::int64_t parse_target_list(const std::string& list, std::int64_t compiled, std::int64_t supported,
                                      const std::string& what) {
  std::int64_t named = 0;
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string word = list.substr(at, end - at);
    std::string upper = word;
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    std::int64_t bit = 0;
    for (std::int64_t t = compiled; t != 0 && bit == 0; t &= t - 1)
      if (upper == hwy::TargetName(t & -t)) bit = t & -t;
    if (bit == 0)
      throw std::invalid_argument(what + ": '" + word +
                                  "' is none of the targets compiled here:" + target_names(compiled));
    named |= bit;
    at = end + 1;
  }
  if ((named & supported) == 0)
    throw std::invalid_argument(what + "=" + list + ": this CPU runs none of these targets");
  return named & supported;
}

}  // namespace attn::detail
