// Shared pieces of the libFuzzer harnesses: a byte reader, strided views over exactly-sized heap
// buffers, the corruptions they have in common, and the property checks (abort with a message on a
// violation).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/options.hpp"
#include "attn/tensor.hpp"
#include "core/element.hpp"

namespace attn::fuzzing {

[[noreturn]] inline void die(const std::string& why) {
  std::fprintf(stderr, "FUZZ PROPERTY VIOLATED: %s\n", why.c_str());
  std::abort();
}

// Reads the input front to back; past its end it yields a fixed pseudo-random stream, so a short
// input still describes a whole problem.
class Bytes {
 public:
  Bytes(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  std::uint8_t u8() {
    if (i_ < n_) return d_[i_++];
    x_ = x_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint8_t>(x_ >> 56);
  }

 private:
  const std::uint8_t* d_;
  std::size_t n_, i_ = 0;
  std::uint64_t x_ = 0x2545F4914F6CDD1Dull;
};

// The corruption kind an input asks for, from its mode byte: none (-1) below `first`, so that most
// inputs make a valid call, else one of the harness's `count` kinds.
inline int draw_corruption(Bytes& in, int count, int first = 150) {
  const std::uint8_t mode = in.u8();
  return mode < first ? -1 : (mode - first) % count;
}

using Shape4 = std::array<std::int64_t, 4>;

// Valid option values at the extremes (docs/robustness.md, "Huge and non-finite options"): windows
// that mean "unbounded" without being -1, the largest softcap, scales of zero, tiny and huge magnitude.
// The top byte values of each draw pick from these, so corpora stay valid.
constexpr std::int64_t kHugeWindows[] = {std::numeric_limits<std::int64_t>::max(),
                                         std::numeric_limits<std::int64_t>::max() - 1, std::int64_t{1} << 62,
                                         std::int64_t{1} << 31, (std::int64_t{1} << 31) - 1};
constexpr double kExtremeSoftcaps[] = {3.4028234663852886e38, 1e30, 1e-30};
constexpr double kExtremeScales[] = {0.0, -0.0, 1e-30, -1e-30, 3.4028234663852886e38, -3.4028234663852886e38};

// Invalid values for the scale and softcap corruptions: non-finite, negative, or finite beyond the f32
// range (rejected: docs/robustness.md).
inline double bad_scale(int amount) {
  return std::array<double, 5>{NAN, INFINITY, -INFINITY, 1e39, -1e300}[amount % 5];
}
inline double bad_softcap(int amount) {
  return std::array<double, 5>{NAN, INFINITY, -0.5 - amount, 1e39, 1e300}[amount % 5];
}

// Whether a scale makes scores overflow to +-inf (NaN outputs are then the documented answer, so the
// targets skip their bound checks).
inline bool scale_may_overflow(const AttentionOptions& o) { return !(std::fabs(o.softmax_scale.value_or(1)) < 1e30); }

inline std::int64_t draw_window(std::uint8_t byte, int max_window) {
  constexpr int kHuge = static_cast<int>(std::size(kHugeWindows));
  return byte >= 256 - kHuge ? kHugeWindows[byte - (256 - kHuge)] : byte % max_window;
}

// The attention options every target draws, in one byte order (corpora stay valid): a window of up to
// max_window - 1 keys on each side (or a huge one), softcap, scale (each sometimes at an extreme), ALiBi
// slopes for batch x heads (kept alive in `slopes`), thread count.
inline AttentionOptions draw_options(Bytes& in, bool causal, bool use_softcap, bool use_scale, bool use_alibi,
                                     std::int64_t batch, std::int64_t heads, int max_window,
                                     std::vector<float>& slopes) {
  AttentionOptions o;
  o.causal = causal;
  if (in.u8() & 1) o.window_left = draw_window(in.u8(), max_window);
  if (in.u8() & 1) o.window_right = draw_window(in.u8(), max_window);
  if (use_softcap) {
    const std::uint8_t b = in.u8();
    constexpr int n = static_cast<int>(std::size(kExtremeSoftcaps));
    o.softcap = b >= 256 - n ? kExtremeSoftcaps[b - (256 - n)] : (1 + b) / 8.0;
  }
  if (use_scale) {
    const std::uint8_t b = in.u8();
    constexpr int n = static_cast<int>(std::size(kExtremeScales));
    o.softmax_scale = b >= 256 - n ? kExtremeScales[b - (256 - n)] : static_cast<std::int8_t>(b) / 32.0;
  }
  slopes.assign(static_cast<std::size_t>(batch * heads), 0.0f);
  for (auto& s : slopes) s = in.u8() / 64.0f;
  if (use_alibi) {
    o.alibi_slopes = slopes;
    o.alibi_batch_stride = in.u8() & 1 ? heads : 0;
  }
  o.num_threads = in.u8() % 4;
  return o;
}

// Tile sizes (the tiled entry points'): each left to the library or drawn in 1..max.
inline TileOptions draw_tiles(Bytes& in, int max) {
  TileOptions tiles;
  if (in.u8() & 1) tiles.q_tile = 1 + in.u8() % max;
  if (in.u8() & 1) tiles.k_tile = 1 + in.u8() % max;
  return tiles;
}

// Dropout (AttentionOptions::dropout_p, dropout_seed, dropout_offset) on about 1 input in 6: a byte
// < 40, past the input's end too. Harnesses draw it after every byte they read before they had dropout,
// so inputs written for them parse as before. p in (0, 1): k / 256, or 1e-300 (which keeps all but 1
// in 2^32 weights); any seed; an offset < 2^32.
inline void draw_dropout(Bytes& in, AttentionOptions& o) {
  if (in.u8() >= 40) return;
  const std::uint8_t b = in.u8();
  o.dropout_p = b == 255 ? 1e-300 : (1 + b) / 256.0;
  o.dropout_seed = 0;
  for (int i = 0; i < 8; ++i) o.dropout_seed = o.dropout_seed << 8 | in.u8();
  o.dropout_offset = 0;
  for (int i = 0; i < 4; ++i) o.dropout_offset = o.dropout_offset << 8 | in.u8();
}

// Attention sinks, after dropout's bytes (inputs from before parse as they did): on about 1 input in 6,
// one logit per head in [-8, 8) from a byte each, byte 0 meaning no sink (-inf); kept in `sinks`.
inline void draw_sinks(Bytes& in, AttentionOptions& o, std::int64_t heads, std::vector<float>& sinks) {
  if (in.u8() >= 40) return;
  sinks.resize(static_cast<std::size_t>(heads));
  for (float& s : sinks) {
    const std::uint8_t b = in.u8();
    s = b == 0 ? -std::numeric_limits<float>::infinity() : (b - 128) / 16.0f;
  }
  o.sinks = sinks;
}

// Invalid dropout options (docs/robustness.md): dropout_p NaN or outside [0, 1), or dropout_offset
// >= 2^32. Returns the option the rejection must name.
inline const char* corrupt_dropout(AttentionOptions& o, int amount) {
  if (amount % 8 == 7) {
    o.dropout_offset = (std::uint64_t{1} << 32) + static_cast<std::uint64_t>(amount / 8) * 0x0123456789ull;
    return "dropout_offset";
  }
  o.dropout_p = std::array<double, 7>{NAN, 1.0, -0.25, 1.5, INFINITY, -INFINITY, -1e-300}[amount % 8];
  return "dropout_p";
}

struct View {
  std::vector<std::uint8_t> buf;      // exactly the bytes the view may touch
  std::vector<std::uint8_t> before;   // snapshot
  std::vector<std::int64_t> offsets;  // element offsets of the logical elements
  TensorView t;
};

// A view of `shape` in a layout drawn from the bytes: any dim order, padding, an inner stride of 1 or
// 2, and for inputs a batch broadcast (stride 0). The buffer holds exactly the extent.
inline View make_view(DType dt, Shape4 shape, Bytes& in, bool input, int rank = 4) {
  static const int perms[24][4] = {{0, 1, 2, 3}, {0, 1, 3, 2}, {0, 2, 1, 3}, {0, 2, 3, 1}, {0, 3, 1, 2}, {0, 3, 2, 1},
                                   {1, 0, 2, 3}, {1, 0, 3, 2}, {1, 2, 0, 3}, {1, 2, 3, 0}, {1, 3, 0, 2}, {1, 3, 2, 0},
                                   {2, 0, 1, 3}, {2, 0, 3, 1}, {2, 1, 0, 3}, {2, 1, 3, 0}, {2, 3, 0, 1}, {2, 3, 1, 0},
                                   {3, 0, 1, 2}, {3, 0, 2, 1}, {3, 1, 0, 2}, {3, 1, 2, 0}, {3, 2, 0, 1}, {3, 2, 1, 0}};
  const std::uint8_t a = in.u8(), b = in.u8();
  // Innermost first: the dense row-major order is {3,2,1,0} (rank 4) or {2,1,0} (rank 3).
  int order[4];
  if (a < 128) {
    for (int j = 0; j < rank; ++j) order[j] = rank - 1 - j;
  } else {
    int n = 0;
    for (int j = 0; j < 4; ++j)
      if (perms[a % 24][j] < rank) order[n++] = perms[a % 24][j];
  }
  View v;
  v.t.dtype = dt;
  v.t.rank = rank;
  v.t.shape = shape;
  std::int64_t next = (b & 1) ? 2 : 1;
  for (int j = 0; j < rank; ++j) {
    const int i = order[j];
    v.t.strides[i] = next;
    next = next * std::max<std::int64_t>(shape[i], 1) + ((b >> (1 + j)) & 1) * (1 + (b >> 6));
  }
  if (input && (b & 32) && rank == 4) v.t.strides[0] = 0;
  if (rank == 3) {
    v.t.shape[3] = 1;
    v.t.strides[3] = 1;
  }
  bool empty = false;
  std::int64_t max_off = 0;
  for (int i = 0; i < rank; ++i) {
    empty |= shape[i] == 0;
    max_off += (std::max<std::int64_t>(shape[i], 1) - 1) * v.t.strides[i];
  }
  v.buf.assign(static_cast<std::size_t>(empty ? 1 : max_off + 1) * dtype_size(dt), 0xA5);
  v.t.data = v.buf.data();
  if (!empty)
    for (std::int64_t i0 = 0; i0 < shape[0]; ++i0)
      for (std::int64_t i1 = 0; i1 < shape[1]; ++i1)
        for (std::int64_t i2 = 0; i2 < shape[2]; ++i2)
          for (std::int64_t i3 = 0; i3 < (rank == 4 ? shape[3] : 1); ++i3)
            v.offsets.push_back(i0 * v.t.strides[0] + i1 * v.t.strides[1] + i2 * v.t.strides[2] +
                                (rank == 4 ? i3 * v.t.strides[3] : 0));
  return v;
}

// The corruptions of a single view that the harnesses share. Each harness numbers its own corruption
// kinds (the order its seed corpus was written for) and maps these onto them, choosing the victim.
enum class ViewFault { kNegDim, kNegStride, kRank, kDtypeMismatch, kBadDtype, kNullData, kOverflow, kShapeMismatch };

// Makes `t` certainly invalid as `kind` says, `amount` choosing the dim and the value. Returns false
// where the kind cannot make this view invalid (an empty view may have no data): the harness then
// skips the input.
inline bool apply_view_corruption(ViewFault kind, TensorView& t, int amount) {
  const int dim = amount % t.rank;
  switch (kind) {
    case ViewFault::kNegDim:
      t.shape[dim] = -1 - amount / 4 % 3;
      break;
    case ViewFault::kNegStride:
      t.strides[dim] = -1 - amount / 4;
      break;
    case ViewFault::kRank:  // the other rank of the API (3 <-> 4), or one it never takes (2, 5, 6, 7)
      t.rank = amount % 2 ? 7 - t.rank : t.rank == 4 ? 5 + amount % 3 : amount % 4 == 0 ? 2 : 5;
      break;
    case ViewFault::kDtypeMismatch:  // one of the four dtypes, but not its own (which others must share)
      t.dtype = static_cast<DType>((static_cast<int>(t.dtype) + 1 + amount % 3) & 3);
      break;
    case ViewFault::kBadDtype:  // a code outside the enum (the quantized ones, 4..6, are valid in places)
      t.dtype = static_cast<DType>(7 + amount % 200);
      break;
    case ViewFault::kNullData:
      for (int i = 0; i < t.rank; ++i)
        if (t.shape[i] == 0) return false;
      t.data = nullptr;
      break;
    case ViewFault::kOverflow:  // an extent that overflows int64 (never allocated: it must be rejected)
      t.shape[dim] = std::int64_t(1) << (40 + amount % 23);
      t.strides[dim] = std::int64_t(1) << (40 + amount / 4 % 23);
      break;
    case ViewFault::kShapeMismatch:  // one dim larger: a mismatch with the view it must match, past its buffer
      t.shape[dim] += 1 + amount % 3;
      break;
  }
  return true;
}

// The option corruptions the harnesses share; each makes the options certainly invalid.
enum class OptionFault { kScale, kSoftcap, kWindow, kAlibiStride, kThreads, kDropout };

// Applies `kind` to `o`, `amount` choosing the value. A bad ALiBi batch stride comes with the drawn
// `slopes` (without slopes the stride means nothing). Returns the option a rejection must name where
// one must (dropout's), else nullptr.
inline const char* corrupt_option(OptionFault kind, AttentionOptions& o, int amount, const std::vector<float>& slopes) {
  switch (kind) {
    case OptionFault::kScale:
      o.softmax_scale = bad_scale(amount);
      break;
    case OptionFault::kSoftcap:
      o.softcap = bad_softcap(amount);
      break;
    case OptionFault::kWindow:
      (amount & 1 ? o.window_left : o.window_right) = -2 - amount / 2;
      break;
    case OptionFault::kAlibiStride:
      o.alibi_slopes = slopes;
      o.alibi_batch_stride = -1 - amount;
      break;
    case OptionFault::kThreads:
      o.num_threads = -1 - amount;
      break;
    case OptionFault::kDropout:
      return corrupt_dropout(o, amount);
  }
  return nullptr;
}

// The corruptions of a forward call's out and lse that the harnesses share.
enum class OutputFault { kOutAliases, kLseOverlap, kLseDtype };

// Applies `kind`: out with a stride of 0 over a dim of 2 or more, lse on top of out's or q's buffer
// (`which` chooses), or lse in a dtype other than its own. Returns false where out has no such dim
// (a stride of 0 over a dim of 1 is valid): the harness then skips the input.
inline bool corrupt_output(OutputFault kind, View& out, View& lse, const View& q, int which, int amount) {
  switch (kind) {
    case OutputFault::kOutAliases: {
      const int i = amount % out.t.rank;
      if (out.t.shape[i] < 2) return false;
      out.t.strides[i] = 0;
      break;
    }
    case OutputFault::kLseOverlap:
      lse.t.data = (which & 1 ? out : q).t.data;
      break;
    case OutputFault::kLseDtype:
      lse.t.dtype = lse.t.dtype == DType::f64 ? DType::f32 : static_cast<DType>(amount % 2 ? 0 : 2 + amount % 2);
      break;
  }
  return true;
}

// The shared fault that a harness's corruption kind stands for, where the harness numbers them its own
// way (its seed corpus was written for its numbers): `ours` holds its number for each shared fault, in
// the shared enum's order, kNoFault for those it lacks.
constexpr int kNoFault = -2;
template <class Fault, std::size_t N>
std::optional<Fault> shared_fault(int corrupt, const int (&ours)[N]) {
  for (std::size_t i = 0; i < N; ++i)
    if (ours[i] == corrupt && corrupt != kNoFault) return static_cast<Fault>(i);
  return std::nullopt;
}

// The corruption kinds that the forward harnesses (attention, varlen, decode) share, numbered as their
// seed corpora were written: each harness's own kinds follow, from kShared on. A namespace of their own,
// since fuzz_backward numbers its kinds otherwise.
namespace forward {
enum Kind {
  kNone = -1,
  // ViewFault's kinds up to kOverflow, in its order, on one view
  kNegDim,
  kNegStride,
  kRank,
  kDtypeMismatch,
  kBadDtype,
  kNullData,
  kOverflow,
  // each harness's own way: views that disagree or overlap
  kHeadsNotMultiple,
  kShapeMismatch,
  kOutOverlapsInput,
  // OutputFault's kinds, in its order
  kOutAliases,
  kLseOverlap,
  kLseDtype,
  // OptionFault's kinds up to kThreads, in its order
  kScale,
  kSoftcap,
  kWindow,
  kAlibiStride,
  kThreads,
  kShared
};
static_assert(kOverflow == static_cast<int>(ViewFault::kOverflow));
static_assert(kLseDtype - kOutAliases == static_cast<int>(OutputFault::kLseDtype));
static_assert(kThreads - kScale == static_cast<int>(OptionFault::kThreads));

// Applies the forward kinds that every harness applies alike: a view fault (kNegDim .. kOverflow) to
// `victim`, out's and lse's faults, the options'. The harness handles the other kinds, and any of these
// it treats its own way, before it calls this. Returns false where the input is to be skipped (the
// fault cannot make these views invalid).
inline bool corrupt_forward(int corrupt, View& victim, View& out, View& lse, const View& q, AttentionOptions& o,
                            int which, int amount, const std::vector<float>& slopes) {
  if (corrupt >= kNegDim && corrupt <= kOverflow)
    return apply_view_corruption(static_cast<ViewFault>(corrupt), victim.t, amount);
  if (corrupt >= kOutAliases && corrupt <= kLseDtype)
    return corrupt_output(static_cast<OutputFault>(corrupt - kOutAliases), out, lse, q, which, amount);
  if (corrupt >= kScale && corrupt <= kThreads)
    corrupt_option(static_cast<OptionFault>(corrupt - kScale), o, amount, slopes);
  return true;
}
}  // namespace forward

template <class F>
decltype(auto) with_type(DType t, F&& f) {
  return detail::dispatch_dtype(t, f);
}

// The element of `v` at element offset `off`, as a double.
inline double load_at(const View& v, std::int64_t off) {
  double x = 0;
  with_type(v.t.dtype, [&]<class T>() { x = detail::load<double>(reinterpret_cast<const T*>(v.buf.data())[off]); });
  return x;
}

// Values byte / 64 in [-2, 2); with `specials`, three byte values become NaN, +inf and -inf.
inline void fill(View& v, Bytes& in, double amp, bool specials) {
  with_type(v.t.dtype, [&]<class T>() {
    T* p = reinterpret_cast<T*>(v.buf.data());
    for (auto off : v.offsets) {
      const auto b = static_cast<std::int8_t>(in.u8());
      double x = b / 64.0 * amp;
      if (specials && b == 127) x = NAN;
      if (specials && b == 126) x = INFINITY;
      if (specials && b == -128) x = -INFINITY;
      p[off] = detail::store<T>(x);
    }
  });
}

inline void snapshot(const std::vector<View*>& views) {
  for (auto* v : views) v->before = v->buf;
}

inline void check_message(const std::string& what) {
  if (what.rfind("attn::", 0) != 0 || what.size() < 12) die("rejection message without origin or rule: '" + what + "'");
}

inline void check_untouched(const std::vector<View*>& views) {
  for (auto* v : views)
    if (v->buf != v->before) die("a rejected call modified a buffer");
}
// The verdict every harness gives a call (`thrown`: the message of its rejection, or none where it
// returned). A rejection must carry an attn:: message and leave every buffer as it was: returns true,
// nothing more to check. An accepted call must not have been a corrupted one (corrupt < 0 is none):
// returns false, the harness checks the results.
// Where the one fault is in an argument the message must name (`must_name`, e.g. "dropout_p"), a
// rejection naming another is a violation too. ATTN_FUZZ_TRACE=1 prints each verdict.
inline bool judge_call(const std::optional<std::string>& thrown, int corrupt, int which, int amount,
                       const std::vector<View*>& views, const char* must_name = nullptr) {
  if (std::getenv("ATTN_FUZZ_TRACE"))
    std::fprintf(stderr, "corrupt %d: %s\n", corrupt, thrown ? thrown->c_str() : "accepted");
  if (thrown) {
    check_message(*thrown);
    if (must_name && thrown->find(std::string(": ") + must_name + ": ") == std::string::npos)
      die("rejection '" + *thrown + "' does not name " + must_name);
    check_untouched(views);  // inputs and outputs alike hold their old bytes
    return true;
  }
  if (corrupt >= 0)
    die("accepted a call with corruption " + std::to_string(corrupt) + " (which " + std::to_string(which) +
        ", amount " + std::to_string(amount) + ")");
  return false;
}

// Runs `call`, the entry point under test: the message of the std::invalid_argument it threw, or none.
// Anything else propagates, and libFuzzer reports it as a crash.
template <class Call>
std::optional<std::string> rejection(Call&& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return std::nullopt;
}

// Snapshots `views`, runs `call` and gives judge_call's verdict: true where the call was rejected.
template <class Call>
bool call_rejected(Call&& call, const std::vector<View*>& views, int corrupt, int which, int amount,
                   const char* must_name = nullptr) {
  snapshot(views);
  return judge_call(rejection(call), corrupt, which, amount, views, must_name);
}

inline void check_inputs_untouched(const std::vector<View*>& views) {
  for (auto* v : views)
    if (v->buf != v->before) die("an input was written");
}

// Bytes of an output's buffer outside its elements must keep their old values.
inline void check_padding_untouched(const View& v) {
  std::vector<char> mine(v.buf.size(), 0);
  const std::size_t es = dtype_size(v.t.dtype);
  for (auto off : v.offsets) std::memset(&mine[static_cast<std::size_t>(off) * es], 1, es);
  for (std::size_t i = 0; i < v.buf.size(); ++i)
    if (!mine[i] && v.buf[i] != v.before[i]) die("wrote between the elements of an output view");
}

inline double max_abs(const View& v) {
  double m = 0;
  with_type(v.t.dtype, [&]<class T>() {
    const T* p = reinterpret_cast<const T*>(v.buf.data());
    for (auto off : v.offsets) m = std::max(m, std::abs(detail::load<double>(p[off])));
  });
  return m;
}

inline void check_bounded(const View& v, double bound, const char* what) {
  with_type(v.t.dtype, [&]<class T>() {
    const T* p = reinterpret_cast<const T*>(v.buf.data());
    for (auto off : v.offsets) {
      const double x = detail::load<double>(p[off]);
      if (!(std::abs(x) <= bound))
        die(std::string(what) + " = " + std::to_string(x) + " outside the convex hull bound " + std::to_string(bound));
    }
  });
}

inline void check_lse(const View& v) {
  with_type(v.t.dtype, [&]<class T>() {
    const T* p = reinterpret_cast<const T*>(v.buf.data());
    for (auto off : v.offsets) {
      const double x = detail::load<double>(p[off]);
      if (std::isnan(x) || x == INFINITY) die("lse = " + std::to_string(x) + " with finite inputs");
    }
  });
}

}  // namespace attn::fuzzing
