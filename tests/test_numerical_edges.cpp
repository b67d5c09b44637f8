// Numerical edges, for every algorithm and element type: huge and equal logits, fully masked rows,
// empty key sets, non-finite inputs (what the row gets, and that it stays in that row), denormals,
// d = 1 / seqlen 1, and indices past the int32 range (handled with int64, never wrapped).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>

#include "attn/decode.hpp"
#include "attn/varlen.hpp"
#include "core/element.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;
using test::Tensor;

// One call of an algorithm: the name and how it is invoked (tile sizes / split counts varied).
struct Algo {
  std::string name;
  std::function<void(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                     const AttentionOptions&, const TensorView*)>
      call;
};

std::vector<Algo> algos() {
  std::vector<Algo> a;
  a.push_back({"reference",
               [](auto& q, auto& k, auto& v, auto& o, auto& op, auto* l) { attention_reference(q, k, v, o, op, l); }});
  for (std::int64_t tile : {1, 3, 64}) {
    a.push_back({"tiled/" + std::to_string(tile), [tile](auto& q, auto& k, auto& v, auto& o, auto& op, auto* l) {
                   TileOptions t;
                   t.q_tile = tile;
                   t.k_tile = tile;
                   attention_tiled(q, k, v, o, op, t, l);
                 }});
  }
  for (std::int64_t s : {1, 3, 1000}) {
    a.push_back({"splitk/" + std::to_string(s), [s](auto& q, auto& k, auto& v, auto& o, auto& op, auto* l) {
                   SplitKOptions sp;
                   sp.num_splits = s;
                   attention_splitk(q, k, v, o, op, sp, l);
                 }});
  }
  // Decode over a contiguous cache holding all seqlen_k keys (seqlen_q queries, causal among them).
  for (std::int64_t s : {0, 1, 1000}) {
    a.push_back({"decode/" + std::to_string(s), [s](auto& q, auto& k, auto& v, auto& o, auto& op, auto* l) {
                   std::vector<std::int32_t> seqlens(static_cast<std::size_t>(q.shape[0]),
                                                     static_cast<std::int32_t>(k.shape[1]));
                   KVCache cache;
                   cache.k = k;
                   cache.v = v;
                   cache.seqlens = seqlens.data();
                   DecodeOptions dec;
                   dec.num_splits = s;
                   attention_decode(q, cache, o, op, dec, l);
                 }});
  }
  return a;
}

template <class T>
using LseT = detail::Acc<T>;

// Runs `a` on dense tensors; returns out (as double) and lse.
template <class T>
std::pair<std::vector<double>, std::vector<double>> run(const Algo& a, const Tensor<T>& q, const Tensor<T>& k,
                                                        const Tensor<T>& v, const AttentionOptions& o = {}) {
  std::vector<T> out(q.data.size());
  std::vector<LseT<T>> lse(static_cast<std::size_t>(q.b * q.h * q.s));
  const TensorView lv = TensorView::contiguous(lse.data(), q.b, q.h, q.s);
  a.call(q.view(), k.view(), v.view(), TensorView::contiguous(out.data(), q.b, q.s, q.h, q.d), o, &lv);
  std::vector<double> o64(out.size()), l64(lse.begin(), lse.end());
  for (std::size_t i = 0; i < out.size(); ++i) o64[i] = detail::load<double>(out[i]);
  return {o64, l64};
}

template <class T>
Tensor<T> filled(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, double x) {
  Tensor<T> t(b, s, h, d);
  for (auto& e : t.data) e = detail::store<T>(x);
  return t;
}

template <class T>
class Edges : public ::testing::Test {};
using Types = ::testing::Types<double, float, bf16_t, f16_t>;
TYPED_TEST_SUITE(Edges, Types);

// Logits of +-1e4: q rows are s_i * 50, k rows t_j * 50 (exact in every type), d = 4, scale 1, so
// q.k = +-1e4 exactly. Two key patterns: mixed signs (the max dominates), and all -1e4 (every exp
// would underflow without the max subtraction: the output is the mean of v).
TYPED_TEST(Edges, HugeLogitsNeitherOverflowNorNaN) {
  using T = TypeParam;
  const std::int64_t SQ = 6, SK = 9, D = 4;
  for (bool all_negative : {false, true}) {
    Tensor<T> q(1, SQ, 1, D), k(1, SK, 1, D);
    for (std::int64_t i = 0; i < SQ; ++i)
      for (std::int64_t c = 0; c < D; ++c) q.at(0, i, 0, c) = detail::store<T>(all_negative || i % 2 ? 50.0 : -50.0);
    for (std::int64_t j = 0; j < SK; ++j)
      for (std::int64_t c = 0; c < D; ++c) k.at(0, j, 0, c) = detail::store<T>(!all_negative && j % 3 ? 50.0 : -50.0);
    const auto v = random_tensor<T>(1, SK, 1, D, 7);
    AttentionOptions o;
    o.softmax_scale = 1.0;
    const auto [want, want_lse] = run(algos()[0], test::to_f64(q), test::to_f64(k), test::to_f64(v), o);
    for (double l : want_lse) ASSERT_GE(std::abs(l), 9990.0) << "the test must reach |logit| ~ 1e4";
    for (const auto& a : algos()) {
      const auto [out, lse] = run(a, q, k, v, o);
      for (std::size_t i = 0; i < out.size(); ++i) {
        ASSERT_TRUE(std::isfinite(out[i])) << a.name;
        EXPECT_NEAR(out[i], want[i], sizeof(T) == 2 ? 1e-2 : 1e-6) << a.name << " element " << i;
      }
      for (std::size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], want_lse[i], 1e-2) << a.name;
    }
  }
}

