// The tests' one tensor type: a dense [b, s, h, d] tensor in flash-attn's layout that owns its storage,
// random fills of it, and the cu_seqlens of packed variable-length batches over such tensors.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "attn/tensor.hpp"
#include "attn/varlen.hpp"
#include "core/element.hpp"

namespace attn::test {

// A dense [b, s, h, d] tensor that owns its storage. A packed variable-length tensor ([total, h, d], as
// attention_varlen takes it) is one with b = 1 and s = total rows.
template <class T>
struct Tensor {
  std::int64_t b, s, h, d;
  std::vector<T> data;
  Tensor(std::int64_t b_, std::int64_t s_, std::int64_t h_, std::int64_t d_)
      : b(b_), s(s_), h(h_), d(d_), data(static_cast<std::size_t>(b_ * s_ * h_ * d_)) {}
  TensorView view() const { return TensorView::contiguous(data.data(), b, s, h, d); }
  // The rank-3 [b * s, h, d] view of attention_varlen's packed tensors.
  TensorView packed() const { return TensorView::contiguous(data.data(), b * s, h, d); }
  // Rows first .. first + n - 1 of the packed rows, as a [1, n, h, d] view (one sequence of a packed batch).
  TensorView rows(std::int64_t first, std::int64_t n) const {
    return TensorView::contiguous(data.data() + first * h * d, 1, n, h, d);
  }
  // A copy of those rows, as a [1, n, h, d] tensor.
  Tensor<T> copy_rows(std::int64_t first, std::int64_t n) const {
    Tensor<T> t(1, n, h, d);
    std::copy_n(data.begin() + first * h * d, t.data.size(), t.data.begin());
    return t;
  }
  T& at(std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l) {
    return data[static_cast<std::size_t>(((i * s + j) * h + k) * d + l)];
  }
  const T& at(std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l) const {
    return data[static_cast<std::size_t>(((i * s + j) * h + k) * d + l)];
  }
};

// Entries uniform in [-amplitude, amplitude], rounded to T, drawn from `seed`.
template <class T>
Tensor<T> random_tensor(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d, std::uint64_t seed,
                        double amplitude = 1.0) {
  Tensor<T> t(b, s, h, d);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-amplitude, amplitude);
  for (auto& x : t.data) x = detail::store<T>(dist(rng));
  return t;
}

// The same values in another element type (rounded to it where it is narrower).
template <class To, class From>
Tensor<To> convert(const Tensor<From>& t) {
  Tensor<To> r(t.b, t.s, t.h, t.d);
  for (std::size_t i = 0; i < t.data.size(); ++i) r.data[i] = detail::store<To>(detail::load<double>(t.data[i]));
  return r;
}

// The same values, converted exactly to double (every f32/bf16/f16 value is a double).
template <class T>
Tensor<double> to_f64(const Tensor<T>& t) {
  return convert<double>(t);
}

// The inputs of one attention problem: q [b, sq, h, d] and k [b, sk, hk, d] with entries in [-2, 2] (logits
// of a few units, so that the softmax neither flattens nor saturates), v [b, sk, hk, dv] in [-1, 1]; drawn
// from seed, seed + 1 and seed + 2.
template <class T>
struct Qkv {
  Tensor<T> q, k, v;
};

template <class T>
Qkv<T> random_qkv(std::int64_t b, std::int64_t sq, std::int64_t sk, std::int64_t h, std::int64_t hk, std::int64_t d,
                  std::uint64_t seed, std::int64_t dv = 0) {
  return {random_tensor<T>(b, sq, h, d, seed, 2.0), random_tensor<T>(b, sk, hk, d, seed + 1, 2.0),
          random_tensor<T>(b, sk, hk, dv > 0 ? dv : d, seed + 2)};
}

// cu_seqlens of sequences of lengths `lens`: 0, then the running sums.
inline std::vector<std::int32_t> cu_seqlens(const std::vector<std::int32_t>& lens) {
  std::vector<std::int32_t> cu{0};
  for (const std::int32_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// A packed variable-length batch's cu_seqlens (flash-attn's layout): sequence b's query rows are
// cu_q[b] .. cu_q[b + 1] - 1 of the packed queries, its key rows cu_k[b] .. cu_k[b + 1] - 1 of the keys.
struct CuSeqlens {
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  // One (queries, keys) pair per sequence.
  explicit CuSeqlens(const std::vector<std::pair<int, int>>& lens) {
    for (const auto [nq, nk] : lens) {
      cu_q.push_back(cu_q.back() + nq);
      cu_k.push_back(cu_k.back() + nk);
    }
  }
  std::int64_t batch() const { return static_cast<std::int64_t>(cu_q.size()) - 1; }
  std::int64_t total_q() const { return cu_q.back(); }
  std::int64_t total_k() const { return cu_k.back(); }
  VarlenBatch varlen() const { return {cu_q.data(), cu_k.data(), batch()}; }
};

}  // namespace attn::test
