// libFuzzer harness for the attention entry points. Built once per entry point (ATTN_FUZZ_ENTRY, see
// fuzz/CMakeLists.txt) with -fsanitize=fuzzer,address,undefined.
//
// The bytes decide everything: dtype, shapes, memory layouts, options (dropout included, for the entry
// points that take it), tile sizes / split counts, the data, and whether one argument is deliberately
// made invalid. The properties checked:
//   * no crash and no sanitizer report (buffers are sized exactly to what each view may touch, so any
//     read or write outside a view is a heap overflow);
//   * a corrupted argument is rejected, and every rejection is an std::invalid_argument whose message
//     starts with "attn::" and says more than that (and names dropout_p / dropout_offset where those
//     are the fault: out of range, or any dropout for split-K); after it, out and lse hold their old bytes;
//   * an accepted call writes nothing outside out's and lse's views, and with finite inputs its
//     outputs are finite convex combinations of v's rows (|out| <= max |v|, / (1 - dropout_p) with
//     dropout) and lse is finite or -inf.
// Any violated property aborts with a message (libFuzzer then saves the input as a crash-* file).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "attn/attention.hpp"
#include "fuzz_common.hpp"

using namespace attn;
using namespace attn::fuzzing;
using namespace attn::fuzzing::forward;

namespace {

enum Entry { kReference = 1, kTiled = 2, kSplitk = 3, kSplitkPartials = 4 };

// This harness's own corruption kinds, after the forward ones (fuzz_common.hpp). An input's mode byte
// picks one of kCount (draw_corruption): the seed corpus was written for this count.
enum { kKnob = kShared, kDropout, kCount };
static_assert(kCount == 20);

// Split-K (and its partials) is an inference path: it takes no dropout (docs/dropout.md).
// Entry 5 is attention_tiled on the AMX tile emulator (ATTN_AMX=emulate; bf16, f16, or f32 split into bf16
// parts with ATTN_AMX_F32=bf16x3): the tiled forward's AMX path (tiled/amx_kernel.cpp) on any CPU.
#define ATTN_FUZZ_TILED (ATTN_FUZZ_ENTRY == 2 || ATTN_FUZZ_ENTRY == 5)
constexpr bool kTakesDropout = ATTN_FUZZ_ENTRY <= 2 || ATTN_FUZZ_ENTRY == 5;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const std::uint8_t flags = in.u8();
#if ATTN_FUZZ_ENTRY == 5
  static const bool emulated_tiles = setenv("ATTN_AMX", "emulate", 1) == 0 && setenv("ATTN_AMX_F32", "bf16x3", 1) == 0;
  if (!emulated_tiles) die("setenv ATTN_AMX or ATTN_AMX_F32 failed");
  const DType drawn = static_cast<DType>(flags & 3);
  const DType dt = drawn == DType::f16 || drawn == DType::f32 ? drawn : DType::bf16;
#else
  const DType dt = static_cast<DType>(flags & 3);
#endif
  const bool causal = flags & 4, want_lse = flags & 8, use_alibi = flags & 16, use_scale = flags & 32,
             use_softcap = flags & 64, specials = flags & 128;
  const int corrupt = draw_corruption(in, kCount);

  const std::int64_t B = 1 + in.u8() % 3, SQ = 1 + in.u8() % 24, SK = in.u8() % 25, HK = 1 + in.u8() % 3,
                     H = HK * (1 + in.u8() % 3);
  const std::uint8_t dbyte = in.u8();
  const std::int64_t D = dbyte >= 240 && SQ * SK <= 64 ? 1 + in.u8() : 1 + dbyte % 32;  // up to 256, kept cheap
  // v's own head dim (DeepSeek's 192 / 128) where dbyte's bits 5 and 6 are both set, from bytes already
  // read, so the inputs of earlier versions parse as they did.
  const std::int64_t DV = (dbyte & 0x60) == 0x60 && dbyte < 240 ? 1 + (3 * D + HK) % 40 : D;

  Shape4 sq{B, SQ, H, D}, sk{B, SK, HK, D}, sv{B, SK, HK, DV}, so{B, SQ, H, DV};
  View q = make_view(dt, sq, in, true), k = make_view(dt, sk, in, true), v = make_view(dt, sv, in, true);
  View out = make_view(dt, so, in, false);
  const DType lt = dt == DType::f64 ? DType::f64 : DType::f32;
  View lse = make_view(lt, {B, H, SQ, 1}, in, false, 3);

  std::vector<float> slopes;
  AttentionOptions o = draw_options(in, causal, use_softcap, use_scale, use_alibi, B, H, 30, slopes);
  [[maybe_unused]] TileOptions tiles = draw_tiles(in, 40);  // the tiled entries' (the others read its bytes too)
  SplitKOptions split;
  split.num_splits = in.u8() & 1 ? 1 + in.u8() % 64 : (std::int64_t(1) << (in.u8() % 40));
  std::int64_t pb = in.u8() % B, pi = in.u8() % SQ, ph = in.u8() % H;

  for (View* x : {&q, &k, &v}) fill(*x, in, 1.0, specials);