// Equal logits: the output is the plain mean of the visible values and lse = log(visible) + logit.
TYPED_TEST(Edges, AllEqualLogitsGiveTheMean) {
  using T = TypeParam;
  const std::int64_t SQ = 5, SK = 7, D = 3;
  const auto q = filled<T>(1, SQ, 2, D, 0.5), k = filled<T>(1, SK, 2, D, 0.25);
  const auto v = random_tensor<T>(1, SK, 2, D, 3);
  const double logit = 0.5 * 0.25 * D / std::sqrt(double(D));
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    for (const auto& a : algos()) {
      const auto [out, lse] = run(a, q, k, v, o);
      for (std::int64_t i = 0; i < SQ; ++i)
        for (std::int64_t h = 0; h < 2; ++h) {
          const std::int64_t n = causal ? i + SK - SQ + 1 : SK;
          for (std::int64_t c = 0; c < D; ++c) {
            double mean = 0;
            for (std::int64_t j = 0; j < n; ++j)
              mean += detail::load<double>(v.data[static_cast<std::size_t>((j * 2 + h) * D + c)]);
            mean /= double(n);
            EXPECT_NEAR(out[static_cast<std::size_t>((i * 2 + h) * D + c)], mean, sizeof(T) == 2 ? 1e-2 : 1e-6)
                << a.name;
          }
          EXPECT_NEAR(lse[static_cast<std::size_t>(h * SQ + i)], logit + std::log(double(n)), 1e-5) << a.name;
        }
    }
  }
}

// Rows that see no key (causal with seqlen_q > seqlen_k, or a window past the keys) and seqlen_k = 0:
// out = 0 and lse = -inf, never NaN, for every algorithm.
TYPED_TEST(Edges, FullyMaskedRowsAndNoKeys) {
  using T = TypeParam;
  const auto q = random_tensor<T>(2, 8, 2, 5, 1);
  struct Case {
    std::int64_t sk;
    bool causal;
    std::int64_t wl, wr;
  };
  for (const Case cs : {Case{4, true, -1, -1}, Case{6, false, 0, 0}, Case{3, false, -1, 0}, Case{0, false, -1, -1},
                        Case{0, true, 2, 2}}) {
    const auto k = random_tensor<T>(2, cs.sk, 2, 5, 2), v = random_tensor<T>(2, cs.sk, 2, 5, 3);
    AttentionOptions o;
    o.causal = cs.causal;
    o.window_left = cs.wl;
    o.window_right = cs.wr;
    if (cs.wl == 0 && cs.wr == 0) o.window_left = -1, o.window_right = 0, o.causal = false;  // plain causal by window
    for (const auto& a : algos()) {
      const auto [out, lse] = run(a, q, k, v, o);
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t i = 0; i < 8; ++i) {
          const std::int64_t diag = i + cs.sk - 8;
          const bool masked = cs.sk == 0 || ((o.causal || o.window_right == 0) && diag < 0);
          for (std::int64_t h = 0; h < 2; ++h) {
            const double l = lse[static_cast<std::size_t>((b * 2 + h) * 8 + i)];
            ASSERT_FALSE(std::isnan(l)) << a.name;
            if (!masked) {
              EXPECT_TRUE(std::isfinite(l)) << a.name;
              continue;
            }
            EXPECT_EQ(l, -INFINITY) << a.name << " sk " << cs.sk << " row " << i;
            for (std::int64_t c = 0; c < 5; ++c)
              EXPECT_EQ(out[static_cast<std::size_t>(((b * 8 + i) * 2 + h) * 5 + c)], 0.0) << a.name;
          }
        }
    }
  }
  // seqlen_k = 0 needs no key data at all.
  std::vector<T> out(q.data.size());
  const TensorView nk = TensorView::contiguous<T>(nullptr, 2, 0, 2, 5);
  attention_tiled(q.view(), nk, nk, TensorView::contiguous(out.data(), 2, 8, 2, 5));
  for (const T& x : out) EXPECT_EQ(detail::load<double>(x), 0.0);
}

// d = 1 and a single key: the output is that key's value exactly and lse its score, in every type.
TYPED_TEST(Edges, HeadDimOneSeqlenOne) {
  using T = TypeParam;
  const auto q = random_tensor<T>(3, 1, 2, 1, 4), k = random_tensor<T>(3, 1, 1, 1, 5),
             v = random_tensor<T>(3, 1, 1, 1, 6);
  for (const auto& a : algos()) {
    const auto [out, lse] = run(a, q, k, v);
    for (std::int64_t b = 0; b < 3; ++b)
      for (std::int64_t h = 0; h < 2; ++h) {
        EXPECT_EQ(out[static_cast<std::size_t>(b * 2 + h)], detail::load<double>(v.data[static_cast<std::size_t>(b)]))
            << a.name;
        const double s = detail::load<double>(q.data[static_cast<std::size_t>(b * 2 + h)]) *
                         detail::load<double>(k.data[static_cast<std::size_t>(b)]);
        EXPECT_NEAR(lse[static_cast<std::size_t>(b * 2 + h)], s, 1e-6) << a.name;
      }
  }
  // d = 1 with many keys agrees with the f64 oracle.
  const auto q2 = random_tensor<T>(1, 17, 1, 1, 7), k2 = random_tensor<T>(1, 33, 1, 1, 8),
             v2 = random_tensor<T>(1, 33, 1, 1, 9);
  const auto [want, wl] = run(algos()[0], test::to_f64(q2), test::to_f64(k2), test::to_f64(v2));
  for (const auto& a : algos()) {
    const auto [out, lse] = run(a, q2, k2, v2);
    for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want[i], sizeof(T) == 2 ? 1e-2 : 1e-6) << a.name;
  }
}

