// The machine's ceilings, measured in the same run as the benchmarks that are compared with them.
#pragma once

#include <cstddef>
#include <vector>

namespace attn::cli {

// Peak f32 fused-multiply-add throughput with `threads` threads, in GFLOP/s (2 flops per FMA lane),
// from independent FMA chains in registers on the widest vector unit available (probe_fma.cpp).
double fma_peak_gflops(int threads);

// Peak AMX-BF16 throughput (TDPBF16PS, bf16 products summed in f32) with `threads` threads, in GFLOP/s
// (2 flops per product), from independent tile accumulators (probe_amx.cpp); 0 where AMX is not usable
// (detail::amx_support) or the CLI was compiled without it.
double amx_bf16_peak_gflops(int threads);

// Sustained read bandwidth from memory with `threads` threads, in GB/s (10^9 bytes/s), streaming
// a buffer much larger than the last-level cache (probe_bandwidth.cpp).
double read_bandwidth_gbps(int threads);

// The same read loop over `rows` (row_bytes each, a multiple of 64), in list order, split into
// `threads` consecutive shares: the read rate of one particular layout and order, in GB/s.
double rows_read_gbps(const std::vector<const void*>& rows, std::size_t row_bytes, int threads);

}  // namespace attn::cli
