// flash_attn_with_kvcache's arrays as the decode entry points take them (attn::attention_decode and
// attn::cuda::attention_decode), and the int32 arrays of decode and varlen calls (seqlens, cu_seqlens,
// block tables), shared by the CPU and CUDA bindings; templates over the array type, like views.hpp.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "attn/decode.hpp"
#include "attn/varlen.hpp"
#include "views.hpp"

namespace attn_py {

// A quantized cache's codes: a 4-D uint8 array (the Python layer views torch's int8 and float8 tensors
// as uint8, which every DLPack exporter supports) and the type they hold ("i8", "fp8_e4m3", "fp8_e5m2").
template <class A>
TensorView quantized_view_of(const char* who, const char* arg, const A& a, const std::string& type) {
  if (a.dtype() != nb::dtype<std::uint8_t>()) reject(who, arg, "a quantized cache's codes must come as uint8");
  const attn::DType t =
      type == "i8"         ? attn::DType::i8
      : type == "fp8_e4m3" ? attn::DType::fp8_e4m3
      : type == "fp8_e5m2"
          ? attn::DType::fp8_e5m2
          : (reject(who, "cache_type", "must be i8, fp8_e4m3 or fp8_e5m2, got " + type), attn::DType::i8);
  if (a.ndim() != 4) reject(who, arg, "must have 4 dimensions, got " + std::to_string(a.ndim()));
  TensorView v;
  v.dtype = t;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.rank = 4;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = static_cast<std::int64_t>(a.shape(i));
    v.strides[i] = a.stride(i);
  }
  return v;
}

// `want_name` says what `want` counts ("batch", "batch + 1").
template <class A>
const std::int32_t* int32_data(const char* who, const char* arg, const A& a, std::int64_t want,
                               const char* want_name = "batch") {
  if (a.dtype() != nb::dtype<std::int32_t>() || a.ndim() != 1 || (a.shape(0) > 1 && a.stride(0) != 1))
    reject(who, arg, "must be a contiguous 1-D int32 array");
  if (static_cast<std::int64_t>(a.shape(0)) != want)
    reject(who, arg,
           std::string("must hold ") + want_name + " = " + std::to_string(want) + " entries, got " +
               std::to_string(a.shape(0)));
  return static_cast<const std::int32_t*>(a.data());
}

// A block table: int32 [batch, max_pages], unit stride along pages (any row stride).
template <class A>
attn::VarlenPages pages_of(const char* who, const A& bt, std::int64_t batch) {
  if (bt.dtype() != nb::dtype<std::int32_t>() || bt.ndim() != 2 || (bt.shape(1) > 1 && bt.stride(1) != 1) ||
      static_cast<std::int64_t>(bt.shape(0)) != batch)
    reject(who, "block_table", "must be int32 [batch, max_pages] with unit stride along pages");
  const auto max_pages = static_cast<std::int64_t>(bt.shape(1));
  return {static_cast<const std::int32_t*>(bt.data()), max_pages, bt.shape(0) > 1 ? bt.stride(0) : max_pages};
}

// The batch of a varlen call (attn/varlen.hpp, both backends), from its cu_seqlens arrays (batch + 1
// int32 offsets each).
template <class A>
attn::VarlenBatch varlen_batch(const char* who, const A& cu_seqlens_q, const A& cu_seqlens_k) {
  const std::int64_t batch = static_cast<std::int64_t>(cu_seqlens_q.shape(0)) - 1;
  return {int32_data(who, "cu_seqlens_q", cu_seqlens_q, batch + 1, "batch + 1"),
          int32_data(who, "cu_seqlens_k", cu_seqlens_k, batch + 1, "batch + 1"), batch};
}

// The views, the cache and the decode options of one call. It holds what dec points to (k_new, v_new,
// the rotary tables), so it is neither copied nor moved.
template <class A>
struct DecodeCall {
  TensorView q, out, lse, k_new, v_new;
  attn::KVCache cache;
  attn::DecodeOptions dec;
  attn::RotaryTables rotary;
  bool has_lse = false;

  DecodeCall(const DecodeCall&) = delete;
  DecodeCall& operator=(const DecodeCall&) = delete;

