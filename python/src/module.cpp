// attn._C: the native extension under the Python package (python/attn). A thin layer: each function
// turns DLPack / NumPy arrays into TensorViews (zero-copy, their own strides), builds AttentionOptions
// from keyword arguments, and calls the C++ entry point with the GIL released. Outputs are allocated
// by the Python side (python/attn/_kernels.py), like the framework would.
//
// Bad input: the C++ std::invalid_argument becomes attn.AttnError, a subclass of both ValueError and
// RuntimeError (flash-attn's tests expect RuntimeError; Python code usually catches ValueError), with
// the C++ message unchanged. Nothing is written before validation passes, as in C++.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "attn/varlen.hpp"

namespace nb = nanobind;

namespace {

using Array = nb::ndarray<nb::device::cpu>;
using attn::TensorView;

PyObject* attn_error = nullptr;

[[noreturn]] void reject(const char* who, const char* arg, const std::string& rule) {
  throw std::invalid_argument(std::string(who) + ": " + arg + ": " + rule);
}

attn::DType dtype_of(const char* who, const char* arg, const Array& a) {
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
TensorView view_of(const char* who, const char* arg, const Array& a, int rank, bool leading_one = false) {
  TensorView v;
  v.dtype = dtype_of(who, arg, a);
  v.data = a.data();
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

const std::int32_t* int32_data(const char* who, const char* arg, const Array& a, std::int64_t want) {
  if (a.dtype() != nb::dtype<std::int32_t>() || a.ndim() != 1 || (a.shape(0) > 1 && a.stride(0) != 1))
    reject(who, arg, "must be a contiguous 1-D int32 array");
  if (static_cast<std::int64_t>(a.shape(0)) != want)
    reject(who, arg, "must hold batch + 1 = " + std::to_string(want) + " entries, got " + std::to_string(a.shape(0)));
  return static_cast<const std::int32_t*>(a.data());
}

// The keyword options every call shares, as flash-attn names them.
struct Options {
  std::optional<double> softmax_scale;
  bool causal = false;
  std::int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  std::optional<Array> alibi_slopes;
  double dropout_p = 0;
  std::uint64_t seed = 0, offset = 0;
  int num_threads = 0;

  // alibi_slopes: f32 [heads] (shared by the batch) or [batch, heads], unit stride along heads.
  attn::AttentionOptions resolve(const char* who) const {
    attn::AttentionOptions o;
    o.softmax_scale = softmax_scale;
    o.causal = causal;
    o.window_left = window_left;
    o.window_right = window_right;
    o.softcap = softcap;
    o.num_threads = num_threads;
    if (dropout_p != 0) reject(who, "dropout_p", "dropout is not available in this build; must be 0");
    if (alibi_slopes) {
      const Array& a = *alibi_slopes;
      if (a.dtype() != nb::dtype<float>() || a.ndim() < 1 || a.ndim() > 2 ||
          (a.shape(a.ndim() - 1) > 1 && a.stride(a.ndim() - 1) != 1))
        reject(who, "alibi_slopes", "must be float32 [heads] or [batch, heads] with unit stride along heads");
      o.alibi_slopes = static_cast<const float*>(a.data());
      o.alibi_batch_stride = a.ndim() == 2 && a.shape(0) > 1 ? a.stride(0) : 0;
    }
    return o;
  }
};

#define ATTN_OPTION_ARGS                                                                                        \
  nb::kw_only(), nb::arg("softmax_scale") = nb::none(), nb::arg("causal") = false, nb::arg("window_left") = -1, \
                 nb::arg("window_right") = -1, nb::arg("softcap") = 0.0, nb::arg("alibi_slopes") = nb::none(),  \
                 nb::arg("dropout_p") = 0.0, nb::arg("seed") = 0, nb::arg("offset") = 0, nb::arg("num_threads") = 0

Options options(std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr, double softcap,
                std::optional<Array> alibi, double dropout_p, std::uint64_t seed, std::uint64_t offset, int threads) {
  return {scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads};
}

void forward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
             std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr, double softcap,
             std::optional<Array> alibi, double dropout_p, std::uint64_t seed, std::uint64_t offset, int threads) {
  const char* who = "attn.forward";
  const attn::AttentionOptions o =
      options(scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads).resolve(who);
  const TensorView qv = view_of(who, "q", q, 4), kv = view_of(who, "k", k, 4), vv = view_of(who, "v", v, 4),
                   ov = view_of(who, "out", out, 4), lv = view_of(who, "lse", lse, 3);
  nb::gil_scoped_release unlocked;
  attn::attention_tiled(qv, kv, vv, ov, o, {}, &lv);
}

void backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& dout, const Array& lse,
              const Array& dq, const Array& dk, const Array& dv, std::optional<double> scale, bool causal,
              std::int64_t wl, std::int64_t wr, double softcap, std::optional<Array> alibi, double dropout_p,
              std::uint64_t seed, std::uint64_t offset, int threads) {
  const char* who = "attn.backward";
  const attn::AttentionOptions o =
      options(scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads).resolve(who);
  const TensorView views[] = {view_of(who, "q", q, 4),     view_of(who, "k", k, 4),       view_of(who, "v", v, 4),
                              view_of(who, "out", out, 4), view_of(who, "dout", dout, 4), view_of(who, "lse", lse, 3),
                              view_of(who, "dq", dq, 4),   view_of(who, "dk", dk, 4),     view_of(who, "dv", dv, 4)};
  nb::gil_scoped_release unlocked;
  attn::attention_backward(views[0], views[1], views[2], views[3], views[4], views[5], views[6], views[7], views[8], o);
}

void varlen_forward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                    const Array& cu_seqlens_q, const Array& cu_seqlens_k, std::optional<double> scale, bool causal,
                    std::int64_t wl, std::int64_t wr, double softcap, std::optional<Array> alibi, double dropout_p,
                    std::uint64_t seed, std::uint64_t offset, int threads) {
  const char* who = "attn.varlen_forward";
  const attn::AttentionOptions o =
      options(scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads).resolve(who);
  const std::int64_t batch = static_cast<std::int64_t>(cu_seqlens_q.shape(0)) - 1;
  const std::int32_t *cq = int32_data(who, "cu_seqlens_q", cu_seqlens_q, batch + 1),
                     *ck = int32_data(who, "cu_seqlens_k", cu_seqlens_k, batch + 1);
  const TensorView qv = view_of(who, "q", q, 3), kv = view_of(who, "k", k, 3), vv = view_of(who, "v", v, 3),
                   ov = view_of(who, "out", out, 3), lv = view_of(who, "lse", lse, 3, true);
  nb::gil_scoped_release unlocked;
  attn::attention_varlen(qv, kv, vv, ov, cq, ck, batch, o, {}, &lv);
}

