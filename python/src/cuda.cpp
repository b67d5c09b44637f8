// attn._C's CUDA bindings, compiled when the package is built with the CUDA backend (ATTN_CUDA=ON in
// CMake: docs/python.md). torch CUDA tensors reach attn::cuda's entry points (include/attn/cuda.hpp)
// as DLPack capsules, zero-copy, on the stream the Python side passes (torch's current stream of the
// tensors' device, which it makes current): the forward and its backward, their varlen forms (packed
// keys; paged keys forward only) and the kvcache call.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>

#include "attn/cuda.hpp"
#include "decode_args.hpp"
#include "views.hpp"

namespace attn_py {
namespace {

using CudaArray = nb::ndarray<nb::device::cuda>;
using CudaOptions = BasicOptions<CudaArray>;

attn::cuda::Stream stream_of(std::uintptr_t stream) { return reinterpret_cast<attn::cuda::Stream>(stream); }

// out (and lse [batch, heads, seqlen_q] f32, or None) from q, k, v: attn::cuda::attention, queued on
// `stream` (a cudaStream_t as an integer; 0 = the legacy default stream).
void forward_cuda(const CudaArray& q, const CudaArray& k, const CudaArray& v, const CudaArray& out,
                  std::optional<CudaArray> lse, std::uintptr_t stream, std::optional<double> scale, bool causal,
                  std::int64_t wl, std::int64_t wr, double softcap, std::optional<CudaArray> alibi, double dropout_p,
                  std::uint64_t seed, std::uint64_t offset, int threads, std::optional<CudaArray> sinks) {
  const char* who = "attn.forward_cuda";
  const attn::AttentionOptions o =
      CudaOptions{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const TensorView qv = view_of(who, "q", q, 4), kv = view_of(who, "k", k, 4), vv = view_of(who, "v", v, 4),
                   ov = view_of(who, "out", out, 4);
  TensorView lv;
  if (lse) lv = view_of(who, "lse", *lse, 3);
  nb::gil_scoped_release unlocked;
  attn::cuda::attention(qv, kv, vv, ov, o, lse ? &lv : nullptr, stream_of(stream));
}

// flash_attn_varlen_func on CUDA tensors: attn::cuda::attention_varlen, or with block_table (k and v a paged
// cache [num_pages, page_size, kv_heads, head_dim]) attn::cuda::attention_varlen_paged. Validation copies
// cu_seqlens (and the block table) to the host and synchronises `stream`.
void varlen_forward_cuda(const CudaArray& q, const CudaArray& k, const CudaArray& v, const CudaArray& out,
                         const CudaArray& lse, const CudaArray& cu_seqlens_q, const CudaArray& cu_seqlens_k,
                         std::optional<CudaArray> block_table, std::uintptr_t stream, std::optional<double> scale,
                         bool causal, std::int64_t wl, std::int64_t wr, double softcap, std::optional<CudaArray> alibi,
                         double dropout_p, std::uint64_t seed, std::uint64_t offset, int threads,
                         std::optional<CudaArray> sinks) {
  const char* who = "attn.varlen_forward_cuda";
  const attn::AttentionOptions o =
      CudaOptions{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const attn::VarlenBatch vb = varlen_batch(who, cu_seqlens_q, cu_seqlens_k);
  const int kv_rank = block_table ? 4 : 3;
  const TensorView qv = view_of(who, "q", q, 3), kv = view_of(who, "k", k, kv_rank), vv = view_of(who, "v", v, kv_rank),
                   ov = view_of(who, "out", out, 3), lv = view_of(who, "lse", lse, 3, true);
  if (block_table) {
    const attn::VarlenPages pages = pages_of(who, *block_table, vb.batch);
    nb::gil_scoped_release unlocked;
    return attn::cuda::attention_varlen_paged(qv, kv, vv, ov, vb, pages, o, &lv, stream_of(stream));
  }
  nb::gil_scoped_release unlocked;
  attn::cuda::attention_varlen(qv, kv, vv, ov, vb, o, &lv, stream_of(stream));
}

// flash_attn_with_kvcache on CUDA tensors: attn::cuda::attention_decode (what it rejects -- quantized
// caches, f64 rotary tables -- it rejects by name). Reading cache_seqlens, the block table,
// cache_batch_idx and cache_leftpad for validation copies them to the host and synchronises `stream`.
void kvcache_cuda(const CudaArray& q, const CudaArray& k_cache, const CudaArray& v_cache, const CudaArray& out,
                  std::optional<CudaArray> lse, const CudaArray& cache_seqlens, std::optional<CudaArray> block_table,
                  std::optional<CudaArray> k_new, std::optional<CudaArray> v_new, std::optional<CudaArray> batch_idx,
                  std::optional<CudaArray> leftpad, std::optional<CudaArray> rotary_cos,
                  std::optional<CudaArray> rotary_sin, bool rotary_interleaved, std::int64_t num_splits,
                  std::int64_t keys_per_split, std::uintptr_t stream, std::optional<double> scale, bool causal,
                  std::int64_t wl, std::int64_t wr, double softcap, std::optional<CudaArray> alibi, double dropout_p,
                  std::uint64_t seed, std::uint64_t offset, int threads, std::optional<CudaArray> sinks,
                  std::optional<CudaArray> k_scale, std::optional<CudaArray> v_scale, std::string cache_type) {
  const char* who = "attn.kvcache_cuda";
  const attn::AttentionOptions o =
      CudaOptions{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const DecodeCall<CudaArray> c(who, q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_new, v_new, batch_idx,
                                leftpad, rotary_cos, rotary_sin, rotary_interleaved, num_splits, keys_per_split,
                                k_scale, v_scale, cache_type);
  nb::gil_scoped_release unlocked;
  attn::cuda::attention_decode(c.q, c.cache, c.out, o, c.dec, c.lse_ptr(), stream_of(stream));
}

}  // namespace
// dq, dk, dv (and dsink [heads] f32) from the forward's out and lse: attn::cuda::attention_backward, queued
// on `stream`.
void backward_cuda(const CudaArray& q, const CudaArray& k, const CudaArray& v, const CudaArray& out,
                   const CudaArray& dout, const CudaArray& lse, const CudaArray& dq, const CudaArray& dk,
                   const CudaArray& dv, std::optional<CudaArray> dsink, std::uintptr_t stream,
                   std::optional<double> scale, bool causal, std::int64_t wl, std::int64_t wr, double softcap,
                   std::optional<CudaArray> alibi, double dropout_p, std::uint64_t seed, std::uint64_t offset,
                   int threads, std::optional<CudaArray> sinks) {
  const char* who = "attn.backward_cuda";
  const attn::AttentionOptions o =
      CudaOptions{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const BackwardViews<CudaArray> w(who, 4, q, k, v, out, dout, lse, dq, dk, dv, dsink);
  nb::gil_scoped_release unlocked;
  attn::cuda::attention_backward(w.q, w.k, w.v, w.out, w.dout, w.lse, w.dq, w.dk, w.dv, o, w.dsink_or_null(),
                                 stream_of(stream));
}

// The varlen form (packed [total, heads, head_dim]; lse [heads, total_q]): attn::cuda::attention_varlen_backward.
void varlen_backward_cuda(const CudaArray& q, const CudaArray& k, const CudaArray& v, const CudaArray& out,
                          const CudaArray& dout, const CudaArray& lse, const CudaArray& dq, const CudaArray& dk,
                          const CudaArray& dv, const CudaArray& cu_seqlens_q, const CudaArray& cu_seqlens_k,
                          std::optional<CudaArray> dsink, std::uintptr_t stream, std::optional<double> scale,
                          bool causal, std::int64_t wl, std::int64_t wr, double softcap, std::optional<CudaArray> alibi,
                          double dropout_p, std::uint64_t seed, std::uint64_t offset, int threads,
                          std::optional<CudaArray> sinks) {
  const char* who = "attn.varlen_backward_cuda";
  const attn::AttentionOptions o =
      CudaOptions{scale, causal, wl, wr, softcap, std::move(alibi), dropout_p, seed, offset, threads, std::move(sinks)}
          .resolve(who, q);
  const attn::VarlenBatch vb = varlen_batch(who, cu_seqlens_q, cu_seqlens_k);
  const BackwardViews<CudaArray> w(who, 3, q, k, v, out, dout, lse, dq, dk, dv, dsink);
  nb::gil_scoped_release unlocked;
  attn::cuda::attention_varlen_backward(w.q, w.k, w.v, w.out, w.dout, w.lse, w.dq, w.dk, w.dv, vb, o, w.dsink_or_null(),
                                        stream_of(stream));
}

void register_cuda(nb::module_& m) {
  m.def("forward_cuda", &forward_cuda, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
        nb::arg("stream") = 0, ATTN_OPTION_ARGS,
        "attn::cuda::attention into out and lse on CUDA tensors (rank-4 q, k, v, out; lse [batch, heads, seqlen_q] "
        "f32 or None), queued on `stream`.");
  m.def("varlen_forward_cuda", &varlen_forward_cuda, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"), nb::arg("block_table").none() = nb::none(),
        nb::arg("stream") = 0, ATTN_OPTION_ARGS,
        "attn::cuda::attention_varlen on CUDA tensors (packed [total, heads, head_dim]; lse [heads, total_q]); with "
        "block_table, attention_varlen_paged (k, v [num_pages, page_size, kv_heads, head_dim]); queued on `stream`.");
  m.def("backward_cuda", &backward_cuda, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("dout"),
        nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("dsink").none() = nb::none(),
        nb::arg("stream") = 0, ATTN_OPTION_ARGS,
        "attn::cuda::attention_backward into dq, dk, dv (and dsink) on CUDA tensors, queued on `stream`.");
  m.def("varlen_backward_cuda", &varlen_backward_cuda, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("dout"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("dsink").none() = nb::none(), nb::arg("stream") = 0, ATTN_OPTION_ARGS,
        "attn::cuda::attention_varlen_backward into dq, dk, dv (and dsink) on CUDA tensors, queued on `stream`.");
  m.def("kvcache_cuda", &kvcache_cuda, nb::arg("q"), nb::arg("k_cache"), nb::arg("v_cache"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("cache_seqlens"), nb::arg("block_table").none(), nb::arg("k_new").none(),
        nb::arg("v_new").none(), nb::arg("cache_batch_idx").none(), nb::arg("cache_leftpad").none(),
        nb::arg("rotary_cos").none(), nb::arg("rotary_sin").none(), nb::arg("rotary_interleaved") = false,
        nb::arg("num_splits") = 0, nb::arg("keys_per_split") = 0, nb::arg("stream") = 0, ATTN_OPTION_ARGS,
        nb::arg("k_scale").none() = nb::none(), nb::arg("v_scale").none() = nb::none(), nb::arg("cache_type") = "",
        "attn::cuda::attention_decode over a KV cache of CUDA tensors (flash_attn_with_kvcache), appending "
        "k_new/v_new in place, queued on `stream`.");
  m.def("cuda_device_count", &attn::cuda::device_count, "CUDA devices usable now (0 without a driver or device).");
}

}  // namespace attn_py