// Subnormal inputs: q and k subnormal give logits ~0 (the mean of v); v subnormal gives subnormal
// outputs, not zeros (no flush-to-zero) and no NaN. The vector kernels: the AMX path reads subnormal
// bf16 as zero, as TDPBF16PS does (test_amx_forward.cpp, SubnormalValuesReadAsZero).
TYPED_TEST(Edges, Denormals) {
  using T = TypeParam;
  const test::ScopedAmxEnv vector_kernels{std::string("off")};
  const double tiny = std::is_same_v<T, double> ? 1e-310 : std::is_same_v<T, f16_t> ? 3e-6 : 1e-39;
  ASSERT_NE(detail::load<double>(detail::store<T>(tiny)), 0.0);
  const auto q = filled<T>(1, 4, 1, 8, tiny), k = filled<T>(1, 6, 1, 8, -tiny);
  auto v = random_tensor<T>(1, 6, 1, 8, 10);
  for (const auto& a : algos()) {
    const auto [out, lse] = run(a, q, k, v);
    for (std::int64_t c = 0; c < 8; ++c) {
      double mean = 0;
      for (std::int64_t j = 0; j < 6; ++j)
        mean += detail::load<double>(v.data[static_cast<std::size_t>(j * 8 + c)]) / 6;
      EXPECT_NEAR(out[static_cast<std::size_t>(c)], mean, sizeof(T) == 2 ? 1e-2 : 1e-6) << a.name;
    }
    for (double l : lse) EXPECT_NEAR(l, std::log(6.0), 1e-6) << a.name;
  }
  const auto vt = filled<T>(1, 6, 1, 8, tiny);
  const double want = detail::load<double>(detail::store<T>(tiny));
  for (const auto& a : algos()) {
    const auto [out, lse] = run(a, random_tensor<T>(1, 4, 1, 8, 11), random_tensor<T>(1, 6, 1, 8, 12), vt);
    for (double x : out) {
      EXPECT_GT(x, 0.0) << a.name << ": a subnormal value flushed to zero";
      EXPECT_NEAR(x, want, want * 0.5) << a.name;
    }
  }
}

// ---- Non-finite inputs. A NaN or an infinity in one input row may only affect the output rows that
// read it: a q row its own output row; a k or v row the rows of its batch and kv-head group that see
// that key. Every other output row must be bit-identical to the run without it.
template <class T>
void expect_confined(const char* what, const std::function<void(Tensor<T>&, Tensor<T>&, Tensor<T>&)>& poison,
                     const std::function<bool(std::int64_t b, std::int64_t i, std::int64_t h)>& may_change,
                     const AttentionOptions& o) {
  const std::int64_t B = 2, SQ = 6, SK = 6, H = 4, HK = 2, D = 3;
  auto q = random_tensor<T>(B, SQ, H, D, 21), k = random_tensor<T>(B, SK, HK, D, 22),
       v = random_tensor<T>(B, SK, HK, D, 23);
  for (const auto& a : algos()) {
    const auto [clean, clean_lse] = run(a, q, k, v, o);
    auto q2 = q, k2 = k, v2 = v;
    poison(q2, k2, v2);
    const auto [out, lse] = run(a, q2, k2, v2, o);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < SQ; ++i)
        for (std::int64_t h = 0; h < H; ++h) {
          if (may_change(b, i, h)) continue;
          for (std::int64_t c = 0; c < D; ++c) {
            const auto at = static_cast<std::size_t>(((b * SQ + i) * H + h) * D + c);
            EXPECT_EQ(std::memcmp(&out[at], &clean[at], sizeof(double)), 0)
                << a.name << ": " << what << " leaked into row (b " << b << ", i " << i << ", h " << h
                << "): " << out[at] << " vs " << clean[at];
          }
          const auto l = static_cast<std::size_t>((b * H + h) * SQ + i);
          EXPECT_EQ(std::memcmp(&lse[l], &clean_lse[l], sizeof(double)), 0)
              << a.name << ": " << what << " leaked into lse";
        }
  }
}

// expect_confined for each value of `bads` written at entry `at` ([b, s, h, d]) of q, k or v (`input`), under
// a causal mask with a left window of `window_left` (-1: none).
template <class T>
void expect_entry_confined(char input, std::array<std::int64_t, 4> at, std::initializer_list<double> bads,
                           const std::function<bool(std::int64_t b, std::int64_t i, std::int64_t h)>& may_change,
                           std::int64_t window_left = -1) {
  AttentionOptions o;
  o.causal = true;
  o.window_left = window_left;
  const std::string what = std::string("a non-finite ") + input + " entry";
  for (const double bad : bads)
    expect_confined<T>(
        what.c_str(),
        [&](Tensor<T>& q, Tensor<T>& k, Tensor<T>& v) {
          Tensor<T>& t = input == 'q' ? q : input == 'k' ? k : v;
          t.at(at[0], at[1], at[2], at[3]) = detail::store<T>(bad);
        },
        may_change, o);
}

