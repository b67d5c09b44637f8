// Bad input: each rule gets an std::invalid_argument naming the argument, and the output stays untouched.
#include <gtest/gtest.h>

#include <limits>
#include <string>

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
// with out and lse untouched.
void expect_rejected(const Fixture& f, std::initializer_list<std::string> needles) {
  using Call = std::function<void()>;
  const std::pair<const char*, Call> calls[] = {
      {"reference", [&] { attention_reference(f.qv, f.kv, f.vv, f.ov, f.opts, &f.lv); }},
      {"tiled", [&] { attention_tiled(f.qv, f.kv, f.vv, f.ov, f.opts, f.tiles, &f.lv); }},
      {"splitk", [&] { attention_splitk(f.qv, f.kv, f.vv, f.ov, f.opts, f.split, &f.lv); }},
  };
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
  }
}

TEST(Validation, TheFixtureIsValid) {
  Fixture f;
  attention_tiled(f.qv, f.kv, f.vv, f.ov, f.opts, f.tiles, &f.lv);
  EXPECT_NE(f.out[0], 123.0f);
}

TEST(Validation, KBatchMismatch) {
  Fixture f;
  f.kv.shape[0] = 2;
  f.vv.shape[0] = 2;
  expect_rejected(f, {"k", "batch"});
}
TEST(Validation, HeadDimMismatch) {
  Fixture f;
  f.kv.shape[3] = 4;
  expect_rejected(f, {"k", "head_dim"});
}
TEST(Validation, VShapeMismatch) {
  Fixture f;
  f.vv.shape[1] = 4;
  expect_rejected(f, {"v", "seqlen"});
}
TEST(Validation, OutShapeMismatch) {
  Fixture f;
  f.ov.shape[1] = 3;
  expect_rejected(f, {"out", "seqlen"});
}
TEST(Validation, LseShapeMismatch) {
  Fixture f;
  f.lv.shape[2] = 5;
  expect_rejected(f, {"lse", "seqlen_q"});
}
TEST(Validation, HeadsNotDivisible) {
  Fixture f;
  auto k3 = random_tensor<float>(1, 5, 3, 8, 2), v3 = random_tensor<float>(1, 5, 3, 8, 3);
  f.kv = k3.view();
  f.vv = v3.view();
  expect_rejected(f, {"heads", "multiple of"});
}
TEST(Validation, ZeroSize) {
  Fixture f;
  f.qv.shape[3] = 0;
  expect_rejected(f, {"q", "head_dim", ">= 1"});
}
TEST(Validation, NegativeSize) {
  Fixture f;
  f.qv.shape[0] = -1;
  expect_rejected(f, {"q", "batch"});
}
TEST(Validation, NegativeStride) {
  Fixture f;
  f.kv.strides[1] = -16;
  expect_rejected(f, {"k", "stride[1]"});
}
TEST(Validation, WrongRank) {
  Fixture f;
  f.vv.rank = 3;
  expect_rejected(f, {"v", "rank"});
}
TEST(Validation, NullQ) {
  Fixture f;
  f.qv.data = nullptr;
  expect_rejected(f, {"q", "null"});
}
TEST(Validation, NullOut) {
  Fixture f;
  f.ov.data = nullptr;
  expect_rejected(f, {"out", "null"});
}
TEST(Validation, DtypeMismatch) {
  Fixture f;
  f.vv.dtype = DType::f64;
  expect_rejected(f, {"v", "dtype"});
}
TEST(Validation, LseDtype) {
  Fixture f;
  f.lv.dtype = DType::f64;
  expect_rejected(f, {"lse", "dtype", "f32"});
}
TEST(Validation, OutOverlapsQ) {
  Fixture f;
  f.ov = f.qv;  // same shape, same memory
  f.ov.data = f.q.data.data() + 1;
  auto before = f.q.data;
  expect_rejected(f, {"out", "overlaps", "q"});
  EXPECT_EQ(f.q.data, before);
}
TEST(Validation, LseOverlapsOut) {
  Fixture f;
  f.lv.data = f.out.data() + 60;
  expect_rejected(f, {"lse", "overlaps"});
}
TEST(Validation, OutStridesAlias) {
  Fixture f;
  f.ov.strides[1] = 0;
  expect_rejected(f, {"out", "alias"});
}
TEST(Validation, SizesOverflow) {
  Fixture f;
  f.kv.shape[1] = std::int64_t(1) << 40;
  f.vv.shape[1] = std::int64_t(1) << 40;
  f.kv.strides[1] = std::int64_t(1) << 40;
  expect_rejected(f, {"k", "overflow"});
}
TEST(Validation, NonFiniteScale) {
  Fixture f;
  f.opts.softmax_scale = std::numeric_limits<double>::quiet_NaN();
  expect_rejected(f, {"softmax_scale", "finite"});
}
TEST(Validation, NegativeThreads) {
  Fixture f;
  f.opts.num_threads = -2;
  expect_rejected(f, {"num_threads"});
}

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
