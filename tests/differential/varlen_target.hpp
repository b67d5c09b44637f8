// The differential test's varlen target: attention_varlen on a random packed batch built from a Config
// (batch + 0..3 sequences, each with 0..seqlen_q queries and 0..seqlen_k keys, empty sequences
// included), in random strided [total, heads, head_dim] layouts surrounded by sentinel bytes. Each
// sequence is checked against the f64 oracle (attention_reference on that sequence's rows alone, with
// its own ALiBi slopes) with the accuracy rule of check_dense, plus: nothing written outside out's and
// lse's elements (and nothing to lse when none is passed), inputs and cu_seqlens unchanged, and a second
// thread count gives identical bits.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "attn/varlen.hpp"
#include "buffers.hpp"
#include "case.hpp"

namespace attn::fuzz {

// A packed [n0, n1, n2] tensor in layout l (buffers.hpp).
inline Buffer make_packed(DType t, std::int64_t n0, std::int64_t n1, std::int64_t n2, const Layout& l) {
  return make_buffer(t, {n0, n1, n2, 1}, 3, l);
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
  Buffer q = make_packed(t, TQ, H, D, pick_layout(r, 3, false)),
         k = make_packed(t, TK, HK, D, pick_layout(r, 3, false)),
         v = make_packed(t, TK, HK, D, pick_layout(r, 3, false));
  const Layout lout = pick_layout(r, 3, false), llse = pick_layout(r, 3, false);
  for (auto* p : {&q, &k, &v})
    for (auto off : p->offsets)
      static_cast<T*>(p->view.data)[off] =
          detail::store<T>(r.real(p == &v ? -1 : -c.amplitude, p == &v ? 1 : c.amplitude));
  const auto q_in = q.bytes, k_in = k.bytes, v_in = v.bytes;
  const auto cu_q0 = cu_q, cu_k0 = cu_k;

  auto run = [&](int threads, Buffer& out, Buffer& lse) {
    AttentionOptions o = c.opts;
    o.num_threads = threads;
    attention_varlen(q.view, k.view, v.view, out.view, VarlenBatch{cu_q.data(), cu_k.data(), B}, o, c.tiles,
                     c.want_lse ? &lse.view : nullptr);
  };
  Buffer out = make_packed(t, TQ, H, D, lout), lse = make_packed(lt, 1, H, TQ, llse);
  Buffer out2 = make_packed(t, TQ, H, D, lout), lse2 = make_packed(lt, 1, H, TQ, llse);
  run(c.opts.num_threads, out, lse);
  run(c.alt_threads, out2, lse2);
  Notes fail;
  fail.writes(out, lse, c.want_lse);
  if (q.bytes != q_in || k.bytes != k_in || v.bytes != v_in || cu_q != cu_q0 || cu_k != cu_k0)
    fail.add("an input was written");
  fail.thread_bits(out2.bytes == out.bytes && lse2.bytes == lse.bytes, c);

  // The logical elements, as double.
  const auto q_all = read_values(q), k_all = read_values(k), v_all = read_values(v), out_all = read_values(out),
             lse_all = read_values(lse);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t q0 = cu_q[b], nq = cu_q[b + 1] - q0, k0 = cu_k[b], nk = cu_k[b + 1] - k0;
    if (nq == 0) continue;
    // The sequence alone, dense, in f64 and in T.
    const std::vector<double> q64(q_all.begin() + q0 * H * D, q_all.begin() + (q0 + nq) * H * D),
        k64(k_all.begin() + k0 * HK * D, k_all.begin() + (k0 + nk) * HK * D),
        v64(v_all.begin() + k0 * HK * D, v_all.begin() + (k0 + nk) * HK * D);
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
    // The sequence's rows of out and lse.
    const std::vector<double> got(out_all.begin() + q0 * H * D, out_all.begin() + (q0 + nq) * H * D);
    std::vector<double> got_lse(oracle_lse.size());
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < nq; ++i)
        got_lse[static_cast<std::size_t>(h * nq + i)] = lse_all[static_cast<std::size_t>(h * TQ + q0 + i)];
    const std::string seq = "sequence " + std::to_string(b) + " of " + std::to_string(B) + " (" + std::to_string(nq) +
                            " queries, " + std::to_string(nk) + " keys): ";
    fail.add(rule_verdict(seq + "out", t, test::max_error(got, oracle), test::max_error(text, oracle),
                          std::max(1.0, test::max_magnitude(oracle)), out_floor(c, t)));
    if (c.want_lse) {
      const double lse_mag = 1 + test::max_magnitude(oracle_lse);
      fail.add(rule_verdict(seq + "lse", t, test::max_error(got_lse, oracle_lse), test::max_error(text_lse, oracle_lse),
                            lse_mag, lse_floor(c, t, lse_mag)));
    }
  }
  return fail.text;
}

inline std::string check_varlen_any(const Config& c) {
  return detail::dispatch_dtype(c.dtype, [&]<class T>() { return check_varlen<T>(c); });
}

}  // namespace attn::fuzz
