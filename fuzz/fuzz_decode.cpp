// libFuzzer harness for attention_decode (include/attn/decode.hpp), built with
// -fsanitize=fuzzer,address,undefined (fuzz/CMakeLists.txt).
//
// The bytes decide the cache dtype (and q in f32 over a 16-bit cache), contiguous or paged cache, its
// layout (dims permuted and padded, head_dim contiguous), page size, page count, block table (a
// shuffled page assignment, unused entries -1, a row stride with garbage padding), seqlens, k_new/v_new
// appends, num_splits, options, the data, and whether one argument is deliberately made invalid: the
// shared view corruptions (fuzz_common.hpp) plus decode's own (null or negative seqlens, seqlens past the
// capacity, block-table entries out of range, bad max_pages / block_table_stride, k_new without v_new,
// appending into an aliased cache or into one slot from two sequences, a non-contiguous head_dim).
// Cache slots no sequence holds are NaN, so reading one breaks the |out| bound. Properties:
//   * a corrupted call is rejected; every rejection is std::invalid_argument with an "attn::" message;
//     after it every buffer (q, cache, k_new, v_new, seqlens, block table, out, lse) holds its old bytes;
//   * an accepted call writes out's and lse's elements and, when appending, exactly the appended cache
//     slots with k_new's / v_new's bytes: every other cache byte is unchanged;
//   * with finite inputs |out| <= max |v| over the keys read, and lse is finite or -inf.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attn/decode.hpp"
#include "fuzz_common.hpp"

using namespace attn;
using namespace attn::fuzzing;
using namespace attn::fuzzing::forward;

namespace {

// This harness's own corruption kinds, after the forward ones (fuzz_common.hpp). An input's mode byte
// picks one of kCount (draw_corruption): the seed corpus was written for this count.
enum {
  kNumSplits = kShared,
  kSeqlensNull,
  kSeqlenNegative,
  kSeqlenOverCapacity,
  kBlockEntry,
  kMaxPages,
  kOnlyOneNew,
  kAppendAlias,
  kCacheStride,
  kCount
};
static_assert(kCount == 27);

// A cache view [n0, n1, hk, d]: head_dim innermost with stride 1; the other three dims in an order and
// with padding drawn from the bytes. The buffer holds exactly the extent.
View cache_view(DType dt, Shape4 shape, Bytes& in) {
  static const int perms[6][3] = {{2, 1, 0}, {2, 0, 1}, {1, 2, 0}, {1, 0, 2}, {0, 2, 1}, {0, 1, 2}};
  const std::uint8_t a = in.u8(), b = in.u8();
  const int* p = perms[a < 128 ? 0 : a % 6];  // innermost first (after head_dim)
  View v;
  v.t.dtype = dt;
  v.t.rank = 4;
  v.t.shape = shape;
  v.t.strides[3] = 1;
  std::int64_t next = shape[3] + ((b & 1) ? 1 + (b >> 5) : 0);
  for (int j = 0; j < 3; ++j) {
    v.t.strides[p[j]] = next;
    next = next * std::max<std::int64_t>(shape[p[j]], 1) + ((b >> (1 + j)) & 1) * 2;
  }
  bool empty = false;
  std::int64_t max_off = 0;
  for (int i = 0; i < 4; ++i) {
    empty |= shape[i] == 0;
    max_off += (std::max<std::int64_t>(shape[i], 1) - 1) * v.t.strides[i];
  }
  v.buf.assign(static_cast<std::size_t>(empty ? 1 : max_off + 1) * dtype_size(dt), 0xA5);
  v.t.data = v.buf.data();
  return v;
}

std::int64_t elem_off(const TensorView& t, std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const std::uint8_t flags = in.u8();
  const int corrupt = draw_corruption(in, kCount);
  const std::uint8_t knobs = in.u8();
  const DType ct = static_cast<DType>(flags & 3);
  const bool causal = flags & 4, want_lse = flags & 8, use_alibi = flags & 16, paged = flags & 32,
             use_softcap = flags & 64, specials = flags & 128;
  const bool q_f32 = (knobs & 1) && (ct == DType::bf16 || ct == DType::f16), append = knobs & 2, use_scale = knobs & 4,
             unused_minus_one = knobs & 8;
  const DType qt = q_f32 ? DType::f32 : ct;

  const std::int64_t B = 1 + in.u8() % 3, SQ = 1 + in.u8() % 3, HK = 1 + in.u8() % 2, H = HK * (1 + in.u8() % 3),
                     D = 1 + in.u8() % 20;
  const std::int64_t page = paged ? 1 + in.u8() % 6 : 0, max_pages = paged ? 1 + in.u8() % 4 : 0;
  const std::int64_t bt_stride = paged ? max_pages + in.u8() % 3 : 0;
  std::int64_t num_pages = paged ? std::max<std::int64_t>(1, B * max_pages + in.u8() % 4 - 1) : B;
  const std::int64_t cap = paged ? max_pages * page : in.u8() % 14;  // contiguous max_seqlen may be 0
  const std::int64_t SN = append ? std::min<std::int64_t>(in.u8() % 4, cap) : 0;
  std::vector<std::int32_t> seqlens(static_cast<std::size_t>(B));
  for (auto& n : seqlens) n = static_cast<std::int32_t>(in.u8() % (cap - SN + 1));

  // Block table: a shuffled assignment of pages to (sequence, column); distinct while pages last.
  std::vector<std::int32_t> perm(static_cast<std::size_t>(num_pages)), table;
  for (std::int64_t i = 0; i < num_pages; ++i) perm[i] = static_cast<std::int32_t>(i);
  for (std::int64_t i = num_pages - 1; i > 0; --i) std::swap(perm[i], perm[in.u8() % (i + 1)]);
  if (paged) {
    table.assign(static_cast<std::size_t>((B - 1) * bt_stride + max_pages), -7);  // exactly the extent read
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t used = (seqlens[b] + SN + page - 1) / page;
      for (std::int64_t j = 0; j < max_pages; ++j)
        table[b * bt_stride + j] = j >= used && unused_minus_one ? -1 : perm[(b * max_pages + j) % num_pages];
    }
  }

