// The differential test's quantized-cache decode targets: attention_decode over an i8, fp8 e4m3 or fp8
// e5m2 cache (contiguous or paged), with one of the scale layouts of docs/decode.md drawn from the
// config's seed: per token (groups 1), per block of dims (groups dividing d; llama.cpp's q8_0 is groups
// d / 32 in f16), per kv head or per tensor (zero strides), in f32 or f16. q, k_new, v_new and out are
// in the config's dtype (f32 for f64 configs: quantized caches take f32, bf16 or f16 activations).
// Checked per sequence against the f64 oracle on the dequantized cache (code x scale in f32, the
// definition), within twice the error of the f32 textbook method on the same values (its output rounded
// to out's type) plus check_decode's slack; bitwise across thread counts. In about 40 % of configs
// k_new / v_new are appended: afterwards every byte of the codes and scales outside the appended slots
// is unchanged, and the appended codes and (owned) scales are those of core/quant.hpp's rule.
// Unused slots hold NaN scales where scales are per token, so a read of one poisons the output.
// In about a third of the int8 configs, with DecodeOptions::quantized_query: where its kernel runs
// (detail::decode_query_codes_run) the oracle and the textbook take q with each row rounded as that mode
// rounds it (common/query_codes.hpp), elsewhere q itself.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "attn/decode.hpp"
#include "case.hpp"
#include "common/query_codes.hpp"
#include "core/quant.hpp"
#include "decode/decode_internal.hpp"

