// Head dims: v's head dim apart from q's and k's (DeepSeek's prefill, 192 / 128), every dim up to 576,
// and MLA decode (d_qk 576, d_v 512, one kv head, V the first 512 dims of K's cache rows). Each path
// against a textbook oracle written here (softmax(scale q k^T) v in f64, causal bottom-right), and the
// rules that guard the new shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "attn/decode.hpp"
#include "attn/varlen.hpp"
#include "support.hpp"

namespace attn {
namespace {

using test::max_error;
using test::random_tensor;
using test::Tensor;

// out[b, i, h, :] = softmax over the visible keys of scale q.k, times v, in f64. k and v are read
// through views (any strides), so an MLA value view of k's rows is read as the kernels read it.
std::vector<double> textbook(const Tensor<double>& q, const TensorView& k, const TensorView& v, bool causal) {
  const std::int64_t B = q.b, sq = q.s, H = q.h, d = q.d, sk = k.shape[1], hk = k.shape[2], dv = v.shape[3];
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  auto at = [](const TensorView& t, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t c) {
    return static_cast<const double*>(
        t.data)[b * t.strides[0] + s * t.strides[1] + h * t.strides[2] + c * t.strides[3]];
  };
  std::vector<double> out(static_cast<std::size_t>(B * sq * H * dv), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < sq; ++i) {
        const std::int64_t end = causal ? std::min(sk, sk - sq + i + 1) : sk, g = h / (H / hk);
        if (end <= 0) continue;
        std::vector<double> s(static_cast<std::size_t>(end));
        double m = -INFINITY, l = 0;
        for (std::int64_t j = 0; j < end; ++j) {
          double dot = 0;
          for (std::int64_t c = 0; c < d; ++c)
            dot += q.data[static_cast<std::size_t>(((b * sq + i) * H + h) * d + c)] * at(k, b, j, g, c);
          s[static_cast<std::size_t>(j)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        for (double& x : s) l += (x = std::exp(x - m));
        for (std::int64_t c = 0; c < dv; ++c) {
          double acc = 0;
          for (std::int64_t j = 0; j < end; ++j) acc += s[static_cast<std::size_t>(j)] * at(v, b, j, g, c);
          out[static_cast<std::size_t>(((b * sq + i) * H + h) * dv + c)] = acc / l;
        }
      }
  return out;
}

struct Dims {
  std::int64_t d, dv;
};

// Every prefill path with v's head dim apart from q's: exact in f64 for several tile sizes and splits.
TEST(UnequalHeadDims, EveryForwardPathIsExactInF64) {
  for (const Dims dims : {Dims{192, 128}, Dims{128, 192}, Dims{3, 5}, Dims{64, 1}, Dims{17, 40}})
    for (bool causal : {false, true}) {
      SCOPED_TRACE("d " + std::to_string(dims.d) + ", dv " + std::to_string(dims.dv) + (causal ? ", causal" : ""));
      const std::int64_t B = 2, sq = 37, sk = 53, H = 4, HK = 2;
      const auto q = random_tensor<double>(B, sq, H, dims.d, 1);
      const auto k = random_tensor<double>(B, sk, HK, dims.d, 2);
      const auto v = random_tensor<double>(B, sk, HK, dims.dv, 3);
      const std::vector<double> want = textbook(q, k.view(), v.view(), causal);
      AttentionOptions o;
      o.causal = causal;
      Tensor<double> out(B, sq, H, dims.dv);
      attention_reference(q.view(), k.view(), v.view(), out.view(), o);
      EXPECT_LE(max_error(out.data, want), test::kF64Tolerance) << "reference";
      for (std::int64_t tile : {std::int64_t{8}, std::int64_t{64}}) {
        TileOptions t;
        t.q_tile = tile;
        t.k_tile = tile / 2 + 3;
        Tensor<double> o_t(B, sq, H, dims.dv);
        attention_tiled(q.view(), k.view(), v.view(), o_t.view(), o, t);
        EXPECT_LE(max_error(o_t.data, want), test::kF64Tolerance) << "tiled, tile " << tile;
      }
      for (std::int64_t w : {std::int64_t{1}, std::int64_t{5}}) {
        Tensor<double> o_s(B, sq, H, dims.dv);
        attention_splitk(q.view(), k.view(), v.view(), o_s.view(), o, SplitKOptions{w});
        EXPECT_LE(max_error(o_s.data, want), test::kF64Tolerance) << "splitk, " << w << " splits";
      }
      const auto parts = splitk_partials(q.view(), k.view(), v.view(), o, SplitKOptions{3}, 1, 5, 2);
      ASSERT_EQ(parts.size(), 3u);
      EXPECT_EQ(static_cast<std::int64_t>(parts[0].o.size()), dims.dv);
      // varlen: the two batch rows as two packed sequences.
      const std::int32_t cq[] = {0, static_cast<std::int32_t>(sq), static_cast<std::int32_t>(2 * sq)};
      const std::int32_t ck[] = {0, static_cast<std::int32_t>(sk), static_cast<std::int32_t>(2 * sk)};
      Tensor<double> o_v(B, sq, H, dims.dv);
      attention_varlen(TensorView::contiguous(q.data.data(), B * sq, H, dims.d),
                       TensorView::contiguous(k.data.data(), B * sk, HK, dims.d),
                       TensorView::contiguous(v.data.data(), B * sk, HK, dims.dv),
                       TensorView::contiguous(o_v.data.data(), B * sq, H, dims.dv), cq, ck, B, o);
      EXPECT_LE(max_error(o_v.data, want), test::kF64Tolerance) << "varlen";
      // varlen over pages of 16 keys: sequence b's keys in its own pages.
      const std::int64_t page = 16, per_seq = (sk + page - 1) / page;
      Tensor<double> kp(B * per_seq, page, HK, dims.d), vp(B * per_seq, page, HK, dims.dv);
      std::vector<std::int32_t> table;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t x = 0; x < per_seq; ++x)
          table.push_back(static_cast<std::int32_t>((B - 1 - b) * per_seq + x));
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t j = 0; j < sk; ++j) {
          const std::int64_t pg = table[static_cast<std::size_t>(b * per_seq + j / page)];
          for (std::int64_t g = 0; g < HK; ++g) {
            for (std::int64_t c = 0; c < dims.d; ++c)
              kp.at(pg, j % page, g, c) = k.data[static_cast<std::size_t>(((b * sk + j) * HK + g) * dims.d + c)];
            for (std::int64_t c = 0; c < dims.dv; ++c)
              vp.at(pg, j % page, g, c) = v.data[static_cast<std::size_t>(((b * sk + j) * HK + g) * dims.dv + c)];
          }
        }
      Tensor<double> o_p(B, sq, H, dims.dv);
      attention_varlen_paged(TensorView::contiguous(q.data.data(), B * sq, H, dims.d), kp.view(), vp.view(),
                             TensorView::contiguous(o_p.data.data(), B * sq, H, dims.dv), cq, ck, B,
                             VarlenPages{table.data(), per_seq, 0}, o);
      EXPECT_LE(max_error(o_p.data, want), test::kF64Tolerance) << "varlen paged";
    }
}

// f32 with unequal dims: the tiled kernel's error against the f64 oracle within twice the textbook's.
TEST(UnequalHeadDims, F32TiledIsWithinTwiceTheTextbookError) {
  const std::int64_t B = 1, sq = 300, sk = 300, H = 2, d = 192, dv = 128;
  const auto q = random_tensor<float>(B, sq, H, d, 4), k = random_tensor<float>(B, sk, H, d, 5);
  const auto v = random_tensor<float>(B, sk, H, dv, 6);
  const auto k64 = test::to_f64(k), v64 = test::to_f64(v);
  const std::vector<double> want = textbook(test::to_f64(q), k64.view(), v64.view(), true);
  AttentionOptions o;
  o.causal = true;
  Tensor<float> ref(B, sq, H, dv), tiled(B, sq, H, dv);
  attention_reference(q.view(), k.view(), v.view(), ref.view(), o);
  attention_tiled(q.view(), k.view(), v.view(), tiled.view(), o);
  const double e_ref = max_error(ref.data, want), e_tiled = max_error(tiled.data, want);
  EXPECT_GT(e_ref, 0.0);  // f32 rounding is visible: the bound below is not vacuous
  EXPECT_TRUE(test::meets_textbook_rule(e_tiled, e_ref, test::kForwardFactor, 1e-7));
}

// Every head dim the CPU takes, 1 .. 576 (the fast paths' 64, 128, 192, 256, 512, 576 and odd ones
// between), through the tiled kernel and decode, exact in f64.
TEST(HeadDims, EveryDimUpTo576IsExactInF64) {
  for (std::int64_t d : {1, 7, 64, 128, 192, 200, 256, 384, 512, 576}) {
    SCOPED_TRACE("d " + std::to_string(d));
    const std::int64_t sq = 5, sk = 70, H = 2;
    const auto q = random_tensor<double>(1, sq, H, d, 7), k = random_tensor<double>(1, sk, H, d, 8);
    const auto v = random_tensor<double>(1, sk, H, d, 9);
    const std::vector<double> want = textbook(q, k.view(), v.view(), true);
    AttentionOptions o;
    o.causal = true;
    Tensor<double> out(1, sq, H, d), dec(1, sq, H, d);
    attention_tiled(q.view(), k.view(), v.view(), out.view(), o);
    EXPECT_LE(max_error(out.data, want), test::kF64Tolerance) << "tiled";
    const std::int32_t seqlens[] = {static_cast<std::int32_t>(sk)};
    const test::DecodeCall call(k.view(), v.view(), seqlens);
    attention_decode(q.view(), call.cache, dec.view(), o);
    EXPECT_LE(max_error(dec.data, want), test::kF64Tolerance) << "decode";
    // The backward at this dim against the textbook backward.
    Tensor<double> lse_store(1, 1, H, sq);
    const TensorView lse = TensorView::contiguous(lse_store.data.data(), 1, H, sq);
    attention_tiled(q.view(), k.view(), v.view(), out.view(), o, {}, &lse);
    const auto dout = random_tensor<double>(1, sq, H, d, 30);
    Tensor<double> dq(1, sq, H, d), dk(1, sk, H, d), dv(1, sk, H, d), rq(1, sq, H, d), rk(1, sk, H, d), rv(1, sk, H, d);
    attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse, dq.view(), dk.view(), dv.view(), o);
    attention_backward_reference(q.view(), k.view(), v.view(), out.view(), dout.view(), lse, rq.view(), rk.view(),
                                 rv.view(), o);
    EXPECT_LE(max_error(dq.data, rq.data), test::kF64Tolerance) << "dq";
    EXPECT_LE(max_error(dk.data, rk.data), test::kF64Tolerance) << "dk";
    EXPECT_LE(max_error(dv.data, rv.data), test::kF64Tolerance) << "dv";
  }
}

// The SIMD decode kernel (f32 caches) at every dim, on every SIMD target (the dims its dot products
// unroll for, 64, 128, 192 and 256, and the run-time loop of the others): within twice the textbook's
// error at the cache's precision (attention_reference on the same values).
TEST(HeadDims, SimdDecodeIsWithinTwiceTheTextbookErrorUpTo576) {
  for (std::int64_t d : {1, 7, 64, 192, 200, 256, 512, 576}) {
    SCOPED_TRACE("d " + std::to_string(d));
    const std::int64_t sk = 300, H = 4, HK = 2;
    const auto q = random_tensor<float>(1, 1, H, d, 31), k = random_tensor<float>(1, sk, HK, d, 32);
    const auto v = random_tensor<float>(1, sk, HK, d, 33);
    const auto k64 = test::to_f64(k), v64 = test::to_f64(v);
    const std::vector<double> want = textbook(test::to_f64(q), k64.view(), v64.view(), false);
    Tensor<float> ref(1, 1, H, d), dec(1, 1, H, d);
    attention_reference(q.view(), k.view(), v.view(), ref.view());
    const std::int32_t seqlens[] = {static_cast<std::int32_t>(sk)};
    const test::DecodeCall call(k.view(), v.view(), seqlens);
    const double e_ref = max_error(ref.data, want);
    test::for_each_simd_target("decode", test::decode_dispatched, [&](std::int64_t target) {
      SCOPED_TRACE(hwy::TargetName(target));
      std::fill(dec.data.begin(), dec.data.end(), std::nanf(""));  // each target writes its own output
      attention_decode(q.view(), call.cache, dec.view());
      EXPECT_TRUE(test::meets_textbook_rule(max_error(dec.data, want), e_ref, test::kForwardFactor, 1e-7));
    });
  }
}

// MLA decode: one kv head of 576 dims, 16 query heads, V = the first 512 dims of each cache row (a view
// of the same memory), keys appended by k_new alone; contiguous and paged, f64 exact and f32 within
// twice the textbook's error.
template <class T>
void check_mla(bool paged) {
  const std::int64_t B = 2, n = 150, fresh = 2, H = 16, d = 576, dv = 512, page = 32;
  const std::int64_t rows = paged ? B * ((n + page - 1) / page) : B, slots = paged ? page : n;
  auto kc = random_tensor<T>(rows, slots, 1, d, 10);
  const auto q = random_tensor<T>(B, 1, H, d, 11), k_new = random_tensor<T>(B, fresh, 1, d, 12);
  std::vector<std::int32_t> seqlens(static_cast<std::size_t>(B), static_cast<std::int32_t>(n - fresh)), table;
  const std::int64_t per_seq = (n + page - 1) / page;
  for (std::int64_t x = 0; x < B * per_seq; ++x) table.push_back(static_cast<std::int32_t>(B * per_seq - 1 - x));
  test::DecodeCall call(kc.view(), TensorView::strided(kc.data.data(), {rows, slots, 1, dv}, {slots * d, d, d, 1}),
                        seqlens.data());
  if (paged) call.cache.block_table = table.data(), call.cache.max_pages = per_seq;
  call.append(k_new.view());  // k_new alone: its rows hold the values too
  Tensor<T> out(B, 1, H, dv);
  attention_decode(q.view(), call.cache, out.view(), {}, call.dec);

  // The oracle's dense copy of each sequence's keys (the cache after the append), values its prefix.
  Tensor<double> k64(B, n, 1, d);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t c = 0; c < d; ++c) {
        const double x =
            j >= n - fresh
                ? detail::load<double>(k_new.data[static_cast<std::size_t>((b * fresh + j - (n - fresh)) * d + c)])
            : paged
                ? detail::load<double>(kc.at(table[static_cast<std::size_t>(b * per_seq + j / page)], j % page, 0, c))
                : detail::load<double>(kc.at(b, j, 0, c));
        k64.at(b, j, 0, c) = x;
      }
  for (std::int64_t b = 0; b < B; ++b)  // the append wrote k_new's rows whole
    for (std::int64_t t = 0; t < fresh; ++t) {
      const std::int64_t j = n - fresh + t;
      const T* row =
          paged ? &kc.at(table[static_cast<std::size_t>(b * per_seq + j / page)], j % page, 0, 0) : &kc.at(b, j, 0, 0);
      for (std::int64_t c = 0; c < d; ++c) ASSERT_EQ(detail::load<double>(row[c]), k64.at(b, j, 0, c));
    }
  const TensorView v64 = TensorView::strided(k64.data.data(), {B, n, 1, dv}, {n * d, d, d, 1});
  const std::vector<double> want = textbook(test::to_f64(q), k64.view(), v64, false);
  const double err = max_error(out.data, want);
  if constexpr (std::is_same_v<T, double>) {
    EXPECT_LE(err, test::kF64Tolerance);
  } else {  // the textbook method at T: attention_reference over the same (dense) cache, V a view of K
    Tensor<T> kd(B, n, 1, d), ref(B, 1, H, dv);
    for (std::size_t i = 0; i < kd.data.size(); ++i) kd.data[i] = detail::store<T>(k64.data[i]);
    attention_reference(q.view(), kd.view(), TensorView::strided(kd.data.data(), {B, n, 1, dv}, {n * d, d, d, 1}),
                        ref.view());
    const double e_ref = max_error(ref.data, want);
    EXPECT_GT(e_ref, 0.0);
    EXPECT_TRUE(test::meets_textbook_rule(err, e_ref, test::kForwardFactor, 1e-7));
  }
}

