// `attn bench decode`: attention_decode against the machine's read bandwidth, measured in the same run
// at the same thread count.
//
// Decode reads every K and V element of the cache once, so its floor is
//   bytes = 2 x cache_len x kv_heads x head_dim x element bytes   (summed over the batch)
//           + the scales a quantized cache reads per key (int8: 4 bytes per key and kv head, q8_0: 2
//           per 32 elements; fp8's per-kv-head scales: none to speak of)
//   seconds >= bytes / read bandwidth.
// --dtype takes a list (e.g. bf16,int8,q8_0,fp8): each case runs once per cache type, and the table
// gives tokens per second and the speed against the first type of the list, measured in the same run.
// Each case reports the median seconds of attention_decode, its GB/s of KV read, the probe's GB/s
// (read_bandwidth_gbps, mean of one probe right before and one right after the case) and the ratio,
// then the layout probe: the same K and V rows summed in the order the kernel reads them (every key's
// K row and V row, key after key, sequence after sequence) with no other work (rows_read_gbps). The
// sequential probe is the machine's ceiling; the layout probe is the ceiling of this cache layout
// (a paged cache with pages in random order reads slower than one long stream, kernel or not).
// Cases (default): batch 1, 32 heads, 8 kv heads, d = 128 (--head-dim for another), bf16 cache at 32k and 128k keys;
// batch 16 with cache lengths spread geometrically from 1k to 64k in a paged cache (page size 16, pages in a shuffled
// order); each at 1 and 2 threads. --quick: 8k keys and a batch of 4 (1k..8k), in seconds (a smoke test: 32 MiB of
// cache stays partly in a 32 MiB L3, so its layout column reads from cache).
// --cache N: the single batch-1 case at N keys (what bench/peers/peers.py --mode decode runs).
// --layout kv-heads: the cache stored kv-head-major ([batch or page, kv_heads, keys, d], Hugging Face's
// order) through strides instead of flash-attn's [batch or page, keys, kv_heads, d]; the kernels walk
// it key by key as well (walking it kv head by kv head was no faster on Zen 4, docs/decode.md), and the
// layout probe reads its rows in that order.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attn/decode.hpp"
#include "bench_common.hpp"
#include "commands.hpp"
#include "probes.hpp"
#include "units.hpp"

namespace attn::cli {
namespace {

struct Case {
  std::string name;
  std::int64_t batch;
  std::vector<std::int64_t> lengths;  // cache length per sequence
  std::int64_t page_size;             // 0 = contiguous cache
};

struct Args {
  bool quick = false, json = false;
  std::string threads = "1,2", dtype = "bf16", num_splits = "0", seq_q = "1", cache, layout = "keys", head_dim = "128";
  std::int64_t d = 128;  // head_dim, parsed
};

// A cache format: the stored type and, for the quantized ones, the scales' layout (include/attn/decode.hpp):
// groups per (key, kv head) row (0 = one scale per kv head, shared by every key) and their type.
struct Format {
  std::string name;
  DType type;
  std::int64_t groups = 0;
  DType scale_type = DType::f32;
  bool quantized_query = false;  // "+qq": the cache decoded with DecodeOptions::quantized_query
  std::size_t scale_bytes(std::int64_t keys, std::int64_t kv_heads) const {  // read per K or V
    return groups > 0 ? static_cast<std::size_t>(keys * kv_heads * groups) * dtype_size(scale_type) : 0;
  }
};

Format parse_format(const std::string& s, std::int64_t head_dim) {
  if (s.size() > 3 && s.ends_with("+qq")) {
    Format f = parse_format(s.substr(0, s.size() - 3), head_dim);
    if (f.type != DType::i8) throw UsageError("--dtype " + s + ": +qq (quantized_query) needs int8 or q8_0");
    f.name = s;
    f.quantized_query = true;
    return f;
  }
  if (s == "bf16") return {s, DType::bf16};
  if (s == "f16") return {s, DType::f16};
  if (s == "f32") return {s, DType::f32};
  if (s == "int8") return {s, DType::i8, 1, DType::f32};  // one f32 scale per key and kv head
  if (s == "q8_0") {                                      // llama.cpp's blocks of 32
    if (head_dim % 32 != 0)
      throw UsageError("--dtype q8_0: needs a head dim that is a multiple of 32, got " + std::to_string(head_dim));
    return {s, DType::i8, head_dim / 32, DType::f16};
  }
  if (s == "fp8" || s == "fp8_e4m3") return {"fp8_e4m3", DType::fp8_e4m3};  // one scale per kv head
  if (s == "fp8_e5m2") return {s, DType::fp8_e5m2};
  throw UsageError(
      "--dtype: each must be bf16, f16, f32, int8, q8_0, fp8 (= fp8_e4m3), fp8_e5m2, int8+qq or q8_0+qq, got '" + s +
      "'");
}

std::vector<Format> parse_formats(const std::string& s, std::int64_t head_dim) {
  std::vector<Format> r;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) r.push_back(parse_format(item, head_dim));
  if (r.empty()) throw UsageError("--dtype: empty list");
  return r;
}

std::vector<int> parse_threads(const std::string& s) {
  std::vector<int> r;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    const std::int64_t t = parse_count(item, "--threads");
    if (t < 1 || t > 1024) throw UsageError("--threads: each must be in [1, 1024], got " + item);
    r.push_back(static_cast<int>(t));
  }
  if (r.empty()) throw UsageError("--threads: empty list");
  return r;
}

