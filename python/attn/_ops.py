"""attn's kernels as torch.library custom ops (attn::fwd, attn::bwd, attn::varlen_fwd, attn::varlen_bwd, and
the inference-only attn::varlen_fwd_paged) with fake (meta) implementations, and the autograd formula
that joins each forward to its backward.

Registered as custom ops, the kernels are opaque to torch.compile (fullgraph=True traces through them
using the fake implementations) and checked by torch.library.opcheck. The ops never see tensors that
require grad: autograd wraps them (register_autograd), so the DLPack hand-over to attn._C is zero-copy.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from ._options import AttentionOptions


# Tensors go to attn._C as DLPack capsules made by torch's C exporter (about 1 us each on the development
# machine), rather than through Tensor.__dlpack__, whose Python-level checks cost about 6 us a tensor;
# the capsule still shares the tensor's memory and strides.
_dl = torch.utils.dlpack.to_dlpack


def _dl_opt(t: Optional[Tensor]):
    return None if t is None else _dl(t)


def _lse_dtype(t: Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _kw(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, seed, num_threads, sinks):
    return dict(softmax_scale=softmax_scale, causal=causal, window_left=window_left, window_right=window_right,
                softcap=softcap, alibi_slopes=_dl_opt(alibi_slopes), dropout_p=dropout_p, seed=seed, offset=0,
                num_threads=num_threads, sinks=_dl_opt(sinks))


def _dsink(sinks: Optional[Tensor], lse: Tensor) -> Optional[Tensor]:
    """The buffer the backward writes the sinks' gradient into (lse's dtype), or None without sinks."""
    return None if sinks is None else torch.empty(sinks.shape, dtype=lse.dtype, device=lse.device)


def _fake_sink_grad(sinks: Optional[Tensor], like: Tensor) -> Tensor:
    return sinks.new_empty(sinks.shape) if sinks is not None else like.new_empty((0,), dtype=torch.float32)


def _sink_grad(sinks: Optional[Tensor], dsink: Optional[Tensor]) -> Tensor:
    """The gradient as the ops return it: in the sinks' dtype, or an empty tensor without sinks (custom ops
    cannot return None)."""
    return dsink.to(sinks.dtype) if sinks is not None else torch.empty(0)


def _out_for(q, v):
    """The output: q's shape with v's head dim (DeepSeek's 192 / 128), allocated like q as flash-attn does."""
    if v.size(-1) == q.size(-1):  # ints, cheaper than comparing two torch.Size objects
        return torch.empty_like(q)
    return q.new_empty(q.shape[:-1] + v.shape[-1:])


def _fwd_eager(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, seed,
               num_threads, sinks, with_lse=True):
    b, sq, h, _ = q.shape
    out = _out_for(q, v)
    lse = torch.empty((b, h, sq), dtype=_lse_dtype(q), device=q.device) if with_lse else None
    _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl_opt(lse), **_kw(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                                        dropout_p, seed, num_threads, sinks))
    return out, lse


@torch.library.custom_op("attn::fwd", mutates_args=(), device_types="cpu")
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: Optional[float], causal: bool, window_left: int,
        window_right: int, softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float, seed: int,
        num_threads: int, sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    return _fwd_eager(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
                      seed, num_threads, sinks)


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, seed, num_threads, sinks):
    b, sq, h, _ = q.shape
    return _out_for(q, v), q.new_empty((b, h, sq), dtype=_lse_dtype(q))


def _bwd_eager(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
               dropout_p, seed, num_threads, sinks):
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dsink = _dsink(sinks, lse)
    _C.backward(*map(_dl, (q, k, v, out, dout, lse, dq, dk, dv)), _dl_opt(dsink), **_kw(softmax_scale, causal, window_left, window_right, softcap,
                                                           alibi_slopes, dropout_p, seed, num_threads, sinks))
    return dq, dk, dv, _sink_grad(sinks, dsink)


@torch.library.custom_op("attn::bwd", mutates_args=(), device_types="cpu")
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, softmax_scale: Optional[float],
        causal: bool, window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
        dropout_p: float, seed: int, num_threads: int, sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _bwd_eager(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap,
                      alibi_slopes, dropout_p, seed, num_threads, sinks)


@bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
      seed, num_threads, sinks):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _fake_sink_grad(sinks, q)


