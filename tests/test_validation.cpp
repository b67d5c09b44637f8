// Bad input: each rule gets an std::invalid_argument naming the argument, and the output stays untouched.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;

struct Fixture {
  test::Tensor<float> q = random_tensor<float>(1, 4, 2, 8, 1), k = random_tensor<float>(1, 5, 2, 8, 2),
                      v = random_tensor<float>(1, 5, 2, 8, 3);
  std::vector<float> out = std::vector<float>(64, 123.0f), lse = std::vector<float>(8, 456.0f);
  TensorView qv = q.view(), kv = k.view(), vv = v.view(), ov = TensorView::contiguous(out.data(), 1, 4, 2, 8),
             lv = TensorView::contiguous(lse.data(), 1, 2, 4);
  AttentionOptions opts;
  TileOptions tiles;
  SplitKOptions split;
};

// Runs every entry point on the fixture and expects each to throw a message containing all `needles`,
// with out and lse untouched and the inputs unchanged.
void expect_rejected(const Fixture& f, const std::vector<std::string>& needles) {
  using Call = std::function<void()>;
  const std::pair<const char*, Call> calls[] = {
      {"reference", [&] { attention_reference(f.qv, f.kv, f.vv, f.ov, f.opts, &f.lv); }},
      {"tiled", [&] { attention_tiled(f.qv, f.kv, f.vv, f.ov, f.opts, f.tiles, &f.lv); }},
      {"splitk", [&] { attention_splitk(f.qv, f.kv, f.vv, f.ov, f.opts, f.split, &f.lv); }},
  };
  const auto q0 = f.q.data, k0 = f.k.data, v0 = f.v.data;
  for (const auto& [algo, call] : calls) {
    try {
      call();
      ADD_FAILURE() << algo << ": no exception";
    } catch (const std::invalid_argument& e) {
      for (const auto& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << algo << ": " << e.what();
    }
    if (f.ov.data == f.out.data())
      for (float x : f.out) ASSERT_EQ(x, 123.0f) << algo << " wrote out";
    for (float x : f.lse) ASSERT_EQ(x, 456.0f) << algo << " wrote lse";
    EXPECT_TRUE(f.q.data == q0 && f.k.data == k0 && f.v.data == v0) << algo << " wrote an input";
  }
}

TEST(Validation, TheFixtureIsValid) {
  Fixture f;
  attention_tiled(f.qv, f.kv, f.vv, f.ov, f.opts, f.tiles, &f.lv);
  EXPECT_NE(f.out[0], 123.0f);
}

// One rule: how it breaks the valid fixture, and what the message must name.
struct Rule {
  const char* name;
  std::function<void(Fixture&)> breaks;
  std::vector<std::string> needles;
};
void PrintTo(const Rule& r, std::ostream* os) { *os << r.name; }

const Rule kRules[] = {
    {"KBatchMismatch", [](Fixture& f) { f.kv.shape[0] = f.vv.shape[0] = 2; }, {"k", "batch"}},
    {"HeadDimMismatch", [](Fixture& f) { f.kv.shape[3] = 4; }, {"k", "head_dim"}},
    {"VShapeMismatch", [](Fixture& f) { f.vv.shape[1] = 4; }, {"v", "seqlen"}},
    {"OutShapeMismatch", [](Fixture& f) { f.ov.shape[1] = 3; }, {"out", "seqlen"}},
    {"LseShapeMismatch", [](Fixture& f) { f.lv.shape[2] = 5; }, {"lse", "seqlen_q"}},
    {"HeadsNotDivisible",
     [](Fixture& f) {
       static const auto k3 = random_tensor<float>(1, 5, 3, 8, 2), v3 = random_tensor<float>(1, 5, 3, 8, 3);
       f.kv = k3.view();
       f.vv = v3.view();
     },
     {"heads", "multiple of"}},
    {"ZeroSize", [](Fixture& f) { f.qv.shape[3] = 0; }, {"q", "head_dim", ">= 1"}},
    {"NegativeSize", [](Fixture& f) { f.qv.shape[0] = -1; }, {"q", "batch"}},
    {"NegativeStride", [](Fixture& f) { f.kv.strides[1] = -16; }, {"k", "stride[1]"}},
    {"WrongRank", [](Fixture& f) { f.vv.rank = 3; }, {"v", "rank"}},
    {"NullQ", [](Fixture& f) { f.qv.data = nullptr; }, {"q", "null"}},
    {"NullOut", [](Fixture& f) { f.ov.data = nullptr; }, {"out", "null"}},
    {"DtypeMismatch", [](Fixture& f) { f.vv.dtype = DType::f64; }, {"v", "dtype"}},
    {"LseDtype", [](Fixture& f) { f.lv.dtype = DType::f64; }, {"lse", "dtype", "f32"}},
    {"OutOverlapsQ",  // same shape, q's memory moved by one element
     [](Fixture& f) {
       f.ov = f.qv;
       f.ov.data = f.q.data.data() + 1;
     },
     {"out", "overlaps", "q"}},
    {"LseOverlapsOut", [](Fixture& f) { f.lv.data = f.out.data() + 60; }, {"lse", "overlaps"}},
    {"OutStridesAlias", [](Fixture& f) { f.ov.strides[1] = 0; }, {"out", "alias"}},
    {"SizesOverflow",
     [](Fixture& f) {
       f.kv.shape[1] = f.vv.shape[1] = std::int64_t(1) << 40;
       f.kv.strides[1] = std::int64_t(1) << 40;
     },
     {"k", "overflow"}},
    {"NonFiniteScale",
     [](Fixture& f) { f.opts.softmax_scale = std::numeric_limits<double>::quiet_NaN(); },
     {"softmax_scale", "finite"}},
    {"NegativeThreads", [](Fixture& f) { f.opts.num_threads = -2; }, {"num_threads"}},
};

class ValidationRule : public ::testing::TestWithParam<Rule> {};

TEST_P(ValidationRule, EveryEntryPointRejectsItAndWritesNothing) {
  Fixture f;
  GetParam().breaks(f);
  expect_rejected(f, GetParam().needles);
}

INSTANTIATE_TEST_SUITE_P(Rules, ValidationRule, ::testing::ValuesIn(kRules),
                         [](const ::testing::TestParamInfo<Rule>& i) { return std::string(i.param.name); });

TEST(Validation, TileSizeZero) {
  Fixture f;
  f.tiles.k_tile = 0;
  EXPECT_THROW(
      {
        try {
          attention_tiled(f.qv, f.kv, f.vv, f.ov, f.opts, f.tiles, &f.lv);
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("k_tile"), std::string::npos) << e.what();
          throw;
        }
      },
      std::invalid_argument);
  for (float x : f.out) EXPECT_EQ(x, 123.0f);
  f.tiles = {};
  f.tiles.q_tile = -3;
  EXPECT_THROW(attention_tiled(f.qv, f.kv, f.vv, f.ov, f.opts, f.tiles), std::invalid_argument);
}

TEST(Validation, SplitsZero) {
  Fixture f;
  f.split.num_splits = 0;
  try {
    attention_splitk(f.qv, f.kv, f.vv, f.ov, f.opts, f.split, &f.lv);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("num_splits"), std::string::npos) << e.what();
  }
  for (float x : f.out) EXPECT_EQ(x, 123.0f);
}

TEST(Validation, SplitkPartialsRowOutOfRange) {
  Fixture f;
  EXPECT_THROW(splitk_partials(f.qv, f.kv, f.vv, {}, {}, 0, 4, 0), std::invalid_argument);
  EXPECT_THROW(splitk_partials(f.qv, f.kv, f.vv, {}, {}, 0, 0, 2), std::invalid_argument);
  EXPECT_EQ(splitk_partials(f.qv, f.kv, f.vv, {}, {}, 0, 3, 1).size(), 1u);
}

}  // namespace
}  // namespace attn
