// Bad input to the backward pass: each rule gets an std::invalid_argument naming the argument, and no
// buffer changes (the gradients keep their bytes; inputs are never written).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "attn/backward.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;

// Every buffer lives in one arena, 100 floats apart (the largest view spans 80), so that a view moved
// onto another buffer overlaps that buffer and nothing else.
struct Fixture {
  std::vector<float> arena = make_arena();
  float* at(int slot) { return arena.data() + 100 * slot; }
  TensorView qv = TensorView::contiguous(at(0), 1, 4, 2, 8), kv = TensorView::contiguous(at(1), 1, 5, 2, 8),
             vv = TensorView::contiguous(at(2), 1, 5, 2, 8), dov = TensorView::contiguous(at(3), 1, 4, 2, 8),
             ov = TensorView::contiguous(at(4), 1, 4, 2, 8), lv = TensorView::contiguous(at(5), 1, 2, 4),
             dqv = TensorView::contiguous(at(6), 1, 4, 2, 8), dkv = TensorView::contiguous(at(7), 1, 5, 2, 8),
             dvv = TensorView::contiguous(at(8), 1, 5, 2, 8);
  AttentionOptions opts;
  TileOptions tiles;

  // Slots 0-3 (q, k, v, dout) random, out 0.5, lse 1.5, the gradients 123, 124, 125, the spare slots 9
  // and 10 zero.
  static std::vector<float> make_arena() {
    std::vector<float> a(1100, 0.0f);
    const auto r = random_tensor<float>(1, 4, 10, 10, 1);
    std::copy(r.data.begin(), r.data.end(), a.begin());
    std::fill(a.begin() + 400, a.begin() + 464, 0.5f);
    std::fill(a.begin() + 500, a.begin() + 508, 1.5f);
    for (int g = 0; g < 3; ++g) std::fill(a.begin() + 600 + 100 * g, a.begin() + 680 + 100 * g, 123.0f + g);
    return a;
  }
  float grad(int g) const { return arena[static_cast<std::size_t>(600 + 100 * g)]; }
  std::vector<float> snapshot() const { return arena; }
};

// Runs both entry points on the fixture; each must throw a message containing every needle and leave
// every buffer as it was.
void expect_rejected(const Fixture& f, std::initializer_list<std::string> needles, bool tiled_only = false) {
  const auto before = f.snapshot();
  const std::pair<const char*, std::function<void()>> calls[] = {
      {"attn::attention_backward",
       [&] { attention_backward(f.qv, f.kv, f.vv, f.ov, f.dov, f.lv, f.dqv, f.dkv, f.dvv, f.opts, f.tiles); }},
      {"attn::attention_backward_reference",
       [&] { attention_backward_reference(f.qv, f.kv, f.vv, f.ov, f.dov, f.lv, f.dqv, f.dkv, f.dvv, f.opts); }},
  };
  for (const auto& [who, call] : calls) {
    if (tiled_only && std::string(who) != "attn::attention_backward") continue;
    try {
      call();
      ADD_FAILURE() << who << ": no exception";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(std::string(who) + ": ", 0), 0u) << msg;
      for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << who << ": " << msg;
    }
    EXPECT_EQ(std::memcmp(f.arena.data(), before.data(), before.size() * sizeof(float)), 0)
        << who << " changed a buffer";
  }
}

TEST(BackwardValidation, TheFixtureIsValid) {
  for (int which = 0; which < 2; ++which) {
    Fixture f;
    if (which == 0)
      attention_backward(f.qv, f.kv, f.vv, f.ov, f.dov, f.lv, f.dqv, f.dkv, f.dvv, f.opts, f.tiles);
    else
      attention_backward_reference(f.qv, f.kv, f.vv, f.ov, f.dov, f.lv, f.dqv, f.dkv, f.dvv, f.opts);
    EXPECT_NE(f.grad(0), 123.0f);
    EXPECT_NE(f.grad(1), 124.0f);
    EXPECT_NE(f.grad(2), 125.0f);
  }
}

// One way to break the valid fixture, and the message it must get.
struct Break {
  std::function<void(Fixture&)> breaks;
  std::string message;
};

// A rule, checked on fresh fixtures, one per way of breaking it; `tiled_only`: a rule of
// attention_backward's options alone.
struct Rule {
  const char* name;
  std::vector<Break> breaks;
  bool tiled_only = false;
};
void PrintTo(const Rule& r, std::ostream* os) { *os << r.name; }