def _varlen_fwd_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right,
                      softcap, alibi_slopes, dropout_p, seed, num_threads, sinks):
    total_q, h, _ = q.shape
    out = _out_for(q, v)
    lse = torch.empty((h, total_q), dtype=_lse_dtype(q), device=q.device)
    _C.varlen_forward(*map(_dl, (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)),
                      **_kw(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, seed,
                            num_threads, sinks))
    return out, lse


@torch.library.custom_op("attn::varlen_fwd", mutates_args=(), device_types="cpu")
def varlen_fwd(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               softmax_scale: Optional[float], causal: bool, window_left: int, window_right: int, softcap: float,
               alibi_slopes: Optional[Tensor], dropout_p: float, seed: int, num_threads: int, sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    return _varlen_fwd_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right,
                             softcap, alibi_slopes, dropout_p, seed, num_threads, sinks)


@varlen_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
      dropout_p, seed, num_threads, sinks):
    total_q, h, _ = q.shape
    return _out_for(q, v), q.new_empty((h, total_q), dtype=_lse_dtype(q))


def _varlen_paged_eager(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, block_table, softmax_scale, causal,
                        window_left, window_right, softcap, alibi_slopes, dropout_p, seed, num_threads, sinks):
    total_q, h, _ = q.shape
    out = _out_for(q, v_cache)
    lse = torch.empty((h, total_q), dtype=_lse_dtype(q), device=q.device)
    _C.varlen_forward(*map(_dl, (q, k_cache, v_cache, out, lse, cu_seqlens_q, cu_seqlens_k, block_table)),
                      **_kw(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, seed,
                            num_threads, sinks))
    return out, lse


@torch.library.custom_op("attn::varlen_fwd_paged", mutates_args=(), device_types="cpu")
def varlen_fwd_paged(q: Tensor, k_cache: Tensor, v_cache: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     block_table: Tensor, softmax_scale: Optional[float], causal: bool, window_left: int,
                     window_right: int, softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float, seed: int,
                     num_threads: int, sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    return _varlen_paged_eager(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, block_table, softmax_scale, causal,
                               window_left, window_right, softcap, alibi_slopes, dropout_p, seed, num_threads, sinks)


@varlen_fwd_paged.register_fake
def _(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, block_table, softmax_scale, causal, window_left, window_right,
      softcap, alibi_slopes, dropout_p, seed, num_threads, sinks):
    total_q, h, _ = q.shape
    return _out_for(q, v_cache), q.new_empty((h, total_q), dtype=_lse_dtype(q))


def _varlen_bwd_eager(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left,
                      window_right, softcap, alibi_slopes, dropout_p, seed, num_threads, sinks):
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dsink = _dsink(sinks, lse)
    _C.varlen_backward(*map(_dl, (q, k, v, out, dout, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k)), _dl_opt(dsink),
                       **_kw(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, seed,
                             num_threads, sinks))
    return dq, dk, dv, _sink_grad(sinks, dsink)


@torch.library.custom_op("attn::varlen_bwd", mutates_args=(), device_types="cpu")
def varlen_bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
               cu_seqlens_k: Tensor, softmax_scale: Optional[float], causal: bool, window_left: int,
               window_right: int, softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float, seed: int,
               num_threads: int, sinks: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return _varlen_bwd_eager(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left,
                             window_right, softcap, alibi_slopes, dropout_p, seed, num_threads, sinks)


@varlen_bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_left, window_right, softcap,
      alibi_slopes, dropout_p, seed, num_threads, sinks):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _fake_sink_grad(sinks, q)


# ---- autograd: d(out) flows back through attn::bwd; the lse output and the options get no gradient.


def _setup_fwd(ctx, inputs, output):
    q, k, v, *options = inputs
    ctx.options = _detached(AttentionOptions._make(options))
    ctx.save_for_backward(q, k, v, *output)


_NO_OPTION_GRADS = AttentionOptions._make((None,) * len(AttentionOptions._fields))


def _option_grads(options: AttentionOptions, dsink):
    """Gradients of the options, one per field in the ops' order: None, except the sinks' when they are given."""
    return _NO_OPTION_GRADS if options.sinks is None else _NO_OPTION_GRADS._replace(sinks=dsink)


