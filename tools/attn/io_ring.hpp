// `attn io --ring` (cmd_io_ring.cpp): its options, registered on `attn io` beside the traffic model's.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace attn::cli {

struct RingIoArgs {
  bool ring = false, full = false, json = false;
  std::string seq, head_dim, bytes, svg;  // shared with `attn io` (empty: the ring model's defaults)
  std::string ranks = "8", heads = "32", kv_heads = "8", rate = "2000", links = "10,25,100,200,400", latency = "5";
};

void add_ring_options(CLI::App& io, RingIoArgs& a);
void run_io_ring(const RingIoArgs& a);

}  // namespace attn::cli