// Lengths from lo to hi, geometric, rounded to a multiple of 16 (the same every run).
std::vector<std::int64_t> spread(std::int64_t n, std::int64_t lo, std::int64_t hi) {
  std::vector<std::int64_t> r;
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = n == 1 ? 0 : static_cast<double>(i) / static_cast<double>(n - 1);
    r.push_back(std::llround(static_cast<double>(lo) * std::pow(static_cast<double>(hi) / lo, x) / 16) * 16);
  }
  return r;
}

// Fills raw storage with pseudo-random values in [-1, 1) of the dtype (fast enough for GBs of cache).
void fill(void* data, std::size_t count, DType t, std::uint64_t seed) {
  const std::size_t nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (std::size_t id = 0; id < nt; ++id)
    pool.emplace_back([=] {
      std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + id * 0xBF58476D1CE4E5B9ull + 1;
      for (std::size_t i = count * id / nt; i < count * (id + 1) / nt; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const float f = static_cast<float>(static_cast<std::int32_t>(x >> 40) - (1 << 23)) / float(1 << 23);
        if (t == DType::f32) {
          static_cast<float*>(data)[i] = f;
        } else if (is_quantized(t)) {  // random codes; fp8 with exponent bit 6 clear: finite, |x| < 2
          static_cast<std::uint8_t*>(data)[i] =
              static_cast<std::uint8_t>(t == DType::i8 ? (x >> 32) : ((x >> 32) & 0xBF));
        } else if (t == DType::bf16) {
          std::uint32_t u;
          std::memcpy(&u, &f, 4);
          static_cast<std::uint16_t*>(data)[i] = static_cast<std::uint16_t>(u >> 16);
        } else {
          const _Float16 h = static_cast<_Float16>(f);
          std::memcpy(static_cast<std::uint16_t*>(data) + i, &h, 2);
        }
      }
    });
  for (auto& th : pool) th.join();
}

struct Buffer {
  std::unique_ptr<unsigned char[]> bytes;
  explicit Buffer(std::size_t n) : bytes(new unsigned char[n]) {}
  void* get() const { return bytes.get(); }
};

// [a, b, c, d] over dense storage; swap_bc: stored as [a, c, b, d] (a kv-head-major cache).
TensorView view4(void* data, DType t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d,
                 bool swap_bc = false) {
  TensorView v;
  v.data = data;
  v.dtype = t;
  v.rank = 4;
  v.shape = {a, b, c, d};
  v.strides = swap_bc ? std::array<std::int64_t, 4>{b * c * d, d, b * d, 1}
                      : std::array<std::int64_t, 4>{b * c * d, c * d, d, 1};
  return v;
}

