// merge_states: the outputs and lse of attention over disjoint key chunks, merged, equal attention over
// all the keys (f64 to 1e-12, any chunking, empty chunks included); -inf states contribute nothing; a
// NaN stays in its row; bad arguments are named and nothing is written.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "attn/attention.hpp"
#include "attn/merge.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;

// q [1, S, H, D] against chunks of k, v along the keys; parts laid out [S, chunks, H, D].
struct Chunked {
  std::int64_t S, H, D, states;
  std::vector<double> parts, parts_lse, whole, whole_lse;
  Chunked(std::int64_t s, std::int64_t h, std::int64_t d, std::int64_t keys, const std::vector<std::int64_t>& cuts,
          bool causal)
      : S(s), H(h), D(d), states(static_cast<std::int64_t>(cuts.size()) + 1) {
    auto q = random_tensor<double>(1, S, H, D, 1, 2.0), k = random_tensor<double>(1, keys, H, D, 2, 2.0),
         v = random_tensor<double>(1, keys, H, D, 3);
    AttentionOptions o;
    o.causal = causal;
    parts.assign(static_cast<std::size_t>(S * states * H * D), 0.0);
    parts_lse.assign(static_cast<std::size_t>(S * states * H), 0.0);
    whole.resize(static_cast<std::size_t>(S * H * D));
    whole_lse.resize(static_cast<std::size_t>(H * S));
    const TensorView wl = TensorView::contiguous(whole_lse.data(), 1, H, S);
    attention_reference(q.view(), k.view(), v.view(), TensorView::contiguous(whole.data(), 1, S, H, D), o, &wl);
    std::vector<std::int64_t> edges = {0};
    edges.insert(edges.end(), cuts.begin(), cuts.end());
    edges.push_back(keys);
    for (std::int64_t c = 0; c < states; ++c) {
      const std::int64_t j0 = edges[c], n = edges[c + 1] - j0;
      // Keys [j0, j0 + n) under the whole problem's causal diagonal (key j0 + j visible to query i when
      // j0 + j <= i + keys - S): in the chunk's own bottom-right frame, window_right = keys - n - j0.
      AttentionOptions oc;
      if (causal) oc.window_right = keys - n - j0;
      TensorView kc = k.view(), vc = v.view();
      kc.data = k.data.data() + j0 * H * D;
      vc.data = v.data.data() + j0 * H * D;
      kc.shape[1] = vc.shape[1] = n;
      TensorView out = TensorView::strided(parts.data() + c * H * D, {1, S, H, D}, {0, states * H * D, D, 1});
      TensorView lse;
      lse.data = parts_lse.data() + c * H;
      lse.dtype = DType::f64;
      lse.rank = 3;
      lse.shape = {1, H, S, 1};
      lse.strides = {0, 1, states * H, 1};
      if (causal && oc.window_right < 0) {  // no query sees this chunk: its states are neutral
        for (std::int64_t i = 0; i < S; ++i)
          for (std::int64_t h = 0; h < H; ++h)
            parts_lse[static_cast<std::size_t>((i * states + c) * H + h)] = -INFINITY;
        continue;
      }
      attention_reference(q.view(), kc, vc, out, oc, &lse);
    }
  }
  TensorView parts_view() const { return TensorView::contiguous(parts.data(), S, states, H, D); }
  TensorView lse_view() const { return TensorView::contiguous(parts_lse.data(), S, states, H); }
};

TEST(MergeStates, ChunksMergeToTheWholeAttention) {
  for (bool causal : {false, true})
    for (const auto& cuts : std::vector<std::vector<std::int64_t>>{{}, {7}, {1, 2, 30}, {0, 0, 19, 19, 40}}) {
      Chunked c(9, 3, 5, 40, cuts, causal);
      std::vector<double> out(c.whole.size(), 42), lse(c.whole_lse.size(), 42);
      const TensorView lv = TensorView::strided(lse.data(), {c.S, 1, c.H, 1}, {c.H, 0, 1, 1});
      TensorView l3 = lv;
      l3.rank = 3;
      merge_states(c.parts_view(), c.lse_view(), TensorView::contiguous(out.data(), c.S, 1, c.H, c.D), &l3);
      for (std::int64_t i = 0; i < c.S; ++i)
        for (std::int64_t h = 0; h < c.H; ++h) {
          EXPECT_NEAR(lse[static_cast<std::size_t>(i * c.H + h)], c.whole_lse[static_cast<std::size_t>(h * c.S + i)],
                      test::kF64Tolerance);
          for (std::int64_t x = 0; x < c.D; ++x)
            EXPECT_NEAR(out[static_cast<std::size_t>((i * c.H + h) * c.D + x)],
                        c.whole[static_cast<std::size_t>((i * c.H + h) * c.D + x)], test::kF64Tolerance)
                << "causal " << causal << " cuts " << cuts.size();
        }
    }
}

