// libFuzzer harness for attention_decode over quantized caches (include/attn/decode.hpp, "Quantized
// caches"), built with -fsanitize=fuzzer,address,undefined (fuzz/CMakeLists.txt).
//
// The bytes decide the stored type (i8, fp8 e4m3, fp8 e5m2), the scales' layout (one per key and kv
// head, one per block of head_dim / groups dims, or shared per kv head or per tensor through 0
// strides), their type (f32, f16), q's type, a contiguous or paged cache, seqlens, an append from
// k_new/v_new, options (quantized_query on int8 caches among them), the codes and scales (NaN codes and scales among
// them with `specials`), and whether one argument is deliberately made invalid: a missing or misshapen scale view, a
// scale of the wrong type, groups that do not divide head_dim, a quantized q or k_new, a scale view on an unquantized
// cache, a shared scale that is not finite and > 0 when appending, a non-finite appended value with shared scales,
// computed scales that overlap out. Properties:
//   * a corrupted call is rejected with an "attn::" message naming the argument, and every buffer
//     (q, cache, scales, k_new, v_new, out, lse) holds its old bytes;
//   * an accepted call leaves every cache code and scale outside the appended positions as it was;
//   * with finite codes and scales, |out| <= max |dequantized v| over the keys read (the append's
//     included), and lse is finite or -inf.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "attn/decode.hpp"
#include "core/quant.hpp"
#include "validate/validate.hpp"
#include "fuzz_common.hpp"

using namespace attn;
using namespace attn::fuzzing;

namespace {

enum Corrupt {
  kNone = -1,
  kScaleMissing,
  kScaleDtype,
  kScaleShape,
  kGroupsNotDividing,
  kQuantizedQ,
  kQuantizedKNew,
  kScaleOnFloatCache,
  kSharedScaleBad,
  kNonFiniteAppend,
  kScaleOverlapsOut,
  kCount
};
static_assert(kCount == 10);  // an input's mode byte picks one of kCount: the seed corpus was written for 10

struct Buffer {
  std::vector<std::uint8_t> bytes, before;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const std::uint8_t flags = in.u8();
  const DType ct = static_cast<DType>(4 + flags % 3);
  const bool paged = flags & 4, append = flags & 8, f16_scales = flags & 16, want_lse = flags & 32,
             specials = flags & 64, causal = flags & 128;
  const int corrupt = draw_corruption(in, kCount, 170);
  const std::uint8_t layout = in.u8();
  const DType qt = layout % 3 == 0 ? DType::f32 : layout % 3 == 1 ? DType::bf16 : DType::f16;
  const std::int64_t B = 1 + in.u8() % 3, SQ = 1 + in.u8() % 2, HK = 1 + in.u8() % 2, H = HK * (1 + in.u8() % 2);
  const std::int64_t D = (in.u8() & 1) ? 32 * (1 + in.u8() % 2) : 1 + in.u8() % 20;
  const int scale_kind = (layout >> 2) % 4;  // 0: per key and kv head, 1: per block, 2: per kv head, 3: per tensor
  const std::int64_t groups = scale_kind == 1 ? (D % 32 == 0 ? D / 32 : (D % 2 == 0 ? 2 : 1)) : 1;
  const std::int64_t page = paged ? 1 + in.u8() % 5 : 0, max_pages = paged ? 1 + in.u8() % 3 : 0;
  const std::int64_t rows = paged ? B * max_pages + in.u8() % 2 : B, slots = paged ? page : 1 + in.u8() % 10;
  const std::int64_t cap = paged ? max_pages * page : slots;
  const std::int64_t SN = append ? std::min<std::int64_t>(1 + in.u8() % 3, cap) : 0;
  std::vector<std::int32_t> seqlens(static_cast<std::size_t>(B)), table;
  for (auto& n : seqlens) n = static_cast<std::int32_t>(in.u8() % (cap - SN + 1));
  if (paged)  // sequence b owns pages b * max_pages .. : distinct, so appends never share a slot
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < max_pages; ++j) table.push_back(static_cast<std::int32_t>(b * max_pages + j));