// A quantized cache's scale view over `rows` cache rows of `slots` keys: dense per-row groups, or one
// scale per kv head (strides 0 over rows and keys). Values 1/64: the codes' dequantized values stay in
// the range of the float formats' random data.
TensorView scale_view(const Format& f, Buffer& buf, std::int64_t rows, std::int64_t slots, std::int64_t kv_heads) {
  const std::int64_t g = std::max<std::int64_t>(f.groups, 1), n = f.groups > 0 ? rows * slots * kv_heads * g : kv_heads;
  for (std::int64_t i = 0; i < n; ++i)
    if (f.scale_type == DType::f16)
      static_cast<std::uint16_t*>(buf.get())[i] = 0x2400;  // 2^-6
    else
      static_cast<float*>(buf.get())[i] = 1.0f / 64;
  TensorView v = view4(buf.get(), f.scale_type, rows, slots, kv_heads, g);
  if (f.groups == 0) v.strides = {0, 0, 1, 0};
  return v;
}

void run_case(const Case& cs, const Args& args, const Format& fmt, const std::vector<int>& threads, std::int64_t splits,
              std::int64_t seq_q, std::vector<double>& first_format_s) {
  const std::int64_t H = 32, HK = 8, D = args.d, B = cs.batch;
  const bool kv_heads_major = args.layout == "kv-heads";
  const DType dt = fmt.type, act = is_quantized(dt) ? DType::bf16 : dt;  // quantized caches: bf16 q and out
  const std::size_t es = dtype_size(dt);
  std::int64_t total_keys = 0, max_len = 0, pages = 0;
  for (auto n : cs.lengths) {
    total_keys += n;
    max_len = std::max(max_len, n);
    if (cs.page_size > 0) pages += (n + cs.page_size - 1) / cs.page_size;
  }
  // The cache: contiguous [B, max_len, HK, D] or paged [pages, page_size, HK, D].
  const std::int64_t rows = cs.page_size > 0 ? pages * cs.page_size : B * max_len;
  const std::size_t elems = static_cast<std::size_t>(rows * HK * D);
  Buffer kbuf(elems * es), vbuf(elems * es), qbuf(static_cast<std::size_t>(B * seq_q * H * D) * dtype_size(act)),
      obuf(static_cast<std::size_t>(B * seq_q * H * D) * dtype_size(act));
  fill(kbuf.get(), elems, dt, 1);
  fill(vbuf.get(), elems, dt, 2);
  fill(qbuf.get(), static_cast<std::size_t>(B * seq_q * H * D), act, 3);
  const std::int64_t slots = cs.page_size > 0 ? cs.page_size : max_len;  // keys per page or sequence
  const std::size_t scale_bytes = fmt.groups > 0 ? fmt.scale_bytes(rows, HK) : HK * sizeof(float);
  Buffer ksbuf(scale_bytes), vsbuf(scale_bytes);
  std::vector<std::int32_t> seqlens(cs.lengths.begin(), cs.lengths.end());
  std::vector<std::int32_t> table;
  KVCache cache;
  cache.seqlens = seqlens.data();
  if (cs.page_size > 0) {
    const std::int64_t max_pages = (max_len + cs.page_size - 1) / cs.page_size;
    std::vector<std::int32_t> order(static_cast<std::size_t>(pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(7));  // a fragmented allocator
    table.assign(static_cast<std::size_t>(B * max_pages), -1);
    std::size_t next = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < (cs.lengths[static_cast<std::size_t>(b)] + cs.page_size - 1) / cs.page_size; ++j)
        table[static_cast<std::size_t>(b * max_pages + j)] = order[next++];
    cache.k = view4(kbuf.get(), dt, pages, cs.page_size, HK, D, kv_heads_major);
    cache.v = view4(vbuf.get(), dt, pages, cs.page_size, HK, D, kv_heads_major);
    cache.block_table = table.data();
    cache.max_pages = max_pages;
  } else {
    cache.k = view4(kbuf.get(), dt, B, max_len, HK, D, kv_heads_major);
    cache.v = view4(vbuf.get(), dt, B, max_len, HK, D, kv_heads_major);
  }
  if (is_quantized(dt)) {
    cache.k_scale = scale_view(fmt, ksbuf, cache.k.shape[0], slots, HK);
    cache.v_scale = scale_view(fmt, vsbuf, cache.k.shape[0], slots, HK);
  }
  const TensorView q = view4(qbuf.get(), act, B, seq_q, H, D), out = view4(obuf.get(), act, B, seq_q, H, D);
  // The K and V rows in the kernel's order, for the layout probe: key after key, each key's rows of all
  // kv heads (one row of kv_heads x d elements, or, kv-head-major, kv_heads rows of d elements).
  const std::size_t head_bytes = static_cast<std::size_t>(D) * es;
  const std::size_t row_bytes = kv_heads_major ? head_bytes : static_cast<std::size_t>(HK) * head_bytes;
  std::vector<const void*> kv_rows;
  kv_rows.reserve(static_cast<std::size_t>(2 * total_keys * (kv_heads_major ? HK : 1)));
  auto add = [&](std::int64_t b, std::int64_t j, std::int64_t g) {
    const std::int64_t page =
        cs.page_size > 0 ? table[static_cast<std::size_t>(b * cache.max_pages + j / cs.page_size)] : b;
    const std::int64_t slot = cs.page_size > 0 ? j % cs.page_size : j;
    const std::size_t off = kv_heads_major ? static_cast<std::size_t>((page * HK + g) * slots + slot) * head_bytes
                                           : static_cast<std::size_t>(page * slots + slot) * row_bytes;
    kv_rows.push_back(static_cast<const unsigned char*>(kbuf.get()) + off);
    kv_rows.push_back(static_cast<const unsigned char*>(vbuf.get()) + off);
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < cs.lengths[static_cast<std::size_t>(b)]; ++j)
      for (std::int64_t g = 0; g < (kv_heads_major ? HK : 1); ++g) add(b, j, g);
  // The bytes decode must read: K and V, and the scales of a quantized cache (per-kv-head ones: none to speak of).
  const double bytes = 2.0 * static_cast<double>(total_keys) * HK * D * static_cast<double>(es) +
                       2.0 * static_cast<double>(fmt.scale_bytes(total_keys, HK));
  const double flops = 4.0 * static_cast<double>(seq_q * total_keys) * H * D;
  DecodeOptions dec;
  dec.num_splits = splits;
  dec.quantized_query = fmt.quantized_query;

  for (std::size_t ti = 0; ti < threads.size(); ++ti) {
    const int t = threads[ti];
    AttentionOptions o;
    o.num_threads = t;
    o.causal = seq_q > 1;
    const double bw_before = read_bandwidth_gbps(t);
    const Timing tm =
        time_it([&] { attention_decode(q, cache, out, o, dec); }, args.quick ? 3 : 7, args.quick ? 0.1 : 1.0, 200);
    const double bw = 0.5 * (bw_before + read_bandwidth_gbps(t));
    const double layout = rows_read_gbps(kv_rows, row_bytes, t);
    const double gbps = bytes / tm.median_s / 1e9, fraction = gbps / bw;
    const double tokens_per_s = static_cast<double>(B * seq_q) / tm.median_s;
    if (first_format_s.size() <= ti) first_format_s.push_back(tm.median_s);
    const double vs_first = first_format_s[ti] / tm.median_s;
    if (args.json) {
      std::printf("%s\n", nlohmann::json{{"kind", "decode"},
                                         {"case", cs.name},
                                         {"batch", B},
                                         {"seq_q", seq_q},
                                         {"seq_k", max_len},
                                         {"total_keys", total_keys},
                                         {"heads", H},
                                         {"kv_heads", HK},
                                         {"head_dim", D},
                                         {"dtype", fmt.name},
                                         {"tokens_per_s", tokens_per_s},
                                         {"speed_vs_first_dtype", vs_first},
                                         {"causal", o.causal},
                                         {"paged", cs.page_size > 0},
                                         {"layout", args.layout},
                                         {"page_size", cs.page_size},
                                         {"threads", t},
                                         {"seconds", tm.median_s},
                                         {"gflops", flops / tm.median_s / 1e9},
                                         {"gbps", gbps},
                                         {"read_bandwidth_gbps", bw},
                                         {"bandwidth_fraction", fraction},
                                         {"layout_read_gbps", layout},
                                         {"layout_fraction", gbps / layout},
                                         {"reps", tm.reps},
                                         {"machine", machine_name()},
                                         {"kernels", kernel_paths()}}
                              .dump()
                              .c_str());
    } else {
      std::printf("%-22s %-8s %7d %10.3f ms %8.1f GB/s %8.1f GB/s %7.0f%% %8.1f GB/s %7.0f%% %9.0f %7.2fx\n",
                  cs.name.c_str(), fmt.name.c_str(), t, tm.median_s * 1e3, gbps, bw, 100 * fraction, layout,
                  100 * gbps / layout, tokens_per_s, vs_first);
    }
    std::fflush(stdout);
  }
}

}  // namespace

