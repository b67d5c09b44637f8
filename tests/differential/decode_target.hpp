// The differential test's decode targets: attention_decode over a contiguous or a paged KV cache built
// from a random Config (seqlen_k is the cache capacity; each sequence holds a random number of keys),
// checked per sequence against the f64 oracle on that sequence's keys, with the rule of check_dense.
// Unused cache slots hold NaN, so reading one poisons the output. In about 40 % of configs k_new/v_new
// (0..3 new keys per sequence) are appended: the cache afterwards must equal the old cache with exactly
// those slots replaced (every other byte untouched), and the oracle runs over the keys after the append.
// In about 30 % of configs with a bf16 or f16 cache, q and out are f32 (Q; the serving case of f32
// activations over a 16-bit cache), against the f32 textbook method on the same values.
#pragma once

#include <algorithm>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/decode.hpp"
#include "case.hpp"

namespace attn::fuzz {

template <class T, class Q = T>
std::string check_decode(Config c, bool paged) {
  using A = detail::Acc<T>;
  bind_arrays(c);
  Rng r(mix(c.seed) ^ 0xdec0de);
  const std::int64_t B = c.batch, SQ = std::min<std::int64_t>(c.seqlen_q, 4), H = c.heads, HK = c.kv_heads,
                     D = c.head_dim, cap = std::max<std::int64_t>(c.seqlen_k, 1);
  const std::int64_t page = paged ? r.uniform(1, 16) : cap, pages_per_seq = (cap + page - 1) / page;
  const std::int64_t num_pages = paged ? B * pages_per_seq + r.uniform(0, 3) : B;
  std::vector<std::int32_t> seqlens(static_cast<std::size_t>(B)), table;
  for (auto& n : seqlens) n = static_cast<std::int32_t>(r.chance(0.1) ? 0 : r.uniform(0, c.seqlen_k));
  // Appends draw from their own stream, so configs without them stay what their seed always gave.
  Rng ra(mix(c.seed) ^ 0xa99e4d);
  const std::int64_t capacity = paged ? pages_per_seq * page : cap;
  const bool append = ra.chance(0.4);
  const std::int64_t SN = append ? std::min<std::int64_t>(ra.uniform(0, 3), capacity) : 0;
  for (auto& n : seqlens) n = static_cast<std::int32_t>(std::min<std::int64_t>(n, capacity - SN));
  std::vector<std::int32_t> perm(static_cast<std::size_t>(num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), r.engine());
  if (paged) table.assign(perm.begin(), perm.begin() + B * pages_per_seq);
  const std::int64_t slots = paged ? page : cap;
  std::vector<T> kc(static_cast<std::size_t>(num_pages * slots * HK * D), detail::store<T>(NAN)), vc = kc;
  std::vector<Q> q(static_cast<std::size_t>(B * SQ * H * D));
  for (auto& x : q) x = detail::store<Q>(r.real(-c.amplitude, c.amplitude));
  // Logical keys of sequence b, position p: (page, slot) of the cache.
  auto where = [&](std::int64_t b, std::int64_t p) {
    const std::int64_t pg = paged ? table[static_cast<std::size_t>(b * pages_per_seq + p / page)] : b;
    return ((pg * slots + (paged ? p % page : p)) * HK) * D;
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t p = 0; p < seqlens[static_cast<std::size_t>(b)]; ++p)
      for (std::int64_t x = 0; x < HK * D; ++x) {
        kc[static_cast<std::size_t>(where(b, p) + x)] = detail::store<T>(r.real(-c.amplitude, c.amplitude));
        vc[static_cast<std::size_t>(where(b, p) + x)] = detail::store<T>(r.real(-1, 1));
      }
  // k_new, v_new [B, SN, HK, D], and the cache as it must be after the append.
  std::vector<T> kn(static_cast<std::size_t>(B * SN * HK * D)), vn(kn.size());
  for (auto& x : kn) x = detail::store<T>(ra.real(-c.amplitude, c.amplitude));
  for (auto& x : vn) x = detail::store<T>(ra.real(-1, 1));
  std::vector<T> kc_want = kc, vc_want = vc;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < SN; ++t)
      for (std::int64_t x = 0; x < HK * D; ++x) {
        const auto dst = static_cast<std::size_t>(where(b, seqlens[static_cast<std::size_t>(b)] + t) + x);
        kc_want[dst] = kn[static_cast<std::size_t>((b * SN + t) * HK * D + x)];
        vc_want[dst] = vn[static_cast<std::size_t>((b * SN + t) * HK * D + x)];
      }
  const TensorView knv = TensorView::contiguous(kn.data(), B, SN, HK, D),
                   vnv = TensorView::contiguous(vn.data(), B, SN, HK, D);
  KVCache cache;
  cache.k = TensorView::contiguous(kc.data(), num_pages, slots, HK, D);
  cache.v = TensorView::contiguous(vc.data(), num_pages, slots, HK, D);
  cache.seqlens = seqlens.data();
  if (paged) {
    cache.block_table = table.data();
    cache.max_pages = pages_per_seq;
  }
  DecodeOptions dec;
  dec.num_splits = c.num_splits % 7 == 0 ? 0 : c.num_splits;  // 0 = automatic
  if (append) {
    dec.k_new = &knv;
    dec.v_new = &vnv;
  }
  const DType lt = dtype_of<T>() == DType::f64 ? DType::f64 : DType::f32;
  auto run = [&](int threads, std::vector<Q>& out, std::vector<A>& lse) {
    AttentionOptions o = c.opts;
    o.num_threads = threads;
    out.assign(q.size(), detail::store<Q>(0));
    lse.assign(static_cast<std::size_t>(B * H * SQ), A(0));
    const TensorView lv = TensorView::contiguous(lse.data(), B, H, SQ);
    attention_decode(TensorView::contiguous(q.data(), B, SQ, H, D), cache,
                     TensorView::contiguous(out.data(), B, SQ, H, D), o, dec, &lv);
  };
  (void)lt;
  std::vector<Q> out, out2;
  std::vector<A> lse, lse2;
  run(c.opts.num_threads, out, lse);
  run(c.alt_threads, out2, lse2);
  std::string fail;
  // Appending twice (once per run) writes the same values: the cache must equal the expected one.
  if (std::memcmp(kc.data(), kc_want.data(), kc.size() * sizeof(T)) ||
      std::memcmp(vc.data(), vc_want.data(), vc.size() * sizeof(T)))
    fail = "the cache after appending " + std::to_string(SN) + " keys differs from the old cache plus k_new/v_new; ";
  if (std::memcmp(out.data(), out2.data(), out.size() * sizeof(Q)) ||
      std::memcmp(lse.data(), lse2.data(), lse.size() * sizeof(A)))
    fail = "num_threads changes the bits; ";
  // Per sequence: the oracle (f64) and the textbook method (in T, or in f32 for f32 activations) on its
  // keys alone.
  using U = std::conditional_t<std::is_same_v<Q, T>, T, float>;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n = seqlens[static_cast<std::size_t>(b)] + SN;
    std::vector<double> q64(static_cast<std::size_t>(SQ * H * D)), k64(static_cast<std::size_t>(n * HK * D)), v64 = k64;
    for (std::size_t i = 0; i < q64.size(); ++i)
      q64[i] = detail::load<double>(q[static_cast<std::size_t>(b * SQ * H * D) + i]);
    for (std::int64_t p = 0; p < n; ++p)
      for (std::int64_t x = 0; x < HK * D; ++x) {
        k64[static_cast<std::size_t>(p * HK * D + x)] =
            detail::load<double>(kc_want[static_cast<std::size_t>(where(b, p) + x)]);
        v64[static_cast<std::size_t>(p * HK * D + x)] =
            detail::load<double>(vc_want[static_cast<std::size_t>(where(b, p) + x)]);
      }
    std::vector<U> qT(q64.size()), kT(k64.size()), vT(v64.size()), text(q64.size());
    for (std::size_t i = 0; i < q64.size(); ++i) qT[i] = detail::store<U>(q64[i]);
    for (std::size_t i = 0; i < k64.size(); ++i) {
      kT[i] = detail::store<U>(k64[i]);
      vT[i] = detail::store<U>(v64[i]);
    }
    std::vector<double> oracle(q64.size());
    AttentionOptions o = c.opts;
    if (o.alibi_slopes) o.alibi_slopes = o.alibi_slopes.from(b * o.alibi_batch_stride), o.alibi_batch_stride = 0;
    attention_reference(
        TensorView::contiguous(q64.data(), 1, SQ, H, D), TensorView::contiguous(k64.data(), 1, n, HK, D),
        TensorView::contiguous(v64.data(), 1, n, HK, D), TensorView::contiguous(oracle.data(), 1, SQ, H, D), o);
    attention_reference(TensorView::contiguous(qT.data(), 1, SQ, H, D), TensorView::contiguous(kT.data(), 1, n, HK, D),
                        TensorView::contiguous(vT.data(), 1, n, HK, D),
                        TensorView::contiguous(text.data(), 1, SQ, H, D), o);
    const std::span<const Q> got(out.data() + b * SQ * H * D, oracle.size());
    if (auto v = rule_verdict("out", dtype_of<U>(), test::max_error(got, oracle), test::max_error(text, oracle), 1,
                              out_floor(c, dtype_of<U>()));
        !v.empty())
      fail += "sequence " + std::to_string(b) + " (" + std::to_string(n) + " keys): " + v + "; ";
  }
  return fail;
}

inline std::string check_decode_any(const Config& c, bool paged) {
  // Its own stream, so that the other configs stay what their seed always gave.
  const bool f32_q = (c.dtype == DType::bf16 || c.dtype == DType::f16) && Rng(mix(c.seed) ^ 0xf32).chance(0.3);
  if (f32_q)
    return c.dtype == DType::bf16 ? check_decode<bf16_t, float>(c, paged) : check_decode<f16_t, float>(c, paged);
  return detail::dispatch_dtype(c.dtype, [&]<class T>() { return check_decode<T>(c, paged); });
}

}  // namespace attn::fuzz
