// A quantized KV cache for the tests (tests/test_decode_quantized*.cpp): random keys and values, the same
// stored in a quantized format (contiguous or paged, shuffled pages) with its scales by core/quant.hpp's
// rule, the cache dequantized, the textbook reference per sequence, and a decode of it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "attn/attention.hpp"
#include "attn/decode.hpp"
#include "core/quant.hpp"
#include "support.hpp"

namespace attn::test {

// A cache format: the stored type, scale groups per row (0: one shared scale per kv head), scale dtype.
struct Format {
  const char* name;
  DType type;
  std::int64_t groups;  // 1: per (token, kv head); d / 32: q8_0 blocks; 0: shared per kv head
  DType scale_dtype;
};
// At head dim 128. Blocks of 16 do not fill AVX2's two-vector P V block, so the one-vector path runs too;
// blocks of 64 are two vectors of the AVX512-BF16 kernel's dot products.
inline const Format kFormats[] = {{"int8 per token", DType::i8, 1, DType::f32},
                                  {"q8_0 (blocks of 32, f16 scales)", DType::i8, 4, DType::f16},
                                  {"int8 in blocks of 16 (f32 scales)", DType::i8, 8, DType::f32},
                                  {"int8 in blocks of 64 (f32 scales)", DType::i8, 2, DType::f32},
                                  {"fp8 e4m3 per kv head", DType::fp8_e4m3, 0, DType::f32},
                                  {"fp8 e5m2 per kv head", DType::fp8_e5m2, 0, DType::f32}};

// Sequences of random keys and values (f32), and the same as a quantized cache, contiguous
// [B, cap, HK, D] or paged (pages of `page` slots, shuffled), with its scales.
// kD: the head dim of q, K and V.
template <std::int64_t kD = 128>
struct QuantCacheT {
  static constexpr std::int64_t HK = 2, D = kD;
  Format f;
  std::int64_t B, cap, page, rows, slots;
  std::vector<std::int64_t> lens;
  std::vector<Tensor<float>> K, V;  // [1, len, HK, D]
  std::vector<std::uint8_t> kc, vc;
  std::vector<float> ks32, vs32;  // scales (f32 or f16 storage)
  std::vector<f16_t> ks16, vs16;
  std::vector<std::int32_t> seqlens, table;
  std::int64_t max_pages = 0;

