// The randomised differential test's vocabulary: a Config (one random valid problem, fully determined
// by a 64-bit seed), the strided buffers it lives in, and the f64 oracle it is checked against.
//
// A config is printed as one line (`describe`) and replayed with ATTN_FUZZ_SEED=<seed>: the seed alone
// regenerates the shapes, options, layouts and data.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "common/accuracy.hpp"
#include "core/element.hpp"

namespace attn::fuzz {

// Memory layout of one rank-4 (or rank-3) view: dims ordered innermost first, each padded; inputs may
// also broadcast (stride 0) over batch or heads.
struct Layout {
  std::array<int, 4> order{3, 2, 1, 0};  // order[0] is the innermost (smallest stride) dim
  std::array<std::int64_t, 4> pad{};     // extra elements added to each dim's stride
  std::int64_t inner = 1;                // stride of the innermost dim
  bool broadcast_batch = false;          // stride[0] = 0 (inputs only)
};

struct Config {
  std::uint64_t seed = 0;
  DType dtype = DType::f32;
  std::int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads = 1, kv_heads = 1, head_dim = 1;
  // v's and out's head dim where it differs from q's and k's (DeepSeek's 192 / 128); 0 = head_dim. The
  // dense forward targets (reference, tiled, split-K) and the backward read it.
  std::int64_t head_dim_v = 0;
  AttentionOptions opts;
  std::vector<float> alibi;  // slopes backing opts.alibi_slopes (rebound by the user of the config)
  std::vector<float> sinks;  // logits backing opts.sinks (rebound likewise, by bind_arrays)
  double amplitude = 1.0;    // q and k entries uniform in [-amplitude, amplitude]; v in [-1, 1]
  bool want_lse = false;
  Layout lq, lk, lv, lout, llse;
  // Per-target knobs.
  TileOptions tiles;
  std::int64_t num_splits = 1;
  int alt_threads = 1;  // a second thread count: results must be bitwise identical
};

inline std::string layout_str(const Layout& l) {
  std::ostringstream s;
  s << "[" << l.order[0] << l.order[1] << l.order[2] << l.order[3] << " pad";
  for (auto p : l.pad) s << " " << p;
  s << " inner " << l.inner << (l.broadcast_batch ? " bcast" : "") << "]";
  return s.str();
}

// The configuration for an entry point without dropout (split-K, decode: inference paths).
inline Config without_dropout(Config c) {
  c.opts.dropout_p = 0;
  return c;
}

inline std::string describe(const Config& c) {
  std::ostringstream s;
  s << "seed=" << c.seed << " dtype=" << dtype_name(c.dtype) << " b=" << c.batch << " sq=" << c.seqlen_q
    << " sk=" << c.seqlen_k << " h=" << c.heads << " hk=" << c.kv_heads << " d=" << c.head_dim
    << " dv=" << (c.head_dim_v ? c.head_dim_v : c.head_dim) << " causal=" << c.opts.causal << " window=("
    << c.opts.window_left << "," << c.opts.window_right << ")"
    << " softcap=" << c.opts.softcap << " alibi=" << (c.alibi.empty() ? "off" : "on")
    << " alibi_bstride=" << c.opts.alibi_batch_stride << " sinks=" << (c.sinks.empty() ? "off" : "on")
    << " scale=" << (c.opts.softmax_scale ? std::to_string(*c.opts.softmax_scale) : "default") << " amp=" << c.amplitude
    << " dropout=" << c.opts.dropout_p << "/" << c.opts.dropout_seed << "/" << c.opts.dropout_offset
    << " threads=" << c.opts.num_threads << "/" << c.alt_threads << " lse=" << c.want_lse
    << " q_tile=" << (c.tiles.q_tile ? std::to_string(*c.tiles.q_tile) : "auto")
    << " k_tile=" << (c.tiles.k_tile ? std::to_string(*c.tiles.k_tile) : "auto") << " splits=" << c.num_splits
    << " layouts q" << layout_str(c.lq) << " k" << layout_str(c.lk) << " v" << layout_str(c.lv) << " out"
    << layout_str(c.lout) << " lse" << layout_str(c.llse);
  return s.str();
}

// splitmix64: decorrelates consecutive seeds.
inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed) {}
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {  // inclusive
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(g_);
  }
  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(g_); }
  bool chance(double p) { return real(0, 1) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<std::size_t>(uniform(0, std::int64_t(v.size()) - 1))];
  }
  std::mt19937_64& engine() { return g_; }

 private:
  std::mt19937_64 g_;
};

// Sizes biased towards the small and the awkward (1, primes, tile edges +-1), sometimes larger.
inline std::int64_t pick_len(Rng& r, std::int64_t max) {
  static const std::vector<std::int64_t> edges = {1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129};
  std::int64_t n = r.chance(0.4) ? r.pick(edges) : r.uniform(1, r.chance(0.8) ? 40 : max);
  return std::min(n, max);
}