void add_bench_decode(CLI::App& bench) {
  auto args = std::make_shared<Args>();
  auto* c = bench.add_subcommand("decode", "One query per sequence over a KV cache, against the read bandwidth");
  c->add_flag("--quick", args->quick, "small cases that run in seconds");
  c->add_flag("--json", args->json, "one JSON object per line");
  c->add_option("--threads", args->threads, "comma-separated thread counts")->capture_default_str();
  c->add_option("--dtype", args->dtype,
                "cache types, comma-separated, compared in one table (the first is the baseline): bf16, f16, f32, "
                "int8 (f32 scale per key and kv head), q8_0 (i8, f16 scale per 32 dims), fp8 = fp8_e4m3, fp8_e5m2 "
                "(one scale per kv head), int8+qq and q8_0+qq (with quantized_query: q as int8 codes); quantized "
                "caches run with bf16 q")
      ->capture_default_str();
  c->add_option("--num-splits", args->num_splits, "key slices per sequence (0 = automatic)")->capture_default_str();
  c->add_option("--seq-q", args->seq_q, "queries per sequence (causal among them when > 1)")->capture_default_str();
  c->add_option("--cache", args->cache, "one case instead of the table: batch 1, a contiguous cache of this many keys");
  c->add_option("--head-dim", args->head_dim, "head dim of q, K and V (1 to 576)")->capture_default_str();
  c->add_option("--layout", args->layout,
                "cache layout: keys ([.., keys, kv_heads, d], flash-attn) or kv-heads ([.., kv_heads, keys, d])")
      ->capture_default_str();
  c->callback([args] {
    args->d = parse_count(args->head_dim, "--head-dim");
    if (args->d < 1 || args->d > 576) throw UsageError("--head-dim: must be in [1, 576]");
    const std::vector<Format> formats = parse_formats(args->dtype, args->d);
    if (args->layout != "keys" && args->layout != "kv-heads")
      throw UsageError("--layout: must be keys or kv-heads, got '" + args->layout + "'");
    const auto threads = parse_threads(args->threads);
    const std::int64_t splits = parse_count(args->num_splits, "--num-splits");
    const std::int64_t seq_q = parse_count(args->seq_q, "--seq-q");
    if (seq_q < 1 || seq_q > 64) throw UsageError("--seq-q: must be in [1, 64]");
    std::vector<Case> cases;
    if (!args->cache.empty()) {
      const std::int64_t n = parse_count(args->cache, "--cache");
      if (n < 1 || n > (std::int64_t{1} << 30)) throw UsageError("--cache: must be in [1, 2^30]");
      cases.push_back({"b1 " + args->cache + " contiguous", 1, {n}, 0});
    } else if (args->quick) {
      cases.push_back({"b1 8k contiguous", 1, {8192}, 0});
      cases.push_back({"b4 1k..8k paged16", 4, spread(4, 1024, 8192), 16});
    } else {
      cases.push_back({"b1 32k contiguous", 1, {32768}, 0});
      cases.push_back({"b1 128k contiguous", 1, {131072}, 0});
      cases.push_back({"b16 1k..64k paged16", 16, spread(16, 1024, 65536), 16});
    }
    if (!args->json) {
      std::printf("attn bench decode: %s; %s; 32 heads, 8 kv heads, d = %lld, cache %s, seq_q = %lld\n",
                  machine_name().c_str(), kernel_paths().c_str(), static_cast<long long>(args->d),
                  args->layout == "keys" ? "[.., keys, kv_heads, d]" : "[.., kv_heads, keys, d]",
                  static_cast<long long>(seq_q));
      std::printf("%-22s %-8s %7s %13s %13s %13s %8s %13s %8s %9s %8s\n", "case", "cache", "threads", "median",
                  "KV read", "probe read", "of probe", "layout read", "of layout", "tokens/s",
                  ("vs " + formats[0].name).c_str());
    }
    for (const auto& cs : cases) {
      std::vector<double> first_format_s;  // per thread count: the first format's median, the ratios' base
      for (const Format& f : formats) run_case(cs, *args, f, threads, splits, seq_q, first_format_s);
    }
  });
}

}  // namespace attn::cli
