// The textbook backward pass, kept deliberately plain: it is the oracle of the tiled backward. Per
// (batch, kv head), for each query head h of its group, with S the score rule's logits:
//   P  = exp(S - lse)             (the forward's lse; seqlen_q x seqlen_k, materialised)
//   dP = dO V^T                   (materialised)
//   D  = rowsum(dO * O)
//   dS = P * (dP - D)             (materialised; the gradient of the loss with respect to the logits)
//   dX = dS * d logit / d dot     (ScoreRule::logit_grad: the scale and the soft-cap's derivative)
//   dV += P^T dO,  dK += dX^T Q,  dQ = dX K
// With dropout (keep mask Z, core/dropout.hpp, regenerated from the options; O the dropped forward
// output): dS = P * (Z dP / (1 - p) - D) and dV += (P o Z / (1 - p))^T dO.
// Masked entries are skipped, never weighted by 0, so nothing a row cannot see reaches its gradients.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "attn/backward.hpp"
#include "validate/backward_problem.hpp"
#include "cpu/tile_ops.hpp"

namespace attn {
namespace {

using detail::BackwardProblem;

// The scratch of one (batch, kv head) task: rows of d (K, dK, Q, dQ) and of dv (V, dV, O, dO).
template <class A>
struct Buffers {
  std::vector<A> storage;
  A *K, *V, *dK, *dV, *Q, *O, *dO, *dQ, *P, *dP, *dS;
  Buffers(std::int64_t sq, std::int64_t sk, std::int64_t d, std::int64_t dv)
      : storage(static_cast<std::size_t>(2 * (sk + sq) * (d + dv) + 3 * sq * sk)) {
    A* at = storage.data();
    for (A** x : {&K, &dK}) *x = std::exchange(at, at + sk * d);
    for (A** x : {&V, &dV}) *x = std::exchange(at, at + sk * dv);
    for (A** x : {&Q, &dQ}) *x = std::exchange(at, at + sq * d);
    for (A** x : {&O, &dO}) *x = std::exchange(at, at + sq * dv);
    for (A** x : {&P, &dP, &dS}) *x = std::exchange(at, at + sq * sk);
  }
};

template <class A>
A lse_at(const BackwardProblem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
  const TensorView& l = *p.lse;
  return static_cast<const A*>(l.data)[b * l.strides[0] + h * l.strides[1] + i * l.strides[2]];
}

// P, dP and dS (already through the transforms: dX) of query head h, over the visible keys of each row.
template <class A>
void head_matrices(const BackwardProblem& p, Buffers<A>& m, std::int64_t b, std::int64_t h) {
  const std::int64_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim, dv = p.head_dim_v;
  const detail::Mask mask = p.mask();
  const A slope = static_cast<A>(p.rule.alibi_slope(b, h));
  for (std::int64_t i = 0; i < sq; ++i) {
    const std::int64_t lo = mask.first_key(i), hi = std::max(lo, mask.end_key(i));
    const A lse = lse_at<A>(p, b, h, i);
    const A D = detail::dot(m.dO + i * dv, m.O + i * dv, dv);
    for (std::int64_t j = lo; j < hi; ++j) {
      const A x = detail::dot(m.Q + i * d, m.K + j * d, d);
      const std::int64_t e = i * sk + j;
      m.P[e] = std::exp(mask.score(x, i, j, slope) - lse);
      m.dP[e] = detail::dot(m.dO + i * dv, m.V + j * dv, dv);
      m.dS[e] = x;  // the dot product, until dS replaces it below
    }
    // Dropout scales dP (the gradient reaching P) and, below, the P of dV by the same factors.
    if (p.dropout.enabled()) p.dropout.scale_row(b, h, i, lo, hi, m.dP + i * sk + lo, 1);
    for (std::int64_t j = lo; j < hi; ++j) {
      const std::int64_t e = i * sk + j;
      m.dS[e] = m.P[e] * (m.dP[e] - D) * p.rule.logit_grad(m.dS[e]);
    }
    if (p.dropout.enabled()) p.dropout.scale_row(b, h, i, lo, hi, m.P + i * sk + lo, 1);
  }
}

// dQ = dX K, dK += dX^T Q, dV += P^T dO for query head h, over the visible entries.
template <class A>
void head_products(const BackwardProblem& p, Buffers<A>& m) {
  const std::int64_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim, dv = p.head_dim_v;
  const detail::Mask mask = p.mask();
  std::fill(m.dQ, m.dQ + sq * d, A(0));
  for (std::int64_t i = 0; i < sq; ++i) {
    const std::int64_t lo = mask.first_key(i), hi = std::max(lo, mask.end_key(i));
    for (std::int64_t j = lo; j < hi; ++j) {
      const A dS = m.dS[i * sk + j], P = m.P[i * sk + j];
      for (std::int64_t c = 0; c < d; ++c) {
        m.dQ[i * d + c] += dS * m.K[j * d + c];
        m.dK[j * d + c] += dS * m.Q[i * d + c];
      }
      for (std::int64_t c = 0; c < dv; ++c) m.dV[j * dv + c] += P * m.dO[i * dv + c];
    }
  }
}

template <class T, class A>
void store_rows(const TensorView& t, const A* src, std::int64_t b, std::int64_t rows, std::int64_t h, std::int64_t d) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* dst = detail::row_ptr<T>(t, b, r, h);
    for (std::int64_t c = 0; c < d; ++c) dst[c * t.strides[3]] = detail::store<T>(src[r * d + c]);
  }
}

template <class T>
void run(const BackwardProblem& p) {
  using A = detail::Acc<T>;
  const std::int64_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim, dv = p.head_dim_v;
  const int threads = detail::resolve_threads(p.num_threads);
  // Scratch is allocated before anything is written, so a bad_alloc leaves the gradients untouched.
  std::vector<Buffers<A>> scratch;  // reserved: the matrices point into each element's storage
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) scratch.emplace_back(sq, sk, d, dv);
  const std::int64_t tasks = p.batch * p.kv_heads;
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t b = task / p.kv_heads, hk = task % p.kv_heads;
    Buffers<A>& m = scratch[static_cast<std::size_t>(omp_get_thread_num())];
    detail::pack_rows<T>(m.K, p.k, b, 0, sk, hk, d);
    detail::pack_rows<T>(m.V, p.v, b, 0, sk, hk, dv);
    std::fill(m.dK, m.dK + sk * d, A(0));
    std::fill(m.dV, m.dV + sk * dv, A(0));
    for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      detail::pack_rows<T>(m.Q, p.q, b, 0, sq, h, d);
      detail::pack_rows<T>(m.O, p.out, b, 0, sq, h, dv);
      detail::pack_rows<T>(m.dO, p.dout, b, 0, sq, h, dv);
      head_matrices(p, m, b, h);
      head_products(p, m);
      store_rows<T>(p.dq, m.dQ, b, sq, h, d);
    }
    store_rows<T>(p.dk, m.dK, b, sk, hk, d);
    store_rows<T>(p.dv, m.dV, b, sk, hk, dv);
  }
}

}  // namespace

void attention_backward_reference(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                                  const TensorView& dout, const TensorView& lse, const TensorView& dq,
                                  const TensorView& dk, const TensorView& dv, const AttentionOptions& opts,
                                  const TensorView* dsink) {
  const BackwardProblem p =
      detail::validate_backward("attn::attention_backward_reference", q, k, v, out, dout, lse, dq, dk, dv, opts, dsink);
  detail::dispatch_dtype(p.dtype, [&]<class T>() { run<T>(p); });
  if (dsink) detail::sink_gradient({p}, *dsink);
}

}  // namespace attn
