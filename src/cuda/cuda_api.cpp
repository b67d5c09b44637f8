// The CUDA entry points: validation (the CPU rules of validate/validate and decode_validate, plus the
// backend's own: device memory, bf16/f16, head_dim 64/128/256, 16-byte rows), then the launchers.
#include "attn/cuda.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "validate/backward_problem.hpp"
#include "validate/problem.hpp"
#include "validate/validate.hpp"
#include "validate/page_rules.hpp"
#include "core/split.hpp"
#include "validate/varlen_rules.hpp"
#include "cuda/heuristics.hpp"
#include "cuda/layout.hpp"
#include "cuda/params.hpp"
#include "core/checked.hpp"
#include "validate/decode_problem.hpp"

namespace attn::cuda_detail {
Launchers& launchers() {
  static Launchers l;
  return l;
}
}  // namespace attn::cuda_detail

namespace attn::cuda {
namespace {

using detail::fail;

void check_cuda(const char* who, int err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(who) + ": " + what + ": " + cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void require_device(const char* who, const char* arg, const void* ptr) {
  if (!ptr) return;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state
    fail(who, arg, "must point to device memory (cudaPointerGetAttributes failed)");
  }
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    fail(who, arg, "must point to device memory, got a host pointer");
}

// The kernels' shape rules for a 16-bit rank-4 view: dtype, head_dim, contiguous 16-byte rows.
void require_kernel_layout(const char* who, const char* arg, const TensorView& t, bool check_dims = true) {
  if (t.dtype != DType::bf16 && t.dtype != DType::f16)
    fail(who, arg, "dtype must be bf16 or f16 on CUDA, got " + std::string(dtype_name(t.dtype)));
  if (check_dims && t.shape[3] != 64 && t.shape[3] != 128 && t.shape[3] != 256)
    fail(who, arg, "head_dim must be 64, 128 or 256 on CUDA, got " + std::to_string(t.shape[3]));
  if (t.strides[3] != 1) fail(who, arg, "last dimension must be contiguous (stride[3] = 1) on CUDA");
  if (reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0 || t.strides[0] % 8 || t.strides[1] % 8 || t.strides[2] % 8)
    fail(who, arg, "rows must be 16-byte aligned on CUDA (data and strides of dims 0..2 multiples of 8 elements)");
  require_device(who, arg, t.data);
}

void require_lse(const char* who, const TensorView* lse) {
  if (lse) require_device(who, "lse", lse->data);
}

template <std::size_t N>
void copy_strides(std::int64_t (&dst)[N], const TensorView& t) {
  for (std::size_t i = 0; i < N; ++i) dst[i] = t.strides[i];
}

std::vector<std::int32_t> to_host(const char* who, const std::int32_t* dev, std::int64_t n, Stream stream) {
  std::vector<std::int32_t> h(static_cast<std::size_t>(n));
  if (n == 0) return h;
  check_cuda(who, cudaMemcpyAsync(h.data(), dev, static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToHost, stream),
             "copying an index array to the host");
  check_cuda(who, cudaStreamSynchronize(stream), "copying an index array to the host");
  return h;
}

// The caller's host mirror of a device index array when given, else a copy (a stream sync).
std::vector<std::int32_t> host_array(const char* who, const std::int32_t* dev, const std::int32_t* host, std::int64_t n,
                                     Stream stream) {
  return host ? std::vector<std::int32_t>(host, host + n) : to_host(who, dev, n, stream);
}

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 1;
  return n;
}

// The data pointers and strides of q, k, v, out and lse, as both parameter blocks spell them.
template <class Params>
void set_views(Params& params, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const TensorView* lse) {
  params.q = q.data;
  params.k = k.data;
  params.v = v.data;
  params.out = out.data;
  params.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  copy_strides(params.qs, q);
  copy_strides(params.ks, k);
  copy_strides(params.vs, v);
  copy_strides(params.os, out);
  if (lse) copy_strides(params.ls, *lse);
}

cuda_detail::FwdParams forward_params(const detail::Problem& p, const TensorView* lse) {
  cuda_detail::FwdParams f{};
  set_views(f, p.q, p.k, p.v, p.out, lse);
  f.batch = p.batch;
  f.seqlen_q = p.seqlen_q;
  f.seqlen_k = p.seqlen_k;
  f.heads = p.heads;
  f.kv_heads = p.kv_heads;
  f.head_dim = p.head_dim;
  f.rule = p.rule;
  return f;
}

void validate_forward(const char* who, const detail::Problem& p, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& out, const AttentionOptions& opts, const TensorView* lse) {
  detail::reject_dropout(who, p.dropout, "the CUDA forward is an inference path");
  if (p.head_dim_v != p.head_dim)
    fail(who, "v",
         "head_dim must equal q's (" + std::to_string(p.head_dim) + ") on CUDA, got " + std::to_string(p.head_dim_v) +
             " (unequal head dims are CPU-only)");
  for (auto [name, t] : {std::pair<const char*, const TensorView*>{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
    require_kernel_layout(who, name, *t);
  require_lse(who, lse);
  if (opts.alibi_slopes) require_device(who, "alibi_slopes", opts.alibi_slopes.data);
  if (opts.sinks) require_device(who, "sinks", opts.sinks.data);
}

// The forward over the sequences of a validated varlen call (cq: cu_seqlens_q on the host), reading the
// keys through `pages` (device table) when it is paged.
void launch_varlen(const char* who, const detail::Problem& p, const VarlenBatch& vb,
                   const std::vector<std::int32_t>& cq, const TensorView* lse, Stream stream,
                   const detail::PageTable& pages = {}) {
  std::int64_t max_q = 0;
  for (std::int64_t b = 0; b < vb.batch; ++b) max_q = std::max<std::int64_t>(max_q, cq[b + 1] - cq[b]);
  cuda_detail::FwdParams f = forward_params(p, lse);
  f.batch = vb.batch;
  f.cu_q = vb.cu_seqlens_q;
  f.cu_k = vb.cu_seqlens_k;
  f.pages = pages;
  if (max_q == 0) return;
  check_cuda(who, cuda_detail::launchers().forward(f, p.dtype, max_q, stream), "kernel launch");
}

// What the backward kernels take beyond the CPU's rules: the forward's (validate_forward) for q, k, v,
// out and lse, no dropout, the kernels' layout for dout and the gradients, dsink in device memory.
void validate_backward_for_cuda(const char* who, const detail::BackwardProblem& p, const AttentionOptions& opts) {
  detail::reject_dropout(who, p.dropout, "the CUDA backward runs");
  validate_forward(who, p, p.q, p.k, p.v, p.out, opts, p.lse);
  for (auto [name, t] :
       {std::pair<const char*, const TensorView*>{"dout", &p.dout}, {"dq", &p.dq}, {"dk", &p.dk}, {"dv", &p.dv}})
    require_kernel_layout(who, name, *t);
  if (p.dsink) require_device(who, "dsink", p.dsink->data);
}

// The backward's parameters, its scratch (two f32 per head and query row) allocated and freed on `stream`
// around the launches; batch: the grid's sequences (varlen: the batch's, the views being packed).
void launch_backward(const char* who, const detail::BackwardProblem& p, std::int64_t batch, std::int64_t max_q,
                     std::int64_t max_k, const VarlenBatch* vb, Stream stream) {
  cuda_detail::BwdParams b{};
  b.f = forward_params(p, p.lse);
  b.f.batch = batch;
  if (vb) {
    b.f.cu_q = vb->cu_seqlens_q;
    b.f.cu_k = vb->cu_seqlens_k;
  }
  b.dout = p.dout.data;
  b.dq = p.dq.data;
  b.dk = p.dk.data;
  b.dv = p.dv.data;
  copy_strides(b.dos, p.dout);
  copy_strides(b.dqs, p.dq);
  copy_strides(b.dks, p.dk);
  copy_strides(b.dvs, p.dv);
  b.dsink = p.dsink ? static_cast<float*>(p.dsink->data) : nullptr;
  b.rows = p.batch * p.seqlen_q;
  void* scratch = nullptr;
  const std::size_t bytes = static_cast<std::size_t>(2 * p.heads * b.rows) * 4;
  if (bytes) check_cuda(who, cudaMallocAsync(&scratch, bytes, stream), "allocating the row statistics");
  b.delta = static_cast<float*>(scratch);
  b.lse2 = b.delta + p.heads * b.rows;
  const int err = cuda_detail::launch_backward(b, p.dtype, max_q, max_k, stream);
  if (scratch) (void)cudaFreeAsync(scratch, stream);
  check_cuda(who, err, "kernel launch");
}

// The index arrays attention_decode's validation reads (seqlens, and the block table, batch_idx and leftpad
// when given), checked to be device memory and copied to the host (or taken from the caller's mirror),
// and the cache as the CPU validator sees it: pointing at these copies.
struct HostDecodeArrays {
  std::vector<std::int32_t> seqlens, table, batch_idx, leftpad;
  KVCache cache;
  HostDecodeArrays(const char* who, const TensorView& q, const KVCache& c, const DecodeHostMirror& host, Stream stream)
      : cache(c) {
    if (is_quantized(c.k.dtype))  // the CPU validator would read the scales as host memory
      fail(who, "cache.k",
           "quantized caches (" + std::string(dtype_name(c.k.dtype)) + ") are CPU-only (attn::attention_decode)");
    if (!c.seqlens) fail(who, "cache.seqlens", "data pointer is null");
    const std::int64_t batch = q.rank == 4 ? q.shape[0] : 0;
    if (batch < 1) detail::check_view(who, "q", q, 4, false);  // throws with the view rule
    const bool paged = c.block_table != nullptr;
    if (paged && c.max_pages < 1) fail(who, "cache.max_pages", "must be >= 1, got " + std::to_string(c.max_pages));
    const std::int64_t bt_stride = c.block_table_stride == 0 ? c.max_pages : c.block_table_stride;
    if (paged && bt_stride < c.max_pages)
      fail(who, "cache.block_table_stride", "must be >= max_pages (" + std::to_string(c.max_pages) + ") or 0");
    require_device(who, "cache.seqlens", c.seqlens);
    if (paged) require_device(who, "cache.block_table", c.block_table);
    if (c.batch_idx) require_device(who, "cache.batch_idx", c.batch_idx);
    if (c.leftpad) require_device(who, "cache.leftpad", c.leftpad);
    seqlens = host_array(who, c.seqlens, host.seqlens, batch, stream);
    cache.seqlens = seqlens.data();
    if (paged) {
      table = host_array(who, c.block_table, host.block_table, (batch - 1) * bt_stride + c.max_pages, stream);
      cache.block_table = table.data();
    }
    if (c.batch_idx) {
      batch_idx = host_array(who, c.batch_idx, host.batch_idx, batch, stream);
      cache.batch_idx = batch_idx.data();
    }
    if (c.leftpad) {
      leftpad = host_array(who, c.leftpad, host.leftpad, batch, stream);
      cache.leftpad = leftpad.data();
    }
  }
};

// What the decode kernels take beyond the CPU's rules: q of the cache's type, equal head dims (no MLA
// view), the kernels' layouts, device pointers, f32 rotary tables.
void check_decode_for_cuda(const char* who, const detail::DecodeProblem& p, const TensorView& q, const KVCache& cache,
                           const TensorView& out, const AttentionOptions& opts, const DecodeOptions& dec,
                           const TensorView* lse) {
  if (q.dtype != cache.k.dtype) fail(who, "q", "dtype must be the cache's on CUDA (f32 activations are CPU-only)");
  if (p.head_dim_v != p.head_dim || p.v_in_k)
    fail(who, "cache.v",
         p.v_in_k ? std::string("must not view cache.k's rows on CUDA (the MLA layout is CPU-only)")
                  : "head_dim must equal cache.k's (" + std::to_string(p.head_dim) + ") on CUDA, got " +
                        std::to_string(p.head_dim_v) + " (unequal head dims are CPU-only)");
  require_kernel_layout(who, "q", q);
  require_kernel_layout(who, "out", out);
  require_kernel_layout(who, "cache.k", cache.k);
  require_kernel_layout(who, "cache.v", cache.v);
  if (dec.k_new) {
    require_kernel_layout(who, "k_new", *dec.k_new);
    require_kernel_layout(who, "v_new", *dec.v_new);
  }
  require_lse(who, lse);
  if (opts.alibi_slopes) require_device(who, "alibi_slopes", opts.alibi_slopes.data);
  if (opts.sinks) require_device(who, "sinks", opts.sinks.data);
  if (dec.rotary) {
    if (dec.rotary->dtype != DType::f32)
      fail(who, "rotary.dtype", "must be f32 on CUDA, got " + std::string(dtype_name(dec.rotary->dtype)));
    require_device(who, "rotary.cos", dec.rotary->cos);
    require_device(who, "rotary.sin", dec.rotary->sin);
  }
}

// The kernels' parameters of a validated decode call, but for the split count and the scratch buffers.
cuda_detail::DecodeParams decode_params(const detail::DecodeProblem& p, const TensorView& q, const KVCache& cache,
                                        const TensorView& out, const TensorView* lse, const DecodeOptions& dec) {
  cuda_detail::DecodeParams d{};
  set_views(d, q, cache.k, cache.v, out, lse);
  d.k_head_stride = cache.k.strides[2];
  d.v_head_stride = cache.v.strides[2];
  d.batch = p.batch;
  d.seqlen_q = p.seqlen_q;
  d.heads = p.heads;
  d.kv_heads = p.kv_heads;
  d.head_dim = p.head_dim;
  d.index = detail::cache_index(cache, p.index.seqlen_new, p.index.pages.stride);  // the device's arrays
  d.rule = p.rule;
  d.row_blocks = (p.group() * p.seqlen_q + 15) / 16;
  d.keys_per_split = dec.keys_per_split;
  if (dec.k_new) {
    d.k_new = dec.k_new->data;
    d.v_new = dec.v_new->data;
    copy_strides(d.kns, *dec.k_new);
    copy_strides(d.vns, *dec.v_new);
  }
  d.rotary = p.rotary;  // the tables are device memory (check_decode_for_cuda)
  return d;
}

// The grid's slices: with keys_per_split the most any sequence has (the decode kernel's rule: slices of
// the keys its queries see), else num_splits, else the automatic count.
std::int64_t decode_splits(const detail::DecodeProblem& p, const DecodeOptions& dec,
                           const std::vector<std::int32_t>& seqlens) {
  std::int64_t max_keys = 0, max_slices = 1;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    max_keys = std::max<std::int64_t>(max_keys, seqlens[b] + p.index.seqlen_new);
    if (dec.keys_per_split > 0)
      max_slices = std::max(max_slices, detail::slices_for_keys_per_split(p.mask(b).seen_count(), dec.keys_per_split));
  }
  if (dec.keys_per_split > 0) return max_slices;
  return dec.num_splits > 0 ? dec.num_splits : decode_num_splits(max_keys, p.batch, p.heads, p.kv_heads, p.seqlen_q);
}

// The scratch the launch needs (the split partials, q rotated), allocated and freed on `stream` around it.
void launch_decode(const char* who, cuda_detail::DecodeParams& d, const detail::DecodeProblem& p, Stream stream) {
  void *scratch = nullptr, *q_rot = nullptr;
  if (d.num_splits > 1 || d.keys_per_split > 0) {
    const std::size_t bytes =
        static_cast<std::size_t>(p.batch * p.heads * p.seqlen_q * d.num_splits * (p.head_dim + 2)) * 4;
    check_cuda(who, cudaMallocAsync(&scratch, bytes, stream), "allocating the split partials");
    d.partial = static_cast<float*>(scratch);
  }
  if (d.rotary.enabled()) {
    const std::size_t bytes = static_cast<std::size_t>(p.batch * p.seqlen_q * p.heads * p.head_dim) * 2;
    const int err = cudaMallocAsync(&q_rot, bytes, stream);
    if (err != cudaSuccess && scratch) (void)cudaFreeAsync(scratch, stream);
    check_cuda(who, err, "allocating the rotated queries");
    d.q_rot = q_rot;
  }
  const int err = cuda_detail::launchers().decode(d, p.cache_dtype, stream);
  if (scratch) (void)cudaFreeAsync(scratch, stream);
  if (q_rot) (void)cudaFreeAsync(q_rot, stream);
  check_cuda(who, err, "kernel launch");
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const AttentionOptions& opts, const TensorView* lse, Stream stream) {
  const char* who = "attn::cuda::attention";
  const detail::Problem p = detail::validate(who, q, k, v, &out, opts, lse);
  validate_forward(who, p, q, k, v, out, opts, lse);
  const cuda_detail::FwdParams f = forward_params(p, lse);
  check_cuda(who, cuda_detail::launchers().forward(f, p.dtype, p.seqlen_q, stream), "kernel launch");
}

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const VarlenBatch& vb, const AttentionOptions& opts, const TensorView* lse, Stream stream) {
  const char* who = "attn::cuda::attention_varlen";
  const detail::Problem p = detail::validate_packed(who, q, k, v, out, vb.batch, opts, lse);
  if (!vb.cu_seqlens_q) fail(who, "cu_seqlens_q", "pointer is null");
  if (!vb.cu_seqlens_k) fail(who, "cu_seqlens_k", "pointer is null");
  validate_forward(who, p, p.q, p.k, p.v, p.out, opts, lse);
  require_device(who, "cu_seqlens_q", vb.cu_seqlens_q);
  require_device(who, "cu_seqlens_k", vb.cu_seqlens_k);
  const auto cq = host_array(who, vb.cu_seqlens_q, vb.host_cu_seqlens_q, vb.batch + 1, stream);
  const auto ck = host_array(who, vb.cu_seqlens_k, vb.host_cu_seqlens_k, vb.batch + 1, stream);
  detail::check_varlen_offsets(who, VarlenBatch{cq.data(), ck.data(), vb.batch}, p.seqlen_q, p.seqlen_k);
  launch_varlen(who, p, vb, cq, lse, stream);
}

void attention_varlen_paged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                            const VarlenBatch& vb, const VarlenPages& pages, const AttentionOptions& opts,
                            const TensorView* lse, Stream stream, const std::int32_t* host_block_table) {
  const char* who = "attn::cuda::attention_varlen_paged";
  detail::check_varlen_batch(who, vb.batch);
  if (!vb.cu_seqlens_q) fail(who, "cu_seqlens_q", "pointer is null");
  if (!vb.cu_seqlens_k) fail(who, "cu_seqlens_k", "pointer is null");
  if (!pages.block_table) fail(who, "pages.block_table", "pointer is null");
  // The table's extent (and its stride rule, 0 resolved to max_pages) before a copy of it is sized from them.
  const std::int64_t bt_stride =
      detail::check_block_table(who, "pages.block_table", pages.block_table, pages.max_pages, pages.block_table_stride,
                                vb.batch, k.rank == 4 ? std::max<std::int64_t>(k.shape[1], 1) : 1)
          .stride;
  for (auto [name, ptr] : {std::pair<const char*, const void*>{"cu_seqlens_q", vb.cu_seqlens_q},
                           {"cu_seqlens_k", vb.cu_seqlens_k},
                           {"pages.block_table", pages.block_table}})
    require_device(who, name, ptr);
  const std::int64_t table_len = (vb.batch - 1) * bt_stride + pages.max_pages;
  const auto cq = host_array(who, vb.cu_seqlens_q, vb.host_cu_seqlens_q, vb.batch + 1, stream);
  const auto ck = host_array(who, vb.cu_seqlens_k, vb.host_cu_seqlens_k, vb.batch + 1, stream);
  const auto table = host_array(who, pages.block_table, host_block_table, table_len, stream);
  VarlenPages host_pages = pages;
  host_pages.block_table = table.data();
  const detail::Problem p = detail::validate_packed_paged(
      who, q, k, v, out, VarlenBatch{cq.data(), ck.data(), vb.batch}, host_pages, opts, lse, pages.block_table);
  validate_forward(who, p, p.q, p.k, p.v, p.out, opts, lse);
  launch_varlen(who, p, vb, cq, lse, stream, detail::PageTable{pages.block_table, bt_stride, k.shape[1]});
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                        const TensorView& dout, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& opts, const TensorView* dsink, Stream stream) {
  const char* who = "attn::cuda::attention_backward";
  const detail::BackwardProblem p = detail::validate_backward(who, q, k, v, out, dout, lse, dq, dk, dv, opts, dsink);
  validate_backward_for_cuda(who, p, opts);
  launch_backward(who, p, p.batch, p.seqlen_q, p.seqlen_k, nullptr, stream);
}

void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                               const TensorView& dout, const TensorView& lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const VarlenBatch& vb,
                               const AttentionOptions& opts, const TensorView* dsink, Stream stream) {
  const char* who = "attn::cuda::attention_varlen_backward";
  const detail::BackwardProblem p =
      detail::validate_packed_backward(who, q, k, v, out, dout, lse, dq, dk, dv, vb.batch, opts, dsink);
  if (!vb.cu_seqlens_q) fail(who, "cu_seqlens_q", "pointer is null");
  if (!vb.cu_seqlens_k) fail(who, "cu_seqlens_k", "pointer is null");
  validate_backward_for_cuda(who, p, opts);
  require_device(who, "cu_seqlens_q", vb.cu_seqlens_q);
  require_device(who, "cu_seqlens_k", vb.cu_seqlens_k);
  const auto cq = host_array(who, vb.cu_seqlens_q, vb.host_cu_seqlens_q, vb.batch + 1, stream);
  const auto ck = host_array(who, vb.cu_seqlens_k, vb.host_cu_seqlens_k, vb.batch + 1, stream);
  detail::check_varlen_offsets(who, VarlenBatch{cq.data(), ck.data(), vb.batch}, p.seqlen_q, p.seqlen_k);
  std::int64_t max_q = 0, max_k = 0;
  for (std::int64_t b = 0; b < vb.batch; ++b) {
    max_q = std::max<std::int64_t>(max_q, cq[b + 1] - cq[b]);
    max_k = std::max<std::int64_t>(max_k, ck[b + 1] - ck[b]);
  }
  launch_backward(who, p, vb.batch, max_q, max_k, &vb, stream);
}