  // The cache (dense [rows, slots, HK, D] codes) and its scales.
  const std::size_t elems = static_cast<std::size_t>(rows * slots * HK * D);
  Buffer kc, vc, ks, vs;
  for (Buffer* c : {&kc, &vc}) {
    c->bytes.resize(elems);
    for (auto& x : c->bytes) {
      x = in.u8();
      if (!specials && ct != DType::i8) x &= 0xBF;  // fp8 with exponent bit 6 clear: finite
    }
  }
  const bool per_position = scale_kind <= 1;
  const std::int64_t nscale = per_position ? rows * slots * HK * groups : scale_kind == 2 ? HK : 1;
  const DType st = f16_scales ? DType::f16 : DType::f32;
  for (Buffer* s : {&ks, &vs}) {
    s->bytes.resize(static_cast<std::size_t>(nscale) * dtype_size(st));
    for (std::int64_t i = 0; i < nscale; ++i) {
      const std::uint8_t b = in.u8();
      const float x = specials && b == 255 ? NAN : (1 + b % 64) / 256.0f;
      detail::write_scale(TensorView{s->bytes.data(), st, 4, {nscale, 1, 1, 1}, {1, 1, 1, 1}}, i, x);
    }
  }
  auto scale_view = [&](Buffer& s) {
    TensorView v{s.bytes.data(), st, 4, {rows, slots, HK, groups}, {}};
    if (scale_kind <= 1)
      v.strides = {slots * HK * groups, HK * groups, groups, 1};
    else
      v.strides = {0, 0, scale_kind == 2 ? 1 : 0, 0};
    return v;
  };
  KVCache cache;
  cache.k = TensorView{kc.bytes.data(), ct, 4, {rows, slots, HK, D}, {slots * HK * D, HK * D, D, 1}};
  cache.v = TensorView{vc.bytes.data(), ct, 4, {rows, slots, HK, D}, {slots * HK * D, HK * D, D, 1}};
  cache.k_scale = scale_view(ks);
  cache.v_scale = scale_view(vs);
  cache.seqlens = seqlens.data();
  if (paged) {
    cache.block_table = table.data();
    cache.max_pages = max_pages;
  }
  // The library's rule: an append computes and writes the scales when no two positions share one.
  const bool k_owned = detail::aliasing_dim(cache.k_scale) < 0, v_owned = detail::aliasing_dim(cache.v_scale) < 0;

  View q = make_view(qt, {B, SQ, H, D}, in, true), out = make_view(qt, {B, SQ, H, D}, in, false);
  View lse = make_view(DType::f32, {B, H, SQ, 1}, in, false, 3);
  View kn = make_view(qt, {B, SN, HK, D}, in, true), vn = make_view(qt, {B, SN, HK, D}, in, true);
  fill(q, in, 1.0, false);
  fill(kn, in, 1.0, false);
  fill(vn, in, 1.0, false);
  AttentionOptions o;
  o.causal = causal;
  DecodeOptions dec;
  dec.num_splits = in.u8() % 5;
  dec.quantized_query = ct == DType::i8 && (layout & 0x40);  // an int8 cache's opt-in integer dots
  if (append) {
    dec.k_new = &kn.t;
    dec.v_new = &vn.t;
  }

  const std::uint8_t amount = in.u8();
  std::vector<std::int8_t> i8_q(static_cast<std::size_t>(B * std::max<std::int64_t>(SQ, SN) * H * D) + 1);
  static const float zero_or_nan[2] = {0.0f, NAN};
  std::vector<float> float_cache;  // K's rows, then V's
  const char* must = nullptr;      // the argument a rejection must name
  switch (corrupt) {
    case kNone:
      break;
    case kScaleMissing:
      must = amount & 1 ? "cache.v_scale" : "cache.k_scale";
      (amount & 1 ? cache.v_scale : cache.k_scale) = TensorView{};
      break;
    case kScaleDtype:
      must = amount & 1 ? "cache.v_scale" : "cache.k_scale";
      (amount & 1 ? cache.v_scale : cache.k_scale).dtype = amount & 2 ? DType::bf16 : DType::f64;
      break;
    case kScaleShape:
      must = amount & 1 ? "cache.v_scale" : "cache.k_scale";
      (amount & 1 ? cache.v_scale : cache.k_scale).shape[amount / 2 % 3] += 1 + amount / 8 % 2;
      break;
    case kGroupsNotDividing:
      must = amount & 1 ? "cache.v_scale" : "cache.k_scale";
      (amount & 1 ? cache.v_scale : cache.k_scale).shape[3] = D + 1 + amount % 3;
      break;
    case kQuantizedQ:
      must = "q";
      q.t.data = i8_q.data();
      q.t.dtype = static_cast<DType>(4 + amount % 3);
      break;
    case kQuantizedKNew:
      if (!append) return 0;
      must = "k_new";
      kn.t.dtype = static_cast<DType>(4 + amount % 3);
      break;
    case kScaleOnFloatCache:  // an f32 cache (q f32, so that only the scale rule can object) with scales
      if (qt != DType::f32) return 0;
      must = "cache.k_scale";
      float_cache.assign(2 * elems, 0.5f);  // two caches: one view for both would be MLA's layout
      cache.k = TensorView{float_cache.data(), DType::f32, 4, {rows, slots, HK, D}, cache.k.strides};
      cache.v = TensorView{float_cache.data() + elems, DType::f32, 4, {rows, slots, HK, D}, cache.k.strides};
      break;
    case kSharedScaleBad:  // appending with a given (aliasing) scale of 0 or NaN
      // One element with zero strides aliases nothing: a valid scale the append would write (into
      // read-only memory here), not a fault.
      if (!append || SN == 0 || rows * slots * HK * groups < 2) return 0;
      must = "cache.k_scale";
      cache.k_scale = TensorView{
          const_cast<float*>(&zero_or_nan[amount & 1]), DType::f32, 4, {rows, slots, HK, groups}, {0, 0, 0, 0}};
      break;
    case kNonFiniteAppend:  // a NaN or Inf in k_new with given scales (finite ones: specials off)
      if (!append || SN == 0 || k_owned || specials || kn.offsets.empty()) return 0;
      must = "k_new";
      with_type(qt, [&]<class T>() {
        reinterpret_cast<T*>(kn.buf.data())[kn.offsets[amount % kn.offsets.size()]] =
            detail::store<T>(amount & 1 ? NAN : INFINITY);
      });
      break;
    case kScaleOverlapsOut:  // computed scales, written by the append, on top of out's buffer
      if (!append || SN == 0 || !k_owned) return 0;
      must = "out";  // out overlapping an input (the scales) is the first rule it breaks
      cache.k_scale.data = out.buf.data();
      break;
  }