inline Layout pick_layout(Rng& r, int rank, bool input) {
  Layout l;
  if (rank == 3) l.order = {2, 1, 0, 3};
  if (r.chance(0.5)) {  // a transposed layout, e.g. [b, h, s, d] or head_dim not innermost
    std::shuffle(l.order.begin(), l.order.begin() + rank, r.engine());
  }
  for (int i = 0; i < rank; ++i) l.pad[i] = r.chance(0.3) ? r.uniform(1, 5) : 0;
  l.inner = r.chance(0.15) ? r.uniform(2, 3) : 1;
  l.broadcast_batch = input && r.chance(0.1);
  return l;
}

// A random valid configuration: the whole feature space, shapes kept small enough that a config and
// its f64 oracle take about a millisecond.
inline Config generate(std::uint64_t seed) {
  Rng r(mix(seed));
  Config c;
  c.seed = seed;
  c.dtype = r.pick(std::vector<DType>{DType::f64, DType::f32, DType::bf16, DType::f16});
  c.head_dim = r.chance(0.3) ? r.pick(std::vector<std::int64_t>{1, 2, 3, 8, 16, 32, 64, 80, 96, 128, 256})
                             : r.uniform(1, r.chance(0.8) ? 24 : 256);
  c.kv_heads = r.uniform(1, 3);
  c.heads = c.kv_heads * r.pick(std::vector<std::int64_t>{1, 1, 2, 3, 4});
  c.batch = r.uniform(1, 3);
  // Budget: batch * heads * seqlen_q * seqlen_k * head_dim multiply-adds, at most ~1.5e6.
  const std::int64_t budget = 1500000 / (c.batch * c.heads * c.head_dim);
  c.seqlen_q = pick_len(r, std::max<std::int64_t>(1, std::min<std::int64_t>(300, budget)));
  c.seqlen_k =
      r.chance(0.05) ? 0 : pick_len(r, std::max<std::int64_t>(1, std::min<std::int64_t>(300, budget / c.seqlen_q)));
  auto& o = c.opts;
  o.causal = r.chance(0.4);
  const std::int64_t span = std::max(c.seqlen_q, c.seqlen_k) + 2;
  // Windows past every key, up to INT64_MAX, mean "unbounded" (docs/robustness.md).
  const auto window = [&] {
    return r.chance(0.1) ? std::numeric_limits<std::int64_t>::max() - r.uniform(0, 2) : r.uniform(0, span);
  };
  if (r.chance(0.3)) o.window_left = window();
  if (r.chance(0.2)) o.window_right = window();
  if (r.chance(0.2)) o.softcap = r.real(0.5, 30);
  if (r.chance(0.2)) o.softmax_scale = r.real(-1.5, 1.5);
  if (r.chance(0.2)) {
    const bool per_batch = r.chance(0.5);
    c.alibi.resize(static_cast<std::size_t>((per_batch ? c.batch : 1) * c.heads));
    for (auto& s : c.alibi) s = static_cast<float>(r.real(0, 1));
    o.alibi_batch_stride = per_batch ? c.heads : 0;
  }
  o.num_threads = static_cast<int>(r.uniform(0, 4));
  c.alt_threads = static_cast<int>(r.uniform(1, 3));
  c.amplitude = r.pick(std::vector<double>{1, 1, 1, 0.01, 3, 8});
  c.want_lse = r.chance(0.6);
  c.lq = pick_layout(r, 4, true);
  c.lk = pick_layout(r, 4, true);
  c.lv = pick_layout(r, 4, true);
  c.lout = pick_layout(r, 4, false);
  c.llse = pick_layout(r, 3, false);
  if (r.chance(0.7)) c.tiles.q_tile = r.uniform(1, c.seqlen_q + 3);
  if (r.chance(0.7)) c.tiles.k_tile = r.uniform(1, c.seqlen_k + 3);
  c.num_splits = r.chance(0.1) ? r.uniform(1, 5000) : r.uniform(1, c.seqlen_k + 4);
  // Dropout, drawn last so that the draws above stay those of earlier versions. Targets of inference
  // paths (split-K, decode) and varlen, whose oracle runs sequences alone, clear it (without_dropout).
  if (r.chance(0.15)) {
    o.dropout_p = r.pick(std::vector<double>{0.1, 0.5, 0.9, r.real(0, 0.99)});
    o.dropout_seed = static_cast<std::uint64_t>(r.engine()());
    o.dropout_offset = static_cast<std::uint64_t>(r.uniform(0, std::numeric_limits<std::uint32_t>::max()));
  }
  // Sinks, drawn after dropout for the same reason: around the logits' range, some heads without one.
  if (r.chance(0.15)) {
    c.sinks.resize(static_cast<std::size_t>(c.heads));
    for (auto& s : c.sinks) s = r.chance(0.2) ? -INFINITY : static_cast<float>(r.real(-4, 6));
  }
  // v's own head dim, drawn last for the same reason.
  if (r.chance(0.2)) c.head_dim_v = r.uniform(1, std::min<std::int64_t>(2 * c.head_dim + 8, 256));
  return c;
}

