"""flash-attn 2.8's functions (flash_attn_interface.py), same signatures, defaults and return values,
on attn's CPU kernels, and on its CUDA backend for CUDA tensors in a build that has it (flash_attn_func
and its packed forms, inference only). Inputs are torch tensors on the CPU (f64, f32, bf16, f16, any
strides: packed qkv and kv are passed as views, without a copy); every function but the kvcache one is
differentiable. NumPy arrays, and other frameworks' CPU arrays through DLPack, are accepted by
flash_attn_func (forward only; it returns NumPy arrays for them). docs/python.md lists what differs."""
import operator
import sys
from typing import Tuple

from . import _C
from . import _threads
from ._options import AttentionOptions
from ._threads import get_num_threads


_ops = None


def _torch_ops():
    """attn._ops, imported on the first call with torch tensors: NumPy callers never import torch."""
    global _ops
    if _ops is None:
        from . import _ops as ops
        _ops = ops
    return _ops


def _window(who, window_size) -> Tuple[int, int]:
    """(left, right) of a window_size, a pair of ints: Python's, NumPy's, anything with __index__. A float
    is refused rather than truncated, as flash-attn's int parameters refuse it."""
    try:
        left, right = window_size
        return operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise _C.AttnError(f"{who}: window_size: must be a pair (left, right) of ints, got {window_size!r}") from None


def _seed(dropout_p: float) -> int:
    if dropout_p == 0:
        return 0
    import torch
    return int(torch.randint(0, 2**62, (1,)).item())  # the default generator: torch.manual_seed replays it


def _options(who, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, sinks=None) -> AttentionOptions:
    left, right = _window(who, window_size)
    return AttentionOptions(softmax_scale=None if softmax_scale is None else float(softmax_scale), causal=bool(causal),
                            window_left=left, window_right=right, softcap=float(softcap), alibi_slopes=alibi_slopes,
                            dropout_p=float(dropout_p), seed=_seed(dropout_p), num_threads=get_num_threads(),
                            sinks=sinks)


# flash-attn pads S_dmask's sequence dims to multiples of this (its seqlen_q_rounded, seqlen_k_rounded).
S_DMASK_ROUND = 128