void varlen_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& dout,
                     const Array& lse, const Array& dq, const Array& dk, const Array& dv, const Array& cu_seqlens_q,
                     const Array& cu_seqlens_k, std::optional<double> scale, bool causal, std::int64_t wl,
                     std::int64_t wr, double softcap, std::optional<Array> alibi, double dropout_p, std::uint64_t seed,
                     std::uint64_t offset, int threads) {
  const char* who = "attn.varlen_backward";
  const attn::AttentionOptions o =
      options(scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads).resolve(who);
  const std::int64_t batch = static_cast<std::int64_t>(cu_seqlens_q.shape(0)) - 1;
  const std::int32_t *cq = int32_data(who, "cu_seqlens_q", cu_seqlens_q, batch + 1),
                     *ck = int32_data(who, "cu_seqlens_k", cu_seqlens_k, batch + 1);
  const TensorView views[] = {
      view_of(who, "q", q, 3),     view_of(who, "k", k, 3),       view_of(who, "v", v, 3),
      view_of(who, "out", out, 3), view_of(who, "dout", dout, 3), view_of(who, "lse", lse, 3, true),
      view_of(who, "dq", dq, 3),   view_of(who, "dk", dk, 3),     view_of(who, "dv", dv, 3)};
  nb::gil_scoped_release unlocked;
  attn::attention_varlen_backward(views[0], views[1], views[2], views[3], views[4], views[5], views[6], views[7],
                                  views[8], cq, ck, batch, o);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "attn's native kernels; use the functions of the attn package.";
  attn_error = PyErr_NewExceptionWithDoc(
      "attn.AttnError", "A bad argument to an attn kernel; the message names the argument and the rule.",
      PyTuple_Pack(2, PyExc_ValueError, PyExc_RuntimeError), nullptr);
  m.attr("AttnError") = nb::handle(attn_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(attn_error, e.what());
    }
  });
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), ATTN_OPTION_ARGS,
        "attention_tiled into out and lse (rank-4 q, k, v, out; lse [batch, heads, seqlen_q]).");
  m.def("backward", &backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), ATTN_OPTION_ARGS,
        "attention_backward into dq, dk, dv.");
  m.def("varlen_forward", &varlen_forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), ATTN_OPTION_ARGS,
        "attention_varlen (packed [total, heads, head_dim]; lse [heads, total_q]).");
  m.def("varlen_backward", &varlen_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
        ATTN_OPTION_ARGS, "attention_varlen_backward into dq, dk, dv.");
}
