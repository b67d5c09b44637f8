// The options' arrays (AttentionOptions::alibi_slopes and sinks, attn::F32Array) carry their length, and
// every entry point checks it against the problem's heads and batch (the number of sequences for the
// varlen and decode calls) before writing anything: a short array is a named error, never a read past
// its end. The arrays of the exact length are accepted, and give the same result as a longer array
// holding the same values.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "attn/attn.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::random_tensor;

constexpr std::int64_t kBatch = 2, kSeq = 5, kHeads = 4, kKvHeads = 2, kDim = 8;
constexpr float kUntouched = 123.0f;

// Batch 2 of 5 queries and 5 keys, 4 query heads over 2 kv heads, as dense tensors, as a varlen batch
// (the same rows packed) and as a decode call (one query per sequence over a contiguous cache).
struct Problem {
  test::Tensor<float> q = random_tensor<float>(kBatch, kSeq, kHeads, kDim, 1),
                      k = random_tensor<float>(kBatch, kSeq, kKvHeads, kDim, 2),
                      v = random_tensor<float>(kBatch, kSeq, kKvHeads, kDim, 3),
                      dout = random_tensor<float>(kBatch, kSeq, kHeads, kDim, 4);
  std::vector<float> out = std::vector<float>(q.data.size(), kUntouched);
  std::vector<float> lse = std::vector<float>(kBatch * kHeads * kSeq, kUntouched);
  std::vector<float> grads = std::vector<float>(3 * q.data.size(), kUntouched);
  std::vector<std::int32_t> cu = {0, kSeq, 2 * kSeq}, seqlens = {kSeq, kSeq};

  TensorView out4() { return TensorView::contiguous(out.data(), kBatch, kSeq, kHeads, kDim); }
  TensorView out3() {
    TensorView o = out4();
    o.rank = 3;
    o.shape = {kBatch * kSeq, kHeads, kDim};
    o.strides = {kHeads * kDim, kDim, 1};
    return o;
  }
  TensorView grad(int i, std::int64_t heads) {
    return TensorView::contiguous(grads.data() + i * q.data.size(), kBatch, kSeq, heads, kDim);
  }
};

using Call = std::function<void(Problem&, const AttentionOptions&)>;

// Every entry point that takes AttentionOptions, on the problem above.
std::vector<std::pair<const char*, Call>> entry_points() {
  return {
      {"attention_reference",
       [](Problem& p, const AttentionOptions& o) {
         attention_reference(p.q.view(), p.k.view(), p.v.view(), p.out4(), o);
       }},
      {"attention_tiled",
       [](Problem& p, const AttentionOptions& o) { attention_tiled(p.q.view(), p.k.view(), p.v.view(), p.out4(), o); }},
      {"attention_splitk",
       [](Problem& p, const AttentionOptions& o) {
         attention_splitk(p.q.view(), p.k.view(), p.v.view(), p.out4(), o, SplitKOptions{3});
       }},
      {"attention_varlen",
       [](Problem& p, const AttentionOptions& o) {
         attention_varlen(p.q.packed(), p.k.packed(), p.v.packed(), p.out3(), p.cu.data(), p.cu.data(), kBatch, o);
       }},
      {"attention_decode",
       [](Problem& p, const AttentionOptions& o) {
         KVCache cache;
         cache.k = p.k.view();
         cache.v = p.v.view();
         cache.seqlens = p.seqlens.data();
         TensorView q1 = p.q.view(), o1 = p.out4();
         q1.shape[1] = o1.shape[1] = 1;
         attention_decode(q1, cache, o1, o);
       }},
      {"attention_backward",
       [](Problem& p, const AttentionOptions& o) {
         attention_backward(p.q.view(), p.k.view(), p.v.view(), p.out4(), p.dout.view(),
                            TensorView::contiguous(p.lse.data(), kBatch, kHeads, kSeq), p.grad(0, kHeads),
                            p.grad(1, kKvHeads), p.grad(2, kKvHeads), o);
       }},
  };
}

void expect_rejected(const AttentionOptions& o, const std::string& needle) {
  for (const auto& [name, call] : entry_points()) {
    Problem p;
    try {
      call(p, o);
      ADD_FAILURE() << name << ": no exception";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << name << ": " << e.what();
    }
    for (float x : p.out) ASSERT_EQ(x, kUntouched) << name << " wrote out";
    for (float x : p.grads) ASSERT_EQ(x, kUntouched) << name << " wrote a gradient";
  }
}

TEST(OptionArrays, ShortSinksAreRejectedByEveryEntryPoint) {
  const std::vector<float> sinks(kHeads - 1, 0.5f);
  AttentionOptions o;
  o.sinks = sinks;
  expect_rejected(o, "sinks: must hold one value per query head (4), got 3");
}

TEST(OptionArrays, LongSinksAreRejectedToo) {  // a [kv_heads] or [batch, heads] array passed by mistake
  const std::vector<float> sinks(kBatch * kHeads, 0.5f);
  AttentionOptions o;
  o.sinks = sinks;
  expect_rejected(o, "sinks: must hold one value per query head (4), got 8");
}

TEST(OptionArrays, SharedSlopesShorterThanTheHeadsAreRejected) {
  const std::vector<float> slopes(kHeads - 1, 0.25f);
  AttentionOptions o;
  o.alibi_slopes = slopes;
  expect_rejected(o, "alibi_slopes: must hold (batch - 1) x alibi_batch_stride + heads = 4 values");
}

TEST(OptionArrays, PerSequenceSlopesMustCoverTheLastSequence) {
  const std::vector<float> slopes(kHeads, 0.25f);  // one sequence's worth, with a stride to the next
  AttentionOptions o;
  o.alibi_slopes = slopes;
  o.alibi_batch_stride = kHeads;
  expect_rejected(o, "alibi_slopes: must hold (batch - 1) x alibi_batch_stride + heads = 8 values (batch 2");
}

TEST(OptionArrays, AnEmptyArrayWithAPointerIsNotOff) {
  const float slope = 0.25f;
  AttentionOptions o;
  o.alibi_slopes = {&slope, 0};
  expect_rejected(o, "alibi_slopes: must hold");
}

// The exact lengths run, and equal a call whose arrays hold more values than they need (the extra
// ones never read).
TEST(OptionArrays, ExactLengthsRunAndMatchLongerArrays) {
  const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f, 0.3f, 0.2f, 0.1f, 0.05f};
  std::vector<float> longer = slopes;
  longer.resize(slopes.size() + 16, 1e30f);
  const std::vector<float> sinks = {0.1f, -1.0f, 2.0f, 0.0f};
  for (std::int64_t stride : {std::int64_t{0}, kHeads}) {
    AttentionOptions exact, loose;
    exact.alibi_slopes = F32Array(slopes.data(), stride == 0 ? kHeads : kBatch * kHeads);
    loose.alibi_slopes = longer;
    exact.alibi_batch_stride = loose.alibi_batch_stride = stride;
    exact.sinks = loose.sinks = sinks;
    for (const auto& [name, call] : entry_points()) {
      if (std::string(name) == "attention_backward") continue;  // its lse here is not the forward's
      Problem a, b;
      ASSERT_NO_THROW(call(a, exact)) << name;
      ASSERT_NO_THROW(call(b, loose)) << name;
      EXPECT_EQ(a.out, b.out) << name << " stride " << stride;
      EXPECT_NE(a.out[0], kUntouched) << name;
    }
  }
}

}  // namespace
}  // namespace attn
