// The differential test's backward target: attention_backward on a Config's strided views, with dout,
// dq, dk and dv in layouts of their own, each gradient against the f64 oracle (the textbook backward
// in f64 on dense copies, from the f64 forward's out and lse) with the gradient rule of STANDARDS.md:
//   f64: within 1e-12 of the oracle relative to the gradient's largest element (plus 1e-14 x the data's
//   amplitude, for gradients that are 0 in exact arithmetic);
//   f32/bf16/f16: error <= 3 x the textbook backward's at the same precision (from the same out and
//   lse the kernel gets), plus a slack of about one unit in the last place.
// Also: nothing written outside the gradients' elements, no input written, and a second thread count
// gives identical bits.
// With `amx` (the backward_amx target: bf16, or f16 for f16 configurations, on the CPU's AMX tiles where
// usable, else on the emulator) the kernel rounds P and dS to that type, and the rule is flash-attn's for
// such a path: 3 x the error of PyTorch's math backward in that type (math_reference_backward), or of the
// textbook's where that is larger. The math backward sums D = P . dP from its own P; the kernel, like the
// textbook and FlashAttention-2, takes D = dO . O from the forward's rounded out, whose rounding dominates
// where dP - D cancels (one key nearly all the weight: dk at 6x the math backward's error, 0.4x the
// textbook's; seed 51384128129680). Dropout included.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "amx/amx.hpp"
#include "amx_reference.hpp"
#include "buffers.hpp"
#include "case.hpp"

namespace attn::fuzz {

template <class T>
std::string check_backward(Config c, bool amx = false) {
  const DType t = dtype_of<T>(), lt = t == DType::f64 ? DType::f64 : DType::f32;
  bind_arrays(c);
  Rng r(mix(c.seed) ^ 0xbac4);
  const std::int64_t B = c.batch, SQ = c.seqlen_q, SK = c.seqlen_k, H = c.heads, HK = c.kv_heads, D = c.head_dim;
  const std::int64_t DV = c.head_dim_v > 0 ? c.head_dim_v : D;  // v's, out's, dout's and dv's head dim
  const std::array<std::int64_t, 4> qs{B, SQ, H, D}, ks{B, SK, HK, D}, vs{B, SK, HK, DV}, os{B, SQ, H, DV};
  Buffer q = make_buffer(t, qs, 4, c.lq), k = make_buffer(t, ks, 4, c.lk), v = make_buffer(t, vs, 4, c.lv);
  Buffer dout = make_buffer(t, os, 4, pick_layout(r, 4, true));
  fill_random<T>(q, r, c.amplitude);
  fill_random<T>(k, r, c.amplitude);
  fill_random<T>(v, r, 1.0);
  fill_random<T>(dout, r, 1.0);
  Buffer out = make_buffer(t, os, 4, c.lout), lse = make_buffer(lt, {B, H, SQ, 1}, 3, c.llse);
  attention_reference(q.view, k.view, v.view, out.view, c.opts, &lse.view);  // the forward at precision T

  // Dense copies: f64 (the oracle, with its own f64 forward) and T (the textbook at T, from T's forward).
  const auto q64 = read<T>(q), k64 = read<T>(k), v64 = read<T>(v), do64 = read<T>(dout);
  auto dense = [](const std::array<std::int64_t, 4>& s, auto* p) {
    return TensorView::contiguous(p, s[0], s[1], s[2], s[3]);
  };
  std::vector<double> o64(do64.size()), l64(static_cast<std::size_t>(B * H * SQ));
  const TensorView l64v = TensorView::contiguous(l64.data(), B, H, SQ);
  attention_reference(dense(qs, q64.data()), dense(ks, k64.data()), dense(vs, v64.data()), dense(os, o64.data()),
                      c.opts, &l64v);
  std::vector<double> oracle[3] = {std::vector<double>(q64.size()), std::vector<double>(k64.size()),
                                   std::vector<double>(v64.size())};
  attention_backward_reference(dense(qs, q64.data()), dense(ks, k64.data()), dense(vs, v64.data()),
                               dense(os, o64.data()), dense(os, do64.data()), l64v, dense(qs, oracle[0].data()),
                               dense(ks, oracle[1].data()), dense(vs, oracle[2].data()), c.opts);
  std::vector<double> textbook[3], math[3];
  double lse_mag = 0;  // the largest finite |lse|: the magnitude at which a recomputed logit rounds
  {
    auto to_t = [](const std::vector<double>& x) {
      std::vector<T> y(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) y[i] = detail::store<T>(x[i]);
      return y;
    };
    auto qT = to_t(q64), kT = to_t(k64), vT = to_t(v64), dT = to_t(do64), oT = to_t(read<T>(out));
    const auto lse_vals = read_values(lse);
    std::vector<detail::Acc<T>> lT(lse_vals.begin(), lse_vals.end());
    lse_mag = test::max_magnitude(lse_vals);
    std::vector<T> g[3] = {std::vector<T>(qT.size()), std::vector<T>(kT.size()), std::vector<T>(vT.size())};
    attention_backward_reference(dense(qs, qT.data()), dense(ks, kT.data()), dense(vs, vT.data()), dense(os, oT.data()),
                                 dense(os, dT.data()), TensorView::contiguous(lT.data(), B, H, SQ),
                                 dense(qs, g[0].data()), dense(ks, g[1].data()), dense(vs, g[2].data()), c.opts);
    for (int i = 0; i < 3; ++i)
      for (const T& x : g[i]) textbook[i].push_back(detail::load<double>(x));
    if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>) {
      if (amx) {  // the baseline of a path that rounds P: PyTorch's math backward in T
        auto tensor = [](const std::array<std::int64_t, 4>& sh, const std::vector<T>& x) {
          test::Tensor<T> t(sh[0], sh[1], sh[2], sh[3]);
          t.data = x;
          return t;
        };
        const test::MathGrads<T> m =
            test::math_reference_backward<T>(tensor(qs, qT), tensor(ks, kT), tensor(vs, vT), tensor(os, dT), c.opts);
        const std::vector<T>* mg[3] = {&m.dq, &m.dk, &m.dv};
        for (int i = 0; i < 3; ++i)
          for (const T& x : *mg[i]) math[i].push_back(detail::load<double>(x));
      }
    }
  }