def _backward_fwd(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv, dsink = bwd(dout.contiguous(), q, k, v, out, lse, *ctx.options)
    return (dq, dk, dv) + _option_grads(ctx.options, dsink)


def _setup_varlen(ctx, inputs, output):
    q, k, v, cu_q, cu_k, *options = inputs
    ctx.options = _detached(AttentionOptions._make(options))
    ctx.save_for_backward(q, k, v, cu_q, cu_k, *output)


def _backward_varlen(ctx, dout, dlse):
    q, k, v, cu_q, cu_k, out, lse = ctx.saved_tensors
    dq, dk, dv, dsink = varlen_bwd(dout.contiguous(), q, k, v, out, lse, cu_q, cu_k, *ctx.options)
    return (dq, dk, dv, None, None) + _option_grads(ctx.options, dsink)


fwd.register_autograd(_backward_fwd, setup_context=_setup_fwd)
varlen_fwd.register_autograd(_backward_varlen, setup_context=_setup_varlen)


# ---- eager mode: the same kernels and formulas through torch.autograd.Function, which costs a few
# microseconds per call where the custom op's dispatch costs tens; torch.compile sees the custom ops.
def _detached(options: AttentionOptions) -> AttentionOptions:
    """The options with the sinks detached: the kernels take plain tensors."""
    return options if options.sinks is None else options._replace(sinks=options.sinks.detach())


# The Functions take the options whole, and the sinks apart as well: autograd sees only the tensors among
# apply's arguments, and the sinks are the one option with a gradient.
class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, options):
        ctx.options = _detached(options)
        fwd_ = _cuda_fwd if q.is_cuda else _fwd_eager
        out, lse = fwd_(q.detach(), k.detach(), v.detach(), *ctx.options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        bwd_ = _cuda_bwd if q.is_cuda else _bwd_eager
        dq, dk, dv, dsink = bwd_(dout.contiguous(), q, k, v, out, lse, *ctx.options)
        return dq, dk, dv, dsink if ctx.options.sinks is not None else None, None


class _VarlenAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, sinks, options):
        ctx.options = _detached(options)
        fwd_ = _cuda_varlen_fwd if q.is_cuda else _varlen_fwd_eager
        out, lse = fwd_(q.detach(), k.detach(), v.detach(), cu_q, cu_k, *ctx.options)
        ctx.save_for_backward(q, k, v, cu_q, cu_k, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, cu_q, cu_k, out, lse = ctx.saved_tensors
        bwd_ = _cuda_varlen_bwd if q.is_cuda else _varlen_bwd_eager
        dq, dk, dv, dsink = bwd_(dout.contiguous(), q, k, v, out, lse, cu_q, cu_k, *ctx.options)
        return dq, dk, dv, None, None, dsink if ctx.options.sinks is not None else None, None


def _cuda_fwd(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, seed,
              num_threads, sinks, with_lse=True):
    """_fwd_eager's CUDA twin: (out, lse or None) of attn._C.forward_cuda on torch's current stream."""
    options = AttentionOptions(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
                               seed, num_threads, sinks)
    return _cuda_launch(q, k, v, options, with_lse)


def _cuda_bwd(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
              dropout_p, seed, num_threads, sinks):
    """_bwd_eager's CUDA twin: attn._C.backward_cuda into new dq, dk, dv (and the sinks' gradient)."""
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dsink = _dsink(sinks, lse)
    with torch.cuda.device(q.device):
        _C.backward_cuda(*map(_dl, (q, k, v, out, dout, lse, dq, dk, dv)), _dl_opt(dsink), stream=cuda_stream(q),
                         **_kw(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, seed,
                               num_threads, sinks))
    return dq, dk, dv, _sink_grad(sinks, dsink)


def _cuda_varlen_fwd(q, k, v, cu_q, cu_k, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                     dropout_p, seed, num_threads, sinks):
    options = AttentionOptions(softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p,
                               seed, num_threads, sinks)
    return _cuda_launch(q, k, v, options, True, (cu_q, cu_k))


def _cuda_varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, softmax_scale, causal, window_left, window_right, softcap,
                     alibi_slopes, dropout_p, seed, num_threads, sinks):
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    dsink = _dsink(sinks, lse)
    with torch.cuda.device(q.device):
        _C.varlen_backward_cuda(*map(_dl, (q, k, v, out, dout, lse, dq, dk, dv, cu_q, cu_k)), _dl_opt(dsink),
                                stream=cuda_stream(q), **_kw(softmax_scale, causal, window_left, window_right, softcap,
                                                             alibi_slopes, dropout_p, seed, num_threads, sinks))
    return dq, dk, dv, _sink_grad(sinks, dsink)