  // Apply the corruption (after the data, so the data bytes stay aligned with the valid case).
  const std::uint8_t which = in.u8(), amount = in.u8();
  draw_dropout(in, o);  // the last bytes read: inputs from before dropout parse as they did
  std::vector<float> sinks;
  draw_sinks(in, o, H, sinks);
  if (!kTakesDropout) o.dropout_p = 0;  // split-K's rejection of a valid rate is a kDropout corruption
  const char* must_name = nullptr;      // the option a rejection must name, where that is the only fault
  View* tv[] = {&q, &k, &v, &out};
  View& victim = *tv[which % 4];
  std::vector<View*> views = {&q, &k, &v, &out};
  if (want_lse || corrupt == kLseOverlap || corrupt == kLseDtype) views.push_back(&lse);
#if ATTN_FUZZ_ENTRY == 4
  // splitk_partials takes no out or lse: corrupting those proves nothing.
  if (corrupt != kNone &&
      (&victim == &out || corrupt == kOutOverlapsInput || corrupt == kOutAliases || corrupt == kLseOverlap ||
       corrupt == kLseDtype || (corrupt == kShapeMismatch && which % 3 == 2)))
    return 0;
#endif
  switch (corrupt) {
    case kNone:
      break;
    case kNegDim:  // a dim of 0 or less, k's and v's key count below 0 (no keys is valid)
      victim.t.shape[amount % 4] = -(amount / 4 % 3);
      if (&victim == &k || &victim == &v) victim.t.shape[1] = -1 - amount % 2;
      break;
    case kDtypeMismatch:  // q's dtype is the one the others must match: change k's instead
      apply_view_corruption(ViewFault::kDtypeMismatch, (&victim == &q ? k : victim).t, amount);
      break;
    case kOverflow:
      apply_view_corruption(ViewFault::kOverflow, victim.t, amount);
      if (&victim == &k) {  // so that the overflow, not v's mismatch, is what fails
        v.t.shape = k.t.shape;
        if (k.t.shape[3] == D) v.t.shape[3] = DV;  // v's own head dim, unless the overflow is there
      }
      break;
    case kHeadsNotMultiple:  // kv_heads = heads + 1 never divides heads
      k.t.shape[2] = v.t.shape[2] = H + 1;
      break;
    case kShapeMismatch:   // k, v or out one dim larger: a mismatch with q, k or v
      if (which % 3 == 1)  // v's head dim is its own (out's follows it): the mismatch is in another dim
        v.t.shape[amount % 3] += 1 + amount / 3 % 3;
      else
        apply_view_corruption(ViewFault::kShapeMismatch, tv[1 + which % 3]->t, amount);
      break;
    case kOutOverlapsInput:
      out.t.data = (which & 1 ? q : which & 2 ? k : v).t.data;
      if (SK == 0 && !(which & 1)) return 0;
      break;
    case kKnob:
#if ATTN_FUZZ_TILED
      (amount & 1 ? tiles.q_tile : tiles.k_tile) = -(amount / 2 % 3);
#elif ATTN_FUZZ_ENTRY == 3
      split.num_splits = -(amount % 3);
#elif ATTN_FUZZ_ENTRY == 4
      switch (amount % 4) {
        case 0:
          split.num_splits = -(amount / 4 % 3);
          break;
        case 1:
          pb = amount & 4 ? -1 : B;
          break;
        case 2:
          pi = amount & 4 ? -1 : SQ;
          break;
        case 3:
          ph = amount & 4 ? -1 : H;
          break;
      }
#else
      return 0;
#endif
      break;
    case kDropout:
      if (!kTakesDropout && amount & 128) {  // a valid rate, which split-K must reject all the same
        o.dropout_p = (1 + amount % 64) / 65.0;
        must_name = "dropout_p";
      } else {
        must_name = corrupt_dropout(o, amount);
      }
      break;
    default:
      if (!corrupt_forward(corrupt, victim, out, lse, q, o, which, amount, slopes)) return 0;
  }
  const TensorView* lse_arg = want_lse || corrupt == kLseOverlap || corrupt == kLseDtype ? &lse.t : nullptr;
#if ATTN_FUZZ_ENTRY == 4
  // splitk_partials returns one state per slice: keep the count small enough to be quick.
  if (corrupt != kKnob) split.num_splits = 1 + split.num_splits % 300;
#endif
  const auto call = [&] {
#if ATTN_FUZZ_ENTRY == 1
    attention_reference(q.t, k.t, v.t, out.t, o, lse_arg);
#elif ATTN_FUZZ_TILED
    attention_tiled(q.t, k.t, v.t, out.t, o, tiles, lse_arg);
#elif ATTN_FUZZ_ENTRY == 3
    attention_splitk(q.t, k.t, v.t, out.t, o, split, lse_arg);
#elif ATTN_FUZZ_ENTRY == 4
    const auto parts = splitk_partials(q.t, k.t, v.t, o, split, pb, pi, ph);
    if (static_cast<std::int64_t>(parts.size()) != split.num_splits) die("splitk_partials: wrong number of partials");
#else
#error "ATTN_FUZZ_ENTRY must be 1..5"
#endif
  };
  if (call_rejected(call, views, corrupt, which, amount, must_name)) return 0;
  check_inputs_untouched({&q, &k, &v});
  check_padding_untouched(out);
  if (want_lse) check_padding_untouched(lse);
#if ATTN_FUZZ_ENTRY != 4
  if (!specials && !scale_may_overflow(o)) {
    // Dropout scales the kept weights by 1 / (1 - p): a convex combination of v's rows times that.
    const double vmax = max_abs(v) / (1 - o.dropout_p);
    check_bounded(out, vmax * (1 + 1.0 / 64) + 1e-30, "out");
    if (want_lse) check_lse(lse);
  }
#endif
  return 0;
}