// bf16 runs the AVX512-BF16 kernel where the CPU has it (both dims multiples of 32), else the f32 one.
TEST(MlaDecode, ValuesAreTheKeysFirstDimsContiguous) {
  check_mla<double>(false);
  check_mla<float>(false);
  check_mla<bf16_t>(false);
}
TEST(MlaDecode, ValuesAreTheKeysFirstDimsPaged) {
  check_mla<double>(true);
  check_mla<float>(true);
  check_mla<bf16_t>(true);
}

// Decode with a separate V cache of another head dim, appended by v_new, unquantized and int8 (V's
// scales in groups of its own dim).
TEST(UnequalHeadDims, DecodeWithItsOwnValueCache) {
  const std::int64_t B = 2, n = 90, H = 4, HK = 2, d = 192, dv = 128;
  auto kc = random_tensor<double>(B, n, HK, d, 13), vc = random_tensor<double>(B, n, HK, dv, 14);
  const auto q = random_tensor<double>(B, 3, H, d, 15), kn = random_tensor<double>(B, 1, HK, d, 16),
             vn = random_tensor<double>(B, 1, HK, dv, 17);
  const std::vector<std::int32_t> seqlens(static_cast<std::size_t>(B), static_cast<std::int32_t>(n - 1));
  test::DecodeCall call(kc.view(), vc.view(), seqlens.data());
  const TensorView vnv = vn.view();
  call.append(kn.view(), &vnv);
  AttentionOptions o;
  o.causal = true;
  Tensor<double> out(B, 3, H, dv);
  attention_decode(q.view(), call.cache, out.view(), o, call.dec);
  for (std::int64_t b = 0; b < B; ++b) {
    for (std::int64_t g = 0; g < HK; ++g) {
      for (std::int64_t c = 0; c < d; ++c)
        ASSERT_EQ(kc.at(b, n - 1, g, c), kn.data[static_cast<std::size_t>((b * HK + g) * d + c)]);
      for (std::int64_t c = 0; c < dv; ++c)
        ASSERT_EQ(vc.at(b, n - 1, g, c), vn.data[static_cast<std::size_t>((b * HK + g) * dv + c)]);
    }
  }
  EXPECT_LE(max_error(out.data, textbook(q, kc.view(), vc.view(), true)), test::kF64Tolerance);

  // int8: scales per (token, kv head) for K, blocks of 32 of V's 128 dims for V.
  Tensor<std::int8_t> k8(B, n, HK, d), v8(B, n, HK, dv);
  Tensor<float> ks(B, n, HK, 1), vs(B, n, HK, dv / 32);
  for (auto& x : k8.data) x = 0;
  for (auto& x : v8.data) x = 0;
  const auto q32 = random_tensor<float>(B, 1, H, d, 18), k32 = random_tensor<float>(B, n, HK, d, 19),
             v32 = random_tensor<float>(B, n, HK, dv, 20);
  const std::vector<std::int32_t> none(static_cast<std::size_t>(B), 0);
  test::DecodeCall qc(k8.view(), v8.view(), none.data());
  qc.cache.k_scale = ks.view();
  qc.cache.v_scale = vs.view();
  const TensorView v32v = v32.view();
  qc.append(k32.view(), &v32v);
  Tensor<float> o8(B, 1, H, dv);
  attention_decode(q32.view(), qc.cache, o8.view(), {}, qc.dec);
  // Oracle on the dequantized cache.
  Tensor<double> kd(B, n, HK, d), vd(B, n, HK, dv);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t g = 0; g < HK; ++g) {
        for (std::int64_t c = 0; c < d; ++c) kd.at(b, j, g, c) = double(k8.at(b, j, g, c)) * ks.at(b, j, g, 0);
        for (std::int64_t c = 0; c < dv; ++c) vd.at(b, j, g, c) = double(v8.at(b, j, g, c)) * vs.at(b, j, g, c / 32);
      }
  EXPECT_LE(max_error(o8.data, textbook(test::to_f64(q32), kd.view(), vd.view(), false)), 1e-5);
}

