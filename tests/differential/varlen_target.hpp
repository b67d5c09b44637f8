// The differential test's varlen target: attention_varlen on a random packed batch built from a Config
// (batch + 0..3 sequences, each with 0..seqlen_q queries and 0..seqlen_k keys, empty sequences
// included), in random strided [total, heads, head_dim] layouts surrounded by sentinel bytes. Each
// sequence is checked against the f64 oracle (attention_reference on that sequence's rows alone, with
// its own ALiBi slopes) with the accuracy rule of check_dense, plus: nothing written outside out's and
// lse's elements (and nothing to lse when none is passed), inputs and cu_seqlens unchanged, and a second
// thread count gives identical bits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attn/varlen.hpp"
#include "case.hpp"

namespace attn::fuzz {

// A rank-3 strided view over a sentinel-filled buffer (4 spare elements on each side).
struct PackedBuffer {
  std::vector<unsigned char> bytes;
  TensorView view;
  std::vector<std::int64_t> offsets;  // row-major over the shape
  std::int64_t stray(unsigned char sentinel) const {
    std::vector<char> mine(bytes.size(), 0);
    const std::size_t es = dtype_size(view.dtype);
    for (auto off : offsets) std::memset(&mine[(4 + static_cast<std::size_t>(off)) * es], 1, es);
    std::int64_t n = 0;
    for (std::size_t i = 0; i < bytes.size(); ++i) n += !mine[i] && bytes[i] != sentinel;
    return n;
  }
};

inline PackedBuffer make_packed(DType t, std::int64_t n0, std::int64_t n1, std::int64_t n2, const Layout& l) {
  PackedBuffer b;
  std::int64_t extent = 0;
  const auto st = strides_for({n0, n1, n2, 1}, 3, l, &extent);
  const std::size_t es = dtype_size(t);
  b.bytes.assign(static_cast<std::size_t>(extent + 8) * es, 0xA5);
  b.view.data = b.bytes.data() + 4 * es;
  b.view.dtype = t;
  b.view.rank = 3;
  b.view.shape = {n0, n1, n2, 1};
  b.view.strides = st;
  for (std::int64_t i = 0; i < n0; ++i)
    for (std::int64_t j = 0; j < n1; ++j)
      for (std::int64_t k = 0; k < n2; ++k) b.offsets.push_back(i * st[0] + j * st[1] + k * st[2]);
  return b;
}

template <class T>
std::string check_varlen(Config c) {
  using A = detail::Acc<T>;
  const DType t = dtype_of<T>(), lt = t == DType::f64 ? DType::f64 : DType::f32;
  Rng r(mix(c.seed) ^ 0x7a41e2);
  const std::int64_t B = c.batch + r.uniform(0, 3), H = c.heads, HK = c.kv_heads, D = c.head_dim;
  if (!c.alibi.empty() && c.opts.alibi_batch_stride > 0) {  // per-sequence slopes for the extra sequences
    c.alibi.resize(static_cast<std::size_t>(B * H));
    for (auto& s : c.alibi) s = static_cast<float>(r.real(0, 1));
  }
  bind_arrays(c);
  std::vector<std::int32_t> cu_q(static_cast<std::size_t>(B + 1), 0), cu_k = cu_q;
  for (std::int64_t b = 0; b < B; ++b) {
    cu_q[b + 1] = cu_q[b] + static_cast<std::int32_t>(r.chance(0.15) ? 0 : r.uniform(1, c.seqlen_q));
    cu_k[b + 1] = cu_k[b] + static_cast<std::int32_t>(r.chance(0.15) ? 0 : r.uniform(0, c.seqlen_k));
  }
  if (cu_q[B] == 0)
    for (std::int64_t b = 1; b <= B; ++b) cu_q[b] += 1;
  const std::int64_t TQ = cu_q[B], TK = cu_k[B];
  PackedBuffer q = make_packed(t, TQ, H, D, pick_layout(r, 3, false)),
               k = make_packed(t, TK, HK, D, pick_layout(r, 3, false)),
               v = make_packed(t, TK, HK, D, pick_layout(r, 3, false));
  const Layout lout = pick_layout(r, 3, false), llse = pick_layout(r, 3, false);
  for (auto* p : {&q, &k, &v})
    for (auto off : p->offsets)
      static_cast<T*>(p->view.data)[off] =
          detail::store<T>(r.real(p == &v ? -1 : -c.amplitude, p == &v ? 1 : c.amplitude));
  const auto q_in = q.bytes, k_in = k.bytes, v_in = v.bytes;
  const auto cu_q0 = cu_q, cu_k0 = cu_k;

  auto run = [&](int threads, PackedBuffer& out, PackedBuffer& lse) {
    AttentionOptions o = c.opts;
    o.num_threads = threads;
    attention_varlen(q.view, k.view, v.view, out.view, VarlenBatch{cu_q.data(), cu_k.data(), B}, o, c.tiles,
                     c.want_lse ? &lse.view : nullptr);
  };
  PackedBuffer out = make_packed(t, TQ, H, D, lout), lse = make_packed(lt, 1, H, TQ, llse);
  PackedBuffer out2 = make_packed(t, TQ, H, D, lout), lse2 = make_packed(lt, 1, H, TQ, llse);
  run(c.opts.num_threads, out, lse);
  run(c.alt_threads, out2, lse2);
  std::string fail;
  auto note = [&](const std::string& s) { fail += (fail.empty() ? "" : "; ") + s; };
  if (auto n = out.stray(0xA5)) note("wrote " + std::to_string(n) + " bytes outside out's view");
  if (auto n = lse.stray(0xA5)) note("wrote " + std::to_string(n) + " bytes outside lse's view");
  if (!c.want_lse && std::any_of(lse.bytes.begin(), lse.bytes.end(), [](unsigned char x) { return x != 0xA5; }))
    note("wrote lse although none was requested");
  if (q.bytes != q_in || k.bytes != k_in || v.bytes != v_in || cu_q != cu_q0 || cu_k != cu_k0)
    note("an input was written");
  if (out2.bytes != out.bytes || lse2.bytes != lse.bytes)
    note("num_threads " + std::to_string(c.alt_threads) + " gives different bits than " +
         std::to_string(c.opts.num_threads));

  auto val = [](const PackedBuffer& p, std::size_t i) {  // logical element i, as double
    double x = 0;
    detail::dispatch_dtype(
        p.view.dtype, [&]<class U>() { x = detail::load<double>(static_cast<const U*>(p.view.data)[p.offsets[i]]); });
    return x;
  };
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t q0 = cu_q[b], nq = cu_q[b + 1] - q0, k0 = cu_k[b], nk = cu_k[b + 1] - k0;
    if (nq == 0) continue;
    // The sequence alone, dense, in f64 and in T.
    std::vector<double> q64(static_cast<std::size_t>(nq * H * D)), k64(static_cast<std::size_t>(nk * HK * D)),
        v64 = k64;
    for (std::size_t i = 0; i < q64.size(); ++i) q64[i] = val(q, static_cast<std::size_t>(q0 * H * D) + i);
    for (std::size_t i = 0; i < k64.size(); ++i) {
      k64[i] = val(k, static_cast<std::size_t>(k0 * HK * D) + i);
      v64[i] = val(v, static_cast<std::size_t>(k0 * HK * D) + i);
    }
    std::vector<T> qT(q64.size()), kT(k64.size()), vT(v64.size()), text(q64.size());
    for (std::size_t i = 0; i < q64.size(); ++i) qT[i] = detail::store<T>(q64[i]);
    for (std::size_t i = 0; i < k64.size(); ++i) {
      kT[i] = detail::store<T>(k64[i]);
      vT[i] = detail::store<T>(v64[i]);
    }
    AttentionOptions o = c.opts;
    if (o.alibi_slopes) o.alibi_slopes = o.alibi_slopes.from(b * o.alibi_batch_stride), o.alibi_batch_stride = 0;
    std::vector<double> oracle(q64.size()), oracle_lse(static_cast<std::size_t>(H * nq));
    std::vector<A> text_lse(oracle_lse.size());
    const TensorView ol = TensorView::contiguous(oracle_lse.data(), 1, H, nq),
                     tl = TensorView::contiguous(text_lse.data(), 1, H, nq);
    attention_reference(
        TensorView::contiguous(q64.data(), 1, nq, H, D), TensorView::contiguous(k64.data(), 1, nk, HK, D),
        TensorView::contiguous(v64.data(), 1, nk, HK, D), TensorView::contiguous(oracle.data(), 1, nq, H, D), o, &ol);
    attention_reference(TensorView::contiguous(qT.data(), 1, nq, H, D), TensorView::contiguous(kT.data(), 1, nk, HK, D),
                        TensorView::contiguous(vT.data(), 1, nk, HK, D),
                        TensorView::contiguous(text.data(), 1, nq, H, D), o, &tl);
    // Errors: NaN, or an infinity the oracle does not have, counts as infinite.
    auto err_of = [](double g, double want) -> double {
      if (std::isnan(g) || std::isnan(want)) return INFINITY;
      if (std::isinf(g) || std::isinf(want)) return g == want ? 0.0 : INFINITY;
      return std::abs(g - want);
    };
    double err = 0, base = 0, lerr = 0, lbase = 0, omax = 0, lmax = 0;
    for (std::size_t i = 0; i < oracle.size(); ++i) {
      err = std::max(err, err_of(val(out, static_cast<std::size_t>(q0 * H * D) + i), oracle[i]));
      base = std::max(base, err_of(detail::load<double>(text[i]), oracle[i]));
      omax = std::max(omax, std::abs(oracle[i]));
    }
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < nq; ++i) {
        const std::size_t j = static_cast<std::size_t>(h * nq + i);
        if (c.want_lse)
          lerr = std::max(lerr, err_of(val(lse, static_cast<std::size_t>(h * TQ + q0 + i)), oracle_lse[j]));
        lbase = std::max(lbase, err_of(text_lse[j], oracle_lse[j]));
        if (std::isfinite(oracle_lse[j])) lmax = std::max(lmax, std::abs(oracle_lse[j]));
      }
    double tol = 0, ltol = 0;
    switch (t) {
      case DType::f64:
        tol = 1e-12 * std::max(1.0, omax);
        ltol = 1e-12 * (1 + lmax);
        break;
      case DType::f32:
        tol = 2 * base + logit_slack(c);
        ltol = 2 * lbase + 1e-6 * (1 + lmax) + logit_slack(c);
        break;
      case DType::bf16:
        tol = 2 * base + std::ldexp(1.0, -8) + logit_slack(c);
        ltol = 2 * lbase + 1e-5 * (1 + lmax) + logit_slack(c);
        break;
      case DType::f16:
        tol = 2 * base + std::ldexp(1.0, -11) + logit_slack(c);
        ltol = 2 * lbase + 1e-5 * (1 + lmax) + logit_slack(c);
        break;
    }
    const std::string seq = "sequence " + std::to_string(b) + " of " + std::to_string(B) + " (" + std::to_string(nq) +
                            " queries, " + std::to_string(nk) + " keys): ";
    if (!(err <= tol))
      note(seq + "out error " + std::to_string(err) + " > " + std::to_string(tol) + " (textbook " +
           std::to_string(base) + ")");
    if (!(lerr <= ltol))
      note(seq + "lse error " + std::to_string(lerr) + " > " + std::to_string(ltol) + " (textbook " +
           std::to_string(lbase) + ")");
  }
  return fail;
}

inline std::string check_varlen_any(const Config& c) {
  return detail::dispatch_dtype(c.dtype, [&]<class T>() { return check_varlen<T>(c); });
}

}  // namespace attn::fuzz
