"""flash_attn.flash_attn_interface: the public functions, the private _flash_attn_forward /
_flash_attn_backward (and their varlen pair) that some projects call directly, and flash_attn_gpu, the C++
extension's five functions (flash-attn 2.8's signatures)."""
import torch

from .. import _C, _ops
from .._options import AttentionOptions
from .._threads import get_num_threads
from ..interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,  # noqa: F401
                          flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                          flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from ..interface import _dense_weights, _result, _varlen_weights, _window

_WHO = "attn.flash_attn.flash_attn_interface."

# flash-attn's module flag for its Triton (AMD) backend, which its tests import: not this one.
USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The key block of S_dmask's weights (flash-attn's tests rebuild the softmax from them block by block):
    attn's S_dmask holds every row's weights against the row's overall maximum, one block of any length."""
    return 1 << 30


def _options(who, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
             seed) -> AttentionOptions:
    left, right = _window(who, (window_size_left, window_size_right))  # ints, or a named error
    return AttentionOptions(softmax_scale=None if softmax_scale is None else float(softmax_scale),
                            causal=bool(causal), window_left=left, window_right=right, softcap=float(softcap),
                            alibi_slopes=alibi_slopes, dropout_p=float(dropout_p), seed=int(seed),
                            num_threads=get_num_threads(), sinks=None)  # no sinks in flash-attn's private API


def _seed(dropout_p, generator=None) -> int:
    """The dropout mask's seed: 0 without dropout, else drawn from generator (torch's default generator when
    None, so torch.manual_seed replays it)."""
    if dropout_p == 0:
        return 0
    return int(torch.randint(0, 2**62, (1,), generator=generator).item())


def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                        alibi_slopes, return_softmax):
    """-> (out, softmax_lse, S_dmask, rng_state); rng_state holds the dropout seed for the backward."""
    return _forward(_WHO + "_flash_attn_forward", q, k, v, dropout_p, softmax_scale, causal, window_size_left,
                    window_size_right, softcap, alibi_slopes, return_softmax, None)


def _forward(who, q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
             alibi_slopes, return_softmax, generator):
    """_flash_attn_forward, errors naming who, the dropout seed drawn from generator (None: the default)."""
    _ops.require_tensors(who, q=q, k=k, v=v)
    seed = _seed(dropout_p, generator)
    opts = _options(who, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, seed)
    out, lse = _ops._fwd_eager(q.detach(), k.detach(), v.detach(), *opts)
    rng_state = torch.tensor([seed, 0], dtype=torch.int64)
    shape = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    s_dmask = _result(out, lse, True, opts, shape, _dense_weights(q, k, opts))[2] if return_softmax else out.new_empty((0,))
    return out, lse, s_dmask, rng_state


def _softmax_d(dout, out, dropout_p):
    """flash-attn's softmax_d per row of out (..., nheads, d): rowsum(dout * out) * (1 - dropout_p), its kernel's
    dP_sum, in f32 (f64 for f64)."""
    acc = torch.float64 if out.dtype == torch.float64 else torch.float32
    return (dout.to(acc) * out.to(acc)).sum(dim=-1) * (1.0 - float(dropout_p))


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
                         window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None):
    """Writes dq, dk, dv in place (allocated when None); returns softmax_d = rowsum(dout * out) * (1 - dropout_p),
    (batch, nheads, seqlen_q), f32 (f64 for f64). flash-attn's is padded to seqlen_q rounded up to 128
    (flash_attn_gpu.bwd returns that one)."""
    _ops.require_tensors(_WHO + "_flash_attn_backward", dout=dout, q=q, k=k, v=v, out=out)
    dq, dk, dv = (torch.empty_like(t) if g is None else g for g, t in ((dq, q), (dk, k), (dv, v)))
    seed = int(rng_state[0]) if rng_state is not None else 0
    opts = _options(_WHO + "_flash_attn_backward", dropout_p, softmax_scale, causal, window_size_left,
                    window_size_right, softcap, alibi_slopes, seed)
    _C.backward(q.detach(), k.detach(), v.detach(), out.detach(), dout.detach(), softmax_lse, dq, dk, dv, offset=0,
                **opts._asdict())  # the fields are the binding's keywords
    return _softmax_d(dout, out, dropout_p).transpose(1, 2).contiguous()


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                               alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False):
    """-> (out, softmax_lse (nheads, total_q), S_dmask, rng_state), as flash-attn 2.8's; with block_table, k and
    v are a paged cache (num_blocks, page_size, nheads_k, d). max_seqlen_q/k are hints (the lengths come from
    cu_seqlens); zero_tensors changes nothing here (outputs are written whole). leftpad_k and seqused_k are not
    supported: they raise."""
    return _varlen_forward(_WHO + "_flash_attn_varlen_forward", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                           max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                           softcap, alibi_slopes, return_softmax, block_table, leftpad_k, seqused_k, None)