namespace attn::fuzz {

// One side (K or V) of the quantized cache: codes [rows, slots, HK, D] and the scale view over `s32` or
// `s16` (its dtype says which).
struct QuantSide {
  std::vector<std::uint8_t> codes;
  std::vector<float> s32;
  std::vector<f16_t> s16;
  TensorView scale;
  std::int64_t at(std::int64_t row, std::int64_t slot, std::int64_t g, std::int64_t e) const {
    return row * scale.strides[0] + slot * scale.strides[1] + g * scale.strides[2] + e * scale.strides[3];
  }
};

template <class Q>
std::string check_decode_quantized(Config c, bool paged) {
  bind_arrays(c);
  Rng r(mix(c.seed) ^ 0x9a47);
  const DType ct = r.pick(std::vector<DType>{DType::i8, DType::fp8_e4m3, DType::fp8_e5m2});
  const DType st = r.chance(0.5) ? DType::f16 : DType::f32;
  const std::int64_t B = c.batch, SQ = std::min<std::int64_t>(c.seqlen_q, 4), H = c.heads, HK = c.kv_heads,
                     D = c.head_dim, cap = std::max<std::int64_t>(c.seqlen_k, 1);
  // Scale layout: 0 per token, 1 per block of dims (a divisor of D), 2 per kv head, 3 per tensor.
  const int kind = static_cast<int>(r.uniform(0, 3));
  std::vector<std::int64_t> divisors;
  for (std::int64_t g = 2; g <= D; ++g)
    if (D % g == 0) divisors.push_back(g);
  const std::int64_t groups = kind == 1 && !divisors.empty() ? r.pick(divisors) : 1;
  const std::int64_t page = paged ? r.uniform(1, 16) : cap, pages_per_seq = (cap + page - 1) / page;
  const std::int64_t rows = paged ? B * pages_per_seq + r.uniform(0, 3) : B, slots = paged ? page : cap;
  std::vector<std::int32_t> seqlens(static_cast<std::size_t>(B)), table;
  for (auto& n : seqlens) n = static_cast<std::int32_t>(r.chance(0.1) ? 0 : r.uniform(0, c.seqlen_k));
  Rng ra(mix(c.seed) ^ 0xa99e4e);  // appends from their own stream
  const std::int64_t capacity = paged ? pages_per_seq * page : cap;
  const std::int64_t SN = ra.chance(0.4) ? std::min<std::int64_t>(ra.uniform(0, 3), capacity) : 0;
  for (auto& n : seqlens) n = static_cast<std::int32_t>(std::min<std::int64_t>(n, capacity - SN));
  std::vector<std::int32_t> perm(static_cast<std::size_t>(rows));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), r.engine());
  if (paged) table.assign(perm.begin(), perm.begin() + B * pages_per_seq);
  auto row_slot = [&](std::int64_t b, std::int64_t p) {  // key p of sequence b: (cache row, slot)
    return paged ? std::pair{static_cast<std::int64_t>(table[static_cast<std::size_t>(b * pages_per_seq + p / page)]),
                             p % page}
                 : std::pair{b, p};
  };
  // The scale view's strides; it is owned (the append computes and writes scales) when no two
  // positions share an element: a zero stride only on dims of size 1 (the library's rule).
  std::array<std::int64_t, 4> strides{slots * HK * groups, HK * groups, groups, 1};
  if (kind == 2) strides = {0, 0, 1, 0};
  if (kind == 3) strides = {0, 0, 0, 0};
  const std::array<std::int64_t, 4> shape{rows, slots, HK, groups};
  bool owned = true;
  for (int i = 0; i < 4; ++i) owned = owned && (strides[i] != 0 || shape[i] == 1);
  const float qmax = detail::quant_max(ct);
  // One row of kv head g at (cache row, slot) quantized by the rule: each group's scale computed from
  // its largest magnitude and written where the view is owned, read where it is shared.
  const auto quantize_row = [&](QuantSide& x, std::pair<std::int64_t, std::int64_t> at_row, std::int64_t g,
                                const float* row) {
    const auto [rw, sl] = at_row;
    const std::int64_t size = D / groups;
    for (std::int64_t e = 0; e < groups; ++e) {
      const std::int64_t at = x.at(rw, sl, g, e);
      float amax = 0;
      for (std::int64_t k = 0; k < size; ++k) amax = std::max(amax, std::abs(row[e * size + k]));
      if (owned) detail::write_scale(x.scale, at, detail::scale_for(ct, amax, st));
      const float sc = detail::read_scale(x.scale, at);
      for (std::int64_t k = 0; k < size; ++k)
        x.codes[static_cast<std::size_t>(((rw * slots + sl) * HK + g) * D + e * size + k)] =
            detail::quantize_value(ct, row[e * size + k], sc);
    }
  };
  QuantSide side[2];  // K, V
  for (int s = 0; s < 2; ++s) {
    QuantSide& x = side[s];
    x.codes.assign(static_cast<std::size_t>(rows * slots * HK * D), 0);
    for (auto& b : x.codes) b = static_cast<std::uint8_t>(r.uniform(0, 255));  // unused slots: any code
    const std::size_t n = static_cast<std::size_t>(kind <= 1 ? rows * slots * HK * groups : kind == 2 ? HK : 1);
    x.s32.assign(n, owned ? NAN : 0.0f);
    x.s16.assign(n, detail::store<f16_t>(owned ? NAN : 0.0));
    x.scale = st == DType::f16 ? TensorView::strided(x.s16.data(), shape, strides)
                               : TensorView::strided(x.s32.data(), shape, strides);
    const double amp = s == 0 ? c.amplitude : 1.0;
    if (!owned)  // shared scales: fixed, near the values' range
      for (std::size_t i = 0; i < n; ++i)
        detail::write_scale(x.scale, static_cast<std::int64_t>(i), static_cast<float>(amp / qmax * r.real(0.5, 1.5)));
    // The keys each sequence holds: values quantized by the rule (owned scales from each group's amax).
    std::vector<float> row(static_cast<std::size_t>(D));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t p = 0; p < seqlens[static_cast<std::size_t>(b)]; ++p)
        for (std::int64_t g = 0; g < HK; ++g) {
          for (auto& v : row) v = static_cast<float>(r.real(-amp, amp));
          quantize_row(x, row_slot(b, p), g, row.data());
        }
  }
  std::vector<Q> q(static_cast<std::size_t>(B * SQ * H * D)), kn(static_cast<std::size_t>(B * SN * HK * D)),
      vn(kn.size());
  for (auto& x : q) x = detail::store<Q>(r.real(-c.amplitude, c.amplitude));
  for (auto& x : kn) x = detail::store<Q>(ra.real(-c.amplitude, c.amplitude));
  for (auto& x : vn) x = detail::store<Q>(ra.real(-1, 1));
  const TensorView knv = TensorView::contiguous(kn.data(), B, SN, HK, D),
                   vnv = TensorView::contiguous(vn.data(), B, SN, HK, D);
  KVCache cache;
  auto codes_view = [&](QuantSide& x) {
    TensorView t = TensorView::contiguous(reinterpret_cast<std::int8_t*>(x.codes.data()), rows, slots, HK, D);
    t.dtype = ct;
    return t;
  };
  cache.k = codes_view(side[0]);
  cache.v = codes_view(side[1]);
  cache.k_scale = side[0].scale;
  cache.v_scale = side[1].scale;
  cache.seqlens = seqlens.data();
  if (paged) {
    cache.block_table = table.data();
    cache.max_pages = pages_per_seq;
  }
  DecodeOptions dec;
  dec.num_splits = c.num_splits % 7 == 0 ? 0 : c.num_splits;
  if (SN > 0 || ra.chance(0.1)) dec.k_new = &knv, dec.v_new = &vnv;  // an append of 0 keys now and then
  dec.quantized_query = ct == DType::i8 && Rng(mix(c.seed) ^ 0x9c0de).chance(0.35);
  const bool rounded_q = dec.quantized_query && detail::decode_query_codes_run(D, groups);
  // What the append must leave: the codes and scales as they were, but the appended slots by the rule.
  QuantSide want[2] = {side[0], side[1]};
  for (int s = 0; s < 2 && dec.k_new; ++s) {
    QuantSide& x = want[s];
    x.scale.data = st == DType::f16 ? static_cast<void*>(x.s16.data()) : static_cast<void*>(x.s32.data());
    const std::vector<Q>& src = s == 0 ? kn : vn;
    std::vector<float> row(static_cast<std::size_t>(D));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < SN; ++t)
        for (std::int64_t g = 0; g < HK; ++g) {
          const Q* v = src.data() + ((b * SN + t) * HK + g) * D;
          for (std::int64_t k = 0; k < D; ++k) row[static_cast<std::size_t>(k)] = detail::load<float>(v[k]);
          quantize_row(x, row_slot(b, seqlens[static_cast<std::size_t>(b)] + t), g, row.data());
        }
  }
  auto run = [&](int threads, std::vector<Q>& out, std::vector<float>& lse) {
    AttentionOptions o = c.opts;
    o.num_threads = threads;
    out.assign(q.size(), detail::store<Q>(0));
    lse.assign(static_cast<std::size_t>(B * H * SQ), 0.0f);
    const TensorView lv = TensorView::contiguous(lse.data(), B, H, SQ);
    attention_decode(TensorView::contiguous(q.data(), B, SQ, H, D), cache,
                     TensorView::contiguous(out.data(), B, SQ, H, D), o, dec, &lv);
  };
  std::vector<Q> out, out2;
  std::vector<float> lse, lse2;
  run(c.opts.num_threads, out, lse);
  run(c.alt_threads, out2, lse2);
  std::string fail = std::string(dtype_name(ct)) + " cache, " + std::string(dtype_name(st)) + " scales, layout " +
                     std::to_string(kind) + ", groups " + std::to_string(groups) +
                     (dec.quantized_query ? rounded_q ? ", quantized_query" : ", quantized_query (exact kernel)" : "") +
                     ": ";
  const std::size_t prefix = fail.size();
  for (int s = 0; s < 2; ++s) {
    const char* n = s == 0 ? "k" : "v";
    if (side[s].codes != want[s].codes)
      fail += std::string("the ") + n + " codes after the append differ from the rule's; ";
    const bool scales_equal = st == DType::f16
                                  ? std::memcmp(side[s].s16.data(), want[s].s16.data(), side[s].s16.size() * 2) == 0
                                  : std::memcmp(side[s].s32.data(), want[s].s32.data(), side[s].s32.size() * 4) == 0;
    if (!scales_equal) fail += std::string("the ") + n + " scales after the append differ from the rule's; ";
  }
  if (std::memcmp(out.data(), out2.data(), out.size() * sizeof(Q)) ||
      std::memcmp(lse.data(), lse2.data(), lse.size() * 4))
    fail += "num_threads changes the bits; ";
  // Per sequence: the oracle (f64) and the f32 textbook method on the dequantized keys and values.
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n = seqlens[static_cast<std::size_t>(b)] + SN;
    std::vector<double> q64(static_cast<std::size_t>(SQ * H * D)), kv64[2];
    for (std::size_t i = 0; i < q64.size(); ++i)
      q64[i] = detail::load<double>(q[static_cast<std::size_t>(b * SQ * H * D) + i]);
    if (rounded_q)
      for (std::size_t at = 0; at < q64.size(); at += static_cast<std::size_t>(D)) {
        std::vector<float> row(q64.begin() + at, q64.begin() + at + D);
        test::round_query_row(row.data(), D);
        std::copy(row.begin(), row.end(), q64.begin() + at);
      }
    for (int s = 0; s < 2; ++s) {
      kv64[s].resize(static_cast<std::size_t>(n * HK * D));
      for (std::int64_t p = 0; p < n; ++p)
        for (std::int64_t g = 0; g < HK; ++g)
          for (std::int64_t e = 0; e < D; ++e) {
            const auto [rw, sl] = row_slot(b, p);
            const std::uint8_t code = side[s].codes[static_cast<std::size_t>(((rw * slots + sl) * HK + g) * D + e)];
            kv64[s][static_cast<std::size_t>((p * HK + g) * D + e)] =
                detail::stored_value(ct, code) *
                detail::read_scale(side[s].scale, side[s].at(rw, sl, g, e / (D / groups)));
          }
    }
    std::vector<float> q32(q64.begin(), q64.end()), k32(kv64[0].begin(), kv64[0].end()),
        v32(kv64[1].begin(), kv64[1].end());
    std::vector<double> oracle(q64.size());
    std::vector<float> text(q64.size());
    AttentionOptions o = c.opts;
    if (o.alibi_slopes) o.alibi_slopes = o.alibi_slopes.from(b * o.alibi_batch_stride), o.alibi_batch_stride = 0;
    attention_reference(
        TensorView::contiguous(q64.data(), 1, SQ, H, D), TensorView::contiguous(kv64[0].data(), 1, n, HK, D),
        TensorView::contiguous(kv64[1].data(), 1, n, HK, D), TensorView::contiguous(oracle.data(), 1, SQ, H, D), o);
    attention_reference(
        TensorView::contiguous(q32.data(), 1, SQ, H, D), TensorView::contiguous(k32.data(), 1, n, HK, D),
        TensorView::contiguous(v32.data(), 1, n, HK, D), TensorView::contiguous(text.data(), 1, SQ, H, D), o);
    std::vector<Q> text_q(text.size());  // the f32 textbook's output rounded to the output type
    for (std::size_t i = 0; i < text.size(); ++i) text_q[i] = detail::store<Q>(double(text[i]));
    const std::span<const Q> got(out.data() + b * SQ * H * D, oracle.size());
    if (auto v = rule_verdict("out", dtype_of<Q>(), test::max_error(got, oracle), test::max_error(text_q, oracle), 1,
                              out_floor(c, dtype_of<Q>()));
        !v.empty())
      fail += "sequence " + std::to_string(b) + " (" + std::to_string(n) + " keys): " + v + "; ";
  }
  return fail.size() == prefix ? "" : fail;
}

inline std::string check_decode_quantized_any(const Config& c, bool paged) {
  switch (c.dtype) {
    case DType::bf16:
      return check_decode_quantized<bf16_t>(c, paged);
    case DType::f16:
      return check_decode_quantized<f16_t>(c, paged);
    default:
      return check_decode_quantized<float>(c, paged);
  }
}

}  // namespace attn::fuzz
