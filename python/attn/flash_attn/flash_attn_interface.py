"""flash_attn.flash_attn_interface: the public functions, the private _flash_attn_forward /
_flash_attn_backward (and their varlen pair) that some projects call directly, and flash_attn_gpu, the C++
extension's five functions (flash-attn 2.8's signatures)."""
import operator

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
    if q.is_cuda:  # attn's CUDA backend (what ring-flash-attn and other libraries on these names call per block)
        _ops._require_cuda_call(who, q, k, v, opts)
        if return_softmax:
            raise _C.AttnError(f"{who}: return_softmax: S_dmask is CPU-only (the CUDA backend has no dropout)")
        out, lse = _ops._cuda_fwd(q.detach(), k.detach(), v.detach(), *opts)
        return out, lse, out.new_empty((0,)), torch.tensor([seed, 0], dtype=torch.int64)
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
    if q.is_cuda:
        _ops._require_cuda_call(_WHO + "_flash_attn_backward", q, k, v, opts)
        with torch.cuda.device(q.device):
            _C.backward_cuda(q.detach(), k.detach(), v.detach(), out.detach(), dout.detach(), softmax_lse, dq, dk, dv,
                             stream=_ops.cuda_stream(q), offset=0, **opts._asdict())
    else:
        _C.backward(q.detach(), k.detach(), v.detach(), out.detach(), dout.detach(), softmax_lse, dq, dk, dv, offset=0,
                    **opts._asdict())  # the fields are the binding's keywords
    return _softmax_d(dout, out, dropout_p).transpose(1, 2).contiguous()


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                               alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False, num_splits=0):
    """-> (out, softmax_lse (nheads, total_q), S_dmask, rng_state), as flash-attn 2.8's; with block_table, k and
    v are a paged cache (num_blocks, page_size, nheads_k, d). max_seqlen_q/k are hints (the lengths come from
    cu_seqlens); zero_tensors changes nothing here (outputs are written whole). seqused_k, int32 (batch,): only
    the first seqused_k[b] keys of sequence b are used (0 <= seqused_k[b] <= its key count, cu_seqlens_k[b + 1]
    - cu_seqlens_k[b]). num_splits (flash-attn after 2.8) is a hint, with flash-attn's rule: > 1 with a
    block_table raises, except for its split-KV decode (_check_num_splits). leftpad_k is not supported: it
    raises."""
    return _varlen_forward(_WHO + "_flash_attn_varlen_forward", q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                           max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
                           softcap, alibi_slopes, return_softmax, block_table, leftpad_k, seqused_k, None, num_splits)


def _key_counts(who, cu_seqlens_k, batch, total_k):
    """Each sequence's key count from cu_seqlens_k, checked by the kernels' own rule (_C.check_cu_seqlens: int32
    (batch + 1,), [0] = 0, non-decreasing, [batch] = total_k unless None) before seqused_k is compared with them."""
    _C.check_cu_seqlens(who, "cu_seqlens_k", cu_seqlens_k.detach().cpu().contiguous(), batch,
                        -1 if total_k is None else int(total_k))
    cu = cu_seqlens_k.tolist()
    return [cu[b + 1] - cu[b] for b in range(batch)]


def _used_keys(who, seqused_k, cu_seqlens_q, cu_seqlens_k, k, v, paged):
    """flash-attn's seqused_k (mha_varlen_fwd): sequence b attends to only the first seqused_k[b] of its keys (those
    from cu_seqlens_k[b] on; with a block_table, the first of its pages' keys), its causal mask and window
    aligned to that count. -> (k, v, cu_seqlens_k) of the same problem with cu_seqlens_k counting only the used
    keys: those keys gathered (a paged cache is read through block_table as it is). Checked before anything
    runs: int32 CPU (batch,), batch = len(cu_seqlens_q) - 1, and 0 <= seqused_k[b] <= sequence b's key count."""
    _ops.require_tensors(who, seqused_k=seqused_k)
    batch = cu_seqlens_q.numel() - 1  # flash-attn's batch
    if seqused_k.dtype != torch.int32 or tuple(seqused_k.shape) != (batch,) or seqused_k.device.type != "cpu":
        raise _C.AttnError(f"{who}: seqused_k: must be an int32 CPU tensor of shape (batch,) = ({batch},), batch = "
                           f"len(cu_seqlens_q) - 1, got {seqused_k.dtype} of shape {tuple(seqused_k.shape)} on "
                           f"{seqused_k.device}")
    counts = _key_counts(who, cu_seqlens_k, batch, None if paged else k.shape[0])
    used = seqused_k.tolist()
    for b, (n, count) in enumerate(zip(used, counts)):
        if not 0 <= n <= count:
            raise _C.AttnError(f"{who}: seqused_k: must satisfy 0 <= seqused_k[b] <= cu_seqlens_k[b + 1] - "
                               f"cu_seqlens_k[b] (sequence b's key count), got seqused_k[{b}] = {n} with {count} "
                               "keys")
    if used == counts:
        return k, v, cu_seqlens_k
    lengths = seqused_k.to(torch.int64)
    cu_used = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))
    if paged:
        return k, v, cu_used.to(torch.int32)
    # key i of the gathered keys: sequence b's key i - cu_used[b], at cu_seqlens_k[b] + i - cu_used[b]
    shift = cu_seqlens_k[:-1].to(torch.int64) - cu_used[:-1]
    index = torch.arange(int(cu_used[-1])) + torch.repeat_interleave(shift, lengths)
    return k.index_select(0, index), v.index_select(0, index), cu_used.to(torch.int32)


