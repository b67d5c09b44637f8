// Randomised differential test: random valid configurations (tests/differential/case.hpp) run through every
// entry point ("target") and checked against the f64 oracle with the accuracy rule of docs/STANDARDS.md
// (tests/common/accuracy.hpp):
//   f64: within 1e-12 of the oracle;  f32/bf16/f16: error <= 2 x the textbook method's error at the
//   same precision (+ a rounding slack of about one unit in the last place of the output type).
// Besides accuracy, each run checks: no NaN where the oracle is finite; fully masked rows give out = 0,
// lse = -inf; nothing is written outside the output views (the padding of strided outputs keeps its
// sentinel bytes); a second thread count gives bitwise identical results; the reference on strided
// views equals the reference on dense copies bit for bit.
// On a CPU with AVX512-BF16, each configuration's bf16 kernels take the dot products or widen, drawn
// from its seed, so both paths are fuzzed whatever the CPU's default (printed with a failure).
//
// The work is fixed, not the time: each target runs ATTN_FUZZ_RUNS configurations from a fixed stream
// of seeds, so a run is the same on a fast machine and on a loaded one, and a failure in CI fails again
// when the same command is run anywhere.
// Environment:
//   ATTN_FUZZ_RUNS       configurations per target (default 200; a third for the AMX targets on the emulator)
//   ATTN_FUZZ_SEED       replay exactly one configuration (printed with every failure) on each target
//   ATTN_FUZZ_BASE_SEED  start each target's stream at this seed, or `random` for a fresh stream (printed);
//                        default: a fixed seed per target
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backward_target.hpp"
#include "buffers.hpp"
#include "case.hpp"
#include "amx/amx.hpp"
#include "amx_reference.hpp"
#include "cpu/dpbf16.hpp"
#include "decode_quant_target.hpp"
#include "decode_target.hpp"
#include "varlen_target.hpp"

