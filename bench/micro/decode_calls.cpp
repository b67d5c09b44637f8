// attention_decode alone, called many times on one cache: the kernel's time per key without the bench's
// probes around it, in L2/L3 (a few thousand keys) or from DRAM (128k), for `perf record` and for A/B
// runs of two builds of libattn. 32 query heads over 8 kv heads, d 128, bf16 q, batch 1; an int8 cache
// with one f32 scale per key and kv head (`int8`), the same with quantized_query (`int8+qq`), or a bf16
// cache (`bf16`). Prints the minimum and the median of the calls, and the minimum per key.
//
//   c++ -O2 -std=c++20 -Iinclude -Isrc bench/micro/decode_calls.cpp build/libattn.a -lhwy -fopenmp \
//       -o /tmp/decode_calls
//   /tmp/decode_calls 2048 2000 1 int8      # keys, calls, threads, cache
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/decode.hpp"

namespace {

constexpr std::int64_t kHeads = 32, kKvHeads = 8, kDim = 128;

template <class T, class Draw>
std::vector<T> drawn(std::int64_t n, Draw&& draw) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = draw();
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace attn;
  const std::int64_t keys = argc > 1 ? std::atoll(argv[1]) : 2048, calls = argc > 2 ? std::atoll(argv[2]) : 500;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  const std::string cache_type = argc > 4 ? argv[4] : "int8";
  if (keys < 1 || calls < 1 || threads < 1 ||
      (cache_type != "int8" && cache_type != "int8+qq" && cache_type != "bf16")) {
    std::fprintf(stderr, "usage: decode_calls KEYS CALLS THREADS int8|int8+qq|bf16\n");
    return 2;
  }
  const std::int64_t elems = keys * kKvHeads * kDim;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const auto code = [&] { return static_cast<std::int8_t>(static_cast<int>(rng() % 255) - 127); };
  const auto value = [&] { return bf16_t(unit(rng)); };
  const std::vector<bf16_t> q = drawn<bf16_t>(kHeads * kDim, value);
  std::vector<bf16_t> out(static_cast<std::size_t>(kHeads * kDim));
  std::vector<std::int8_t> k8, v8;
  std::vector<bf16_t> k16, v16;
  const std::vector<float> scales(static_cast<std::size_t>(keys * kKvHeads), 1.0f / 64);
  const std::int32_t seqlen = static_cast<std::int32_t>(keys);
  KVCache cache;
  if (cache_type == "bf16") {
    k16 = drawn<bf16_t>(elems, value);
    v16 = drawn<bf16_t>(elems, value);
    cache.k = TensorView::contiguous(k16.data(), 1, keys, kKvHeads, kDim);
    cache.v = TensorView::contiguous(v16.data(), 1, keys, kKvHeads, kDim);
  } else {
    k8 = drawn<std::int8_t>(elems, code);
    v8 = drawn<std::int8_t>(elems, code);
    cache.k = TensorView::contiguous(k8.data(), 1, keys, kKvHeads, kDim);
    cache.v = TensorView::contiguous(v8.data(), 1, keys, kKvHeads, kDim);
    cache.k_scale = TensorView::contiguous(scales.data(), 1, keys, kKvHeads, 1);
    cache.v_scale = TensorView::contiguous(scales.data(), 1, keys, kKvHeads, 1);
  }
  cache.seqlens = &seqlen;
  AttentionOptions options;
  options.num_threads = threads;
  DecodeOptions decode;
  decode.quantized_query = cache_type == "int8+qq";
  const TensorView qv = TensorView::contiguous(q.data(), 1, 1, kHeads, kDim);
  const TensorView ov = TensorView::contiguous(out.data(), 1, 1, kHeads, kDim);
  std::vector<double> ms;
  for (std::int64_t i = 0; i < calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    attention_decode(qv, cache, ov, options, decode);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%s, %lld keys, %d threads: min %.4f ms, median %.4f ms, %.3f us per key (min)\n", cache_type.c_str(),
              static_cast<long long>(keys), threads, ms.front(), ms[ms.size() / 2], ms.front() * 1000 / keys);
  return 0;
}