std::int64_t decode_num_splits(std::int64_t max_keys, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads,
                               std::int64_t seqlen_q) {
  const char* who = "attn::cuda::decode_num_splits";
  for (auto [name, x] : {std::pair<const char*, std::int64_t>{"batch", batch},
                         {"heads", heads},
                         {"kv_heads", kv_heads},
                         {"seqlen_q", seqlen_q}})
    if (x < 1) fail(who, name, "must be >= 1, got " + std::to_string(x));
  if (heads % kv_heads != 0)
    fail(who, "heads",
         "must be a multiple of kv_heads (" + std::to_string(kv_heads) + "), got " + std::to_string(heads));
  using detail::saturating_mul;
  const std::int64_t rows = saturating_mul(heads / kv_heads, seqlen_q);
  const std::int64_t blocks = saturating_mul(saturating_mul(batch, kv_heads), rows / 16 + (rows % 16 != 0));
  return cuda_detail::gpu_num_splits(max_keys, blocks, sm_count());
}

void attention_decode(const TensorView& q, const KVCache& cache, const TensorView& out, const AttentionOptions& opts,
                      const DecodeOptions& dec, const TensorView* lse, Stream stream, const DecodeHostMirror& host) {
  const char* who = "attn::cuda::attention_decode";
  const HostDecodeArrays h(who, q, cache, host, stream);
  const detail::DecodeProblem p = detail::validate_decode(who, q, h.cache, out, opts, dec, lse);
  check_decode_for_cuda(who, p, q, cache, out, opts, dec, lse);
  cuda_detail::DecodeParams d = decode_params(p, q, cache, out, lse, dec);
  d.num_splits = decode_splits(p, dec, h.seqlens);
  if (d.num_splits > 65535)
    fail(who, "num_splits", "must be <= 65535 on CUDA (a grid dimension), got " + std::to_string(d.num_splits));
  launch_decode(who, d, p, stream);
}

}  // namespace attn::cuda