namespace attn::fuzz {
namespace {

// How an entry point is called on the config's strided views; `threads` overrides opts.num_threads.
using Runner = std::function<void(const Config&, const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView* lse, int threads)>;

// The error against the oracle of PyTorch's math attention at precision T (bf16 or f16: P rounded to T), the
// baseline of flash-attn's rule for a path that rounds P (the AMX forward); 0 where T is wider, or where
// that reference overflows T (its scores are T: a baseline of Inf would accept anything).
template <class T>
double math_reference_error(const Config& c, const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v,
                            const std::vector<double>& oracle) {
  if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) {
    const std::int64_t DV = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim;
    auto tensor = [](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, const std::vector<T>& x) {
      test::Tensor<T> t(b, s, h, d);
      t.data = x;
      return t;
    };
    const double e = test::max_error(test::math_reference<T>(tensor(c.batch, c.seqlen_q, c.heads, c.head_dim, q),
                                                             tensor(c.batch, c.seqlen_k, c.kv_heads, c.head_dim, k),
                                                             tensor(c.batch, c.seqlen_k, c.kv_heads, DV, v), c.opts),
                                     oracle);
    return std::isfinite(e) ? e : 0.0;
  } else {
    return 0.0;
  }
}

// Runs one dense-layout target on one config. Returns "" or what went wrong. rounds_p: the target rounds P
// to T (the AMX forward), so its baseline is also the math reference's error (math_reference_error).
template <class T>
std::string check_dense(Config c, const Runner& run, bool bitwise_textbook, bool rounds_p = false) {
  const DType t = dtype_of<T>();
  const DType lt = t == DType::f64 ? DType::f64 : DType::f32;
  bind_arrays(c);
  Rng r(mix(c.seed) ^ 0x5eed);
  Buffer q = make_buffer(t, {c.batch, c.seqlen_q, c.heads, c.head_dim}, 4, c.lq);
  Buffer k = make_buffer(t, {c.batch, c.seqlen_k, c.kv_heads, c.head_dim}, 4, c.lk);
  const std::int64_t DV = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim;
  Buffer v = make_buffer(t, {c.batch, c.seqlen_k, c.kv_heads, DV}, 4, c.lv);
  fill_random<T>(q, r, c.amplitude);
  fill_random<T>(k, r, c.amplitude);
  fill_random<T>(v, r, 1.0);
  // The logical values (a broadcast view repeats its data), dense, in f64 and in T.
  const auto q64 = read<T>(q), k64 = read<T>(k), v64 = read<T>(v);
  auto dense = [](std::int64_t a, std::int64_t b, std::int64_t h, std::int64_t d, auto* p) {
    return TensorView::contiguous(p, a, b, h, d);
  };
  std::vector<T> qT(q64.size()), kT(k64.size()), vT(v64.size());
  for (std::size_t i = 0; i < q64.size(); ++i) qT[i] = detail::store<T>(q64[i]);
  for (std::size_t i = 0; i < k64.size(); ++i) kT[i] = detail::store<T>(k64[i]);
  for (std::size_t i = 0; i < v64.size(); ++i) vT[i] = detail::store<T>(v64[i]);
  const std::int64_t B = c.batch, SQ = c.seqlen_q, SK = c.seqlen_k, H = c.heads, HK = c.kv_heads, D = c.head_dim;
  const auto nrows = static_cast<std::size_t>(B * H * SQ);

  std::vector<double> oracle(static_cast<std::size_t>(B * SQ * H * DV)), oracle_lse(nrows);
  {
    const TensorView ol = TensorView::contiguous(oracle_lse.data(), B, H, SQ);
    attention_reference(dense(B, SQ, H, D, q64.data()), dense(B, SK, HK, D, k64.data()),
                        dense(B, SK, HK, DV, v64.data()), dense(B, SQ, H, DV, oracle.data()), c.opts, &ol);
  }
  using A = detail::Acc<T>;
  std::vector<T> text(oracle.size());
  std::vector<A> text_lse(nrows);
  {
    const TensorView tl = TensorView::contiguous(text_lse.data(), B, H, SQ);
    attention_reference(dense(B, SQ, H, D, qT.data()), dense(B, SK, HK, D, kT.data()), dense(B, SK, HK, DV, vT.data()),
                        dense(B, SQ, H, DV, text.data()), c.opts, &tl);
  }
  std::vector<double> text64(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) text64[i] = detail::load<double>(text[i]);

  auto run_into = [&](int threads, Buffer& out, Buffer& lse) {
    run(c, q.view, k.view, v.view, out.view, c.want_lse ? &lse.view : nullptr, threads);
  };
  Buffer out = make_buffer(t, {B, SQ, H, DV}, 4, c.lout), lse = make_buffer(lt, {B, H, SQ, 1}, 3, c.llse);
  run_into(c.opts.num_threads, out, lse);
  Notes fail;
  fail.writes(out, lse, c.want_lse);
  const auto got = read<T>(out);
  double base = test::max_error(text64, oracle);
  if (rounds_p) base = std::max(base, math_reference_error<T>(c, qT, kT, vT, oracle));
  fail.add(rule_verdict("out", t, test::max_error(got, oracle), base, std::max(1.0, test::max_magnitude(oracle)),
                        out_floor(c, t)));
  if (c.want_lse) {
    const double lse_mag = 1 + test::max_magnitude(oracle_lse);
    fail.add(rule_verdict("lse", t, test::max_error(read_values(lse), oracle_lse),
                          test::max_error(text_lse, oracle_lse), lse_mag, lse_floor(c, t, lse_mag)));
  }
  if (bitwise_textbook && std::memcmp(got.data(), text64.data(), got.size() * sizeof(double)) != 0)
    fail.add("strided result differs from the dense result");
  // The thread count must not change a single bit.
  Buffer out2 = make_buffer(t, {B, SQ, H, DV}, 4, c.lout), lse2 = make_buffer(lt, {B, H, SQ, 1}, 3, c.llse);
  run_into(c.alt_threads, out2, lse2);
  fail.thread_bits(out2.bytes == out.bytes && lse2.bytes == lse.bytes, c);
  return fail.text;
}

std::string check(const Config& c, const Runner& run, bool bitwise_textbook, bool rounds_p = false) {
  return detail::dispatch_dtype(c.dtype, [&]<class T>() { return check_dense<T>(c, run, bitwise_textbook, rounds_p); });
}

// ---- Targets: one per public entry point. Each is a name and a function from a config to a verdict.
struct Target {
  const char* name;
  std::function<std::string(const Config&)> check;
};

std::vector<Target> targets() {
  std::vector<Target> t;
  t.push_back({"reference", [](const Config& c) {
                 return check(
                     c,
                     [](const Config& c, auto& q, auto& k, auto& v, auto& o, auto* l, int th) {
                       AttentionOptions opts = c.opts;
                       opts.num_threads = th;
                       attention_reference(q, k, v, o, opts, l);
                     },
                     true);
               }});
  t.push_back({"tiled", [](const Config& c) {
                 return check(
                     c,
                     [](const Config& c, auto& q, auto& k, auto& v, auto& o, auto* l, int th) {
                       AttentionOptions opts = c.opts;
                       opts.num_threads = th;
                       attention_tiled(q, k, v, o, opts, c.tiles, l);
                     },
                     false);
               }});
  // The tiled forward on AMX tiles (tiled/amx_kernel.cpp): f16 configurations as f16 (TDPFP16PS), f32 as
  // f32 split into bf16 parts (ATTN_AMX_F32=bf16x3: held to the f32 textbook's rule, P is not rounded), the
  // rest as bf16, on the CPU's tiles where usable (unless ATTN_AMX=emulate asks for the emulator; f16 where
  // the CPU lacks AMX-FP16 runs on the vector kernel), else on the emulator; dropout included.
  t.push_back({"tiled_amx", [](const Config& c) {
                 Config b = c;
                 b.dtype = c.dtype == DType::f16 || c.dtype == DType::f32 ? c.dtype : DType::bf16;
                 return check(
                     b,
                     [](const Config& c, auto& q, auto& k, auto& v, auto& o, auto* l, int th) {
                       const char* amx = std::getenv("ATTN_AMX");
                       const bool tiles = detail::amx_support().usable() && !(amx && std::string(amx) == "emulate");
                       const test::ScopedAmxEnv amx_env{std::string(tiles ? "on" : "emulate")};
                       const test::ScopedEnv f32_env{"ATTN_AMX_F32", std::string("bf16x3")};
                       AttentionOptions opts = c.opts;
                       opts.num_threads = th;
                       attention_tiled(q, k, v, o, opts, c.tiles, l);
                     },
                     false, b.dtype != DType::f32);
               }});
  t.push_back({"splitk", [](const Config& c) {
                 return check(
                     without_dropout(c),
                     [](const Config& c, auto& q, auto& k, auto& v, auto& o, auto* l, int th) {
                       AttentionOptions opts = c.opts;
                       opts.num_threads = th;
                       SplitKOptions s;
                       s.num_splits = c.num_splits;
                       attention_splitk(q, k, v, o, opts, s, l);
                     },
                     false);
               }});
  // Varlen: a packed batch with cu_seqlens (empty sequences included), each sequence against the oracle
  // on its own rows (tests/differential/varlen_target.hpp).
  // (Without dropout: its oracle runs each sequence alone, as batch 0, while sequence b draws batch b's
  // mask; test_dropout checks that mapping.)
  t.push_back({"varlen", [](const Config& c) { return check_varlen_any(without_dropout(c)); }});
  // Decode over contiguous and paged KV caches, with k_new/v_new appends (tests/differential/decode_target.hpp).
  t.push_back({"decode", [](const Config& c) { return check_decode_any(without_dropout(c), false); }});
  t.push_back({"decode_paged", [](const Config& c) { return check_decode_any(without_dropout(c), true); }});
  // Decode over quantized caches (i8, fp8; every scale layout), with appends (decode_quant_target.hpp).
  t.push_back({"decode_quant", [](const Config& c) { return check_decode_quantized_any(without_dropout(c), false); }});
  t.push_back(
      {"decode_quant_paged", [](const Config& c) { return check_decode_quantized_any(without_dropout(c), true); }});
  // The backward pass: dq, dk, dv against the f64 textbook backward (tests/differential/backward_target.hpp).
  t.push_back({"backward", [](const Config& c) { return check_backward_any(c); }});
  t.push_back({"backward_amx", [](const Config& c) { return check_backward_amx(c); }});
  return t;
}

std::int64_t env_runs(const char* name, std::int64_t fallback) {
  const char* s = std::getenv(name);
  return s && *s ? std::max<std::int64_t>(1, std::strtoll(s, nullptr, 0)) : fallback;
}

// Where the CPU has no AMX tiles (CI's machines, the AArch64 run) the AMX targets run on the tile emulator:
// about 70 ms a configuration in the release build, where backward_amx was the suite's longest test (146 s
// of 2000 configurations), and seconds under the sanitizers. There they run a third of the configurations
// (at least 5); on a CPU with tiles, all of them on the tiles. The emulator's own tests
// (test_amx_emulator) check it against the tile instructions' definitions.
std::int64_t runs_of(std::string_view target, std::int64_t runs) {
  if (target.ends_with("_amx") && !detail::amx_support().usable()) return std::max<std::int64_t>(5, runs / 3);
  return runs;
}

// The first seed of a target's stream: fixed per target by default (a hash of its name, so the targets
// draw different configurations), or as asked.
std::uint64_t base_seed(const char* name) {
  const char* s = std::getenv("ATTN_FUZZ_BASE_SEED");
  if (s && std::string(s) == "random") return std::uint64_t{std::random_device{}()} << 32;
  if (s && *s) return std::strtoull(s, nullptr, 0);
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* c = name; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  return h >> 16;
}

void fuzz_target(const char* name) {
  const auto all = targets();
  const Target* target = nullptr;
  for (const auto& t : all)
    if (std::string(t.name) == name) target = &t;
  ASSERT_NE(target, nullptr);
  auto run_one = [&](std::uint64_t seed) -> bool {
    const Config c = generate(seed);
    // On a CPU with AVX512-BF16 the bf16 kernels run on the dot products or widened, drawn from the
    // seed (a replay takes the same path), whatever the CPU's default (cpu/dpbf16.hpp).
    const int dots = detail::cpu_has_avx512bf16() ? static_cast<int>(mix(seed ^ 0xd07) & 1) : -1;
    detail::force_bf16_dots(dots);
    std::string verdict;
    try {
      verdict = target->check(c);
    } catch (const std::exception& e) {
      verdict = std::string("threw on a valid configuration: ") + e.what();
    }
    detail::force_bf16_dots(-1);
    if (verdict.empty()) return true;
    ADD_FAILURE() << name << ": " << verdict << "\n  config: " << describe(c)
                  << (dots < 0 ? ""
                      : dots   ? " bf16_dots=on"
                               : " bf16_dots=off")
                  << "\n  replay: ATTN_FUZZ_SEED=" << seed << " "
                  << "test_differential --gtest_filter='*" << name << "*'";
    return false;
  };
  if (const char* s = std::getenv("ATTN_FUZZ_SEED"); s && *s) {
    run_one(std::strtoull(s, nullptr, 0));
    return;
  }
  const std::int64_t wanted = runs_of(name, env_runs("ATTN_FUZZ_RUNS", 200));
  std::uint64_t seed = base_seed(name);
  const std::uint64_t first = seed;
  const auto start = std::chrono::steady_clock::now();  // reported, never a limit
  int runs = 0, failures = 0;
  while (runs < wanted) {
    failures += !run_one(seed++);
    ++runs;
    if (failures >= 5) break;  // enough to act on; keeps the log readable
  }
  std::printf("[ fuzz ] %s: %d configurations in %.1f s (seeds %llu..%llu), %d failed\n", name, runs,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
              static_cast<unsigned long long>(first), static_cast<unsigned long long>(seed - 1), failures);
}

TEST(Differential, Reference) { fuzz_target("reference"); }
TEST(Differential, Tiled) { fuzz_target("tiled"); }
TEST(Differential, TiledAmx) { fuzz_target("tiled_amx"); }
TEST(Differential, Splitk) { fuzz_target("splitk"); }
TEST(Differential, Varlen) { fuzz_target("varlen"); }
TEST(Differential, Decode) { fuzz_target("decode"); }
TEST(Differential, DecodePaged) { fuzz_target("decode_paged"); }
TEST(Differential, DecodeQuantized) { fuzz_target("decode_quant"); }
TEST(Differential, DecodeQuantizedPaged) { fuzz_target("decode_quant_paged"); }
TEST(Differential, Backward) { fuzz_target("backward"); }
TEST(Differential, BackwardAmx) { fuzz_target("backward_amx"); }

// The test can fail: a kernel whose scale is off by 0.1 % is caught on most configurations.
TEST(Differential, CatchesABrokenKernel) {
  int caught = 0;
  const int n = 40;
  for (std::uint64_t s = 0; s < n; ++s)
    caught += !check(
                   generate(s),
                   [](const Config& c, auto& q, auto& k, auto& v, auto& o, auto* l, int th) {
                     AttentionOptions opts = c.opts;
                     opts.num_threads = th;
                     opts.softmax_scale = opts.softmax_scale.value_or(1 / std::sqrt(double(c.head_dim))) * 1.001;
                     attention_tiled(q, k, v, o, opts, c.tiles, l);
                   },
                   false)
                   .empty();
  EXPECT_GT(caught, n / 2) << "the accuracy rule let a 0.1 % scale error through on " << n - caught << " of " << n;
}

// The generator itself: a seed determines the configuration, and configurations cover the space.
TEST(Differential, SeedsReplay) {
  EXPECT_EQ(describe(generate(12345)), describe(generate(12345)));
  int causal = 0, lowp = 0, strided = 0, gqa = 0, empty_k = 0;
  for (std::uint64_t s = 0; s < 2000; ++s) {
    const Config c = generate(s);
    causal += c.opts.causal;
    lowp += c.dtype == DType::bf16 || c.dtype == DType::f16;
    strided += c.lq.order != Layout{}.order;
    gqa += c.heads != c.kv_heads;
    empty_k += c.seqlen_k == 0;
  }
  EXPECT_GT(causal, 400);
  EXPECT_GT(lowp, 600);
  EXPECT_GT(strided, 400);
  EXPECT_GT(gqa, 400);
  EXPECT_GT(empty_k, 20);
}

}  // namespace
}  // namespace attn::fuzz