  std::vector<View*> views = {&q, &out, &kn, &vn};
  if (want_lse) views.push_back(&lse);
  snapshot(views);
  for (Buffer* b : {&kc, &vc, &ks, &vs}) b->before = b->bytes;
  const auto what = rejection([&] { attention_decode(q.t, cache, out.t, o, dec, want_lse ? &lse.t : nullptr); });
  if (what)
    for (Buffer* b : {&kc, &vc, &ks, &vs})
      if (b->bytes != b->before) die("a rejected call modified the cache or its scales");
  if (judge_call(what, corrupt, 0, amount, views, must)) return 0;
  check_inputs_untouched({&q, &kn, &vn});
  check_padding_untouched(out);

  // Only the appended positions' codes, and the scale elements they own, may have changed.
  std::vector<char> appended(static_cast<std::size_t>(rows * slots), 0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t pos = seqlens[b]; pos < seqlens[b] + SN; ++pos)
      appended[static_cast<std::size_t>(paged ? table[b * max_pages + pos / page] * page + pos % page
                                              : b * slots + pos)] = 1;
  const std::size_t row_bytes = static_cast<std::size_t>(HK * D);
  for (std::int64_t rs = 0; rs < rows * slots; ++rs)
    for (const Buffer* c : {&kc, &vc})
      if (!appended[static_cast<std::size_t>(rs)] &&
          std::memcmp(c->bytes.data() + rs * row_bytes, c->before.data() + rs * row_bytes, row_bytes) != 0)
        die("a code outside the append changed");
  for (auto [buf, view, owned] : {std::tuple{&ks, cache.k_scale, k_owned}, std::tuple{&vs, cache.v_scale, v_owned}}) {
    std::vector<char> may(buf->bytes.size(), 0);
    for (std::int64_t rs = 0; owned && rs < rows * slots; ++rs)
      if (appended[static_cast<std::size_t>(rs)])
        for (std::int64_t g = 0; g < HK; ++g)
          for (std::int64_t x = 0; x < groups; ++x) {
            const std::int64_t off = (rs / slots) * view.strides[0] + (rs % slots) * view.strides[1] +
                                     g * view.strides[2] + x * view.strides[3];
            std::memset(&may[static_cast<std::size_t>(off) * dtype_size(st)], 1, dtype_size(st));
          }
    for (std::size_t i = 0; i < may.size(); ++i)
      if (!may[i] && buf->bytes[i] != buf->before[i]) die("a scale the append does not own changed");
  }

  // The convex-hull bound over the dequantized values every sequence reads.
  if (specials) return 0;
  double vmax = 0;
  const TensorView vsv = cache.v_scale;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t pos = 0; pos < seqlens[b] + SN; ++pos) {
      const std::int64_t r = paged ? table[b * max_pages + pos / page] : b, s = paged ? pos % page : pos;
      for (std::int64_t g = 0; g < HK; ++g)
        for (std::int64_t e = 0; e < D; ++e) {
          const float sc = detail::read_scale(
              vsv, r * vsv.strides[0] + s * vsv.strides[1] + g * vsv.strides[2] + (e / (D / groups)) * vsv.strides[3]);
          const float x =
              detail::stored_value(ct, vc.bytes[static_cast<std::size_t>(((r * slots + s) * HK + g) * D + e)]) * sc;
          if (!std::isfinite(x)) return 0;
          vmax = std::max(vmax, static_cast<double>(std::fabs(x)));
        }
    }
  check_bounded(out, vmax * (1 + 1.0 / 64) + 1e-30, "out");
  if (want_lse) check_lse(lse);
  return 0;
}