  const Layout lg[3] = {pick_layout(r, 4, false), pick_layout(r, 4, false), pick_layout(r, 4, false)};
  auto run = [&](int threads, Buffer* g) {
    std::optional<test::ScopedAmxEnv> tiles;
    if (amx) {
      const char* mode = std::getenv("ATTN_AMX");
      const bool hardware = detail::amx_support().usable() && !(mode && std::string(mode) == "emulate");
      tiles.emplace(std::string(hardware ? "on" : "emulate"));
    }
    AttentionOptions o = c.opts;
    o.num_threads = threads;
    attention_backward(q.view, k.view, v.view, out.view, dout.view, lse.view, g[0].view, g[1].view, g[2].view, o,
                       c.tiles);
  };
  const auto inputs_before = std::vector{q.bytes, k.bytes, v.bytes, out.bytes, dout.bytes, lse.bytes};
  Buffer grads[3] = {make_buffer(t, qs, 4, lg[0]), make_buffer(t, ks, 4, lg[1]), make_buffer(t, vs, 4, lg[2])};
  Buffer again[3] = {make_buffer(t, qs, 4, lg[0]), make_buffer(t, ks, 4, lg[1]), make_buffer(t, vs, 4, lg[2])};
  run(c.opts.num_threads, grads);
  run(c.alt_threads, again);

