// `attn bench --isa avx2` (and attn-ring-worker's --isa): pins Highway's runtime dispatch -- every
// kernel and the FMA probe -- to the named targets, so a machine with AVX-512 also times its AVX2 code
// (with a 256-bit FMA peak beside it). The names are those of the tests' ATTN_ISA
// (src/cpu/target_names.hpp).
#pragma once

#include <hwy/targets.h>

#include <string>

#include "cpu/target_names.hpp"

namespace attn::cli {

// The list given to --isa, empty when none was (the bench ring passes it on to its worker).
inline std::string& pinned_isa() {
  static std::string list;
  return list;
}

// Throws std::invalid_argument naming --isa for an unknown target or one this CPU cannot run.
inline void pin_isa(const std::string& list) {
  const std::int64_t mask =
      detail::parse_target_list(list, HWY_TARGETS, hwy::SupportedTargets() & HWY_TARGETS, "--isa");
  hwy::SetSupportedTargetsForTest(mask);
  pinned_isa() = list;
}

}  // namespace attn::cli
