// FlashAttention-2's backward pass (Algorithm 2 of the paper), portable C++ over packed tiles. Nothing
// of size seqlen_q x seqlen_k is allocated: the scratch is O(B_r B_c + (B_r + B_c) d) per thread plus
// D (batch x heads x seqlen_q). Three passes, each parallel over tasks that own the rows they write,
// each task's arithmetic fixed by the problem and the tiles alone, so the gradients are bitwise the same
// for any thread count:
//   0. D = rowsum(dO * O), per (b, h, i).
//   1. dK, dV: per (b, kv head, key tile j): for every query head of the GQA group and every query tile
//      i in order, recompute P = exp(S - lse), dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P * (dP - D),
//      dX = dS * d logit / d dot, dK_j += dX^T Q_i.
//   2. dQ: per (b, h, query tile i): the same recomputation over the key tiles j in order,
//      dQ_i += dX K_j. (Recomputing P and dS a second time costs flops but no dQ partials and no merge.)
// Masked entries are skipped, never weighted by 0.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "backward/backward_kernel.hpp"
#include "core/backward_problem.hpp"
#include "core/tile_ops.hpp"

namespace attn {
namespace {

using detail::BackwardProblem;

struct Tiles {
  std::int64_t br, bc;
};

// One thread's scratch: a query tile (Q, dO, dQ, lse, D), a key tile (K, V, dK, dV), the recomputed
// P and dX tiles, and each query row's visible columns [lo, hi) of the key tile.
template <class A>
struct Scratch {
  std::vector<A> storage;
  std::vector<std::int64_t> ranges;
  A *Q, *dO, *dQ, *lse, *D, *K, *V, *dK, *dV, *P, *dX;
  std::int64_t *lo, *hi;
  Scratch(Tiles t, std::int64_t d)
      : storage(static_cast<std::size_t>((3 * d + 2) * t.br + 4 * d * t.bc + 2 * t.br * t.bc)),
        ranges(static_cast<std::size_t>(2 * t.br)) {
    A* at = storage.data();
    for (A** x : {&Q, &dO, &dQ}) *x = std::exchange(at, at + t.br * d);
    for (A** x : {&lse, &D}) *x = std::exchange(at, at + t.br);
    for (A** x : {&K, &V, &dK, &dV}) *x = std::exchange(at, at + t.bc * d);
    for (A** x : {&P, &dX}) *x = std::exchange(at, at + t.br * t.bc);
    lo = ranges.data();
    hi = lo + t.br;
  }
};

// Each row's visible columns of key tile [j0, j0 + cols); false when no row of the tile sees any.
template <class A>
bool visible_ranges(const BackwardProblem& p, Scratch<A>& s, std::int64_t i0, std::int64_t rows, std::int64_t j0,
                    std::int64_t cols) {
  const detail::Mask mask = p.mask();
  bool any = false;
  for (std::int64_t r = 0; r < rows; ++r) {
    s.lo[r] = std::clamp<std::int64_t>(mask.first_key(i0 + r) - j0, 0, cols);
    s.hi[r] = std::clamp<std::int64_t>(mask.end_key(i0 + r) - j0, s.lo[r], cols);
    any = any || s.hi[r] > s.lo[r];
  }
  return any;
}

// Packs query tile [i0, i0 + rows) of head h: Q, dO, and the rows' lse and D.
template <class T, class A>
void pack_query_tile(const BackwardProblem& p, Scratch<A>& s, const std::vector<A>& D, std::int64_t b, std::int64_t h,
                     std::int64_t i0, std::int64_t rows) {
  const std::int64_t d = p.head_dim;
  detail::pack_rows<T>(s.Q, p.q, b, i0, rows, h, d);
  detail::pack_rows<T>(s.dO, p.dout, b, i0, rows, h, d);
  const TensorView& l = *p.lse;
  for (std::int64_t r = 0; r < rows; ++r) {
    s.lse[r] = static_cast<const A*>(l.data)[b * l.strides[0] + h * l.strides[1] + (i0 + r) * l.strides[2]];
    s.D[r] = D[static_cast<std::size_t>((b * p.heads + h) * p.seqlen_q + i0 + r)];
  }
}

// The recomputed tiles: P = exp(S - lse) and dX = P (dP - D) d logit / d dot, over the visible entries.
template <class A>
void recompute(const BackwardProblem& p, Scratch<A>& s, Tiles t, std::int64_t b, std::int64_t h, std::int64_t i0,
               std::int64_t rows, std::int64_t j0) {
  const detail::Mask mask = p.mask();
  const std::int64_t d = p.head_dim;
  const A slope = static_cast<A>(p.rule.alibi_slope(b, h));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = s.lo[r]; c < s.hi[r]; ++c) {
      const A x = detail::dot(s.Q + r * d, s.K + c * d, d);
      const A P = std::exp(mask.score(x, i0 + r, j0 + c, slope) - s.lse[r]);
      const A dP = detail::dot(s.dO + r * d, s.V + c * d, d);
      s.P[r * t.bc + c] = P;
      s.dX[r * t.bc + c] = P * (dP - s.D[r]) * p.rule.logit_grad(x);
    }
}

template <class T, class A>
void store_rows(const TensorView& t, const A* src, std::int64_t b, std::int64_t s0, std::int64_t rows, std::int64_t h,
                std::int64_t d) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T* dst = detail::row_ptr<T>(t, b, s0 + r, h);
    for (std::int64_t c = 0; c < d; ++c) dst[c * t.strides[3]] = detail::store<T>(src[r * d + c]);
  }
}