  Notes fail;
  if (std::vector{q.bytes, k.bytes, v.bytes, out.bytes, dout.bytes, lse.bytes} != inputs_before)
    fail.add("an input was written");
  const char* names[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    if (auto n = stray_writes(grads[i]))
      fail.add("wrote " + std::to_string(n) + " bytes outside " + names[i] + "'s view");
    fail.thread_bits(again[i].bytes == grads[i].bytes, c, std::string(names[i]) + ": ");
    const double err = test::max_error(read<T>(grads[i]), oracle[i]);
    // (A math reference that overflows T gives no baseline: Inf would accept anything.)
    const double math_err = math[i].empty() ? 0.0 : test::max_error(math[i], oracle[i]);
    const double base = std::max(test::max_error(textbook[i], oracle[i]), std::isfinite(math_err) ? math_err : 0.0);
    const double mag = test::max_magnitude(oracle[i]);
    // The logits the kernel recomputes differ from those behind the forward's lse by rounding (the
    // textbook backward recomputes them in the forward's own order, so its S - lse cancels exactly): an
    // error of logit_slack in S moves P by that fraction, and dq = dS K, dk = dS^T Q, dv = P^T dO by up to
    // logit_slack x 2 amplitude (|dP - D| <= 2, |q|, |k| <= amplitude), even where the gradient itself is
    // small by cancellation (f32, d = 1, amplitude 8: 6-8x the textbook's error, seeds
    // 13019020273406444371 and 13019020273406445860; a saturated soft-cap, 9286785742921532745).
    // With dropout the kept entries of P and dP are scaled by 1 / (1 - p), and so is that error (f32,
    // d = 1, dropout 0.9: dq at 6.9x the textbook's error, seed 18204366566546473379).
    // A logit far from zero (ALiBi's bias over a long distance) rounds at its own magnitude, so the
    // recomputed S and the forward's lse can differ by one unit in the last place of |lse| besides
    // (f32, one key, lse up to 271: dv at 9.6x the textbook's error, seed 13614406665955705262).
    const double dropout_gain = 1 / (1 - c.opts.dropout_p);
    const double logit_err = logit_slack(c) + (t == DType::f64 ? 0 : std::ldexp(1.0, -23) * lse_mag);
    const double logit_term = logit_err * std::max(mag, 2 * c.amplitude) * dropout_gain;
    // The floor beyond kGradientFactor x the textbook's error: one unit in the last place of the largest
    // element, and the logits' rounding.
    const double ulp = t == DType::f32    ? std::ldexp(1.0, -23)
                       : t == DType::bf16 ? std::ldexp(1.0, -8)
                                          : std::ldexp(1.0, -11);
    const double floor = ulp * mag + logit_term;
    // In f64, kF64Tolerance relative to the largest element, plus a floor for gradients that vanish in
    // exact arithmetic (one key: dS = P (dP - D) = 0), whose computed values are rounding noise of the size
    // of the terms (about amplitude x 1e-16). The kernel sums D as it sums dP, so without dropout they
    // cancel; with it, D = dO . O reads the dropped O (v times 1 / (1 - p), rounded) and dP is dropped after
    // its sum, and the noise grows by that factor (f64, one key, dropout 0.9: dk 5.2e-14 against 3e-14,
    // seed 14216294960386278293).
    const double tol = t == DType::f64 ? test::kF64Tolerance * mag + 1e-14 * c.amplitude * dropout_gain
                                       : test::textbook_bound(base, test::kGradientFactor, floor);
    const bool ok = t == DType::f64 ? err <= tol : test::within_textbook_rule(err, base, test::kGradientFactor, floor);
    if (!ok) {
      char msg[200];
      std::snprintf(msg, sizeof msg,
                    "%s error %.3g > tolerance %.3g (textbook error %.3g, largest element %.3g, largest lse %.3g)",
                    names[i], err, tol, base, mag, lse_mag);
      fail.add(msg);
    }
  }
  return fail.text;
}

inline std::string check_backward_any(const Config& c) {
  return detail::dispatch_dtype(c.dtype, [&]<class T>() { return check_backward<T>(c); });
}

// The backward on AMX tiles (backward/amx_backward.cpp): f16 configurations as f16 (TDPFP16PS; on a CPU
// without AMX-FP16 they run on the vector kernel), every other as bf16.
inline std::string check_backward_amx(const Config& c) {
  Config b = c;
  if (c.dtype == DType::f16) return check_backward<f16_t>(b, true);
  b.dtype = DType::bf16;
  return check_backward<bf16_t>(b, true);
}

}  // namespace attn::fuzz