def _varlen_forward(who, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                    causal, window_size_left, window_size_right, softcap, alibi_slopes, return_softmax, block_table,
                    leftpad_k, seqused_k, generator):
    """_flash_attn_varlen_forward, errors naming who, the dropout seed drawn from generator (None: the default)."""
    _ops.require_tensors(who, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    for name, t in (("leftpad_k", leftpad_k), ("seqused_k", seqused_k)):
        if t is not None:
            raise _C.AttnError(f"{who}: {name}: is not supported (pass None; flash_attn_with_kvcache takes a "
                               "cache's lengths and left padding)")
    seed = _seed(dropout_p, generator)
    opts = _options(who, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, seed)
    if block_table is None:
        out, lse = _ops._varlen_fwd_eager(q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k, *opts)
    else:
        out, lse = _ops._varlen_paged_eager(q.detach(), k.detach(), v.detach(), cu_seqlens_q, cu_seqlens_k, block_table,
                                            *opts)
    s_dmask = out.new_empty((0,))
    if return_softmax and block_table is None:
        shape = (len(cu_seqlens_q) - 1, q.shape[1], int(max_seqlen_q), int(max_seqlen_k))
        s_dmask = _result(out, lse, True, opts, shape, _varlen_weights(q, k, cu_seqlens_q, cu_seqlens_k, opts))[2]
    return out, lse, s_dmask, torch.tensor([seed, 0], dtype=torch.int64)


def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                                softcap, alibi_slopes, deterministic, rng_state=None, zero_tensors=False):
    """Writes dq, dk, dv in place (allocated when None); returns softmax_d = rowsum(dout * out) * (1 - dropout_p),
    (nheads, total_q), f32 (f64 for f64). flash-attn's holds sequence b's rows from cu_seqlens_q[b] + 128 b, in
    (nheads, total_q + 128 batch) (flash_attn_gpu.varlen_bwd returns that one). The backward is deterministic
    whatever `deterministic` says."""
    _ops.require_tensors(_WHO + "_flash_attn_varlen_backward", dout=dout, q=q, k=k, v=v, out=out,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    dq, dk, dv = (torch.empty_like(t) if g is None else g for g, t in ((dq, q), (dk, k), (dv, v)))
    seed = int(rng_state[0]) if rng_state is not None else 0
    opts = _options(_WHO + "_flash_attn_varlen_backward", dropout_p, softmax_scale, causal, window_size_left,
                    window_size_right, softcap, alibi_slopes, seed)
    _C.varlen_backward(q.detach(), k.detach(), v.detach(), out.detach(), dout.detach(), softmax_lse, dq, dk, dv,
                       cu_seqlens_q, cu_seqlens_k, None, **opts._asdict())
    return _softmax_d(dout, out, dropout_p).transpose(0, 1).contiguous()


# flash-attn's C++ extension (flash_attn_2_cuda), which its flash_attn_interface binds under this name: the
# five functions with its positional signatures, on the functions above.
from . import flash_attn_gpu  # noqa: E402,F401  (it imports this module's functions)