// Points the options at the config's own arrays (ALiBi slopes, sinks), after a copy of the config.
inline void bind_arrays(Config& c) {
  if (!c.alibi.empty()) c.opts.alibi_slopes = c.alibi;
  if (!c.sinks.empty()) c.opts.sinks = c.sinks;
}

// The rounding slack of the accuracy rule for f32-accumulated types, beyond twice the textbook error, in
// the output and in the LSE (which moves by the weighted mean of its logits' errors): the size of a
// logit's rounding error in an f32 dot product, plus 1e-6. Summing d products rounds d
// times at the size of the partial sums (up to amplitude^2 sqrt(d)), so the error of q.k * scale grows
// like 2^-24 amplitude^2 d |scale|. The textbook method's error is of that size too, but its maximum
// over the output is set by the few rows whose softmax is nearly tied between two keys, so on one draw it
// can fall far below its typical size (a lucky summation order), and "2 x textbook" alone then fails
// kernels that merely sum the dot product in another order. With one rounding of a logit (sqrt(d) in
// place of d) as the slack, one of about 36000 random tiled and split-K configurations failed that way
// (seed 16754286861823771039, tiled: f32, amplitude 8, d = 80, error 4.5e-5 against a tolerance of
// 3.9e-5); with d, the worst of 3341 f32 configurations used 0.30 of its tolerance.
inline double logit_slack(const Config& c) {
  const double scale = std::abs(c.opts.softmax_scale.value_or(1 / std::sqrt(double(c.head_dim))));
  return 1e-6 + std::ldexp(1.0, -24) * c.amplitude * c.amplitude * double(c.head_dim) * scale;
}

// The floor of the forward rule at precision t beyond kForwardFactor x the textbook's error
// (common/accuracy.hpp), in the output: about one unit in the last place of a 16-bit output type (the
// kernel and the textbook may round a value to either side), plus the logits' rounding.
inline double out_floor(const Config& c, DType t) {
  const double ulp = t == DType::bf16 ? std::ldexp(1.0, -8) : t == DType::f16 ? std::ldexp(1.0, -11) : 0;
  return ulp + logit_slack(c);
}

// The same in the lse, which is f32 for every reduced precision: 1e-6 (f32 inputs) or 1e-5 (16-bit
// inputs, whose logits are coarser) of its size lse_mag, plus the logits' rounding.
inline double lse_floor(const Config& c, DType t, double lse_mag) {
  return (t == DType::f32 ? 1e-6 : 1e-5) * lse_mag + logit_slack(c);
}

// "" when `err` meets the accuracy rule at precision t, else what failed: in f64, within kF64Tolerance x
// f64_scale of the oracle; otherwise test::within_textbook_rule(err, textbook_err, factor, floor).
inline std::string rule_verdict(const std::string& what, DType t, double err, double textbook_err, double f64_scale,
                                double floor, double factor = test::kForwardFactor) {
  const bool f64 = t == DType::f64;
  const double tol = f64 ? test::kF64Tolerance * f64_scale : test::textbook_bound(textbook_err, factor, floor);
  if (f64 ? err <= tol : test::within_textbook_rule(err, textbook_err, factor, floor)) return "";
  return what + " error " + std::to_string(err) + " > tolerance " + std::to_string(tol) + " (textbook error " +
         std::to_string(textbook_err) + ")";
}

// Strides for a view of `shape` (rank dims) in layout `l`, and the extent (elements) they span.
inline std::array<std::int64_t, 4> strides_for(const std::array<std::int64_t, 4>& shape, int rank, const Layout& l,
                                               std::int64_t* extent) {
  std::array<std::int64_t, 4> st{0, 0, 0, 0};
  std::int64_t next = l.inner;
  for (int j = 0; j < rank; ++j) {
    const int i = l.order[j];
    st[i] = next;
    next = next * std::max<std::int64_t>(shape[i], 1) + l.pad[i];
  }
  if (l.broadcast_batch && rank == 4) st[0] = 0;
  std::int64_t max_off = 0;
  for (int i = 0; i < rank; ++i) max_off += (std::max<std::int64_t>(shape[i], 1) - 1) * st[i];
  *extent = max_off + 1;
  if (rank == 3) st[3] = 1;
  return st;
}

}  // namespace attn::fuzz
