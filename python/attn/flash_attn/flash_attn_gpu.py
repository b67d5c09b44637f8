"""flash-attn 2.8's C++ extension, flash_attn_2_cuda, which its flash_attn_interface imports as
`flash_attn_gpu` (code built on flash-attn, and parts of its tests, call it directly), on attn's CPU kernels:

    fwd(q, k, v, out_, alibi_slopes_, p_dropout, softmax_scale, is_causal, window_size_left,
        window_size_right, softcap, return_softmax, gen_) -> [out, softmax_lse, S_dmask, rng_state]
    varlen_fwd(q, k, v, out_, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
               max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal,
               window_size_left, window_size_right, softcap, return_softmax, gen_[, num_splits])
               -> [out, softmax_lse, S_dmask, rng_state]
    bwd(dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, alibi_slopes_, p_dropout, softmax_scale, is_causal,
        window_size_left, window_size_right, softcap, deterministic, gen_, rng_state)
        -> [dq, dk, dv, softmax_d (batch, nheads, seqlen_q rounded up to 128)]
    varlen_bwd(dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, cu_seqlens_q, cu_seqlens_k, alibi_slopes_,
               max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal,
               window_size_left, window_size_right, softcap, deterministic, gen_, rng_state)
               -> [dq, dk, dv, softmax_d (nheads, total_q + 128 batch)]
    fwd_kvcache(q, kcache, vcache, k_, v_, seqlens_k_, rotary_cos_, rotary_sin_, cache_batch_idx_, leftpad_k_,
                block_table_, alibi_slopes_, out_, softmax_scale, is_causal, window_size_left,
                window_size_right, softcap, is_rotary_interleaved, num_splits) -> [out, softmax_lse]

Positional parameters, as the extension's (pybind11 names none), and lists, as it returns them. Each calls
the private function of flash_attn_interface (or flash_attn_with_kvcache) that flash-attn's Python layer
puts on top of it, so the results are theirs bit for bit. out_, dq_, dk_, dv_: None, or a tensor the result
is written into and which is returned. gen_: None, or a CPU torch.Generator the dropout seed is drawn from
(None: torch's default generator), as in flash-attn 2.8; any other value raises "the RNG `generator`
argument is no longer supported", flash-attn's error after 2.8 (where the slot must be None), an
attn.AttnError, which is a RuntimeError as flash-attn's is. softmax_scale None means 1/sqrt(head_dim)
(flash-attn's Python layer computes it before calling the extension). varlen_fwd's seqused_k and its
num_splits (flash-attn after 2.8) are _flash_attn_varlen_forward's; fwd_kvcache's num_splits is
flash_attn_with_kvcache's. Bad input raises attn.AttnError, named.
"""
import torch

from .. import _C, _ops
from ..interface import S_DMASK_ROUND, flash_attn_with_kvcache
from . import flash_attn_interface as _fi

_WHO = "attn.flash_attn.flash_attn_gpu."


