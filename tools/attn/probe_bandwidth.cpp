// read_bandwidth_gbps: a STREAM-like read probe. `threads` threads each sum their own contiguous part
// of a 512 MiB buffer (16x a 32 MiB L3, so every pass comes from DRAM) with independent vector
// accumulators; the figure is bytes read / median seconds per pass: the ceiling decode is compared with.
// rows_read_gbps: the same threads and timing over a given list of rows in a given order (a decode
// case's K and V rows, in the order the kernel reads them), summed with no other work: the ceiling of
// that particular layout, e.g. a paged cache whose pages lie in random order.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "probes.hpp"

namespace attn::cli {
namespace {

using V16 = std::int32_t __attribute__((vector_size(64)));
using V4u = std::int32_t __attribute__((vector_size(16), aligned(1)));  // SSE2 width, unaligned rows
constexpr std::size_t kBytes = std::size_t{512} << 20;
constexpr std::size_t kVecs = kBytes / sizeof(V16);

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Shared by every call: allocated and first-touched once (by the threads that will read it).
const V16* buffer() {
  static std::unique_ptr<V16, FreeDeleter> buf = [] {
    auto* p = static_cast<V16*>(std::aligned_alloc(4096, kBytes));
    if (!p) throw std::bad_alloc();
    std::memset(p, 1, kBytes);
    return std::unique_ptr<V16, FreeDeleter>(p);
  }();
  return buf.get();
}

std::int32_t sum_range(const V16* p, std::size_t n) {
  V16 a{}, b{}, c{}, d{};
  for (std::size_t i = 0; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  const V16 s = a + b + c + d;
  std::int32_t r = 0;
  for (int i = 0; i < 16; ++i) r += s[i];
  return r;
}

// Sum of one row of `vecs` 64-byte blocks: eight 16-byte accumulators, which the compiler keeps in
// registers at the baseline ISA (64-byte vector types would live on the stack without AVX-512).
std::int32_t sum_row(const unsigned char* p, std::size_t vecs) {
  V4u a[8] = {};
  for (std::size_t i = 0; i + 2 <= vecs; i += 2)
    for (int k = 0; k < 8; ++k) a[k] += *reinterpret_cast<const V4u*>(p + 128 * (i / 2) + 16 * k);
  if (vecs % 2)
    for (int k = 0; k < 4; ++k) a[k] += *reinterpret_cast<const V4u*>(p + 64 * (vecs - 1) + 16 * k);
  std::int32_t r = 0;
  for (int k = 0; k < 8; ++k) r += a[k][0] + a[k][1] + a[k][2] + a[k][3];
  return r;
}

// `threads` threads, thread t returning part_sum(t); `bytes` read per pass / median seconds, in GB/s.
template <class PartSum>
double timed_parallel_read(int threads, double bytes, PartSum part_sum) {
  volatile std::int32_t sink = 0;
  auto pass = [&] {
    std::vector<std::thread> pool;
    std::vector<std::int32_t> part(static_cast<std::size_t>(threads));
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { part[static_cast<std::size_t>(t)] = part_sum(t); });
    for (auto& th : pool) th.join();
    for (auto x : part) sink = sink + x;
  };
  const Timing t = time_it(pass, 5, 0.3, 50);
  return bytes / t.median_s / 1e9;
}

}  // namespace

double rows_read_gbps(const std::vector<const void*>& rows, std::size_t row_bytes, int threads) {
  if (threads < 1) threads = 1;
  const std::size_t n = rows.size(), vecs = row_bytes / 64, T = static_cast<std::size_t>(threads);
  return timed_parallel_read(threads, static_cast<double>(n * vecs * 64), [&](int t) {
    std::int32_t acc = 0;
    for (std::size_t i = n * static_cast<std::size_t>(t) / T; i < n * static_cast<std::size_t>(t + 1) / T; ++i)
      acc += sum_row(static_cast<const unsigned char*>(rows[i]), vecs);
    return acc;
  });
}

double read_bandwidth_gbps(int threads) {
  if (threads < 1) threads = 1;
  const V16* buf = buffer();
  const std::size_t per = kVecs / static_cast<std::size_t>(threads) / 4 * 4;  // vectors per thread
  return timed_parallel_read(threads, static_cast<double>(per * sizeof(V16)) * threads,
                             [&](int t) { return sum_range(buf + per * static_cast<std::size_t>(t), per); });
}

}  // namespace attn::cli
