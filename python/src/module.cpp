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
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "attn/decode.hpp"
#include "attn/dropout.hpp"
#include "attn/info.hpp"
#include "attn/io_model.hpp"
#include "attn/merge.hpp"
#include "attn/varlen.hpp"
#include "decode_args.hpp"
#include "validate/varlen_rules.hpp"
#include "views.hpp"

namespace nb = nanobind;

namespace attn_py {
void register_distributed(nb::module_& m);  // distributed.cpp
#ifdef ATTN_HAS_CUDA
void register_cuda(nb::module_& m);  // cuda.cpp
#endif
}  // namespace attn_py

namespace {

using Array = nb::ndarray<nb::device::cpu>;
// Inputs the kernel only reads: also read-only arrays (a DLPack producer that marks its memory read-only,
// as NumPy does for a legacy capsule).
using InArray = nb::ndarray<nb::ro, nb::device::cpu>;
using Options = attn_py::BasicOptions<Array>;
using attn::TensorView;
using attn::VarlenBatch;
using attn_py::BackwardViews;
using attn_py::dtype_of;
using attn_py::int32_data;
using attn_py::pages_of;
using attn_py::quantized_view_of;
using attn_py::reject;
using attn_py::varlen_batch;
using attn_py::view_of;

PyObject* attn_error = nullptr;

// How long the calling thread's last `forward` spent in the C++ call (validation, planning, kernel), in
// seconds: `python -m attn.bench --vs cpp` subtracts it from the same Python call's wall time, so the
// overhead it reports is per call and free of the machine's drift (both times cover the same kernel
// run). Two steady_clock reads a call (tens of nanoseconds).
thread_local double last_forward_seconds = 0;

// algorithm: "tiled" (the production kernel; q_tile/k_tile 0 = plan_tiles' choice), "reference" (the
// textbook method, the oracle) or "splitk" (num_splits slices per row).
// lse may be None (inference that does not return it).
void forward(const InArray& q, const InArray& k, const InArray& v, const Array& out, std::optional<Array> lse,
             const std::string& algorithm, std::int64_t q_tile, std::int64_t k_tile, std::int64_t num_splits,
             std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr, double softcap,
             std::optional<Array> alibi, double dropout_p, std::uint64_t seed, std::uint64_t offset, int threads,
             std::optional<Array> sinks) {
  const char* who = "attn.forward";
  const attn::AttentionOptions o =
      Options{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const TensorView qv = view_of(who, "q", q, 4), kv = view_of(who, "k", k, 4), vv = view_of(who, "v", v, 4),
                   ov = view_of(who, "out", out, 4);
  TensorView lv;
  if (lse) lv = view_of(who, "lse", *lse, 3);
  const TensorView* lp = lse ? &lv : nullptr;
  attn::TileOptions tiles;
  if (q_tile != 0) tiles.q_tile = q_tile;
  if (k_tile != 0) tiles.k_tile = k_tile;
  if (algorithm != "tiled" && algorithm != "reference" && algorithm != "splitk")
    reject(who, "algorithm", "must be tiled, reference or splitk, got " + algorithm);
  nb::gil_scoped_release unlocked;
  const auto t0 = std::chrono::steady_clock::now();
  if (algorithm == "reference")
    attn::attention_reference(qv, kv, vv, ov, o, lp);
  else if (algorithm == "splitk")
    attn::attention_splitk(qv, kv, vv, ov, o, {num_splits}, lp);
  else
    attn::attention_tiled(qv, kv, vv, ov, o, tiles, lp);
  last_forward_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The C++ call's own time, for `python -m attn.bench --vs cpp`: attention_tiled on the same arrays
// `repeats` times, each timed in C++ (no Python, no DLPack, no allocation), seconds per call.
std::vector<double> time_forward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                                 int repeats, std::optional<double> scale, bool causal, std::int64_t wl,
                                 std::int64_t wr, double softcap, std::optional<Array> alibi, double dropout_p,
                                 std::uint64_t seed, std::uint64_t offset, int threads, std::optional<Array> sinks) {
  const char* who = "attn.time_forward";
  const attn::AttentionOptions o =
      Options{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const TensorView qv = view_of(who, "q", q, 4), kv = view_of(who, "k", k, 4), vv = view_of(who, "v", v, 4),
                   ov = view_of(who, "out", out, 4), lv = view_of(who, "lse", lse, 3);
  if (repeats < 1) reject(who, "repeats", "must be >= 1, got " + std::to_string(repeats));
  std::vector<double> seconds;
  nb::gil_scoped_release unlocked;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    attn::attention_tiled(qv, kv, vv, ov, o, {}, &lv);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return seconds;
}

// dsink: f32/f64 [heads] (lse's dtype), the sinks' gradient, when given (with sinks).
void backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& dout, const Array& lse,
              const Array& dq, const Array& dk, const Array& dv, std::optional<Array> dsink,
              std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr, double softcap,
              std::optional<Array> alibi, double dropout_p, std::uint64_t seed, std::uint64_t offset, int threads,
              std::optional<Array> sinks) {
  const char* who = "attn.backward";
  const attn::AttentionOptions o =
      Options{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const BackwardViews<Array> w(who, 4, q, k, v, out, dout, lse, dq, dk, dv, dsink);
  nb::gil_scoped_release unlocked;
  attn::attention_backward(w.q, w.k, w.v, w.out, w.dout, w.lse, w.dq, w.dk, w.dv, o, {}, w.dsink_or_null());
}

// With block_table, k and v are a paged cache [num_pages, page_size, kv_heads, head_dim]
// (attention_varlen_paged).
void varlen_forward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                    const Array& cu_seqlens_q, const Array& cu_seqlens_k, std::optional<Array> block_table,
                    std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr, double softcap,
                    std::optional<Array> alibi, double dropout_p, std::uint64_t seed, std::uint64_t offset, int threads,
                    std::optional<Array> sinks) {
  const char* who = "attn.varlen_forward";
  const attn::AttentionOptions o =
      Options{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const VarlenBatch vb = varlen_batch(who, cu_seqlens_q, cu_seqlens_k);
  const int kv_rank = block_table ? 4 : 3;
  const TensorView qv = view_of(who, "q", q, 3), kv = view_of(who, "k", k, kv_rank), vv = view_of(who, "v", v, kv_rank),
                   ov = view_of(who, "out", out, 3), lv = view_of(who, "lse", lse, 3, true);
  if (block_table) {
    const attn::VarlenPages pages = pages_of(who, *block_table, vb.batch);
    nb::gil_scoped_release unlocked;
    return attn::attention_varlen_paged(qv, kv, vv, ov, vb, pages, o, {}, &lv);
  }
  nb::gil_scoped_release unlocked;
  attn::attention_varlen(qv, kv, vv, ov, vb, o, {}, &lv);
}

void varlen_backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& dout,
                     const Array& lse, const Array& dq, const Array& dk, const Array& dv, const Array& cu_seqlens_q,
                     const Array& cu_seqlens_k, std::optional<Array> dsink, std::optional<double> scale, bool causal,
                     std::int64_t wl, std::int64_t wr, double softcap, std::optional<Array> alibi, double dropout_p,
                     std::uint64_t seed, std::uint64_t offset, int threads, std::optional<Array> sinks) {
  const char* who = "attn.varlen_backward";
  const attn::AttentionOptions o =
      Options{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const VarlenBatch vb = varlen_batch(who, cu_seqlens_q, cu_seqlens_k);
  const BackwardViews<Array> w(who, 3, q, k, v, out, dout, lse, dq, dk, dv, dsink);
  nb::gil_scoped_release unlocked;
  attn::attention_varlen_backward(w.q, w.k, w.v, w.out, w.dout, w.lse, w.dq, w.dk, w.dv, vb, o, {}, w.dsink_or_null());
}

// flash_attn_with_kvcache: attention_decode over a contiguous or paged cache, appending k_new/v_new in
// place first. cache_seqlens int32 [batch]; block_table int32 [batch, max_pages] (row stride free).
void kvcache(const Array& q, const Array& k_cache, const Array& v_cache, const Array& out, std::optional<Array> lse,
             const Array& cache_seqlens, std::optional<Array> block_table, std::optional<Array> k_new,
             std::optional<Array> v_new, std::optional<Array> batch_idx, std::optional<Array> leftpad,
             std::optional<Array> rotary_cos, std::optional<Array> rotary_sin, bool rotary_interleaved,
             std::int64_t num_splits, std::int64_t keys_per_split, std::optional<double> scale, bool causal,
             std::int64_t wl, std::int64_t wr, double softcap, std::optional<Array> alibi, double dropout_p,
             std::uint64_t seed, std::uint64_t offset, int threads, std::optional<Array> sinks,
             std::optional<Array> k_scale, std::optional<Array> v_scale, std::string cache_type, bool quantized_query) {
  const char* who = "attn.kvcache";
  const attn::AttentionOptions o =
      Options{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const attn_py::DecodeCall<Array> c(who, q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_new, v_new,
                                     batch_idx, leftpad, rotary_cos, rotary_sin, rotary_interleaved, num_splits,
                                     keys_per_split, k_scale, v_scale, cache_type, quantized_query);
  nb::gil_scoped_release unlocked;
  attn::attention_decode(c.q, c.cache, c.out, o, c.dec, c.lse_ptr());
}

// cu_seqlens (batch + 1 int32 offsets) by the varlen kernels' rule (validate/varlen_rules.hpp; total < 0:
// any last offset), for Python code that reads the offsets before it calls a kernel (flash_attn's
// seqused_k), so that a bad array gets the kernel's own message.
void check_cu_seqlens(const std::string& who, const std::string& arg, const Array& cu, std::int64_t batch,
                      std::int64_t total) {
  attn::detail::check_cu_seqlens(who, arg, int32_data(who.c_str(), arg.c_str(), cu, batch + 1, "batch + 1"), batch,
                                 total);
}

void merge_states(const Array& parts, const Array& parts_lse, const Array& out, const Array& lse) {
  const char* who = "attn.merge_states";
  const TensorView pv = view_of(who, "v", parts, 4), lv = view_of(who, "s", parts_lse, 3),
                   ov = view_of(who, "out", out, 4), olv = view_of(who, "lse", lse, 3);
  nb::gil_scoped_release unlocked;
  attn::merge_states(pv, lv, ov, &olv);
}

void merge_state_in_place(const Array& out, const Array& lse, const Array& other, const Array& other_lse) {
  const char* who = "attn.merge_state_in_place";
  const TensorView ov = view_of(who, "v", out, 4), lv = view_of(who, "s", lse, 3),
                   bv = view_of(who, "v_other", other, 4), blv = view_of(who, "s_other", other_lse, 3);
  nb::gil_scoped_release unlocked;
  attn::merge_state_in_place(ov, lv, bv, blv);
}

nb::dict traffic_dict(const attn::io::Traffic& t) {
  nb::dict d;
  d["elements"] = t.elements;
  d["bytes"] = t.bytes;
  d["seconds"] = t.seconds;
  d["block_rows"] = t.block_rows;
  d["block_cols"] = t.block_cols;
  d["passes"] = t.passes;
  return d;
}

// attn::io::model (include/attn/io_model.hpp): the HBM traffic of the standard algorithm, tiled
// Algorithm 1 and FlashAttention-2 at one (N, d, SRAM) point.
nb::dict io_model(std::int64_t seqlen, std::int64_t head_dim, double sram_bytes, double element_bytes, double bandwidth,
                  double derate) {
  const attn::io::Report r = attn::io::model({seqlen, head_dim, sram_bytes, element_bytes, bandwidth, derate});
  nb::dict d;
  d["sram_elements"] = r.sram_elements;
  d["standard"] = traffic_dict(r.standard);
  d["tiled"] = traffic_dict(r.tiled);
  d["fa2"] = traffic_dict(r.fa2);
  d["reduction"] = r.reduction;
  d["score_matrix_bytes"] = r.score_matrix_bytes;
  return d;
}

// The counted simulation of one schedule: every HBM access of Algorithm 1 or FlashAttention-2 on random
// f64 data, with its output checked against the reference.
nb::dict io_count(const std::string& schedule, std::int64_t n, std::int64_t d, std::int64_t m, std::uint64_t seed) {
  if (schedule != "algorithm1" && schedule != "fa2")
    reject("attn.io.count", "schedule", "must be algorithm1 or fa2, got " + schedule);
  attn::io::Counted c;
  {
    nb::gil_scoped_release unlocked;
    c = schedule == "fa2" ? attn::io::count_fa2(n, d, m, seed) : attn::io::count_algorithm1(n, d, m, seed);
  }
  nb::dict r;
  r["reads"] = c.reads;
  r["writes"] = c.writes;
  r["elements"] = c.elements;
  r["sram_peak_elements"] = c.sram_peak_elements;
  r["max_abs_diff"] = c.max_abs_diff;
  return r;
}

// attn::dropout_mask into mask [batch, heads, seqlen_q, seqlen_k]: the factor (0 or 1 / (1 - p)) the
// forward multiplies each softmax weight by.
void dropout_mask(const Array& mask, double dropout_p, std::uint64_t seed, std::uint64_t offset) {
  const char* who = "attn.dropout_mask";
  attn::AttentionOptions o;
  o.dropout_p = dropout_p;
  o.dropout_seed = seed;
  o.dropout_offset = offset;
  const TensorView mv = view_of(who, "mask", mask, 4);
  nb::gil_scoped_release unlocked;
  attn::dropout_mask(mv, o);
}

// attn::softmax_weights into weights [batch, heads, seqlen_q, seqlen_k]: exp(s_ij - m_i) for the keys
// query i sees, 0 elsewhere (flash-attn's S_dmask, one key block).
void softmax_weights(const InArray& q, const InArray& k, const Array& weights, std::optional<double> scale, bool causal,
                     std::int64_t wl, std::int64_t wr, double softcap, std::optional<Array> alibi, double dropout_p,
                     std::uint64_t seed, std::uint64_t offset, int threads, std::optional<Array> sinks) {
  const char* who = "attn.softmax_weights";
  const attn::AttentionOptions o =
      Options{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const TensorView qv = view_of(who, "q", q, 4), kv = view_of(who, "k", k, 4), wv = view_of(who, "weights", weights, 4);
  nb::gil_scoped_release unlocked;
  attn::softmax_weights(qv, kv, wv, o);
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
  attn_py::register_distributed(m);
#ifdef ATTN_HAS_CUDA
  attn_py::register_cuda(m);
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  m.def(
      "info",
      [] {
        const attn::KernelInfo k = attn::kernel_info();
        nb::dict d;
        d["simd"] = k.simd;
        d["amx"] = k.amx;
        d["amx_reason"] = k.amx_reason;
        d["f16_on_tiles"] = k.f16_on_tiles;
        d["f32_on_tiles"] = k.f32_on_tiles;
        d["bf16_dots"] = k.bf16_dots;
        d["quantized_query"] = k.quantized_query;
        d["summary"] = k.summary;
        return d;
      },
      "attn::kernel_info(): the SIMD target, where the bf16 kernels run (AMX tiles: hardware, emulated or none, "
      "and why), the bf16 dot products, and a one-line summary.");
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("algorithm") = "tiled", nb::arg("q_tile") = 0, nb::arg("k_tile") = 0, nb::arg("num_splits") = 1,
        ATTN_OPTION_ARGS,
        "attention_tiled (or _reference, _splitk) into out and lse (rank-4 q, k, v, out; lse [batch, heads, "
        "seqlen_q]).");
  m.def(
      "last_forward_seconds", [] { return last_forward_seconds; },
      "Seconds the calling thread's last `forward` spent in the C++ call (python -m attn.bench --vs cpp).");
  m.def("time_forward", &time_forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("repeats"), ATTN_OPTION_ARGS,
        "attention_tiled `repeats` times, each timed in C++: seconds per call (python -m attn.bench --vs cpp).");
  m.def("backward", &backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dsink").none() = nb::none(),
        ATTN_OPTION_ARGS, "attention_backward into dq, dk, dv (and dsink).");
  m.def("varlen_forward", &varlen_forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("block_table").none() = nb::none(), ATTN_OPTION_ARGS,
        "attention_varlen (packed [total, heads, head_dim]; lse [heads, total_q]); with block_table, "
        "attention_varlen_paged (k, v [num_pages, page_size, kv_heads, head_dim]).");
  m.def("varlen_backward", &varlen_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
        nb::arg("dsink").none() = nb::none(), ATTN_OPTION_ARGS,
        "attention_varlen_backward into dq, dk, dv (and dsink).");
  m.def("kvcache", &kvcache, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("cache_seqlens"), nb::arg("block_table").none(), nb::arg("k_new").none(),
        nb::arg("v_new").none(), nb::arg("cache_batch_idx").none(), nb::arg("cache_leftpad").none(),
        nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(), nb::arg("rotary_interleaved") = false,
        nb::arg("num_splits") = 0, nb::arg("keys_per_split") = 0, ATTN_OPTION_ARGS,
        nb::arg("k_scale").none() = nb::none(), nb::arg("v_scale").none() = nb::none(), nb::arg("cache_type") = "",
        nb::arg("quantized_query") = false,
        "attention_decode over a KV cache (flash_attn_with_kvcache), appending k_new/v_new in place; a quantized "
        "cache comes as uint8 with cache_type and k_scale, v_scale.");
  m.def("check_cu_seqlens", &check_cu_seqlens, nb::arg("who"), nb::arg("arg"), nb::arg("cu"), nb::arg("batch"),
        nb::arg("total"),
        "Checks batch + 1 int32 offsets (0 first, non-decreasing, the last = total unless total < 0) by the varlen "
        "kernels' rule, raising AttnError with their message.");
  m.def("merge_states", &merge_states, nb::arg("parts"), nb::arg("parts_lse"), nb::arg("out"), nb::arg("lse"),
        "attn::merge_states: parts [rows, states, heads, d], parts_lse [rows, states, heads] into out "
        "[rows, 1, heads, d], lse [rows, 1, heads].");
  m.def("merge_state_in_place", &merge_state_in_place, nb::arg("out"), nb::arg("lse"), nb::arg("other"),
        nb::arg("other_lse"),
        "attn::merge_state_in_place: (out [rows, 1, heads, d], lse [rows, 1, heads]) merged with (other, "
        "other_lse), written into out and lse.");
  m.def("io_model", &io_model, nb::arg("seqlen") = 4096, nb::arg("head_dim") = 64, nb::arg("sram_bytes") = 192.0 * 1024,
        nb::arg("element_bytes") = 2.0, nb::arg("bandwidth") = 3.35e12, nb::arg("derate") = 0.8,
        "attn::io::model: the traffic of the three schedules (dict).");
  m.def("io_count", &io_count, nb::arg("schedule"), nb::arg("n"), nb::arg("d"), nb::arg("m"), nb::arg("seed") = 1,
        "attn::io::count_algorithm1 / count_fa2: the counted simulation (dict).");
  m.def("softmax_weights", &softmax_weights, nb::arg("q"), nb::arg("k"), nb::arg("weights"), ATTN_OPTION_ARGS,
        "attn::softmax_weights: exp(s_ij - m_i) into weights [batch, heads, seqlen_q, seqlen_k].");
  m.def("dropout_mask", &dropout_mask, nb::arg("mask"), nb::arg("dropout_p"), nb::arg("seed"), nb::arg("offset") = 0,
        "attn::dropout_mask: the forward's dropout factors into mask [batch, heads, seqlen_q, seqlen_k].");
}