def _rounded(n: int) -> int:
    return -(-n // S_DMASK_ROUND) * S_DMASK_ROUND


def _generator(who, gen_):
    """gen_: None or a CPU torch.Generator (flash-attn 2.8's slot); anything else gets the error of flash-attn
    after 2.8, whose slot must be None, with its text."""
    if gen_ is None or (isinstance(gen_, torch.Generator) and gen_.device.type == "cpu"):
        return gen_
    if isinstance(gen_, torch.Generator):
        raise _C.AttnError(f"{who}: gen_: must be None or a CPU torch.Generator, got Generator on {gen_.device}")
    raise _C.AttnError(f"{who}: gen_: the RNG `generator` argument is no longer supported and must be None "
                       "(flash-attn after 2.8; a CPU torch.Generator is taken, as flash-attn 2.8 took one), got "
                       f"{type(gen_).__name__}")


def _check_into(who, name, given, like, shape):
    """A preallocated output (out_, dq_, ...) of the result's shape, like's dtype and device, checked before
    anything runs."""
    if given is None:
        return
    _ops.require_tensors(who, **{name: given})
    if tuple(given.shape) != tuple(shape) or given.dtype != like.dtype or given.device != like.device:
        raise _C.AttnError(f"{who}: {name}: must have shape {tuple(shape)}, dtype {like.dtype} and device "
                           f"{like.device}, as the result, got {tuple(given.shape)}, {given.dtype}, {given.device}")


def _into(given, result):
    if given is None:
        return result
    given.copy_(result)
    return given


def _grads(who, q, k, v, dq_, dk_, dv_):
    """dq, dk, dv: the given tensors, checked, or new ones."""
    for name, g, t in (("dq_", dq_, q), ("dk_", dk_, k), ("dv_", dv_, v)):
        _check_into(who, name, g, t, t.shape)
    return tuple(torch.empty_like(t) if g is None else g for g, t in ((dq_, q), (dk_, k), (dv_, v)))


def _rng(p_dropout, gen_, rng_state):
    """The backward's rng_state: the forward's, or, as in flash-attn, a new draw when none is given."""
    if rng_state is None and p_dropout > 0:
        return torch.tensor([_fi._seed(p_dropout, gen_), 0], dtype=torch.int64)
    return rng_state


def _needs_dropout(who, return_softmax, p_dropout):
    if return_softmax and not p_dropout > 0:
        raise _C.AttnError(f"{who}: return_softmax: needs p_dropout > 0 (S_dmask carries the dropout pattern; "
                           f"flash-attn's rule), got p_dropout={p_dropout}")


def fwd(q, k, v, out_, alibi_slopes_, p_dropout, softmax_scale, is_causal, window_size_left, window_size_right,
        softcap, return_softmax, gen_, /):
    """mha_fwd: q (batch, seqlen_q, nheads, d), k, v (batch, seqlen_k, nheads_k, d) -> [out, softmax_lse (batch,
    nheads, seqlen_q), S_dmask, rng_state]: _flash_attn_forward's."""
    who = _WHO + "fwd"
    _ops.require_tensors(who, q=q, k=k, v=v)
    gen_ = _generator(who, gen_)
    _check_into(who, "out_", out_, q, q.shape[:-1] + v.shape[-1:])
    _needs_dropout(who, return_softmax, p_dropout)
    out, lse, s_dmask, rng_state = _fi._forward(who, q, k, v, p_dropout, softmax_scale, is_causal, window_size_left,
                                                window_size_right, softcap, alibi_slopes_, return_softmax, gen_)
    return [_into(out_, out), lse, s_dmask, rng_state]


def varlen_fwd(q, k, v, out_, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
               max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left,
               window_size_right, softcap, return_softmax, gen_, num_splits=0, /):
    """mha_varlen_fwd: q (total_q, nheads, d), k, v (total_k, nheads_k, d) or a paged cache with block_table ->
    [out, softmax_lse (nheads, total_q), S_dmask, rng_state]: _flash_attn_varlen_forward's (seqused_k and
    num_splits as there; leftpad_k raises there)."""
    who = _WHO + "varlen_fwd"
    _ops.require_tensors(who, q=q, k=k, v=v)
    gen_ = _generator(who, gen_)
    _check_into(who, "out_", out_, q, q.shape[:-1] + v.shape[-1:])
    _needs_dropout(who, return_softmax, p_dropout)
    out, lse, s_dmask, rng_state = _fi._varlen_forward(
        who, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, is_causal,
        window_size_left, window_size_right, softcap, alibi_slopes, return_softmax, block_table, leftpad_k, seqused_k,
        gen_, num_splits)
    return [_into(out_, out), lse, s_dmask, rng_state]


def bwd(dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, alibi_slopes_, p_dropout, softmax_scale, is_causal,
        window_size_left, window_size_right, softcap, deterministic, gen_, rng_state, /):
    """mha_bwd -> [dq, dk, dv, softmax_d]: _flash_attn_backward's gradients and its softmax_d, zero-padded to
    (batch, nheads, seqlen_q rounded up to 128) as flash-attn's kernel leaves it."""
    who = _WHO + "bwd"
    _ops.require_tensors(who, dout=dout, q=q, k=k, v=v, out=out, softmax_lse=softmax_lse)
    gen_ = _generator(who, gen_)
    dq, dk, dv = _grads(who, q, k, v, dq_, dk_, dv_)
    d = _fi._flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, p_dropout, softmax_scale, is_causal,
                                 window_size_left, window_size_right, softcap, alibi_slopes_, deterministic,
                                 _rng(p_dropout, gen_, rng_state))
    softmax_d = d.new_zeros(d.shape[:-1] + (_rounded(d.shape[-1]),))
    softmax_d[..., :d.shape[-1]] = d
    return [dq, dk, dv, softmax_d]