TYPED_TEST(Edges, NanOrInfInAQueryRowStaysInThatRow) {
  expect_entry_confined<TypeParam>('q', {1, 2, 3, 1}, {NAN, INFINITY, -INFINITY},
                                   [](auto b, auto i, auto h) { return b == 1 && i == 2 && h == 3; });
}

// Key j = 3 of (batch 0, kv head 1) is seen, under the causal mask, only by query rows i >= 3 of query
// heads 2 and 3 in batch 0.
bool sees_key_3(std::int64_t b, std::int64_t i, std::int64_t h) { return b == 0 && i >= 3 && h >= 2; }

TYPED_TEST(Edges, NanOrInfInAKeyRowStaysInTheRowsThatSeeIt) {
  expect_entry_confined<TypeParam>('k', {0, 3, 1, 0}, {NAN, INFINITY}, sees_key_3);
}

TYPED_TEST(Edges, NanOrInfInAValueRowStaysInTheRowsThatSeeIt) {
  expect_entry_confined<TypeParam>('v', {0, 3, 1, 0}, {NAN, INFINITY}, sees_key_3);
}

// With a left window of 1 (row i sees keys i - 1 and i), key 3 is seen by rows 3 and 4 only: rows on
// both sides of it, and in the tiled kernel's 4-row blocks rows whose first visible key differs, so that
// the keys below every row's window and those past it are both walked with per-row checks.
TYPED_TEST(Edges, NanOrInfInAKeyOrValueRowStaysInTheWindowThatSeesIt) {
  const auto sees = [](auto b, auto i, auto h) { return b == 0 && (i == 3 || i == 4) && h >= 2; };
  expect_entry_confined<TypeParam>('v', {0, 3, 1, 2}, {NAN, INFINITY}, sees, 1);
  expect_entry_confined<TypeParam>('k', {0, 3, 1, 2}, {NAN, INFINITY}, sees, 1);
}

// What a row that reads a NaN gets must not depend on the algorithm, the tile size or the split count
// (docs/robustness.md): the NaN propagates to that row's output (never a finite value that silently
// ignores the key, nor the fully-masked answer out = 0, lse = -inf).
TYPED_TEST(Edges, ARowThatReadsANanKeyIsNaNInEveryAlgorithm) {
  using T = TypeParam;
  auto q = random_tensor<T>(1, 4, 1, 2, 31), k = random_tensor<T>(1, 5, 1, 2, 32), v = random_tensor<T>(1, 5, 1, 2, 33);
  k.at(0, 2, 0, 1) = detail::store<T>(NAN);
  for (const auto& a : algos()) {
    const auto [out, lse] = run(a, q, k, v);
    for (std::int64_t i = 0; i < 4; ++i)
      EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(i * 2)]) && std::isnan(lse[static_cast<std::size_t>(i)]))
          << a.name << ": row " << i << " reads a NaN key, got out " << out[static_cast<std::size_t>(i * 2)] << " lse "
          << lse[static_cast<std::size_t>(i)];
  }
}

// ---- A +inf score. docs/robustness.md: a score of -inf counts as masked, +inf gives NaN (inf - inf),
// in every algorithm whatever the tile size or the split. The +inf comes from an infinity in one key
// row against a positive query, or from finite entries whose dot product overflows the accumulator.
// Every position of that key is tried, so with each k_tile it falls in a row's last key tile, in an
// earlier one, and alone in its tile (k_tile 1, or the last of 10 keys with k_tile 3).
enum class InfScore { InfInKey, Overflow };

// Whether query i of a (sq, sk) problem sees key j under `o` (causal and left windows, bottom-right
// aligned): written out here rather than taken from the library.
bool sees(const AttentionOptions& o, std::int64_t sq, std::int64_t sk, std::int64_t i, std::int64_t j) {
  const std::int64_t diag = i + sk - sq;
  if (o.causal && j > diag) return false;
  return o.window_left < 0 || j >= diag - o.window_left;
}

// q with entries in [0.5, 1] (so an infinite or huge key scores +inf, not -inf), k and v random.
template <class T>
Tensor<T> positive_queries(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, std::uint64_t seed) {
  auto q = random_tensor<T>(b, s, h, d, seed);
  for (auto& e : q.data) e = detail::store<T>(0.5 + 0.5 * std::abs(detail::load<double>(e)));
  return q;
}

// Puts the +inf-scoring key into row `j` of k (every kv head, batch 0).
template <class T>
void plant_inf_score(Tensor<T>& k, std::int64_t j, InfScore kind) {
  // 0.9 x the accumulator's largest value (finite in T, except f16, which does not use it): four
  // products of at least 0.45 x that overflow the f32 / f64 dot product.
  const double big = 0.9 * static_cast<double>(std::numeric_limits<LseT<T>>::max());
  for (std::int64_t h = 0; h < k.h; ++h)
    for (std::int64_t c = 0; c < k.d; ++c)
      k.at(0, j, h, c) = detail::store<T>(kind == InfScore::InfInKey ? (c == 1 ? double(INFINITY) : 0.25) : big);
}

template <class T>
std::vector<InfScore> inf_score_kinds() {
  // f16's largest value (65504) squared does not overflow the f32 accumulator.
  if (std::is_same_v<T, f16_t>) return {InfScore::InfInKey};
  return {InfScore::InfInKey, InfScore::Overflow};
}

