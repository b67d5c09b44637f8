// libFuzzer harness for attention_varlen (include/attn/varlen.hpp), built with
// -fsanitize=fuzzer,address,undefined (fuzz/CMakeLists.txt).
//
// The bytes decide the dtype, the batch and each sequence's query and key counts (0 included), the
// packed [total, heads, head_dim] layouts, options, tile sizes, the data, and whether one argument is
// deliberately made invalid: the shared view corruptions (fuzz_common.hpp) plus cu_seqlens ones (null,
// first entry not 0, decreasing, last entry past or short of the packed length, batch < 1) and an lse
// of the wrong rank or leading dim. cu_seqlens arrays are heap vectors of exactly batch + 1 entries, so
// reading past them is an ASan report. Properties (abort on violation):
//   * a corrupted call is rejected; every rejection is std::invalid_argument with an "attn::" message;
//     after it every buffer (inputs, out, lse, cu_seqlens) holds its old bytes;
//   * an accepted call writes nothing but out's and lse's elements; inputs and cu_seqlens unchanged;
//   * a sequence with queries but no keys gets out = 0 and lse = -inf; with finite inputs
//     |out| <= max |v| and lse is finite or -inf.
#include <cmath>
#include <cstdint>
#include <vector>

#include "attn/varlen.hpp"
#include "fuzz_common.hpp"

using namespace attn;
using namespace attn::fuzzing;
using namespace attn::fuzzing::forward;

namespace {

// This harness's own corruption kinds, after the forward ones (fuzz_common.hpp). An input's mode byte
// picks one of kCount (draw_corruption): the seed corpus was written for this count.
enum { kTile = kShared, kCuNull, kCuFirst, kCuDecreasing, kCuLast, kBatch, kLseShape, kCount };
static_assert(kCount == 25);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const std::uint8_t flags = in.u8();
  const DType dt = static_cast<DType>(flags & 3);
  const bool causal = flags & 4, want_lse = flags & 8, use_alibi = flags & 16, use_scale = flags & 32,
             use_softcap = flags & 64, specials = flags & 128;
  const int corrupt = draw_corruption(in, kCount);