def varlen_bwd(dout, q, k, v, out, softmax_lse, dq_, dk_, dv_, cu_seqlens_q, cu_seqlens_k, alibi_slopes_,
               max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left,
               window_size_right, softcap, deterministic, gen_, rng_state, /):
    """mha_varlen_bwd -> [dq, dk, dv, softmax_d]: _flash_attn_varlen_backward's gradients and its softmax_d in
    flash-attn's layout, (nheads, total_q + 128 batch), sequence b's rows from cu_seqlens_q[b] + 128 b, zeros
    between."""
    who = _WHO + "varlen_bwd"
    _ops.require_tensors(who, dout=dout, q=q, k=k, v=v, out=out, softmax_lse=softmax_lse, cu_seqlens_q=cu_seqlens_q,
                         cu_seqlens_k=cu_seqlens_k)
    gen_ = _generator(who, gen_)
    dq, dk, dv = _grads(who, q, k, v, dq_, dk_, dv_)
    d = _fi._flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                        max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, is_causal,
                                        window_size_left, window_size_right, softcap, alibi_slopes_, deterministic,
                                        _rng(p_dropout, gen_, rng_state), zero_tensors)
    batch, total_q = len(cu_seqlens_q) - 1, d.shape[-1]  # cu_seqlens_q was validated by the backward
    lengths = cu_seqlens_q.to(torch.int64).diff()
    rows = torch.arange(total_q) + S_DMASK_ROUND * torch.repeat_interleave(torch.arange(batch), lengths)
    softmax_d = d.new_zeros((d.shape[0], total_q + S_DMASK_ROUND * batch))
    softmax_d[:, rows] = d
    return [dq, dk, dv, softmax_d]


def fwd_kvcache(q, kcache, vcache, k_, v_, seqlens_k_, rotary_cos_, rotary_sin_, cache_batch_idx_, leftpad_k_,
                block_table_, alibi_slopes_, out_, softmax_scale, is_causal, window_size_left, window_size_right,
                softcap, is_rotary_interleaved, num_splits, /):
    """mha_fwd_kvcache -> [out, softmax_lse (batch, nheads, seqlen_q)]: flash_attn_with_kvcache's, k_ and v_
    appended into the caches in place."""
    who = _WHO + "fwd_kvcache"
    _ops.require_tensors(who, q=q, kcache=kcache, vcache=vcache)
    _check_into(who, "out_", out_, q, q.shape[:-1] + vcache.shape[-1:])
    out, lse = flash_attn_with_kvcache(
        q, kcache, vcache, k=k_, v=v_, rotary_cos=rotary_cos_, rotary_sin=rotary_sin_, cache_seqlens=seqlens_k_,
        cache_batch_idx=cache_batch_idx_, cache_leftpad=leftpad_k_, block_table=block_table_,
        softmax_scale=softmax_scale, causal=is_causal, window_size=(window_size_left, window_size_right),
        softcap=softcap, rotary_interleaved=is_rotary_interleaved, alibi_slopes=alibi_slopes_, num_splits=num_splits,
        return_softmax_lse=True)
    return [_into(out_, out), lse]