  const Shape4 cshape = paged ? Shape4{num_pages, page, HK, D} : Shape4{B, cap, HK, D};
  View kc = cache_view(ct, cshape, in), vc = cache_view(ct, cshape, in);
  View q = make_view(qt, {B, SQ, H, D}, in, true), out = make_view(qt, {B, SQ, H, D}, in, false);
  const DType lt = ct == DType::f64 ? DType::f64 : DType::f32;
  View lse = make_view(lt, {B, H, SQ, 1}, in, false, 3);
  View kn = make_view(ct, {B, SN, HK, D}, in, true), vn = make_view(ct, {B, SN, HK, D}, in, true);

  std::vector<float> slopes;
  AttentionOptions o = draw_options(in, causal, use_softcap, use_scale, use_alibi, B, H, 12, slopes);
  DecodeOptions dec;
  {
    const std::uint8_t s = in.u8();
    dec.num_splits = s < 64 ? 0 : s < 224 ? 1 + s % 9 : std::int64_t(1) << (s % 14);
  }

  // Data: every slot of the cache NaN, then the keys each sequence holds from the bytes (a page shared
  // by two sequences is filled twice; same values either way for the bound).
  fill(q, in, 1.0, specials);
  with_type(ct, [&]<class T>() {
    for (View* c : {&kc, &vc}) {
      T* p = reinterpret_cast<T*>(c->buf.data());
      for (std::int64_t i0 = 0; i0 < cshape[0]; ++i0)
        for (std::int64_t i1 = 0; i1 < cshape[1]; ++i1)
          for (std::int64_t h = 0; h < HK; ++h)
            for (std::int64_t d = 0; d < D; ++d) p[elem_off(c->t, i0, i1, h, d)] = detail::store<T>(NAN);
    }
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t pos = 0; pos < seqlens[b]; ++pos) {
        const std::int64_t pg = paged ? table[b * bt_stride + pos / page] : b, slot = paged ? pos % page : pos;
        for (View* c : {&kc, &vc})
          for (std::int64_t h = 0; h < HK; ++h)
            for (std::int64_t d = 0; d < D; ++d) {
              const auto x = static_cast<std::int8_t>(in.u8());
              double val = x / 64.0;
              if (specials && x == 127) val = NAN;
              if (specials && x == 126) val = INFINITY;
              reinterpret_cast<T*>(c->buf.data())[elem_off(c->t, pg, slot, h, d)] = detail::store<T>(val);
            }
      }
  });
  fill(kn, in, 1.0, specials);
  fill(vn, in, 1.0, specials);
  const double vmax = [&] {  // max |v| over the keys read (NaN slots ignored by max_abs's std::max)
    double m = max_abs(vn);
    with_type(ct, [&]<class T>() {
      const T* p = reinterpret_cast<const T*>(vc.buf.data());
      for (std::size_t i = 0; i < vc.buf.size() / sizeof(T); ++i) {
        const double x = detail::load<double>(p[i]);
        if (std::isfinite(x)) m = std::max(m, std::abs(x));
      }
    });
    return m;
  }();

  KVCache cache;
  cache.seqlens = seqlens.data();
  if (paged) {
    cache.block_table = table.data();
    cache.max_pages = max_pages;
    cache.block_table_stride = bt_stride == max_pages && (knobs & 16) ? 0 : bt_stride;
  }
  if (append) {
    dec.k_new = &kn.t;
    dec.v_new = &vn.t;
  }

  const std::uint8_t which = in.u8(), amount = in.u8();
  View* tv[] = {&q, &kc, &vc, &out, &kn};
  View& victim = *tv[which % (append ? 5 : 4)];
  const bool lse_passed = want_lse || corrupt == kLseOverlap || corrupt == kLseDtype;
  switch (corrupt) {
    case kNone:
      break;
    case kDtypeMismatch:  // q: neither the cache's nor f32; cache.k: v mismatches; out: q; the rest: cache.k
      if (&victim == &q)
        q.t.dtype = ct == DType::bf16  ? DType::f16
                    : ct == DType::f16 ? DType::bf16
                    : ct == DType::f64 ? DType::bf16
                                       : DType::f64;
      else
        apply_view_corruption(ViewFault::kDtypeMismatch, victim.t, amount);
      break;
    case kHeadsNotMultiple:
      kc.t.shape[2] = vc.t.shape[2] = kn.t.shape[2] = vn.t.shape[2] = H + 1;
      break;
    case kShapeMismatch: {  // cache.v, out, v_new or (contiguous) cache.k's batch one larger in some dim
      View* t[] = {&vc, &out, append ? &vn : &vc, paged ? &vc : &kc};
      View* w = t[which % 4];
      if (w == &kc)  // cache.k's other dims are the ones the rest must match
        kc.t.shape[0] += 1 + amount % 3;
      else
        apply_view_corruption(ViewFault::kShapeMismatch, w->t, amount);
      break;
    }
    case kOutOverlapsInput: {
      View* src[] = {&q, &kc, &vc, append ? &kn : &q};
      View* s = src[which % 4];
      if (s->t.shape[1] == 0) return 0;
      out.t.data = s->t.data;
      break;
    }
    case kNumSplits:
      dec.num_splits = -1 - amount;
      break;
    case kSeqlensNull:
      cache.seqlens = nullptr;
      break;
    case kSeqlenNegative:
      seqlens[amount % B] = -1 - amount / 4;
      break;
    case kSeqlenOverCapacity:
      seqlens[amount % B] = amount & 128 ? INT32_MAX : static_cast<std::int32_t>(cap - SN + 1 + amount / 4 % 5);
      break;
    case kBlockEntry: {  // an entry of a page some sequence needs, out of [0, num_pages)
      if (!paged) return 0;
      const std::int64_t b = amount % B, used = (seqlens[b] + SN + page - 1) / page;
      if (used == 0) return 0;
      table[b * bt_stride + amount / 4 % used] =
          amount & 2 ? -1 - amount / 8 : static_cast<std::int32_t>(num_pages + amount / 8);
      break;
    }
    case kMaxPages:
      if (!paged) return 0;
      if (amount & 1)
        cache.max_pages = -(amount / 2 % 3);
      else if (max_pages >= 2)
        cache.block_table_stride = 1 + amount / 2 % (max_pages - 1);
      else
        return 0;
      break;
    case kOnlyOneNew:
      (amount & 1 ? dec.k_new : dec.v_new) = &(amount & 1 ? kn : vn).t;
      (amount & 1 ? dec.v_new : dec.k_new) = nullptr;
      break;
    case kAppendAlias:  // writing the cache while it overlaps itself, another input, or two sequences share a slot
      if (!append || SN == 0) return 0;
      switch (amount % 4) {
        case 0:
          vc.t.data = kc.t.data;
          break;
        case 1:
          kn.t.data = kc.t.data;
          break;
        case 2:
          if (!paged || B < 2) return 0;
          seqlens[1] = seqlens[0];
          for (std::int64_t j = 0; j < max_pages; ++j) table[bt_stride + j] = table[j];
          break;
        case 3: {
          const int i = amount / 4 % 3;
          if (kc.t.shape[i] < 2) return 0;
          kc.t.strides[i] = 0;
          break;
        }
      }
      break;
    case kCacheStride:
      if (D < 2) return 0;
      (amount & 1 ? vc : kc).t.strides[3] = 2 + amount / 2 % 3;
      break;
    default:
      if (!corrupt_forward(corrupt, victim, out, lse, q, o, which, amount, slopes)) return 0;
  }
  cache.k = kc.t;  // after the corruption, which may have changed either view
  cache.v = vc.t;
  std::vector<View*> views = {&q, &kc, &vc, &out, &kn, &vn};
  if (lse_passed) views.push_back(&lse);
  const auto seqlens0 = seqlens, table0 = table;
  snapshot(views);
  // What the cache must hold after an accepted call: the old bytes, plus k_new / v_new in the slots
  // seqlens[b] .. seqlens[b] + SN - 1.
  std::vector<std::uint8_t> want_k = kc.buf, want_v = vc.buf;
  if (corrupt == kNone && append) {
    const std::size_t es = dtype_size(ct);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < SN; ++t) {
        const std::int64_t pos = seqlens[b] + t, pg = paged ? table[b * bt_stride + pos / page] : b,
                           slot = paged ? pos % page : pos;
        if (pg < 0 || pg >= num_pages) continue;  // cannot happen in a valid call
        for (std::int64_t h = 0; h < HK; ++h)
          for (std::int64_t d = 0; d < D; ++d) {
            std::memcpy(&want_k[elem_off(kc.t, pg, slot, h, d) * es], &kn.buf[elem_off(kn.t, b, t, h, d) * es], es);
            std::memcpy(&want_v[elem_off(vc.t, pg, slot, h, d) * es], &vn.buf[elem_off(vn.t, b, t, h, d) * es], es);
          }
      }
  }
  const auto what = rejection([&] { attention_decode(q.t, cache, out.t, o, dec, lse_passed ? &lse.t : nullptr); });
  if (seqlens != seqlens0 || table != table0) die("seqlens or block table written");
  if (judge_call(what, corrupt, which, amount, views)) return 0;
  check_inputs_untouched({&q, &kn, &vn});
  if (kc.buf != want_k || vc.buf != want_v) die("the cache differs from old cache + appended k_new/v_new");
  check_padding_untouched(out);
  if (want_lse) check_padding_untouched(lse);
  if (!specials && !scale_may_overflow(o)) {
    check_bounded(out, vmax * (1 + 1.0 / 64) + 1e-30, "out");
    if (want_lse) check_lse(lse);
  }
  return 0;
}
