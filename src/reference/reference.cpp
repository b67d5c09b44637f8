// Algorithm 0, the textbook method, kept deliberately plain: it is the oracle.
//   S = q k^T * scale        (seqlen_q x seqlen_k, materialised)
//   P = softmax(S) row-wise  (each row: subtract its max, exponentiate, divide by the sum; a sink logit,
//                            when given, is one more entry of the row whose weight multiplies no value)
//   out = (P o Z / (1 - p)) v  Z the dropout keep mask (core/dropout.hpp); with dropout off, out = P v
// Masked entries of S are -inf; a row with no visible key gets out = 0 and lse = -inf (the sink, with
// one). lse is the undropped softmax's, sink included.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/attention.hpp"
#include "cpu/tile_ops.hpp"

namespace attn {
namespace {

template <class T>
void run(const detail::Problem& p) {
  using A = detail::Acc<T>;
  const std::int64_t sq = p.seqlen_q, sk = p.seqlen_k, d = p.head_dim, dv = p.head_dim_v;
  const std::int64_t tasks = p.batch * p.heads;
  // Scratch is allocated before anything is written, so a bad_alloc leaves out untouched.
  const int threads = detail::resolve_threads(p.num_threads);
  std::vector<std::vector<A>> scratch(static_cast<std::size_t>(threads));
  for (auto& s : scratch) s.resize(static_cast<std::size_t>(sq * sk + (sq + sk) * d + (sk + 1) * dv));

#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (std::int64_t task = 0; task < tasks; ++task) {
    const std::int64_t b = task / p.heads, h = task % p.heads, hk = p.kv_head_of(h);
    A* S = scratch[static_cast<std::size_t>(omp_get_thread_num())].data();
    A* Q = S + sq * sk;
    A* K = Q + sq * d;
    A* V = K + sk * d;
    A* row = V + sk * dv;
    detail::pack_rows<T>(Q, p.q, b, 0, sq, h, d);
    detail::pack_rows<T>(K, p.k, b, 0, sk, hk, d);
    detail::pack_rows<T>(V, p.v, b, 0, sk, hk, dv);
    for (std::int64_t i = 0; i < sq; ++i) {
      A* s = S + i * sk;
      detail::score_row(p, s, Q + i * d, K, sk, 0, i, static_cast<A>(p.rule.alibi_slope(b, h)));
      // Softmax of the row, the textbook way, over the keys the row sees (masked keys are skipped, not
      // weighted by 0, so a NaN or Inf in a value row the row cannot see does not reach it). A NaN
      // score makes the max NaN (the comparison keeps it) and so the whole row NaN.
      // The sink (-inf without one) is one more logit of the row, with no value.
      const std::int64_t lo = p.first_key(i), hi = std::max(lo, p.end_key(i));
      const A sink = static_cast<A>(p.rule.sink(h));
      A m = -std::numeric_limits<A>::infinity();
      for (std::int64_t j = lo; j < hi; ++j) m = (s[j] > m || s[j] != s[j]) && m == m ? s[j] : m;
      m = (sink > m || sink != sink) && m == m ? sink : m;
      const bool empty = m == -std::numeric_limits<A>::infinity();
      A sum = 0;
      if (!empty) {
        for (std::int64_t j = lo; j < hi; ++j) sum += (s[j] = std::exp(s[j] - m));
        sum += std::exp(sink - m);
        for (std::int64_t j = lo; j < hi; ++j) s[j] /= sum;
        // Dropped weights become 0, kept ones P / (1 - p); the sum (and so lse) stays undropped.
        if (p.dropout.enabled()) p.dropout.scale_row(b, h, i, lo, hi, s + lo, 1);
      }
      // out = P v (P dropped)
      for (std::int64_t c = 0; c < dv; ++c) row[c] = 0;
      if (!empty)
        for (std::int64_t j = lo; j < hi; ++j)
          for (std::int64_t c = 0; c < dv; ++c) row[c] += s[j] * V[j * dv + c];
      T* dst = detail::row_ptr<T>(p.out, b, i, h);
      for (std::int64_t c = 0; c < dv; ++c) dst[c * p.out.strides[3]] = detail::store<T>(row[c]);
      if (p.lse) {
        A* l = static_cast<A*>(p.lse->data) + b * p.lse->strides[0] + h * p.lse->strides[1] + i * p.lse->strides[2];
        *l = empty ? -std::numeric_limits<A>::infinity() : m + std::log(sum);
      }
    }
  }
}

}  // namespace

void attention_reference(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                         const AttentionOptions& opts, const TensorView* lse) {
  const detail::Problem p = detail::validate("attn::attention_reference", q, k, v, &out, opts, lse);
  detail::dispatch_dtype(p.dtype, [&]<class T>() { run<T>(p); });
}

}  // namespace attn
