// The cases of the AMX kernels' tests (test_amx_forward.cpp, test_amx_backward.cpp): one problem's shape
// and options, the options and tiles it sets, and the tile units the kernels run on here.
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "amx/amx.hpp"
#include "support.hpp"

namespace attn::test {

struct AmxCase {
  std::int64_t b, sq, sk, h, hk, d, dv;
  bool causal = false;
  std::int64_t left = -1, right = -1;
  double softcap = 0;
  bool alibi = false, sinks = false;
  std::int64_t q_tile = 0, k_tile = 0;  // 0 = the AMX plan's
  int threads = 2;
  double dropout = 0;  // dropout_p (seed 1234, offset 5)
  bool f16 = false;    // f16 inputs (TDPFP16PS) instead of bf16
  bool f32 = false;    // f32 inputs, on the tiles by bf16 parts (test_amx_forward_f32)
};

inline AmxCase with_dropout(AmxCase c, double p) {
  c.dropout = p;
  return c;
}
inline AmxCase in_f16(AmxCase c) {
  c.f16 = true;
  return c;
}
inline AmxCase in_f32(AmxCase c) {
  c.f32 = true;
  return c;
}

inline std::ostream& operator<<(std::ostream& os, const AmxCase& c) {
  return os << "b" << c.b << " sq" << c.sq << " sk" << c.sk << " h" << c.h << "/" << c.hk << " d" << c.d << "/" << c.dv
            << (c.causal ? " causal" : "") << " win(" << c.left << "," << c.right << ") cap" << c.softcap
            << (c.alibi ? " alibi" : "") << (c.sinks ? " sinks" : "") << " tiles " << c.q_tile << "x" << c.k_tile
            << " thr" << c.threads << " dropout " << c.dropout
            << (c.f16   ? " f16"
                : c.f32 ? " f32"
                        : " bf16");
}

// The case's options (masks, soft-cap, ALiBi slopes and sinks, which point into `slopes` and `sinks`,
// threads, dropout) and forced tiles.
inline void set_case_options(const AmxCase& c, std::vector<float>& slopes, std::vector<float>& sinks,
                             AttentionOptions& o, TileOptions& tiles) {
  o = options_of({c.b, c.sq, c.sk, c.h, c.hk, c.d, c.causal, c.left, c.right, c.softcap, c.alibi}, 0.5f, slopes);
  if (c.sinks) {
    sinks = sinks_for(c.h);
    o.sinks = sinks;
  }
  o.num_threads = c.threads;
  o.dropout_p = c.dropout;
  o.dropout_seed = 1234;
  o.dropout_offset = 5;
  if (c.q_tile) tiles.q_tile = c.q_tile;
  if (c.k_tile) tiles.k_tile = c.k_tile;
}

// The modes the AMX kernels run in on this machine: the emulator always, the tiles where usable (for
// f16: where they run TDPFP16PS).
inline std::vector<const char*> amx_modes(bool f16 = false) {
  std::vector<const char*> m{"emulate"};
  if (detail::amx_support().usable() && (!f16 || detail::amx_support().cpu_fp16)) m.push_back("on");
  return m;
}

}  // namespace attn::test