TEST(MergeStates, NeutralAndNaNStates) {
  // Row 0: state 0 neutral (-inf), state 1 real; row 1: state 1 NaN; row 2: all neutral.
  std::vector<float> parts = {9, 9, 1, 2, 3, 4, NAN, 5, 9, 9, 9, 9},
                     plse = {-INFINITY, 0.5f, 0.0f, NAN, -INFINITY, -INFINITY};
  std::vector<float> out(6, 42), lse(3, 42);
  TensorView l3 = TensorView::strided(lse.data(), {3, 1, 1, 1}, {1, 0, 1, 1});
  l3.rank = 3;
  merge_states(TensorView::contiguous(parts.data(), 3, 2, 1, 2), TensorView::contiguous(plse.data(), 3, 2, 1),
               TensorView::contiguous(out.data(), 3, 1, 1, 2), &l3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(lse[0], 0.5f);
  EXPECT_TRUE(std::isnan(out[2]) && std::isnan(out[3]) && std::isnan(lse[1]));
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_EQ(out[5], 0.0f);
  EXPECT_EQ(lse[2], -INFINITY);
}

TEST(MergeStates, BadArgumentsAreNamedAndNothingIsWritten) {
  std::vector<float> parts(2 * 3 * 2 * 4, 0.5f), plse(2 * 3 * 2, 0.0f), out(2 * 2 * 4, 42);
  const TensorView p = TensorView::contiguous(parts.data(), 2, 3, 2, 4),
                   pl = TensorView::contiguous(plse.data(), 2, 3, 2);
  auto expect = [&](const TensorView& a, const TensorView& b, const TensorView& o, const std::string& needle) {
    try {
      merge_states(a, b, o);
      ADD_FAILURE() << "no exception for " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("attn::merge_states: " + needle), std::string::npos) << e.what();
    }
    for (float x : out) ASSERT_EQ(x, 42.0f);
  };
  expect(p, pl, TensorView::contiguous(out.data(), 2, 2, 2, 2), "out");  // states 2
  expect(p, pl, TensorView::contiguous(out.data(), 2, 1, 2, 3), "out");  // head_dim
  expect(p, TensorView::contiguous(plse.data(), 2, 2, 3), TensorView::contiguous(out.data(), 2, 1, 2, 4), "parts_lse");
  std::vector<double> dl(plse.size());
  expect(p, TensorView::contiguous(dl.data(), 2, 3, 2), TensorView::contiguous(out.data(), 2, 1, 2, 4), "parts_lse");
  expect(p, pl, TensorView::contiguous(parts.data(), 2, 1, 2, 4), "out");  // overlaps parts
}

// merge_state_in_place: the same result as merge_states on the two states, bitwise, including neutral
// and NaN rows; bad arguments named with out and lse untouched.
TEST(MergeStateInPlace, EqualsMergeStatesOfTheTwo) {
  const std::int64_t R = 5, H = 3, D = 7;
  auto a = random_tensor<float>(R, 1, H, D, 1), b = random_tensor<float>(R, 1, H, D, 2);
  std::vector<float> la(R * H), lb(R * H);
  for (std::int64_t i = 0; i < R * H; ++i) la[i] = 0.3f * float(i % 4) - 0.5f, lb[i] = 0.2f * float(i % 5);
  la[1] = -INFINITY, lb[2] = -INFINITY, la[4] = lb[4] = -INFINITY, lb[7] = NAN;
  std::vector<float> parts(R * 2 * H * D), plse(R * 2 * H), want(R * H * D), want_lse(R * H);
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t h = 0; h < H; ++h) {
      plse[(r * 2 + 0) * H + h] = la[r * H + h], plse[(r * 2 + 1) * H + h] = lb[r * H + h];
      for (std::int64_t c = 0; c < D; ++c) {
        parts[((r * 2 + 0) * H + h) * D + c] = a.data[(r * H + h) * D + c];
        parts[((r * 2 + 1) * H + h) * D + c] = b.data[(r * H + h) * D + c];
      }
    }
  const TensorView wl = TensorView::contiguous(want_lse.data(), R, 1, H);
  merge_states(TensorView::contiguous(parts.data(), R, 2, H, D), TensorView::contiguous(plse.data(), R, 2, H),
               TensorView::contiguous(want.data(), R, 1, H, D), &wl);
  merge_state_in_place(a.view(), TensorView::contiguous(la.data(), R, 1, H), b.view(),
                       TensorView::contiguous(lb.data(), R, 1, H));
  for (std::size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(a.data[i] == want[i] || (std::isnan(a.data[i]) && std::isnan(want[i]))) << i;
  for (std::size_t i = 0; i < want_lse.size(); ++i)
    EXPECT_TRUE(la[i] == want_lse[i] || (std::isnan(la[i]) && std::isnan(want_lse[i]))) << i;
}

TEST(MergeStateInPlace, BadArgumentsAreNamedAndNothingIsWritten) {
  std::vector<float> out(2 * 3 * 4, 42), lse(2 * 3, 42), other(2 * 3 * 4, 1), olse(2 * 3, 0);
  const TensorView o = TensorView::contiguous(out.data(), 2, 1, 3, 4), l = TensorView::contiguous(lse.data(), 2, 1, 3),
                   b = TensorView::contiguous(other.data(), 2, 1, 3, 4),
                   bl = TensorView::contiguous(olse.data(), 2, 1, 3);
  auto expect = [&](const TensorView& o2, const TensorView& l2, const TensorView& b2, const TensorView& bl2,
                    const std::string& needle) {
    try {
      merge_state_in_place(o2, l2, b2, bl2);
      ADD_FAILURE() << "no exception for " << needle;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("attn::merge_state_in_place: " + needle), std::string::npos) << e.what();
    }
    for (float x : out) ASSERT_EQ(x, 42.0f);
    for (float x : lse) ASSERT_EQ(x, 42.0f);
  };
  expect(o, l, TensorView::contiguous(other.data(), 2, 1, 3, 3), bl, "other: head_dim");
  std::vector<double> dl(6);
  expect(o, l, b, TensorView::contiguous(dl.data(), 2, 1, 3), "other_lse: dtype must be f32");
  expect(o, l, o, bl, "other: overlaps out or lse");
  expect(o, TensorView::contiguous(lse.data(), 2, 1, 2), b, bl, "lse: heads");
}

}  // namespace
}  // namespace attn