// Compares one run against the reference on the same inputs: the same NaN / non-NaN pattern element
// by element (out and lse), NaN wherever the row sees the bad key, and the other rows bit-identical to
// the same algorithm's run without the bad key and close to the reference. Out is [queries, H, D];
// `query_of_lse(e)` gives the query of lse element e; `seen(i)` says whether query i sees the key.
struct InfScoreRun {
  const std::vector<double>&out, &lse, &clean, &clean_lse, &want, &want_lse;
};

template <class T>
void expect_inf_score_rows(const std::string& what, const InfScoreRun& r, std::int64_t H, std::int64_t D,
                           const std::function<std::int64_t(std::int64_t)>& query_of_lse,
                           const std::function<bool(std::int64_t)>& seen) {
  const double tol = sizeof(T) == 2 ? 1e-2 : 1e-6;
  std::int64_t bad = 0;
  std::string first;
  auto note = [&](const std::string& m) {
    if (bad++ == 0) first = m;
  };
  for (std::size_t e = 0; e < r.out.size(); ++e) {
    const std::int64_t i = static_cast<std::int64_t>(e) / (H * D);
    const std::string at = "out[" + std::to_string(e) + "] (query " + std::to_string(i) + ")";
    if (std::isnan(r.out[e]) != std::isnan(r.want[e]))
      note(at + ": " + std::to_string(r.out[e]) + ", the reference " + std::to_string(r.want[e]));
    else if (seen(i) && !std::isnan(r.out[e]))
      note(at + " sees the +inf score but is " + std::to_string(r.out[e]));
    else if (!seen(i) &&
             (std::memcmp(&r.out[e], &r.clean[e], sizeof(double)) != 0 || !(std::abs(r.out[e] - r.want[e]) <= tol)))
      note(at + " does not see the key but changed: " + std::to_string(r.out[e]) + ", without it " +
           std::to_string(r.clean[e]) + ", the reference " + std::to_string(r.want[e]));
  }
  for (std::size_t e = 0; e < r.lse.size(); ++e) {
    const std::int64_t i = query_of_lse(static_cast<std::int64_t>(e));
    const std::string at = "lse[" + std::to_string(e) + "] (query " + std::to_string(i) + ")";
    if (std::isnan(r.lse[e]) != std::isnan(r.want_lse[e]))
      note(at + ": " + std::to_string(r.lse[e]) + ", the reference " + std::to_string(r.want_lse[e]));
    else if (seen(i) && !std::isnan(r.lse[e]))
      note(at + " sees the +inf score but is " + std::to_string(r.lse[e]));
    else if (!seen(i) && (std::memcmp(&r.lse[e], &r.clean_lse[e], sizeof(double)) != 0 ||
                          !(std::abs(r.lse[e] - r.want_lse[e]) <= 1e-5)))
      note(at + " does not see the key but changed: " + std::to_string(r.lse[e]) + ", without it " +
           std::to_string(r.clean_lse[e]) + ", the reference " + std::to_string(r.want_lse[e]));
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " wrong elements, first " << first;
}

std::vector<AttentionOptions> inf_score_masks() {
  AttentionOptions full, causal, window;
  causal.causal = true;
  window.causal = true;
  window.window_left = 2;
  return {full, causal, window};
}

std::string mask_name(const AttentionOptions& o) {
  return !o.causal ? "full" : o.window_left < 0 ? "causal" : "window " + std::to_string(o.window_left);
}

// attention_tiled over q_tile {1, 3, default} x k_tile {1, 3, 16, all keys}, and the other algorithms.
TYPED_TEST(Edges, APlusInfScoreGivesNaNInEveryAlgorithmAndTile) {
  using T = TypeParam;
  const std::int64_t S = 10, H = 2, HK = 1, D = 4;
  std::vector<Algo> all = algos();
  for (std::optional<std::int64_t> qt :
       {std::optional<std::int64_t>(1), std::optional<std::int64_t>(3), std::optional<std::int64_t>()})
    for (std::int64_t kt : {std::int64_t(1), std::int64_t(3), std::int64_t(16), S}) {
      const std::string name =
          "tiled q_tile " + (qt ? std::to_string(*qt) : std::string("default")) + " k_tile " + std::to_string(kt);
      all.push_back({name, [qt, kt](auto& q, auto& k, auto& v, auto& o, auto& op, auto* l) {
                       TileOptions t;
                       t.q_tile = qt;
                       t.k_tile = kt;
                       attention_tiled(q, k, v, o, op, t, l);
                     }});
    }
  const auto q = positive_queries<T>(1, S, H, D, 61), k = random_tensor<T>(1, S, HK, D, 62),
             v = random_tensor<T>(1, S, HK, D, 63);
  for (const AttentionOptions& o : inf_score_masks())
    for (InfScore kind : inf_score_kinds<T>())
      for (std::int64_t j = 0; j < S; ++j) {
        auto kb = k;
        plant_inf_score(kb, j, kind);
        const auto [want, want_lse] = run(all[0], q, kb, v, o);
        auto seen = [&](std::int64_t i) { return sees(o, S, S, i, j); };
        const std::string what =
            mask_name(o) + (kind == InfScore::InfInKey ? ", inf in key " : ", overflow at key ") + std::to_string(j);
        for (std::int64_t i = 0; i < S; ++i)
          if (seen(i)) ASSERT_TRUE(std::isnan(want_lse[static_cast<std::size_t>(i)])) << what << ": the reference";
        for (const Algo& a : all) {
          const auto [clean, clean_lse] = run(a, q, k, v, o);
          const auto [out, lse] = run(a, q, kb, v, o);
          expect_inf_score_rows<T>(
              a.name + ", " + what, InfScoreRun{out, lse, clean, clean_lse, want, want_lse}, H, D,
              [&](std::int64_t e) { return e % S; }, seen);
        }
      }
}

// attention_varlen: two sequences (10 queries x 10 keys, 7 x 9) packed, the +inf-scoring key at every
// position of either; each sequence against the reference on it alone.
TYPED_TEST(Edges, APlusInfScoreGivesNaNInVarlen) {
  using T = TypeParam;
  using L = LseT<T>;
  const std::int64_t H = 2, HK = 1, D = 4, TQ = 17, TK = 19;
  const std::vector<std::int32_t> cu_q{0, 10, 17}, cu_k{0, 10, 19};
  // Packed [total, heads, d] tensors are [1, total, heads, d] ones.
  const auto q = positive_queries<T>(1, TQ, H, D, 71), k = random_tensor<T>(1, TK, HK, D, 72),
             v = random_tensor<T>(1, TK, HK, D, 73);
  auto varlen = [&](const test::Tensor<T>& kk, const AttentionOptions& o, std::optional<std::int64_t> qt,
                    std::int64_t kt) {
    std::vector<T> out(q.data.size());
    std::vector<L> lse(static_cast<std::size_t>(H * TQ));
    const TensorView lv = TensorView::contiguous(lse.data(), 1, H, TQ);
    TileOptions t;
    t.q_tile = qt;
    t.k_tile = kt;
    attention_varlen(q.packed(), kk.packed(), v.packed(), TensorView::contiguous(out.data(), TQ, H, D), cu_q.data(),
                     cu_k.data(), 2, o, t, &lv);
    std::vector<double> o64(out.size()), l64(lse.begin(), lse.end());
    for (std::size_t i = 0; i < out.size(); ++i) o64[i] = detail::load<double>(out[i]);
    return std::pair{o64, l64};
  };
  for (const AttentionOptions& o : inf_score_masks())
    for (InfScore kind : inf_score_kinds<T>())
      for (std::int64_t j = 0; j < TK; ++j) {
        auto kb = k;
        plant_inf_score(kb, j, kind);
        const std::int64_t sj = j < cu_k[1] ? 0 : 1;  // the key's sequence
        // The reference, sequence by sequence, into packed out and lse.
        std::vector<double> want(q.data.size()), want_lse(static_cast<std::size_t>(H * TQ));
        for (std::int64_t b = 0; b < 2; ++b) {
          const std::int64_t q0 = cu_q[b], nq = cu_q[b + 1] - q0, k0 = cu_k[b], nk = cu_k[b + 1] - k0;
          std::vector<T> ob(static_cast<std::size_t>(nq * H * D));
          std::vector<L> lb(static_cast<std::size_t>(H * nq));
          const TensorView lv = TensorView::contiguous(lb.data(), 1, H, nq);
          attention_reference(TensorView::contiguous(q.data.data() + q0 * H * D, 1, nq, H, D),
                              TensorView::contiguous(kb.data.data() + k0 * HK * D, 1, nk, HK, D),
                              TensorView::contiguous(v.data.data() + k0 * HK * D, 1, nk, HK, D),
                              TensorView::contiguous(ob.data(), 1, nq, H, D), o, &lv);
          for (std::size_t e = 0; e < ob.size(); ++e)
            want[static_cast<std::size_t>(q0 * H * D) + e] = detail::load<double>(ob[e]);
          for (std::int64_t h = 0; h < H; ++h)
            for (std::int64_t i = 0; i < nq; ++i)
              want_lse[static_cast<std::size_t>(h * TQ + q0 + i)] = lb[static_cast<std::size_t>(h * nq + i)];
        }
        auto seen = [&](std::int64_t t) {
          const std::int64_t b = t < cu_q[1] ? 0 : 1;
          return b == sj && sees(o, cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b], t - cu_q[b], j - cu_k[b]);
        };
        const std::string what =
            mask_name(o) + (kind == InfScore::InfInKey ? ", inf in key " : ", overflow at key ") + std::to_string(j);
        for (std::int64_t t = 0; t < TQ; ++t)
          if (seen(t)) ASSERT_TRUE(std::isnan(want_lse[static_cast<std::size_t>(t)])) << what << ": the reference";
        for (std::optional<std::int64_t> qt : {std::optional<std::int64_t>(1), std::optional<std::int64_t>()})
          for (std::int64_t kt : {std::int64_t(1), std::int64_t(3), std::int64_t(16), TK}) {
            const auto [clean, clean_lse] = varlen(k, o, qt, kt);
            const auto [out, lse] = varlen(kb, o, qt, kt);
            expect_inf_score_rows<T>(
                "varlen q_tile " + (qt ? std::to_string(*qt) : std::string("default")) + " k_tile " +
                    std::to_string(kt) + ", " + what,
                InfScoreRun{out, lse, clean, clean_lse, want, want_lse}, H, D, [&](std::int64_t e) { return e % TQ; },
                seen);
          }
      }
}

