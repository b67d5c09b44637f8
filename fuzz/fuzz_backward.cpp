// libFuzzer harness for attention_backward (include/attn/backward.hpp), built with
// -fsanitize=fuzzer,address,undefined (fuzz/CMakeLists.txt); built again as fuzz_backward_amx
// (ATTN_FUZZ_AMX): bf16 and f16 only, on the AMX tile emulator.
//
// The bytes decide the dtype, shapes, the layouts of all nine tensors, options (dropout on about 1
// input in 6), tile sizes, the data, and whether one argument is deliberately made invalid: the shared
// view corruptions (fuzz_common.hpp) applied to dout and the gradients, gradients that alias
// themselves, overlap an input or each other, an lse of the wrong dtype or length, bad options
// (dropout's included) and tiles. out and lse come from the reference forward of the same problem,
// with the same dropout. Properties (abort on violation):
//   * a corrupted call is rejected; every rejection is std::invalid_argument with an "attn::" message
//     (naming dropout_p / dropout_offset where those are the fault), and after it every buffer (inputs
//     and gradients) holds its old bytes;
//   * an accepted call writes nothing but dq's, dk's and dv's elements, and leaves the inputs unchanged;
//   * with finite inputs the gradients are finite, and in f64 they agree with the textbook backward
//     (attention_backward_reference) to 1e-9 of the largest gradient element (plus 1e-13).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "fuzz_common.hpp"

using namespace attn;
using namespace attn::fuzzing;