// Pass 0: D[b, h, i] = dO . O.
template <class T, class A>
void row_dots(const BackwardProblem& p, std::vector<A>& D, int threads) {
  const std::int64_t rows = p.batch * p.heads * p.seqlen_q, d = p.head_dim;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t i = row % p.seqlen_q, h = row / p.seqlen_q % p.heads, b = row / p.seqlen_q / p.heads;
    const T* o = detail::row_ptr<const T>(p.out, b, i, h);
    const T* g = detail::row_ptr<const T>(p.dout, b, i, h);
    A sum = 0;
    for (std::int64_t c = 0; c < d; ++c)
      sum += detail::load<A>(g[c * p.dout.strides[3]]) * detail::load<A>(o[c * p.out.strides[3]]);
    D[static_cast<std::size_t>(row)] = sum;
  }
}

// Pass 1, one task: dK_j and dV_j of key tile [j0, j0 + cols) of kv head hk.
template <class T, class A>
void key_tile(const BackwardProblem& p, Scratch<A>& s, const std::vector<A>& D, Tiles t, std::int64_t b,
              std::int64_t hk, std::int64_t j0) {
  const std::int64_t d = p.head_dim, cols = std::min(t.bc, p.seqlen_k - j0);
  detail::pack_rows<T>(s.K, p.k, b, j0, cols, hk, d);
  detail::pack_rows<T>(s.V, p.v, b, j0, cols, hk, d);
  std::fill(s.dK, s.dK + cols * d, A(0));
  std::fill(s.dV, s.dV + cols * d, A(0));
  for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
    for (std::int64_t i0 = 0; i0 < p.seqlen_q; i0 += t.br) {
      const std::int64_t rows = std::min(t.br, p.seqlen_q - i0);
      if (!visible_ranges(p, s, i0, rows, j0, cols)) continue;
      pack_query_tile<T>(p, s, D, b, h, i0, rows);
      recompute(p, s, t, b, h, i0, rows, j0);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = s.lo[r]; c < s.hi[r]; ++c) {
          const A P = s.P[r * t.bc + c], dX = s.dX[r * t.bc + c];
          for (std::int64_t x = 0; x < d; ++x) {
            s.dV[c * d + x] += P * s.dO[r * d + x];
            s.dK[c * d + x] += dX * s.Q[r * d + x];
          }
        }
    }
  store_rows<T>(p.dk, s.dK, b, j0, cols, hk, d);
  store_rows<T>(p.dv, s.dV, b, j0, cols, hk, d);
}