// ---- Sizes near and past the int32 range: offsets are int64 everywhere. The big views are virtual
// (mmap with MAP_NORESERVE): only the pages holding the elements actually used are ever touched.
struct Virtual {
  void* p = MAP_FAILED;
  std::size_t bytes = 0;
  explicit Virtual(std::size_t n) : bytes(n) {
    p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  ~Virtual() {
    if (p != MAP_FAILED) munmap(p, bytes);
  }
  bool ok() const { return p != MAP_FAILED; }
};

// Batch strides of 2^31 + 5 elements for q, k, v, out and lse: element offsets of batch 1 exceed
// INT32_MAX. The result must equal the dense computation.
TEST(Int32Limits, ElementOffsetsPastInt32AreNotWrapped) {
  const std::int64_t big = (std::int64_t(1) << 31) + 5, SQ = 3, SK = 4, D = 2;
  Virtual mem(static_cast<std::size_t>(5 * 2 * big) * sizeof(float));
  if (!mem.ok()) GTEST_SKIP() << "cannot reserve 80 GiB of address space here";
  auto q = random_tensor<float>(2, SQ, 1, D, 41), k = random_tensor<float>(2, SK, 1, D, 42),
       v = random_tensor<float>(2, SK, 1, D, 43);
  float* base = static_cast<float*>(mem.p);
  auto place = [&](int slot, const Tensor<float>* t, std::int64_t s) {
    float* p = base + slot * 2 * big;
    TensorView view = TensorView::strided(p, {2, s, 1, D}, {big, D, D, 1});
    if (t)
      for (std::int64_t b = 0; b < 2; ++b)
        std::memcpy(p + b * big, t->data.data() + b * s * D, static_cast<std::size_t>(s * D) * sizeof(float));
    return view;
  };
  const TensorView qv = place(0, &q, SQ), kv = place(1, &k, SK), vv = place(2, &v, SK), ov = place(3, nullptr, SQ);
  TensorView lv = TensorView::strided(base + 4 * 2 * big, {2, 1, SQ, 1}, {big, SQ, 1, 1});
  lv.rank = 3;
  AttentionOptions o;
  o.causal = true;
  for (const auto& a : algos()) {
    a.call(qv, kv, vv, ov, o, &lv);
    const auto [want, want_lse] = run(a, q, k, v, o);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t i = 0; i < SQ * D; ++i)
        EXPECT_EQ(static_cast<float*>(ov.data)[b * big + i], want[static_cast<std::size_t>(b * SQ * D + i)]) << a.name;
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t i = 0; i < SQ; ++i)
        EXPECT_EQ(static_cast<float*>(lv.data)[b * big + i], want_lse[static_cast<std::size_t>(b * SQ + i)]) << a.name;
  }
}