def _require_cuda_call(who, q, k, v, options: AttentionOptions, cu_seqlens=None, block_table=None):
    cu_q, cu_k = cu_seqlens or (None, None)
    require_cuda(who, q, k=k, v=v, alibi_slopes=options.alibi_slopes, sinks=options.sinks, cu_seqlens_q=cu_q,
                 cu_seqlens_k=cu_k, block_table=block_table)


def _cuda_forward(who, q, k, v, options: AttentionOptions, with_lse, cu_seqlens=None, block_table=None):
    """(out, lse or None) of attn's CUDA backend (attn._C.forward_cuda, or varlen_forward_cuda with
    cu_seqlens = (cu_seqlens_q, cu_seqlens_k) and, for a paged cache k, v, block_table), on torch's current
    stream of q's device, for a call through which no gradient flows (the differentiable calls go through
    _Attention and _VarlenAttention, whose steps take the CUDA twins of the CPU ops)."""
    _require_cuda_call(who, q, k, v, options, cu_seqlens, block_table)
    return _cuda_launch(q, k, v, options, with_lse, cu_seqlens, block_table)


def _cuda_launch(q, k, v, options: AttentionOptions, with_lse, cu_seqlens=None, block_table=None):
    kw = options._replace(alibi_slopes=_dl_opt(options.alibi_slopes), sinks=_dl_opt(options.sinks))._asdict()
    with torch.cuda.device(q.device):
        out = _out_for(q, v)
        if cu_seqlens is not None:  # varlen: q [total_q, heads, d], lse [heads, total_q] (always returned)
            lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
            _C.varlen_forward_cuda(*map(_dl, (q, k, v, out, lse, *cu_seqlens)), block_table=_dl_opt(block_table),
                                   stream=cuda_stream(q), **kw)
            return out, lse
        b, sq, h, _ = q.shape
        lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device) if with_lse else None
        _C.forward_cuda(_dl(q), _dl(k), _dl(v), _dl(out), _dl_opt(lse), stream=cuda_stream(q), **kw)
    return out, lse


def require_cuda(who, q, **arrays):
    """q is a CUDA tensor: the build must have the CUDA backend, and every other tensor of the call (None
    and non-tensor arguments skipped) be on q's device: the CUDA bindings take CUDA arrays only, so this
    is a named error where the binding would raise a TypeError."""
    if not _C.has_cuda:
        raise _C.AttnError(f"{who}: q: is a CUDA tensor, and this build of attn has no CUDA backend (build the "
                           "package with it: pip install . -C cmake.define.ATTN_CUDA=ON, docs/python.md)")
    for name, t in arrays.items():
        if isinstance(t, Tensor) and t.device != q.device:
            raise _C.AttnError(f"{who}: {name}: must be on q's device {q.device}, got {t.device}")


def cuda_stream(t):
    """torch's current stream of t's device, as the integer the CUDA bindings take."""
    return torch.cuda.current_stream(t.device).cuda_stream


def require_cpu(who, q, k, v):
    """attn's kernels in this package run on the CPU: a tensor elsewhere gets a named error, not a crash.
    Tensor.is_cpu first: it costs about a tenth of building each tensor's device object."""
    if q.is_cpu and k.is_cpu and v.is_cpu:
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cpu":
            raise _C.AttnError(f"{who}: {name}: must be a CPU tensor, got one on {t.device} (this function runs "
                               "attn's CPU kernels; CUDA tensors reach the CUDA backend through flash_attn_func, "
                               "flash_attn_varlen_func without a block table, their packed forms and "
                               "flash_attn_with_kvcache: docs/python.md)")


def _needs_grad(q, k, v, sinks):
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or
                                        (sinks is not None and sinks.requires_grad))