def _result(out, lse, return_attn_probs, opts, mask_shape, weights_into=None):
    """out, or (out, lse, S_dmask). S_dmask is empty without dropout, as flash-attn's; with dropout it is
    flash-attn's: (batch, nheads, seqlen_q_rounded, seqlen_k_rounded), in out's dtype, the softmax weights
    exp(s_ij - m_i) before the normalisation (m_i the row's largest visible logit: flash-attn's content
    for a single key block, which _get_block_size_n reports), negated where dropout drops them, 0 for
    the keys a row does not see and in the padding. weights_into(w) writes those weights into w of
    mask_shape (attn::softmax_weights)."""
    if not return_attn_probs:
        return out
    dropout_p = opts.dropout_p
    numpy = type(out).__module__ == "numpy"
    if numpy:
        import numpy as np
        acc = np.float64 if out.dtype == np.float64 else np.float32
        new = lambda shape, dtype=acc: np.zeros(shape, dtype=dtype)
    else:
        import torch
        acc = torch.float64 if out.dtype == torch.float64 else torch.float32
        new = lambda shape, dtype=acc: torch.zeros(shape, dtype=dtype)
    if dropout_p == 0:
        return out, lse, new((0,), out.dtype)
    factors, weights = new(mask_shape), new(mask_shape)
    _C.dropout_mask(factors, dropout_p, opts.seed)
    weights_into(weights)
    b, h, sq, sk = mask_shape
    rounded = lambda n: -(-n // S_DMASK_ROUND) * S_DMASK_ROUND
    s_dmask = new((b, h, rounded(sq), rounded(sk)), out.dtype)
    signed = np.where(factors > 0, weights, -weights) if numpy else torch.where(factors > 0, weights, -weights)
    s_dmask[:, :, :sq, :sk] = signed
    return out, lse, s_dmask


def _dense_weights(q, k, opts):
    """weights_into for q (batch, seqlen_q, nheads, d), k (batch, seqlen_k, nheads_k, d)."""
    if type(q).__module__ == "numpy":
        return lambda w: _C.softmax_weights(q, k, w, **opts._asdict())
    ops = _torch_ops()
    return lambda w: _C.softmax_weights(ops._dl(q.detach()), ops._dl(k.detach()), ops._dl(w), **ops._kw(*opts))


def _varlen_weights(q, k, cu_seqlens_q, cu_seqlens_k, opts):
    """weights_into for packed q (total_q, nheads, d), k (total_k, nheads_k, d): sequence by sequence
    into w[b, :, :n_q, :n_k], each with its row of [batch, nheads] ALiBi slopes."""
    def into(w):
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        for b in range(len(cq) - 1):
            if cq[b + 1] == cq[b] or ck[b + 1] == ck[b]:
                continue  # no rows, or rows that see no key: their weights stay 0
            slopes = opts.alibi_slopes
            o = opts._replace(alibi_slopes=slopes[b] if slopes is not None and slopes.dim() == 2 else slopes)
            _dense_weights(q[cq[b]:cq[b + 1]].unsqueeze(0), k[ck[b]:ck[b + 1]].unsqueeze(0), o)(
                w[b:b + 1, :, :cq[b + 1] - cq[b], :ck[b + 1] - ck[b]])
    return into


def _other_dlpack(x) -> bool:
    """An array of another framework that speaks DLPack (JAX, CuPy, ...): not a torch tensor, not NumPy."""
    torch = sys.modules.get("torch")
    return hasattr(x, "__dlpack__") and not (torch is not None and isinstance(x, torch.Tensor))


def _as_numpy(who, **arrays):
    """The arrays as NumPy arrays, zero-copy through DLPack (numpy.from_dlpack) for other frameworks'; a
    producer NumPy cannot take (not on the CPU, or bf16, which NumPy lacks) gets a named error."""
    import numpy as np
    out = []
    for name, a in arrays.items():
        if type(a).__module__ != "numpy":
            if not hasattr(a, "__dlpack__"):
                raise _C.AttnError(f"{who}: {name}: must be a NumPy array or an array with __dlpack__, as q is, got "
                                   f"{type(a).__name__}")
            try:
                a = np.from_dlpack(a)
            except (BufferError, RuntimeError, TypeError, ValueError) as e:
                raise _C.AttnError(f"{who}: {name}: a DLPack array that NumPy cannot take ({e}): the package takes "
                                   "torch tensors, NumPy arrays, or other frameworks' CPU arrays of float64, "
                                   "float32 or float16") from None
        out.append(a)
    return out


def _numpy_forward(q, k, v, opts: AttentionOptions):
    import numpy as np
    b, sq, h, _ = q.shape
    out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
    lse = np.empty((b, h, sq), dtype=np.float64 if q.dtype == np.float64 else np.float32)
    _C.forward(q, k, v, out, lse, **opts._asdict())  # the fields are the binding's keywords
    return out, lse


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, sinks=None):
    """q (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim) -> out like q;
    with return_attn_probs, (out, softmax_lse (batch, nheads, seqlen_q), S_dmask). attn's backward is
    deterministic whatever `deterministic` says. sinks (an attn addition, gpt-oss's attention sinks):
    float32 (nheads,), one logit per head in every row's softmax denominator, differentiable; the lse
    then includes it (docs/sinks.md)."""
    if not (dropout_p or return_attn_probs) and alibi_slopes is None and sinks is None and _ops is not None:
        out = _ops.inference_forward(q, k, v, softmax_scale, causal, window_size, softcap, _threads._num_threads)
        if out is not None:
            return out
    opts = _options("attn.flash_attn_func", dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, sinks)
    if type(q).__module__ == "numpy" or _other_dlpack(q):
        q, k, v = _as_numpy("attn.flash_attn_func", q=q, k=k, v=v)
        out, lse = _numpy_forward(q, k, v, opts)
    else:
        out, lse = _torch_ops().attention(q, k, v, opts, with_lse=return_attn_probs)
    return _result(out, lse, return_attn_probs, opts, (q.shape[0], q.shape[2], q.shape[1], k.shape[1]),
                   _dense_weights(q, k, opts))


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                              sinks=None):
    """qkv (batch, seqlen, 3, nheads, headdim)."""
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal, window_size,
                           softcap, alibi_slopes, deterministic, return_attn_probs, sinks)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, sinks=None):
    """kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, sinks)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, sinks=None):
    """q (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim), cu_seqlens int32 (batch + 1)
    -> out like q; with return_attn_probs, (out, softmax_lse (nheads, total_q), S_dmask). max_seqlen_q
    and max_seqlen_k are not needed on the CPU (the kernel reads cu_seqlens). With block_table int32
    (batch, max_blocks), k and v are a paged cache (num_blocks, page_size, nheads_k, headdim), any
    page_size >= 1, sequence b's key j in block block_table[b, j // page_size] at slot j % page_size,
    cu_seqlens_k giving the key counts; this form is inference only (no gradient)."""
    _ops = _torch_ops()
    opts = _options("attn.flash_attn_varlen_func", dropout_p, softmax_scale, causal, window_size, softcap,
                    alibi_slopes, sinks)
    if block_table is not None:
        out, lse = _ops.varlen_paged_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, opts)
    else:
        out, lse = _ops.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, opts)
    batch = len(cu_seqlens_q) - 1
    return _result(out, lse, return_attn_probs, opts, (batch, q.shape[1], int(max_seqlen_q), int(max_seqlen_k)),
                   _varlen_weights(q, k, cu_seqlens_q, cu_seqlens_k, opts))


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, sinks=None):
    """qkv (total, 3, nheads, headdim)."""
    return flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, sinks=sinks)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False, sinks=None):
    """kv (total_k, 2, nheads_k, headdim)."""
    return flash_attn_varlen_func(q, kv[:, 0], kv[:, 1], cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs, sinks=sinks)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            sinks=None, keys_per_split=0, k_scale=None, v_scale=None, quantized_query=False):
    """Decode over a KV cache: q (batch, seqlen_q, nheads, headdim); k_cache, v_cache (batch, seqlen_cache,
    nheads_k, headdim), or (num_blocks, page_size, nheads_k, headdim) with block_table int32 (batch,
    max_blocks) for any page_size >= 1; k, v (batch, seqlen_new, nheads_k, headdim) are written into the
    cache in place at cache_seqlens before attending (cache_seqlens is not advanced, as in flash-attn).
    cache_seqlens: int32 tensor (batch,), an int, or None (the whole cache). cache_batch_idx int32 (batch,):
    sequence b uses cache row cache_batch_idx[b]; cache_leftpad int32 (batch,): its keys start at that
    position (both for contiguous caches, as in flash-attn). rotary_cos, rotary_sin (seqlen_ro,
    rotary_dim / 2), with k and v: k rotated at positions cache_seqlens + t, q at cache_seqlens (+ i when
    causal or windowed), pairs (c, c + rotary_dim / 2) or, rotary_interleaved, (2c, 2c + 1), as in
    flash-attn. Returns out like q, or (out, softmax_lse (batch, nheads, seqlen_q)). Not differentiable,
    as in flash-attn. attn's additions: sinks (float32 (nheads,)), and keys_per_split > 0 for
    batch-invariant decode (each sequence's slices depend on its own length only, so its output is
    bitwise the same in any batch; docs/decode.md).

    Quantized caches: k_cache, v_cache of dtype torch.int8, torch.float8_e4m3fn or torch.float8_e5m2 with
    k_scale, v_scale (float32 or float16): a code stands for float(code) * scale. A scale tensor is
    (rows, slots, nheads_k, groups) like the cache's first three dims (groups dividing headdim: 1 per
    token, headdim / 32 for llama.cpp's q8_0 blocks), or (rows, slots, nheads_k) (per token), or
    (nheads_k,) (per kv head, vLLM's and FA3's convention), or a 0-d tensor (per tensor); the last two
    are shared, and k, v are quantized with them; per-token scales of the appended positions are
    computed (amax / 127, 448, 57344) and written into k_scale, v_scale (docs/decode.md).
    quantized_query=True (an int8 cache only, CPU): llama.cpp's fast mode, opt-in; each query row is
    rounded to int8 codes with one scale and q . k runs on the codes, which adds that rounding's error
    to the scores (include/attn/decode.hpp; docs/decode.md "quantized_query")."""
    import contextlib
    import torch
    _ops = _torch_ops()
    _ops.require_tensors("attn.flash_attn_with_kvcache", q=q, k_cache=k_cache, v_cache=v_cache,
                         **{name: t for name, t in (("k", k), ("v", v)) if t is not None})
    left, right = _window("attn.flash_attn_with_kvcache", window_size)
    on_cuda = q.is_cuda  # attn's CUDA backend (docs/python.md, "CUDA tensors")
    if on_cuda and quantized_query:
        raise _C.AttnError("attn.flash_attn_with_kvcache: quantized_query: the CUDA backend has no quantized caches; "
                           "it is a CPU mode")
    if on_cuda:
        _ops.require_cuda("attn.flash_attn_with_kvcache", q, k_cache=k_cache, v_cache=v_cache, k=k, v=v,
                          cache_seqlens=cache_seqlens, block_table=block_table, cache_batch_idx=cache_batch_idx,
                          cache_leftpad=cache_leftpad, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                          alibi_slopes=alibi_slopes, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    else:
        _ops.require_cpu("attn.flash_attn_with_kvcache", q, k_cache, v_cache)
    k_cache, v_cache, k_scale, v_scale, cache_type, cache_seqlens = _cache_arguments(
        "attn.flash_attn_with_kvcache", q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table)
    table = torch.float64 if k_cache.dtype == torch.float64 else torch.float32
    to_table = lambda t: None if t is None else t.detach().to(table).contiguous()
    batch, seqlen_q, heads, _ = q.shape
    # v's head dim (MLA: 512 of 576)
    out = torch.empty(q.shape[:-1] + v_cache.shape[-1:], dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float64 if k_cache.dtype == torch.float64 else torch.float32,
                      device=q.device)
    detach = lambda t: None if t is None else t.detach()
    kernel, extra = ((_C.kvcache_cuda, dict(stream=_ops.cuda_stream(q))) if on_cuda
                     else (_C.kvcache, dict(quantized_query=bool(quantized_query))))
    with torch.cuda.device(q.device) if on_cuda else contextlib.nullcontext():
        kernel(detach(q), detach(k_cache), detach(v_cache), out, lse if return_softmax_lse else None, cache_seqlens,
               block_table, detach(k), detach(v), cache_batch_idx, cache_leftpad, to_table(rotary_cos),
               to_table(rotary_sin), bool(rotary_interleaved), num_splits=int(num_splits),
               keys_per_split=int(keys_per_split),
               softmax_scale=None if softmax_scale is None else float(softmax_scale), causal=bool(causal),
               window_left=left, window_right=right, softcap=float(softcap), alibi_slopes=alibi_slopes,
               num_threads=get_num_threads(), sinks=detach(sinks), k_scale=k_scale, v_scale=v_scale,
               cache_type=cache_type, **extra)
    return (out, lse) if return_softmax_lse else out


def _cache_arguments(who, q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table):
    """flash_attn_with_kvcache's cache arguments as the bindings take them: (k_cache, v_cache, k_scale,
    v_scale, cache_type, cache_seqlens). A quantized cache (cache_type "i8", "fp8_e4m3" or "fp8_e5m2")
    needs both scales and one code type, and goes as uint8 codes with rank-4 scale views; cache_seqlens
    None (the whole cache) or an int becomes an int32 tensor (batch,) on q's device."""
    import torch
    cache_type = _QUANTIZED.get(k_cache.dtype, "")
    if cache_type:
        if k_scale is None or v_scale is None:
            raise _C.AttnError(who + ": " + ("k_scale" if k_scale is None else "v_scale") +
                               ": required for a quantized cache (k_cache is " + str(k_cache.dtype) + ")")
        if v_cache.dtype != k_cache.dtype:
            raise _C.AttnError(who + ": v_cache: dtype must match k_cache's (" + str(k_cache.dtype) + "), got " +
                               str(v_cache.dtype))
        k_scale, v_scale = _scale_view(k_scale, k_cache), _scale_view(v_scale, k_cache)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    if cache_seqlens is None or isinstance(cache_seqlens, int):
        full = k_cache.shape[1] * (block_table.shape[1] if block_table is not None else 1)
        cache_seqlens = torch.full((q.shape[0],), full if cache_seqlens is None else cache_seqlens,
                                   dtype=torch.int32, device=q.device)
    return k_cache, v_cache, k_scale, v_scale, cache_type, cache_seqlens


def _quantized_types():
    import torch
    types = {torch.int8: "i8"}
    for name, code in (("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")):
        if hasattr(torch, name):
            types[getattr(torch, name)] = code
    return types


class _LazyQuantized(dict):  # torch is imported on first use, as everywhere in this module
    def get(self, key, default=None):
        if not self:
            self.update(_quantized_types())
        return dict.get(self, key, default)


_QUANTIZED = _LazyQuantized()


def _scale_view(s, k_cache):
    """A scale tensor as attn's rank-4 view [rows, slots, nheads_k, groups] (0 strides where shared)."""
    rows, slots, kv_heads = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    s = s.detach()
    if s.dim() == 0:
        return s.reshape(1, 1, 1, 1).expand(rows, slots, kv_heads, 1)
    if s.dim() == 1 and s.shape[0] == kv_heads:
        return s.reshape(1, 1, kv_heads, 1).expand(rows, slots, kv_heads, 1)
    if s.dim() == 3:
        return s.unsqueeze(-1)
    return s