// Pass 2, one task: dQ_i of query tile [i0, i0 + rows) of head h, over the key tiles in order.
template <class T, class A>
void query_tile(const BackwardProblem& p, Scratch<A>& s, const std::vector<A>& D, Tiles t, std::int64_t b,
                std::int64_t h, std::int64_t i0) {
  const std::int64_t d = p.head_dim, rows = std::min(t.br, p.seqlen_q - i0), hk = p.kv_head_of(h);
  pack_query_tile<T>(p, s, D, b, h, i0, rows);
  std::fill(s.dQ, s.dQ + rows * d, A(0));
  for (std::int64_t j0 = 0; j0 < p.seqlen_k; j0 += t.bc) {
    const std::int64_t cols = std::min(t.bc, p.seqlen_k - j0);
    if (!visible_ranges(p, s, i0, rows, j0, cols)) continue;
    detail::pack_rows<T>(s.K, p.k, b, j0, cols, hk, d);
    detail::pack_rows<T>(s.V, p.v, b, j0, cols, hk, d);
    recompute(p, s, t, b, h, i0, rows, j0);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = s.lo[r]; c < s.hi[r]; ++c) {
        const A dX = s.dX[r * t.bc + c];
        for (std::int64_t x = 0; x < d; ++x) s.dQ[r * d + x] += dX * s.K[c * d + x];
      }
  }
  store_rows<T>(p.dq, s.dQ, b, i0, rows, h, d);
}

template <class T>
void run(const BackwardProblem& p, Tiles t, int threads) {
  using A = detail::Acc<T>;
  // All scratch before anything is written: a bad_alloc leaves the gradients untouched.
  std::vector<A> D(static_cast<std::size_t>(p.batch * p.heads * p.seqlen_q));
  std::vector<Scratch<A>> scratch;  // reserved: the tiles point into each element's storage
  scratch.reserve(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) scratch.emplace_back(t, p.head_dim);
  row_dots<T>(p, D, threads);
  const std::int64_t k_tiles = (p.seqlen_k + t.bc - 1) / t.bc, q_tiles = (p.seqlen_q + t.br - 1) / t.br;
  const std::int64_t kv_tasks = p.batch * p.kv_heads * k_tiles, q_tasks = p.batch * p.heads * q_tiles;
#pragma omp parallel num_threads(threads)
  {
    Scratch<A>& s = scratch[static_cast<std::size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < kv_tasks; ++task)
      key_tile<T>(p, s, D, t, task / (p.kv_heads * k_tiles), task / k_tiles % p.kv_heads, task % k_tiles * t.bc);
#pragma omp for schedule(dynamic)
    for (std::int64_t task = 0; task < q_tasks; ++task)
      query_tile<T>(p, s, D, t, task / (p.heads * q_tiles), task / q_tiles % p.heads, task % q_tiles * t.br);
  }
}

}  // namespace

namespace detail {

void run_backward(const std::vector<BackwardProblem>& problems, const TileOptions& tiles, int threads) {
  for (const BackwardProblem& p : problems) {
    const TilePlan plan = plan_tiles(p.seqlen_q, p.seqlen_k, p.head_dim, p.dtype, tiles);
    const Tiles t{std::max<std::int64_t>(1, std::min(plan.q_tile, p.seqlen_q)),
                  std::max<std::int64_t>(1, std::min(plan.k_tile, p.seqlen_k))};
    detail::dispatch_dtype(p.dtype, [&]<class T>() { run<T>(p, t, threads); });
  }
}

}  // namespace detail

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& opts, const TileOptions& tiles) {
  const char* who = "attn::attention_backward";
  const BackwardProblem p = detail::validate_backward(who, q, k, v, out, dout, lse, dq, dk, dv, opts);
  detail::validate_tiles(who, tiles);
  detail::run_backward({p}, tiles, detail::resolve_threads(p.num_threads));
}

}  // namespace attn