// The backward with v's own head dim: the tiled backward against the textbook backward (f64, 1e-12),
// and both against the equal-dims problem whose v is zero-padded to q's dim (whose gradients have been
// tested on their own): the same dq and dk, and dv its first head_dim_v columns.
TEST(UnequalHeadDims, TheBackwardIsExactInF64) {
  for (const Dims dims : {Dims{192, 128}, Dims{40, 72}, Dims{5, 3}})
    for (bool causal : {false, true}) {
      SCOPED_TRACE("d " + std::to_string(dims.d) + ", dv " + std::to_string(dims.dv) + (causal ? ", causal" : ""));
      const std::int64_t B = 2, sq = 29, sk = 45, H = 4, HK = 2, w = std::max(dims.d, dims.dv);
      const auto q = random_tensor<double>(B, sq, H, dims.d, 40), k = random_tensor<double>(B, sk, HK, dims.d, 41);
      const auto v = random_tensor<double>(B, sk, HK, dims.dv, 42), dout = random_tensor<double>(B, sq, H, dims.dv, 43);
      AttentionOptions o;
      o.causal = causal;
      Tensor<double> out(B, sq, H, dims.dv), lse_store(1, B, H, sq);
      const TensorView lse = TensorView::contiguous(lse_store.data.data(), B, H, sq);
      attention_tiled(q.view(), k.view(), v.view(), out.view(), o, {}, &lse);
      Tensor<double> dq(B, sq, H, dims.d), dk(B, sk, HK, dims.d), dv(B, sk, HK, dims.dv);
      Tensor<double> rq(B, sq, H, dims.d), rk(B, sk, HK, dims.d), rv(B, sk, HK, dims.dv);
      TileOptions tiles;
      tiles.q_tile = 8;
      tiles.k_tile = 11;
      attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse, dq.view(), dk.view(), dv.view(), o,
                         tiles);
      attention_backward_reference(q.view(), k.view(), v.view(), out.view(), dout.view(), lse, rq.view(), rk.view(),
                                   rv.view(), o);
      EXPECT_LE(max_error(dq.data, rq.data), test::kF64Tolerance) << "dq";
      EXPECT_LE(max_error(dk.data, rk.data), test::kF64Tolerance) << "dk";
      EXPECT_LE(max_error(dv.data, rv.data), test::kF64Tolerance) << "dv";
      // The padded problem: every tensor at width w, zero past its own dims (a zero column of q and k
      // adds nothing to the scores; of v, out and dout nothing to dP and D).
      // t at width `width`: its first columns, padded with zeros.
      auto at_width = [](const Tensor<double>& t, std::int64_t width) {
        Tensor<double> r(t.b, t.s, t.h, width);
        for (std::int64_t a = 0; a < t.b; ++a)
          for (std::int64_t s = 0; s < t.s; ++s)
            for (std::int64_t h = 0; h < t.h; ++h)
              for (std::int64_t c = 0; c < std::min(t.d, width); ++c) r.at(a, s, h, c) = t.at(a, s, h, c);
        return r;
      };
      const auto qp = at_width(q, w), kp = at_width(k, w), vp = at_width(v, w), op = at_width(out, w),
                 dop = at_width(dout, w);
      Tensor<double> pq(B, sq, H, w), pk(B, sk, HK, w), pv(B, sk, HK, w);
      AttentionOptions po = o;
      po.softmax_scale = 1 / std::sqrt(static_cast<double>(dims.d));  // q's dim, not the padded one
      attention_backward(qp.view(), kp.view(), vp.view(), op.view(), dop.view(), lse, pq.view(), pk.view(), pv.view(),
                         po);
      EXPECT_LE(max_error(at_width(pq, dims.d), dq), test::kF64Tolerance) << "dq against the zero-padded problem";
      EXPECT_LE(max_error(at_width(pk, dims.d), dk), test::kF64Tolerance) << "dk against the zero-padded problem";
      EXPECT_LE(max_error(at_width(pv, dims.dv), dv), test::kF64Tolerance) << "dv against the zero-padded problem";
    }
}