def _check_num_splits(who, num_splits, q, k, paged, max_seqlen_q, dropout_p, causal, left, right, alibi_slopes):
    """num_splits as flash-attn's mha_varlen_fwd takes it (after 2.8): an int, a hint for its split-KV kernel that
    changes nothing here. Its rules: for its split-KV decode (one query per sequence, more query heads than key
    heads, no window after causal = False for one query, no dropout or ALiBi, head dim a multiple of 8),
    num_splits <= 128; otherwise, with a block_table, num_splits <= 1; otherwise unused."""
    try:
        n = operator.index(num_splits)
    except TypeError:
        raise _C.AttnError(f"{who}: num_splits: must be an int, got {type(num_splits).__name__}") from None
    if n <= 1:
        return
    if max_seqlen_q == 1 and alibi_slopes is None:
        causal = False  # flash-attn: causal is the same as not for one query
    right = 0 if causal else right
    decode = (max_seqlen_q == 1 and q.dim() == 3 and k.dim() in (3, 4) and q.shape[1] > k.shape[-2] and left < 0
              and right < 0 and float(dropout_p) == 0 and q.shape[-1] % 8 == 0 and alibi_slopes is None)
    if decode and n > 128:
        raise _C.AttnError(f"{who}: num_splits: num_splits > 128 not supported (flash-attn's split-KV decode), got {n}")
    if not decode and paged:
        raise _C.AttnError(f"{who}: num_splits: num_splits > 1 is not supported for varlen paged KV (flash-attn's "
                           "rule: 0 or 1, except for one query per sequence with more query heads than key heads and "
                           f"no window, dropout or ALiBi, which takes up to 128), got {n}")


def _varlen_forward(who, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                    causal, window_size_left, window_size_right, softcap, alibi_slopes, return_softmax, block_table,
                    leftpad_k, seqused_k, generator, num_splits=0):
    """_flash_attn_varlen_forward, errors naming who, the dropout seed drawn from generator (None: the default)."""
    _ops.require_tensors(who, q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    if leftpad_k is not None:
        raise _C.AttnError(f"{who}: leftpad_k: is not supported (pass None; flash_attn_with_kvcache takes a cache's "
                           "left padding)")
    left, right = _window(who, (window_size_left, window_size_right))
    _check_num_splits(who, num_splits, q, k, block_table is not None, max_seqlen_q, dropout_p, causal, left, right,
                      alibi_slopes)
    if seqused_k is not None:
        if q.is_cuda:
            raise _C.AttnError(f"{who}: seqused_k: is CPU-only (pass cu_seqlens_k of the keys to use)")
        k, v, cu_seqlens_k = _used_keys(who, seqused_k, cu_seqlens_q, cu_seqlens_k, k, v, block_table is not None)
    seed = _seed(dropout_p, generator)
    opts = _options(who, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, seed)
    if q.is_cuda:  # attn's CUDA backend, packed or paged keys
        cu = (cu_seqlens_q, cu_seqlens_k)
        _ops._require_cuda_call(who, q, k, v, opts, cu, block_table)
        if return_softmax:
            raise _C.AttnError(f"{who}: return_softmax: S_dmask is CPU-only (the CUDA backend has no dropout)")
        out, lse = _ops._cuda_launch(q.detach(), k.detach(), v.detach(), opts, True, cu, block_table)
        return out, lse, out.new_empty((0,)), torch.tensor([seed, 0], dtype=torch.int64)
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
    if q.is_cuda:
        _ops._require_cuda_call(_WHO + "_flash_attn_varlen_backward", q, k, v, opts, (cu_seqlens_q, cu_seqlens_k))
        with torch.cuda.device(q.device):
            _C.varlen_backward_cuda(q.detach(), k.detach(), v.detach(), out.detach(), dout.detach(), softmax_lse, dq, dk,
                                    dv, cu_seqlens_q, cu_seqlens_k, None, stream=_ops.cuda_stream(q), **opts._asdict())
    else:
        _C.varlen_backward(q.detach(), k.detach(), v.detach(), out.detach(), dout.detach(), softmax_lse, dq, dk, dv,
                           cu_seqlens_q, cu_seqlens_k, None, **opts._asdict())
    return _softmax_d(dout, out, dropout_p).transpose(0, 1).contiguous()


# flash-attn's C++ extension (flash_attn_2_cuda), which its flash_attn_interface binds under this name: the
# five functions with its positional signatures, on the functions above.
from . import flash_attn_gpu  # noqa: E402,F401  (it imports this module's functions)