// seqlen_k = 2^31 + 16 keys (a virtual 8 GiB cache) with a causal window of 5 keys: every query sees
// only the last keys, at positions past INT32_MAX. The tiled and split-K kernels must give what they
// give on the last 16 keys alone (the same relative positions, so the same masks and ALiBi distances).
// The reference is left out: it materialises seqlen_q x seqlen_k scores by design.
TEST(Int32Limits, KeyPositionsPastInt32AreNotWrapped) {
  const std::int64_t tail = 16, SK = (std::int64_t(1) << 31) + tail, SQ = 4, D = 1;
  Virtual km(static_cast<std::size_t>(SK) * sizeof(float)), vm(static_cast<std::size_t>(SK) * sizeof(float));
  if (!km.ok() || !vm.ok()) GTEST_SKIP() << "cannot reserve 16 GiB of address space here";
  auto q = random_tensor<float>(1, SQ, 1, D, 51), k = random_tensor<float>(1, tail, 1, D, 52),
       v = random_tensor<float>(1, tail, 1, D, 53);
  float* kb = static_cast<float*>(km.p) + (SK - tail);
  float* vb = static_cast<float*>(vm.p) + (SK - tail);
  std::memcpy(kb, k.data.data(), tail * sizeof(float));
  std::memcpy(vb, v.data.data(), tail * sizeof(float));
  const float slope = 0.25f;
  AttentionOptions o;
  o.causal = true;
  o.window_left = 4;
  o.alibi_slopes = {&slope, 1};
  const TensorView kv = TensorView::contiguous(static_cast<const float*>(km.p), 1, SK, 1, D),
                   vv = TensorView::contiguous(static_cast<const float*>(vm.p), 1, SK, 1, D);
  for (const auto& a : algos()) {
    // The reference materialises the scores; decode's cache lengths are int32 by its API.
    if (a.name == "reference" || a.name.rfind("decode/", 0) == 0) continue;
    std::vector<float> out(SQ * D), lse(SQ);
    const TensorView lv = TensorView::contiguous(lse.data(), 1, 1, SQ);
    a.call(q.view(), kv, vv, TensorView::contiguous(out.data(), 1, SQ, 1, D), o, &lv);
    const auto [want, want_lse] = run(a, q, k, v, o);
    for (std::int64_t i = 0; i < SQ; ++i) {
      EXPECT_NEAR(out[static_cast<std::size_t>(i)], want[static_cast<std::size_t>(i)], 1e-6) << a.name;
      EXPECT_NEAR(lse[static_cast<std::size_t>(i)], want_lse[static_cast<std::size_t>(i)], 1e-5) << a.name;
    }
  }
}