  QuantCacheT(Format fmt, std::vector<std::int64_t> l, std::int64_t page_size, std::uint64_t seed)
      : f(fmt), B(static_cast<std::int64_t>(l.size())), page(page_size), lens(std::move(l)) {
    cap = *std::max_element(lens.begin(), lens.end()) + 3;
    if (page > 0) {
      max_pages = (cap + page - 1) / page;
      rows = B * max_pages + 2;
      slots = page;
      std::vector<std::int32_t> order(static_cast<std::size_t>(rows));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(seed)));
      table.assign(order.begin(), order.begin() + B * max_pages);
    } else {
      rows = B;
      slots = cap;
    }
    kc.assign(static_cast<std::size_t>(rows * slots * HK * D), 0);
    vc = kc;
    const std::size_t nscale = static_cast<std::size_t>(f.groups ? rows * slots * HK * f.groups : HK);
    ks32.assign(nscale, 0.0f), vs32 = ks32;
    ks16.assign(nscale, f16_t{0}), vs16 = ks16;
    if (f.groups == 0)  // shared per kv head: fixed scales that put the data near the type's range
      for (std::int64_t g = 0; g < HK; ++g) {
        ks32[static_cast<std::size_t>(g)] = 2.0f / detail::quant_max(f.type) * (1 + g);
        vs32[static_cast<std::size_t>(g)] = 1.0f / detail::quant_max(f.type) * (1 + g);
      }
    for (std::int64_t b = 0; b < B; ++b) {
      K.push_back(random_tensor<float>(1, lens[b], HK, D, seed * 100 + 2 * b + 1, 2.0));
      V.push_back(random_tensor<float>(1, lens[b], HK, D, seed * 100 + 2 * b + 2));
      seqlens.push_back(static_cast<std::int32_t>(lens[b]));
      for (std::int64_t j = 0; j < lens[b]; ++j)
        for (std::int64_t g = 0; g < HK; ++g) {
          store_row(kc, k_scale(), &K[b].at(0, j, g, 0), b, j, g);
          store_row(vc, v_scale(), &V[b].at(0, j, g, 0), b, j, g);
        }
    }
  }
  std::int64_t row_of(std::int64_t b, std::int64_t j) const {  // (cache row, slot) of key j of sequence b
    return page > 0 ? table[static_cast<std::size_t>(b * max_pages + j / page)] * page + j % page : b * cap + j;
  }
  TensorView scale_view(std::vector<float>& s32, std::vector<f16_t>& s16) const {
    TensorView v;
    v.data = f.scale_dtype == DType::f16 ? static_cast<void*>(s16.data()) : static_cast<void*>(s32.data());
    v.dtype = f.scale_dtype;
    v.rank = 4;
    v.shape = {rows, slots, HK, f.groups ? f.groups : 1};
    if (f.groups)
      v.strides = {slots * HK * f.groups, HK * f.groups, f.groups, 1};
    else
      v.strides = {0, 0, 1, 0};
    return v;
  }
  TensorView k_scale() { return scale_view(ks32, ks16); }
  TensorView v_scale() { return scale_view(vs32, vs16); }
  std::int64_t scale_at(const TensorView& s, std::int64_t b, std::int64_t j, std::int64_t g, std::int64_t x) const {
    const std::int64_t r = row_of(b, j);
    return (r / slots) * s.strides[0] + (r % slots) * s.strides[1] + g * s.strides[2] + x * s.strides[3];
  }
  // Quantizes one row by core/quant.hpp's rule (owned scales computed from the group's amax).
  void store_row(std::vector<std::uint8_t>& dst, const TensorView& s, const float* x, std::int64_t b, std::int64_t j,
                 std::int64_t g) {
    const std::int64_t groups = s.shape[3], size = D / groups;
    for (std::int64_t e = 0; e < groups; ++e) {
      const std::int64_t at = scale_at(s, b, j, g, e);
      if (f.groups) {
        float amax = 0;
        for (std::int64_t c = 0; c < size; ++c) amax = std::max(amax, std::fabs(x[e * size + c]));
        detail::write_scale(s, at, detail::scale_for(f.type, amax, f.scale_dtype));
      }
      const float sc = detail::read_scale(s, at);
      for (std::int64_t c = 0; c < size; ++c)
        dst[static_cast<std::size_t>(row_of(b, j) * HK * D + g * D + e * size + c)] =
            detail::quantize_value(f.type, x[e * size + c], sc);
    }
  }
  // The cache's values dequantized (stored x scale, in f32), per sequence.
  std::vector<Tensor<float>> dequantized(bool keys) {
    std::vector<Tensor<float>> out;
    const TensorView s = keys ? k_scale() : v_scale();
    const auto& c = keys ? kc : vc;
    for (std::int64_t b = 0; b < B; ++b) {
      Tensor<float> t(1, lens[b], HK, D);
      for (std::int64_t j = 0; j < lens[b]; ++j)
        for (std::int64_t g = 0; g < HK; ++g)
          for (std::int64_t e = 0; e < D; ++e)
            t.at(0, j, g, e) =
                detail::stored_value(f.type, c[static_cast<std::size_t>(row_of(b, j) * HK * D + g * D + e)]) *
                detail::read_scale(s, scale_at(s, b, j, g, e / (D / s.shape[3])));
      out.push_back(std::move(t));
    }
    return out;
  }
  KVCache cache() {
    KVCache c;
    auto view = [&](std::vector<std::uint8_t>& v) {  // bytes as the format's type (int8_t for i8: same layout)
      TensorView t = TensorView::contiguous(reinterpret_cast<std::int8_t*>(v.data()), rows, slots, HK, D);
      t.dtype = f.type;
      return t;
    };
    c.k = view(kc);
    c.v = view(vc);
    c.k_scale = k_scale();
    c.v_scale = v_scale();
    c.seqlens = seqlens.data();
    if (page > 0) {
      c.block_table = table.data();
      c.max_pages = max_pages;
    }
    return c;
  }
};

// attention_reference per sequence over (q rows of sequence b, K[b], V[b]) in type U.
template <class U>
std::vector<U> reference(const Tensor<float>& q, const std::vector<Tensor<float>>& K,
                         const std::vector<Tensor<float>>& V, const AttentionOptions& o) {
  const std::int64_t SQ = q.s, H = q.h, D = q.d;
  std::vector<U> out(q.data.size());
  for (std::size_t b = 0; b < K.size(); ++b) {
    auto conv = [](const Tensor<float>& t, std::int64_t off, std::int64_t s) {
      Tensor<U> r(1, s, t.h, t.d);
      for (std::size_t i = 0; i < r.data.size(); ++i)
        r.data[i] = detail::store<U>(t.data[static_cast<std::size_t>(off) + i]);
      return r;
    };
    const auto qb = conv(q, static_cast<std::int64_t>(b) * SQ * H * D, SQ), kb = conv(K[b], 0, K[b].s),
               vb = conv(V[b], 0, V[b].s);
    attention_reference(qb.view(), kb.view(), vb.view(),
                        TensorView::contiguous(out.data() + b * SQ * H * D, 1, SQ, H, D), o);
  }
  return out;
}

template <std::int64_t kD>
std::vector<float> decode(QuantCacheT<kD>& c, const Tensor<float>& q, const AttentionOptions& o,
                          const DecodeOptions& dec = {}) {
  std::vector<float> out(q.data.size(), 42.0f);
  attention_decode(q.view(), c.cache(), TensorView::contiguous(out.data(), q.b, q.s, q.h, q.d), o, dec);
  return out;
}

using QuantCache = QuantCacheT<>;

}  // namespace attn::test