namespace {

enum Corrupt {
  kNone = -1,
  kNegDim,
  kNegStride,
  kRank,
  kDtypeMismatch,
  kNullData,
  kShapeMismatch,
  kGradAliases,
  kGradOverlapsInput,
  kGradOverlapsGrad,
  kLseDtype,
  kLseShape,
  kScale,
  kSoftcap,
  kWindow,
  kThreads,
  kTile,
  kDropout,
  kCount
};
static_assert(kCount == 17);  // an input's mode byte picks one of kCount: the seed corpus was written for 17

// This harness's numbers for the shared faults, in ViewFault's and OptionFault's order (kNoFault for
// kBadDtype, kOverflow and kAlibiStride, which it lacks): its seed corpus was written for its own numbering.
constexpr int kViewFaults[] = {kNegDim,  kNegStride, kRank,    kDtypeMismatch,
                               kNoFault, kNullData,  kNoFault, kShapeMismatch};
constexpr int kOptionFaults[] = {kScale, kSoftcap, kWindow, kNoFault, kThreads, kDropout};

void check_finite(const View& v, const char* what) {
  for (auto off : v.offsets)
    if (!std::isfinite(load_at(v, off))) die(std::string(what) + " not finite with finite inputs");
}

// The f64 gradients against the textbook backward on the same views (written into copies).
void check_against_textbook(const View& q, const View& k, const View& v, const View& out, const View& dout,
                            const View& lse, const View* grads[3], const AttentionOptions& o) {
  View copies[3] = {*grads[0], *grads[1], *grads[2]};
  for (View& c : copies) c.t.data = c.buf.data();
  attention_backward_reference(q.t, k.t, v.t, out.t, dout.t, lse.t, copies[0].t, copies[1].t, copies[2].t, o);
  for (int g = 0; g < 3; ++g) {
    double scale = 0, err = 0;
    for (auto off : copies[g].offsets) {
      const double want = load_at(copies[g], off);
      scale = std::max(scale, std::abs(want));
      err = std::max(err, std::abs(load_at(*grads[g], off) - want));
    }
    if (!(err <= 1e-9 * scale + 1e-13))  // the floor: gradients that are 0 in exact arithmetic
      die("gradient " + std::to_string(g) + " differs from the textbook by " + std::to_string(err) + " (scale " +
          std::to_string(scale) + ")");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const std::uint8_t flags = in.u8();
#if defined(ATTN_FUZZ_AMX)
  // fuzz_backward_amx: the backward's AMX path (backward/amx_backward.cpp) on the tile emulator, bf16 and f16.
  static const bool emulated_tiles = setenv("ATTN_AMX", "emulate", 1) == 0;
  if (!emulated_tiles) die("setenv ATTN_AMX failed");
  const DType dt = (flags & 3) == static_cast<int>(DType::f16) ? DType::f16 : DType::bf16;
#else
  const DType dt = static_cast<DType>(flags & 3);
#endif
  const bool causal = flags & 4, use_alibi = flags & 16, use_scale = flags & 32, use_softcap = flags & 64,
             specials = flags & 128;
  const int corrupt = draw_corruption(in, kCount);

  const std::int64_t B = 1 + in.u8() % 2, SQ = 1 + in.u8() % 20, SK = in.u8() % 21, HK = 1 + in.u8() % 3,
                     H = HK * (1 + in.u8() % 3), dbyte = in.u8(), D = 1 + dbyte % 24;
  // v's own head dim for one byte value in four (bits 6 and 7 set), from the byte already read, so the
  // inputs of earlier versions parse as they did.
  const std::int64_t DV = (dbyte & 0xC0) == 0xC0 ? 1 + (3 * D + HK) % 30 : D;
  const Shape4 sq{B, SQ, H, D}, sk{B, SK, HK, D}, sv{B, SK, HK, DV}, so{B, SQ, H, DV};
  View q = make_view(dt, sq, in, true), k = make_view(dt, sk, in, true), v = make_view(dt, sv, in, true);
  View out = make_view(dt, so, in, false), dout = make_view(dt, so, in, true);
  View dq = make_view(dt, sq, in, false), dk = make_view(dt, sk, in, false), dv = make_view(dt, sv, in, false);
  const DType lt = dt == DType::f64 ? DType::f64 : DType::f32;
  View lse = make_view(lt, {B, H, SQ, 1}, in, false, 3);

  std::vector<float> slopes;
  AttentionOptions o = draw_options(in, causal, use_softcap, use_scale, use_alibi, B, H, 24, slopes);
  TileOptions tiles = draw_tiles(in, 24);
  for (View* x : {&q, &k, &v, &dout}) fill(*x, in, 1.0, specials);
  const std::uint8_t which = in.u8(), amount = in.u8();
  draw_dropout(in, o);  // the last bytes read: inputs from before dropout parse as they did
  std::vector<float> sinks;
  draw_sinks(in, o, H, sinks);
  attention_reference(q.t, k.t, v.t, out.t, o, &lse.t);  // the forward's out and lse, before any corruption

  const char* must_name = nullptr;  // the option a rejection must name, where that is the only fault
  View* grads[] = {&dq, &dk, &dv};
  View* targets[] = {&dout, &dq, &dk, &dv};
  View& victim = *targets[which % 4];
  View& grad = *grads[which % 3];
  switch (corrupt) {
    case kNone:
      break;
    case kGradAliases: {
      const int dim = amount % 4;
      // An empty gradient (dk, dv with no keys) has no elements to alias, whatever its strides.
      if (grad.t.shape[dim] < 2 || grad.offsets.empty()) return 0;
      grad.t.strides[dim] = 0;
      break;
    }
    case kGradOverlapsInput: {
      View* inputs[] = {&q, &k, &v, &out, &dout, &lse};
      View& in_view = *inputs[amount % 6];
      if (in_view.offsets.empty() || grad.offsets.empty()) return 0;
      grad.t.data = in_view.t.data;
      break;
    }
    case kGradOverlapsGrad: {
      View& other = *grads[(which + 1 + amount % 2) % 3];
      if (other.offsets.empty() || grad.offsets.empty()) return 0;
      grad.t.data = other.t.data;
      break;
    }
    case kLseDtype:
      lse.t.dtype = lt == DType::f64 ? DType::f32 : DType::f64;
      break;
    case kLseShape:
      lse.t.shape[amount % 3] += 1 + amount % 2;
      break;
    case kTile:
      (amount & 1 ? tiles.q_tile : tiles.k_tile) = -(amount / 2 % 3);
      break;
    default:
      if (const auto fault = shared_fault<ViewFault>(corrupt, kViewFaults)) {
        if (!apply_view_corruption(*fault, victim.t, amount)) return 0;
      } else if (const auto option = shared_fault<OptionFault>(corrupt, kOptionFaults)) {
        must_name = corrupt_option(*option, o, amount, slopes);
      }
  }
  std::vector<View*> views = {&q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv};
  const auto call = [&] { attention_backward(q.t, k.t, v.t, out.t, dout.t, lse.t, dq.t, dk.t, dv.t, o, tiles); };
  if (call_rejected(call, views, corrupt, which, amount, must_name)) return 0;
  check_inputs_untouched({&q, &k, &v, &out, &dout, &lse});
  for (View* g : grads) check_padding_untouched(*g);
  if (!specials && !scale_may_overflow(o) && std::fabs(o.softmax_scale.value_or(1)) < 64) {
    check_finite(dq, "dq");
    check_finite(dk, "dk");
    check_finite(dv, "dv");
    const View* g[3] = {&dq, &dk, &dv};
    if (dt == DType::f64) check_against_textbook(q, k, v, out, dout, lse, g, o);
  }
  return 0;
}