const Rule kRules[] = {
    {"ForwardRulesApply",  // through detail::validate
     {{[](Fixture& f) { f.kv.shape[0] = 2; }, "k: batch must equal q's"},
      {[](Fixture& f) { f.ov.shape[1] = 3; }, "out: seqlen must equal q's"},
      {[](Fixture& f) { f.opts.softmax_scale = NAN; }, "softmax_scale: must be finite"}}},
    {"LseIsRequired", {{[](Fixture& f) { f.lv.data = nullptr; }, "lse: data pointer is null"}}},
    {"LseShape", {{[](Fixture& f) { f.lv.shape[2] = 5; }, "lse: seqlen_q must equal q's"}}},
    {"LseDtype", {{[](Fixture& f) { f.lv.dtype = DType::f64; }, "lse: dtype must be f32 for f32 inputs, got f64"}}},
    {"DoutDtype", {{[](Fixture& f) { f.dov.dtype = DType::bf16; }, "dout: dtype must match q's (f32), got bf16"}}},
    {"DoutShape", {{[](Fixture& f) { f.dov.shape[3] = 4; }, "dout: head_dim must equal out's (8), got 4"}}},
    {"DoutRank", {{[](Fixture& f) { f.dov.rank = 3; }, "dout: rank must be 4"}}},
    {"GradientShapes",
     {{[](Fixture& f) { f.dqv.shape[2] = 1; }, "dq: heads must equal q's (2), got 1"},
      {[](Fixture& f) { f.dkv.shape[1] = 4; }, "dk: seqlen must equal k's (5), got 4"},
      {[](Fixture& f) { f.dvv.shape[0] = 2; }, "dv: batch must equal v's (1), got 2"}}},
    {"GradientStrides", {{[](Fixture& f) { f.dkv.strides[1] = -1; }, "dk: stride[1] must be >= 0"}}},
    {"GradientsMustNotAliasThemselves",
     {{[](Fixture& f) { f.dqv.strides[1] = 0; }, "dq: strides make elements alias"},
      {[](Fixture& f) { f.dvv.strides[3] = 0; }, "dv: strides make elements alias"}}},
    {"GradientsMustNotOverlapEachOther",
     {{[](Fixture& f) {  // dq in the spare slot 9, dk starting inside it
         f.dqv.data = f.at(9);
         f.dkv.data = f.at(9) + 63;
       },
       "dk: overlaps dq"},
      {[](Fixture& f) { f.dvv.data = f.at(7) + 79; }, "dv: overlaps dk"},
      {[](Fixture& f) { f.dvv.data = f.at(6) + 50; }, "dv: overlaps dq"}}},
    {"TileSizes", {{[](Fixture& f) { f.tiles.k_tile = 0; }, "tiles.k_tile: must be >= 1"}}, /*tiled_only=*/true},
};

class BackwardValidationRule : public ::testing::TestWithParam<Rule> {};

TEST_P(BackwardValidationRule, IsRejectedAndNoBufferChanges) {
  for (const Break& b : GetParam().breaks) {
    Fixture f;
    b.breaks(f);
    expect_rejected(f, {b.message}, GetParam().tiled_only);
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, BackwardValidationRule, ::testing::ValuesIn(kRules),
                         [](const ::testing::TestParamInfo<Rule>& i) { return std::string(i.param.name); });

TEST(BackwardValidation, GradientDtypes) {
  for (TensorView Fixture::*g : {&Fixture::dqv, &Fixture::dkv, &Fixture::dvv}) {
    Fixture f;
    (f.*g).dtype = DType::f16;
    const char* name = g == &Fixture::dqv ? "dq" : g == &Fixture::dkv ? "dk" : "dv";
    expect_rejected(f, {std::string(name) + ": dtype must match q's (f32), got f16"});
  }
}
TEST(BackwardValidation, GradientsMustNotOverlapInputs) {
  const std::pair<TensorView Fixture::*, const char*> grads[] = {
      {&Fixture::dqv, "dq"}, {&Fixture::dkv, "dk"}, {&Fixture::dvv, "dv"}};
  const std::pair<TensorView Fixture::*, const char*> inputs[] = {{&Fixture::qv, "q"},     {&Fixture::kv, "k"},
                                                                  {&Fixture::vv, "v"},     {&Fixture::ov, "out"},
                                                                  {&Fixture::dov, "dout"}, {&Fixture::lv, "lse"}};
  for (const auto& [g, gname] : grads)
    for (const auto& [in, iname] : inputs) {
      Fixture f;
      (f.*g).data = (f.*in).data;
      expect_rejected(f, {std::string(gname) + ": overlaps input " + iname});
    }
}

}  // namespace
}  // namespace attn

namespace attn {
namespace {

// A dense view without keys ([2, 0, 2, 8]: stride[0] = 0) has no elements, so nothing in it aliases:
// every entry point takes it as dk and dv (and as out/lse's inputs), and dq comes out 0.
TEST(BackwardValidation, EmptyKeyGradientsAreNotAliases) {
  std::vector<float> q(2 * 3 * 2 * 8, 0.25f), dout(q.size(), 1.0f), out(q.size(), 0.0f), dq(q.size(), 7.0f);
  std::vector<float> lse(2 * 2 * 3, -INFINITY);
  float nothing[1] = {0};
  const TensorView empty = TensorView::contiguous(nothing, 2, 0, 2, 8);
  ASSERT_EQ(empty.strides[0], 0);
  const TensorView qv = TensorView::contiguous(q.data(), 2, 3, 2, 8), lv = TensorView::contiguous(lse.data(), 2, 2, 3);
  attention_reference(qv, empty, empty, TensorView::contiguous(out.data(), 2, 3, 2, 8), {}, &lv);
  for (int which = 0; which < 2; ++which) {
    std::fill(dq.begin(), dq.end(), 7.0f);
    const TensorView dqv = TensorView::contiguous(dq.data(), 2, 3, 2, 8);
    const TensorView ov = TensorView::contiguous(out.data(), 2, 3, 2, 8),
                     dov = TensorView::contiguous(dout.data(), 2, 3, 2, 8);
    if (which == 0)
      attention_backward(qv, empty, empty, ov, dov, lv, dqv, empty, empty);
    else
      attention_backward_reference(qv, empty, empty, ov, dov, lv, dqv, empty, empty);
    for (float x : dq) ASSERT_EQ(x, 0.0f);
  }
}

}  // namespace
}  // namespace attn