_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def inference_forward(q, k, v, softmax_scale, causal, window_size, softcap, threads):
    """out of flash_attn_func's plain inference call (no gradient can flow, no dropout, ALiBi, sinks or lse),
    in one frame called straight from flash_attn_func, or None when the call is not that one, or has an
    argument of a form this path does not check (k or v not a tensor, window_size not a pair of ints): the
    general path names it. After a kernel has evicted the interpreter's working set, every frame and object
    of a path is paid in cache misses (docs/python.md, "Speed"), so this path builds no options tuple,
    leaves the defaults to the binding, and catches bad forms with try, which costs nothing until it
    catches (Python >= 3.11), rather than checking them."""
    try:
        if (type(q) is not Tensor or not (q.is_cpu and k.is_cpu and v.is_cpu) or _is_compiling() or
                (_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))):
            return None
        left, right = window_size
    except (AttributeError, TypeError, ValueError):
        return None
    out = _out_for(q, v)
    try:
        _C.forward(_dl(q), _dl(k), _dl(v), _dl(out), None, softmax_scale=softmax_scale, causal=bool(causal),
                   window_left=left, window_right=right, softcap=softcap, num_threads=threads)
    except TypeError:  # an argument the binding refuses by type (a float in window_size)
        return None
    return out


def require_tensors(who, **arrays):
    """Each of arrays a torch tensor: a list or NumPy array among them gets a named error rather than an
    AttributeError from the first attribute read."""
    for name, t in arrays.items():
        if not isinstance(t, Tensor):
            raise _C.AttnError(f"{who}: {name}: must be a torch.Tensor, got {type(t).__name__}")


def _all_tensors(q, k, v):
    return isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)


def attention(q, k, v, options: AttentionOptions, with_lse=True):
    """(out, lse) of attn::fwd, differentiable; the custom op under torch.compile, else the Function, or,
    when no gradient can flow (inference), the kernel alone, which skips lse (None) unless with_lse."""
    if _is_compiling():
        return fwd(q, k, v, *options)
    if not _all_tensors(q, k, v):  # flash_attn_func has sent NumPy and DLPack arrays elsewhere
        require_tensors("attn.flash_attn_func", q=q, k=k, v=v)
    if q.is_cuda:
        _require_cuda_call("attn.flash_attn_func", q, k, v, options)
        if not _needs_grad(q, k, v, options.sinks):
            return _cuda_launch(q, k, v, options, with_lse)
        return _Attention.apply(q, k, v, options.sinks, options)
    require_cpu("attn.flash_attn_func", q, k, v)
    if not _needs_grad(q, k, v, options.sinks):
        return _fwd_eager(q, k, v, *options, with_lse=with_lse)
    return _Attention.apply(q, k, v, options.sinks, options)


def varlen_attention(q, k, v, cu_q, cu_k, options: AttentionOptions):
    if torch.compiler.is_compiling():
        return varlen_fwd(q, k, v, cu_q, cu_k, *options)
    if not _all_tensors(q, k, v):
        require_tensors("attn.flash_attn_varlen_func", q=q, k=k, v=v)
    if q.is_cuda:
        _require_cuda_call("attn.flash_attn_varlen_func", q, k, v, options, (cu_q, cu_k))
        if not _needs_grad(q, k, v, options.sinks):
            return _cuda_launch(q, k, v, options, True, (cu_q, cu_k))
        return _VarlenAttention.apply(q, k, v, cu_q, cu_k, options.sinks, options)
    require_cpu("attn.flash_attn_varlen_func", q, k, v)
    if not _needs_grad(q, k, v, options.sinks):
        return _varlen_fwd_eager(q, k, v, cu_q, cu_k, *options)
    return _VarlenAttention.apply(q, k, v, cu_q, cu_k, options.sinks, options)


def varlen_paged_attention(q, k_cache, v_cache, cu_q, cu_k, block_table, options: AttentionOptions):
    """(out, lse) over a paged cache: inference only (no gradient flows to q or the cache)."""
    if torch.compiler.is_compiling():
        return varlen_fwd_paged(q, k_cache, v_cache, cu_q, cu_k, block_table, *options)
    if not _all_tensors(q, k_cache, v_cache):  # flash_attn_varlen_func names the cache k and v
        require_tensors("attn.flash_attn_varlen_func", q=q, k=k_cache, v=v_cache)
    if q.is_cuda:
        return _cuda_forward("attn.flash_attn_varlen_func", q.detach(), k_cache.detach(), v_cache.detach(), options,
                             True, (cu_q, cu_k), block_table)
    require_cpu("attn.flash_attn_varlen_func", q, k_cache, v_cache)
    return _varlen_paged_eager(q.detach(), k_cache.detach(), v_cache.detach(), cu_q, cu_k, block_table, *options)