  // cache_seqlens int32 [batch]; block_table int32 [batch, max_pages] (row stride free); cache_type ""
  // or a quantized cache's type (its codes as uint8).
  DecodeCall(const char* who, const A& q_, const A& k_cache, const A& v_cache, const A& out_,
             const std::optional<A>& lse_, const A& cache_seqlens, const std::optional<A>& block_table,
             const std::optional<A>& k_new_, const std::optional<A>& v_new_, const std::optional<A>& batch_idx,
             const std::optional<A>& leftpad, const std::optional<A>& rotary_cos, const std::optional<A>& rotary_sin,
             bool rotary_interleaved, std::int64_t num_splits, std::int64_t keys_per_split,
             const std::optional<A>& k_scale, const std::optional<A>& v_scale, const std::string& cache_type,
             bool quantized_query = false) {
    q = view_of(who, "q", q_, 4);
    out = view_of(who, "out", out_, 4);
    if (cache_type.empty()) {
      cache.k = view_of(who, "k_cache", k_cache, 4);
      cache.v = view_of(who, "v_cache", v_cache, 4);
    } else {  // a quantized cache: its bytes (torch's int8 / float8 tensors viewed as uint8) and their type
      cache.k = quantized_view_of(who, "k_cache", k_cache, cache_type);
      cache.v = quantized_view_of(who, "v_cache", v_cache, cache_type);
    }
    if (k_scale) cache.k_scale = view_of(who, "k_scale", *k_scale, 4);
    if (v_scale) cache.v_scale = view_of(who, "v_scale", *v_scale, 4);
    cache.seqlens = int32_data(who, "cache_seqlens", cache_seqlens, q.shape[0]);
    if (block_table) {
      const attn::VarlenPages t = pages_of(who, *block_table, q.shape[0]);
      cache.block_table = t.block_table;
      cache.max_pages = t.max_pages;
      cache.block_table_stride = t.block_table_stride;
    }
    if (batch_idx) cache.batch_idx = int32_data(who, "cache_batch_idx", *batch_idx, q.shape[0]);
    if (leftpad) cache.leftpad = int32_data(who, "cache_leftpad", *leftpad, q.shape[0]);
    dec.num_splits = num_splits;
    dec.keys_per_split = keys_per_split;
    dec.quantized_query = quantized_query;
    if (rotary_cos || rotary_sin) set_rotary(who, rotary_cos, rotary_sin, rotary_interleaved);
    if (k_new_) k_new = view_of(who, "k", *k_new_, 4), dec.k_new = &k_new;
    if (v_new_) v_new = view_of(who, "v", *v_new_, 4), dec.v_new = &v_new;
    if (lse_) lse = view_of(who, "lse", *lse_, 3), has_lse = true;
  }

  const TensorView* lse_ptr() const { return has_lse ? &lse : nullptr; }

 private:
  void set_rotary(const char* who, const std::optional<A>& rotary_cos, const std::optional<A>& rotary_sin,
                  bool interleaved) {
    if (!rotary_cos || !rotary_sin) reject(who, rotary_cos ? "rotary_sin" : "rotary_cos", "both or neither");
    const A &c = *rotary_cos, &s = *rotary_sin;
    for (auto [name, t] : {std::pair<const char*, const A*>{"rotary_cos", &c}, {"rotary_sin", &s}})
      if (t->ndim() != 2 || t->dtype() != c.dtype() || t->shape(0) != c.shape(0) || t->shape(1) != c.shape(1) ||
          (t->shape(1) > 1 && t->stride(1) != 1) || (t->shape(0) > 1 && t->stride(0) != t->shape(1)))
        reject(who, name, "must be dense [seqlen_ro, rotary_dim / 2] arrays of one dtype");
    rotary.cos = c.data();
    rotary.sin = s.data();
    rotary.dtype = dtype_of(who, "rotary_cos", c);
    rotary.positions = static_cast<std::int64_t>(c.shape(0));
    rotary.rotary_dim = 2 * static_cast<std::int64_t>(c.shape(1));
    rotary.interleaved = interleaved;
    dec.rotary = &rotary;
  }
};

}  // namespace attn_py