// Shapes whose element count or byte extent overflows int64 are rejected before any access, and a
// DType value outside the enum is rejected rather than read as some other type.
TEST(Int32Limits, OverflowingShapesAndUnknownDtypesAreRejected) {
  auto q = random_tensor<float>(1, 2, 1, 4, 1), k = random_tensor<float>(1, 3, 1, 4, 2),
       v = random_tensor<float>(1, 3, 1, 4, 3);
  std::vector<float> out(8, 7.0f);
  const TensorView ov = TensorView::contiguous(out.data(), 1, 2, 1, 4);
  for (const auto& a : algos()) {
    TensorView kv = k.view(), vv = v.view();
    kv.shape[1] = vv.shape[1] = std::int64_t(1) << 62;  // extent (2^62 - 1) * 4 elements overflows
    EXPECT_THROW(a.call(q.view(), kv, vv, ov, {}, nullptr), std::invalid_argument) << a.name;
    TensorView bad = q.view();
    bad.dtype = static_cast<DType>(9);
    kv = k.view();
    vv = v.view();
    kv.dtype = vv.dtype = bad.dtype;
    TensorView ob = ov;
    ob.dtype = bad.dtype;
    try {
      a.call(bad, kv, vv, ob, {}, nullptr);
      ADD_FAILURE() << a.name << ": an unknown dtype was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("dtype"), std::string::npos) << e.what();
    }
    for (float x : out) EXPECT_EQ(x, 7.0f) << a.name;
  }
}

// float -> bf16 (core/element.hpp, used for every bf16 output and for decode's q split) against an
// independent rule: the nearest of the two bf16 neighbours by value, computed in double (the one above
// the largest finite bf16 is 2^128, so values past the halfway point round to infinity), ties to the
// even mantissa; NaN stays NaN with its sign.
double bf16_magnitude(std::uint32_t b) {  // b < 0x8000, as if the exponent were unbounded
  const int e = static_cast<int>(b >> 7), m = static_cast<int>(b & 127u);
  return e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
}

TEST(Conversions, FloatToBf16RoundsToNearestEvenAndKeepsNaN) {
  auto check = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    const std::uint16_t got = detail::float_to_bf16(f).bits;
    if (std::isnan(f)) {
      ASSERT_EQ(got & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u;
      ASSERT_TRUE((got & 0x7f80u) == 0x7f80u && (got & 0x7fu) != 0) << std::hex << u << " -> " << got;
      return;
    }
    const std::uint32_t lo = (u >> 16) & 0x7fffu, hi = lo + 1;
    const double x = std::fabs(static_cast<double>(f)), dlo = x - bf16_magnitude(lo), dhi = bf16_magnitude(hi) - x;
    const std::uint32_t want =
        std::isinf(f) || dlo < dhi || (dlo == dhi && (lo & 1u) == 0) ? lo : hi;  // infinity is exact
    ASSERT_EQ(got, static_cast<std::uint16_t>(want | ((u >> 16) & 0x8000u))) << std::hex << u;
  };
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {  // every bf16 value, exactly, and the halfway points
    check(b << 16);
    check((b << 16) | 0x8000u);
    check((b << 16) | 0x7fffu);
    check((b << 16) | 0x8001u);
  }
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 1 << 20; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    check(static_cast<std::uint32_t>(x >> 32));
  }
}

// The compiler's IEEE half type: _Float16 (on x86 converted by libgcc's soft-float routines), or on
// Arm __fp16, which the FPU converts (FCVT): GCC before 13 has no _Float16 in C++ there.
#if defined(__ARM_FP16_FORMAT_IEEE)
using CompilerHalf = __fp16;
#else
using CompilerHalf = _Float16;
#endif

// f16 conversions (element.hpp: float arithmetic and bit operations) against the compiler's half type,
// an independent implementation: every f16 value both ways, every halfway point between neighbouring
// f16 values and its two neighbouring floats, the overflow edge, and 2^20 random floats.
TEST(Conversions, F16MatchesTheCompilersHalfType) {
  auto check_down = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    const std::uint16_t got = detail::float_to_f16(f).bits;
    const CompilerHalf h = static_cast<CompilerHalf>(f);
    std::uint16_t want;
    std::memcpy(&want, &h, 2);
    if (std::isnan(f)) {
      ASSERT_EQ(got & 0x8000u, want & 0x8000u) << std::hex << u;
      ASSERT_TRUE((got & 0x7c00u) == 0x7c00u && (got & 0x3ffu) != 0) << std::hex << u << " -> " << got;
      return;
    }
    ASSERT_EQ(got, want) << std::hex << u << " = " << f;
  };
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    CompilerHalf h;
    const std::uint16_t bits = static_cast<std::uint16_t>(b);
    std::memcpy(&h, &bits, 2);
    const float want = static_cast<float>(h), got = detail::f16_to_float(f16_t{bits});
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << b;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << b;
    } else {
      ASSERT_EQ(detail::float_bits(got), detail::float_bits(want)) << std::hex << b;
    }
    check_down(detail::float_bits(want));
    if (std::isfinite(want) && (b & 0x7fffu) != 0x7bffu) {  // up to the largest finite magnitude
      std::uint16_t next_bits = static_cast<std::uint16_t>(b + 1);
      CompilerHalf next;
      std::memcpy(&next, &next_bits, 2);
      const float mid =
          static_cast<float>((static_cast<double>(want) + static_cast<double>(static_cast<float>(next))) / 2);
      check_down(detail::float_bits(mid));
      check_down(detail::float_bits(mid) + 1);
      check_down(detail::float_bits(mid) - 1);
    }
  }
  for (float f :
       {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, 0x1.0p-24f, 0x1.0p-25f, 0x1.8p-25f, 0x1.0p-26f, 1e-30f})
    for (float s : {1.0f, -1.0f}) check_down(detail::float_bits(f * s));
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 1 << 20; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    check_down(static_cast<std::uint32_t>(x >> 32));
  }
}

}  // namespace
}  // namespace attn
