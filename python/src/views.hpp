// The extension's conversions, shared by its CPU bindings (module.cpp) and CUDA bindings (cuda.cpp):
// DLPack arrays as TensorViews (zero-copy, their own strides) and flash-attn's keyword options as
// AttentionOptions. Templates over the array type, which carries the device the binding accepts.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn_py {

namespace nb = nanobind;
using attn::TensorView;

[[noreturn]] inline void reject(const char* who, const char* arg, const std::string& rule) {
  throw std::invalid_argument(std::string(who) + ": " + arg + ": " + rule);
}

template <class A>
attn::DType dtype_of(const char* who, const char* arg, const A& a) {
  const nb::dlpack::dtype t = a.dtype();
  if (t == nb::dtype<double>()) return attn::DType::f64;
  if (t == nb::dtype<float>()) return attn::DType::f32;
  if (t.lanes == 1 && t.bits == 16 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat))
    return attn::DType::bf16;
  if (t.lanes == 1 && t.bits == 16 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float))
    return attn::DType::f16;
  reject(who, arg, "dtype must be float64, float32, bfloat16 or float16");
}

// The array as a view of rank `rank`. With `leading_one`, one dimension fewer is taken as a leading 1
// (varlen's lse: flash-attn's [heads, total_q] is attn's [1, heads, total_q]).
template <class A>
TensorView view_of(const char* who, const char* arg, const A& a, int rank, bool leading_one = false) {
  TensorView v;
  v.dtype = dtype_of(who, arg, a);
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));  // read-only inputs too (nb::ro)
  const int given = static_cast<int>(a.ndim());
  const int lead = rank - given;
  if (lead != 0 && !(leading_one && lead == 1))
    reject(who, arg, "must have " + std::to_string(rank) + " dimensions, got " + std::to_string(given));
  v.rank = rank;
  for (int i = 0; i < lead; ++i) v.shape[i] = 1, v.strides[i] = 0;
  for (int i = 0; i < given; ++i) {
    v.shape[lead + i] = static_cast<std::int64_t>(a.shape(i));
    v.strides[lead + i] = a.stride(i);
  }
  if (rank == 3) v.shape[3] = 1, v.strides[3] = 1;
  return v;
}

// A [heads] gradient as the [1, heads, 1] view the backward takes.
template <class A>
TensorView sink_grad_view(const char* who, const A& a) {
  if (a.ndim() != 1) reject(who, "dsink", "must be 1-D [heads]");
  TensorView v;
  v.dtype = dtype_of(who, "dsink", a);
  v.data = a.data();
  v.rank = 3;
  v.shape = {1, static_cast<std::int64_t>(a.shape(0)), 1, 1};
  v.strides = {0, a.stride(0), 1, 1};
  return v;
}

// A backward call's arrays as the views attention_backward takes: q, k, v, out, dout, lse, dq, dk, dv
// (rank 4; rank 3 packed for the varlen forms, whose lse is [heads, total_q]) and dsink's, when given.
template <class A>
struct BackwardViews {
  TensorView q, k, v, out, dout, lse, dq, dk, dv, dsink;
  bool has_dsink;
  BackwardViews(const char* who, int rank, const A& q_, const A& k_, const A& v_, const A& out_, const A& dout_,
                const A& lse_, const A& dq_, const A& dk_, const A& dv_, const std::optional<A>& dsink_)
      : q(view_of(who, "q", q_, rank)),
        k(view_of(who, "k", k_, rank)),
        v(view_of(who, "v", v_, rank)),
        out(view_of(who, "out", out_, rank)),
        dout(view_of(who, "dout", dout_, rank)),
        lse(view_of(who, "lse", lse_, 3, rank == 3)),
        dq(view_of(who, "dq", dq_, rank)),
        dk(view_of(who, "dk", dk_, rank)),
        dv(view_of(who, "dv", dv_, rank)),
        dsink(dsink_ ? sink_grad_view(who, *dsink_) : TensorView{}),
        has_dsink(dsink_.has_value()) {}
  const TensorView* dsink_or_null() const { return has_dsink ? &dsink : nullptr; }
};

// The keyword options every call shares, as flash-attn names them; A: the arrays' type (the device they
// must be on).
template <class A>
struct BasicOptions {
  std::optional<double> softmax_scale;
  bool causal = false;
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  std::optional<A> alibi_slopes;
  double dropout_p = 0;
  std::uint64_t seed = 0, offset = 0;
  int num_threads = 0;
  std::optional<A> sinks;

  // alibi_slopes: f32 [heads] (shared by the batch) or [batch, heads], unit stride along heads; sinks:
  // f32 [heads] with unit stride, heads being q's (dimension -2 of rank-4 or packed rank-3 q).
  template <class Q>
  attn::AttentionOptions resolve(const char* who, const Q& q) const {
    attn::AttentionOptions o;
    o.softmax_scale = softmax_scale;
    o.causal = causal;
    o.window_left = window_left;
    o.window_right = window_right;
    o.softcap = softcap;
    o.num_threads = num_threads;
    o.dropout_p = dropout_p;
    o.dropout_seed = seed;
    o.dropout_offset = offset;
    const std::size_t heads = q.ndim() >= 2 ? q.shape(q.ndim() - 2) : 0;
    if (alibi_slopes) {
      const A& a = *alibi_slopes;
      if (a.dtype() != nb::dtype<float>() || a.ndim() < 1 || a.ndim() > 2 || a.shape(a.ndim() - 1) != heads ||
          (heads > 1 && a.stride(a.ndim() - 1) != 1) || (a.ndim() == 2 && a.shape(0) > 1 && a.stride(0) < 0))
        reject(
            who, "alibi_slopes",
            "must be float32 [heads = " + std::to_string(heads) + "] or [batch, heads] with unit stride along heads");
      o.alibi_batch_stride = a.ndim() == 2 && a.shape(0) > 1 ? a.stride(0) : 0;
      // The C++ validation checks this length against the batch (the number of sequences).
      const auto rows = static_cast<std::int64_t>(a.ndim() == 2 ? a.shape(0) : 1);
      o.alibi_slopes = {static_cast<const float*>(a.data()),
                        (rows - 1) * o.alibi_batch_stride + static_cast<std::int64_t>(heads)};
    }
    if (sinks) {
      const A& a = *sinks;
      if (a.dtype() != nb::dtype<float>() || a.ndim() != 1 || a.shape(0) != heads || (heads > 1 && a.stride(0) != 1))
        reject(who, "sinks", "must be float32 [heads = " + std::to_string(heads) + "] with unit stride");
      o.sinks = {static_cast<const float*>(a.data()), static_cast<std::int64_t>(heads)};
    }
    return o;
  }
};

#define ATTN_OPTION_ARGS                                                                                             \
  nb::kw_only(), nb::arg("softmax_scale") = nb::none(), nb::arg("causal") = false, nb::arg("window_left") = -1,      \
                 nb::arg("window_right") = -1, nb::arg("softcap") = 0.0, nb::arg("alibi_slopes") = nb::none(),       \
                 nb::arg("dropout_p") = 0.0, nb::arg("seed") = 0, nb::arg("offset") = 0, nb::arg("num_threads") = 0, \
                 nb::arg("sinks") = nb::none()

}  // namespace attn_py