// Each rule of the new shapes names its argument and leaves the outputs and the cache untouched.
template <class F>
void expect_rejected(F&& call, const std::string& needle, const std::vector<double>& out,
                     const std::vector<double>& cache) {
  const std::vector<double> out0 = out, cache0 = cache;
  try {
    call();
    ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_EQ(out, out0);
  EXPECT_EQ(cache, cache0);
}

TEST(HeadDimRules, BadShapesAreNamedAndWriteNothing) {
  const auto q = random_tensor<double>(1, 2, 2, 64, 21), k = random_tensor<double>(1, 8, 1, 64, 22);
  const auto v = random_tensor<double>(1, 8, 1, 32, 23);
  Tensor<double> out(1, 2, 2, 32), wrong(1, 2, 2, 64);
  for (auto& x : out.data) x = 7;
  for (auto& x : wrong.data) x = 7;
  expect_rejected([&] { attention_tiled(q.view(), k.view(), v.view(), wrong.view()); },
                  "out: head_dim must equal v's (32), got 64", wrong.data, v.data);
  // The backward's dv and dout take v's head dim.
  Tensor<double> dq(1, 2, 2, 64), dk(1, 8, 1, 64), dv_wrong(1, 8, 1, 64), dout(1, 2, 2, 32);
  std::vector<double> lse(4, 0.0);
  const TensorView lse_view = TensorView::contiguous(lse.data(), 1, 2, 2);
  expect_rejected(
      [&] {
        attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_view, dq.view(), dk.view(),
                           dv_wrong.view());
      },
      "attn::attention_backward: dv: head_dim must equal v's (32), got 64", dq.data, dk.data);

  // MLA: a value view wider than the keys, v_new beside it, rotary with it.
  auto kc = random_tensor<double>(1, 8, 1, 64, 24);
  const auto qd = random_tensor<double>(1, 1, 2, 64, 25), kn = random_tensor<double>(1, 1, 1, 64, 26);
  const std::int32_t seqlens[] = {7};
  Tensor<double> o_wide(1, 1, 2, 80), o_mla(1, 1, 2, 48);
  const test::DecodeCall wide(kc.view(), TensorView::strided(kc.data.data(), {1, 8, 1, 80}, {8 * 64, 64, 64, 1}),
                              seqlens);
  expect_rejected([&] { attention_decode(qd.view(), wide.cache, o_wide.view()); },
                  "cache.v: head_dim (80) must be <= cache.k's (64) when cache.v views cache.k's rows (MLA)",
                  o_wide.data, kc.data);
  const TensorView mla_v = TensorView::strided(kc.data.data(), {1, 8, 1, 48}, {8 * 64, 64, 64, 1});
  test::DecodeCall both(kc.view(), mla_v, seqlens);
  const TensorView vnv = TensorView::contiguous(kn.data.data(), 1, 1, 1, 48);
  both.append(kn.view(), &vnv);
  expect_rejected([&] { attention_decode(qd.view(), both.cache, o_mla.view(), {}, both.dec); },
                  "v_new: must be null when cache.v views cache.k's rows (MLA)", o_mla.data, kc.data);
  std::vector<float> table(16, 0.5f);
  RotaryTables rot{table.data(), table.data(), DType::f32, 8, 4, false};
  test::DecodeCall rotated(kc.view(), mla_v, seqlens);
  rotated.append(kn.view()).dec.rotary = &rot;
  expect_rejected([&] { attention_decode(qd.view(), rotated.cache, o_mla.view(), {}, rotated.dec); },
                  "rotary: must be null when cache.v views cache.k's rows (MLA)", o_mla.data, kc.data);
  Tensor<double> o_bad(1, 1, 2, 64);
  expect_rejected([&] { attention_decode(qd.view(), rotated.cache, o_bad.view()); },
                  "out: head_dim must equal cache.v's (48), got 64", o_bad.data, kc.data);
  // A separate value cache of another dim needs v_new of that dim.
  auto vc = random_tensor<double>(1, 8, 1, 48, 27);
  test::DecodeCall mismatched(kc.view(), vc.view(), seqlens);
  const TensorView vn64 = kn.view();
  mismatched.append(kn.view(), &vn64);
  expect_rejected([&] { attention_decode(qd.view(), mismatched.cache, o_mla.view(), {}, mismatched.dec); },
                  "v_new: head_dim must equal cache.v's (48), got 64", o_mla.data, vc.data);
}

}  // namespace
}  // namespace attn