  const std::int64_t B = 1 + in.u8() % 5, HK = 1 + in.u8() % 3, H = HK * (1 + in.u8() % 3), D = 1 + in.u8() % 24;
  std::vector<std::int32_t> cu_q(static_cast<std::size_t>(B + 1), 0), cu_k(static_cast<std::size_t>(B + 1), 0);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::uint8_t x = in.u8(), y = in.u8();
    cu_q[b + 1] = cu_q[b] + (x < 40 ? 0 : x % 9);   // about 1 in 6 sequences without queries
    cu_k[b + 1] = cu_k[b] + (y < 40 ? 0 : y % 11);  // and without keys
  }
  if (cu_q[B] == 0)
    for (std::int64_t b = 1; b <= B; ++b) cu_q[b] += 1;  // q needs >= 1 row in all
  const std::int64_t TQ = cu_q[B], TK = cu_k[B];

  View q = make_view(dt, {TQ, H, D, 1}, in, true, 3), k = make_view(dt, {TK, HK, D, 1}, in, true, 3),
       v = make_view(dt, {TK, HK, D, 1}, in, true, 3), out = make_view(dt, {TQ, H, D, 1}, in, false, 3);
  const DType lt = dt == DType::f64 ? DType::f64 : DType::f32;
  View lse = make_view(lt, {1, H, TQ, 1}, in, false, 3);

  std::vector<float> slopes;
  AttentionOptions o = draw_options(in, causal, use_softcap, use_scale, use_alibi, B, H, 12, slopes);
  TileOptions tiles = draw_tiles(in, 12);
  std::int64_t batch = B;

  for (View* x : {&q, &k, &v}) fill(*x, in, 1.0, specials);

  const std::uint8_t which = in.u8(), amount = in.u8();
  View* tv[] = {&q, &k, &v, &out};
  View& victim = *tv[which % 4];
  std::vector<std::int32_t>& cu = which & 4 ? cu_k : cu_q;
  const std::int64_t cu_total = which & 4 ? TK : TQ;
  const std::int32_t* cu_q_arg = cu_q.data();
  const std::int32_t* cu_k_arg = cu_k.data();
  const bool lse_passed = want_lse || corrupt == kLseOverlap || corrupt == kLseDtype || corrupt == kLseShape;
  std::vector<View*> views = {&q, &k, &v, &out};
  if (lse_passed) views.push_back(&lse);
  switch (corrupt) {
    case kNone:
      break;
    case kNegDim:  // or a zero heads or head_dim (a zero packed length is valid for k and v)
      if (amount % 3 && amount & 64)
        victim.t.shape[amount % 3] = 0;
      else
        apply_view_corruption(ViewFault::kNegDim, victim.t, amount);
      break;
    case kDtypeMismatch:  // q's dtype is the one the others must match: change k's instead
      apply_view_corruption(ViewFault::kDtypeMismatch, (&victim == &q ? k : victim).t, amount);
      break;
    case kHeadsNotMultiple:
      k.t.shape[1] = v.t.shape[1] = H + 1;
      break;
    case kShapeMismatch:  // k, v or out one dim larger: a mismatch with q or k
      apply_view_corruption(ViewFault::kShapeMismatch, tv[1 + which % 3]->t, amount);
      break;
    case kOutOverlapsInput:
      out.t.data = (which & 1 ? q : which & 2 ? k : v).t.data;
      if (TK == 0 && !(which & 1)) return 0;
      break;
    case kTile:
      (amount & 1 ? tiles.q_tile : tiles.k_tile) = -(amount / 2 % 3);
      break;
    case kCuNull:
      (which & 4 ? cu_k_arg : cu_q_arg) = nullptr;
      break;
    case kCuFirst:
      cu[0] = amount & 1 ? 1 + amount / 2 : -1 - amount / 2;
      break;
    case kCuDecreasing: {  // one entry below its predecessor
      const std::size_t j = 1 + amount % B;
      cu[j] = cu[j - 1] - 1 - amount / 8 % 3;
      break;
    }
    case kCuLast:  // the last offset past (or short of) the packed length, or a middle one past it
      if (amount % 3 == 0)
        cu[B] = static_cast<std::int32_t>(cu_total + 1 + amount / 3);
      else if (amount % 3 == 1 && cu_total > 0)
        cu[B] = static_cast<std::int32_t>(cu_total - 1 - amount / 3 % cu_total);
      else if (B >= 2)
        cu[1 + amount / 3 % (B - 1)] = amount & 128 ? INT32_MAX : static_cast<std::int32_t>(cu_total + 1);
      else
        cu[B] = INT32_MAX;
      break;
    case kBatch:
      batch = amount & 1 ? 0 : -1 - amount / 2;
      break;
    case kLseShape:
      if (amount & 1)
        lse.t.shape[0] = 2 + amount / 2 % 3;
      else
        lse.t.rank = amount & 2 ? 4 : 2;
      break;
    default:
      if (!corrupt_forward(corrupt, victim, out, lse, q, o, which, amount, slopes)) return 0;
  }
  const TensorView* lse_arg = lse_passed ? &lse.t : nullptr;
  const std::vector<std::int32_t> cu_q0 = cu_q, cu_k0 = cu_k;
  snapshot(views);
  const auto what =
      rejection([&] { attention_varlen(q.t, k.t, v.t, out.t, cu_q_arg, cu_k_arg, batch, o, tiles, lse_arg); });
  if (cu_q != cu_q0 || cu_k != cu_k0) die("cu_seqlens were written");
  if (judge_call(what, corrupt, which, amount, views)) return 0;
  check_inputs_untouched({&q, &k, &v});
  check_padding_untouched(out);
  if (want_lse) check_padding_untouched(lse);
  // Sequences with queries but no keys: out = 0, lse = -inf (offsets are row-major over the shape).
  for (std::int64_t b = 0; b < B; ++b) {
    if (cu_k[b + 1] != cu_k[b]) continue;
    for (std::int64_t i = cu_q[b]; i < cu_q[b + 1]; ++i)
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t d = 0; d < D; ++d)
          if (load_at(out, out.offsets[static_cast<std::size_t>((i * H + h) * D + d)]) != 0)
            die("a sequence without keys got out != 0");
        if (want_lse && load_at(lse, lse.offsets[static_cast<std::size_t>(h * TQ + i)]) != -INFINITY)
          die("a sequence without keys got lse != -inf");
      }
  }
  if (!specials && !scale_may_overflow(o)) {
    check_bounded(out, max_abs(v) * (1 + 1.0 / 64) + 1e-30, "out");
    if (want_lse) check_lse(lse);
  }
  return 0;
}
