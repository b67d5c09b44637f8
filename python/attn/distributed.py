"""Context parallelism from PyTorch: ring attention (forward and backward) and the sharded decode over a
torch.distributed process group, in ring-flash-attn's conventions (ring_flash_attn_func,
zigzag_ring_flash_attn_func and their packed forms) and flash_attn_with_kvcache's (sharded_decode).

The arithmetic is libattn's, the same as attn_mpi's (src/distributed/): each rank's blocks, masks, block
shifts and merges run in attn._C's RingForward / RingBackward / ShardSlice objects; this module only
moves tensors: at step s rank r folds the k/v chunk of rank (r - s) mod R, having posted the send of
that chunk to r + 1 and the receive of the next from r - 1 before it computes. Only point-to-point sends
of tensors (torch.distributed.batch_isend_irecv) and all_gather carry data, so the transport is the
same on gloo and NCCL; the compute is attn's CPU kernels, so the tensors are CPU tensors.

Every call is collective: each rank validates its own arguments, then the ranks agree before any of them
computes or writes (_agree): if some rank's arguments are bad, every rank raises the same AttnError, the
lowest such rank's message with " (rank r)" appended; then a value that must be equal across the ranks
(dtype, heads, head dims, the options) and is not raises on every rank. docs/distributed.md.
"""
import torch
import torch.distributed as dist
from torch import Tensor

from . import _C
from ._C import AttnError
from ._ops import _dl, _dl_opt, _kw, _lse_dtype, require_cpu, require_tensors
from .interface import _cache_arguments, _options, _window
from .merge import merge_states
from ._threads import get_num_threads

__all__ = ["ring_flash_attn_func", "ring_flash_attn_kvpacked_func", "ring_flash_attn_qkvpacked_func",
           "zigzag_ring_flash_attn_func", "zigzag_ring_flash_attn_kvpacked_func",
           "zigzag_ring_flash_attn_qkvpacked_func", "sharded_decode"]

# Tags of the ring's messages: gloo matches a send to a receive by (peer, tag); NCCL ignores them.
_TAG_K, _TAG_V, _TAG_DK, _TAG_DV, _TAG_HOME_DK, _TAG_HOME_DV = range(6)


def _agree(who, group, check):
    """Runs check() on this rank; it returns (a result, the (arg, what, value) fields every rank must
    share, this rank's lengths) or raises. Then, collectively: if any rank's check raised, every rank
    raises the lowest such rank's message + " (rank r)"; else if a shared field differs between rank 0
    and a rank r, every rank raises "<who>: <arg>: <what> must be the same on every rank (rank 0: x,
    rank r: y)", as attn_mpi's agreement does (src/distributed/collective.cpp). Returns the result and
    every rank's lengths, in rank order. One all_gather_object (a pickle per rank) per call."""
    result = None
    try:
        result, fields, lengths = check()
        mine = (None, fields, lengths)
    except Exception as e:  # any rank's failure must reach every rank, or the others would wait forever
        message = str(e) if isinstance(e, AttnError) else f"{who}: {type(e).__name__}: {e}"
        mine = (message, None, None)
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    for r, (message, _, _) in enumerate(everyone):
        if message is not None:
            raise AttnError(f"{message} (rank {r})")
    first = everyone[0][1]
    for r, (_, fields, _) in enumerate(everyone[1:], start=1):
        for (arg, what, x), (_, _, y) in zip(first, fields):
            if x != y:
                raise AttnError(f"{who}: {arg}: {what} must be the same on every rank (rank 0: {x}, rank {r}: {y})")
    return result, [lengths for _, _, lengths in everyone]


class _Ring:
    """This rank's place in the ring of `group`: R ranks, rank r, sending to r + 1 and receiving from
    r - 1 (as global ranks, which torch.distributed's point-to-point calls take)."""

    def __init__(self, group):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.right = to_global((self.rank + 1) % self.size)
        self.left = to_global((self.rank - 1) % self.size)

    def exchange(self, send, receive, tags):
        """Posts the sends of `send` to the right and the receives into `receive` from the left, one
        tag a pair; returns the requests to wait on."""
        ops = [dist.P2POp(dist.isend, t, self.right, self.group, tag) for t, tag in zip(send, tags)]
        ops += [dist.P2POp(dist.irecv, t, self.left, self.group, tag) for t, tag in zip(receive, tags)]
        return dist.batch_isend_irecv(ops)

    def steps(self, chunk, rows_of, compute, with_grads):
        """The R steps from this rank's own chunk [k, v] (with_grads: [k, v, dk, dv]): at step s,
        compute(chunk, owner) on the chunk of rank owner = r - s. Its k and v go on to r + 1 (and the
        next chunk's come from r - 1) while it computes; its dk and dv once the step's blocks are in them.
        rows_of(owner): that rank's k rows. Returns the last step's chunk (rank r + 1's)."""
        for s in range(self.size):
            owner = (self.rank - s) % self.size
            requests, passing = [], s + 1 < self.size
            if passing:
                rows = rows_of((owner - 1) % self.size)
                nxt = [t.new_empty((t.shape[0], rows) + tuple(t.shape[2:])) for t in chunk]
                requests += self.exchange(chunk[:2], nxt[:2], (_TAG_K, _TAG_V))
            compute(chunk, owner)
            if passing and with_grads:
                requests += self.exchange(chunk[2:], nxt[2:], (_TAG_DK, _TAG_DV))
            for request in requests:
                request.wait()
            if passing:
                chunk = nxt
        return chunk


def _check_tensors(who, q, k, v):
    require_tensors(who, q=q, k=k, v=v)
    require_cpu(who, q, k, v)  # attn's CPU kernels do the compute; the transport would take CUDA tensors


def _ring_forward(who, q, k, v, sinks, raw_options, zigzag, group):
    """(out, lse, options) of this rank's rows: the forward's R steps. raw_options: flash-attn's
    (dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes), parsed on every rank inside
    the agreement, so that a malformed one fails on every rank too."""
    ring = _Ring(group)

    def check():
        _check_tensors(who, q, k, v)
        options = _options(who, *raw_options, sinks)
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_lse_dtype(q))
        acc = _C.ring_forward(who, _dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), zigzag, **_kw(*options))
        return (acc, out, lse, options), acc.shared_fields(), acc.seqlens()

    (acc, out, lse, options), lengths = _agree(who, group, check)
    acc.start([n for n, _ in lengths], [n for _, n in lengths], ring.rank)
    own = [k.contiguous(), v.contiguous()]  # sent whole: the point-to-point calls take dense tensors
    ring.steps(own, lambda r: lengths[r][1], lambda c, owner: acc.fold_chunk(_dl(c[0]), _dl(c[1]), owner), False)
    acc.finish()
    return out, lse, options


def _ring_backward(who, dout, q, k, v, out, lse, options, zigzag, group):
    """(dq, dk, dv, dsink or None) of this rank's rows: the backward's R steps, then the gradients' last
    hop home; dsink is the ranks' parts summed in rank order (in f64), as attn_mpi does."""
    ring = _Ring(group)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sinks = options.sinks
    dsink = None if sinks is None else lse.new_empty(sinks.shape)

    def check():
        acc = _C.ring_backward(who, [_dl(t) for t in (q, k, v, out, dout, lse, dq, dk, dv)], _dl_opt(dsink), zigzag,
                               **_kw(*options))
        return acc, acc.shared_fields(), acc.seqlens()

    acc, lengths = _agree(who, group, check)
    acc.start([n for n, _ in lengths], [n for _, n in lengths], ring.rank)
    grad = torch.float64 if q.dtype == torch.float64 else torch.float32
    own = [k.contiguous(), v.contiguous(), k.new_zeros(k.shape, dtype=grad), v.new_zeros(v.shape, dtype=grad)]
    last = ring.steps(own, lambda r: lengths[r][1],
                      lambda c, owner: acc.add_chunk(*(_dl(t) for t in c), owner), True)
    if ring.size > 1:  # `last` is rank r + 1's chunk with its finished gradients; rank r - 1 holds ours
        home = [k.new_empty(k.shape, dtype=grad), v.new_empty(v.shape, dtype=grad)]
        for request in ring.exchange(last[2:], home, (_TAG_HOME_DK, _TAG_HOME_DV)):
            request.wait()
        last = [None, None] + home
    acc.store(_dl(last[2]), _dl(last[3]))
    if dsink is not None:
        acc.sink_gradient()
        parts = [torch.empty_like(dsink, dtype=torch.float64) for _ in range(ring.size)]
        dist.all_gather(parts, dsink.to(torch.float64), group=group)
        total = torch.zeros_like(parts[0])
        for part in parts:
            total += part
        dsink = total.to(sinks.dtype)
    return dq, dk, dv, dsink


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sinks, raw_options, zigzag, group, who):
        out, lse, options = _ring_forward(who, q.detach(), k.detach(), v.detach(),
                                          None if sinks is None else sinks.detach(), raw_options, zigzag, group)
        ctx.options, ctx.zigzag, ctx.group, ctx.who = options, zigzag, group, who
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv, dsink = _ring_backward(ctx.who + " (backward)", dout.contiguous(), q, k, v, out, lse, ctx.options,
                                           ctx.zigzag, ctx.group)
        return dq, dk, dv, dsink, None, None, None, None


def _ring_attn(who, zigzag, q, k, v, dropout_p, softmax_scale, causal, window_size, alibi_slopes, return_attn_probs,
               group, softcap, sinks):
    raw_options = (dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    out, lse = _RingAttention.apply(q, k, v, sinks, raw_options, zigzag, group, who)
    return (out, lse, None) if return_attn_probs else out


def ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                         alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None, *, softcap=0.0,
                         sinks=None):
    """Ring attention over `group` (None: the default group), the contiguous layout: rank r holds rows
    [sum of the lengths of ranks < r, + its own) of the whole sequence, any lengths (they may differ from
    rank to rank, and q's from k's). q (batch, seqlen_q_local, nheads, headdim), k and v (batch,
    seqlen_k_local, nheads_k, headdim) -> out like q, this rank's rows of attention over the whole
    sequence (masks bottom-right aligned on the whole (seqlen_q, seqlen_k)); with return_attn_probs,
    (out, softmax_lse (batch, nheads, seqlen_q_local), None). Differentiable (dq, dk, dv of this rank's
    rows). dropout_p must be 0; deterministic is ignored (attn's ring is deterministic: a fixed order
    for any thread count). attn's additions, keyword-only: softcap, sinks (float32 (nheads,))."""
    return _ring_attn("attn.distributed.ring_flash_attn_func", False, q, k, v, dropout_p, softmax_scale, causal,
                      window_size, alibi_slopes, return_attn_probs, group, softcap, sinks)


def zigzag_ring_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None, *,
                                softcap=0.0, sinks=None):
    """As ring_flash_attn_func with the zigzag layout: the whole sequence cut into 2R chunks, rank r
    holding chunk r and then chunk 2R-1-r (half its rows each; even lengths), which gives every rank the
    same work under a causal mask. Causal or not (ring-flash-attn's takes only causal)."""
    return _ring_attn("attn.distributed.zigzag_ring_flash_attn_func", True, q, k, v, dropout_p, softmax_scale, causal,
                      window_size, alibi_slopes, return_attn_probs, group, softcap, sinks)


def ring_flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                   alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None, *,
                                   softcap=0.0, sinks=None):
    """qkv (batch, seqlen_local, 3, nheads, headdim)."""
    return ring_flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal,
                                window_size, alibi_slopes, deterministic, return_attn_probs, group, softcap=softcap,
                                sinks=sinks)


def ring_flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                  alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None, *,
                                  softcap=0.0, sinks=None):
    """kv (batch, seqlen_k_local, 2, nheads_k, headdim)."""
    return ring_flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size,
                                alibi_slopes, deterministic, return_attn_probs, group, softcap=softcap, sinks=sinks)


def zigzag_ring_flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                          alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None,
                                          *, softcap=0.0, sinks=None):
    """qkv (batch, seqlen_local, 3, nheads, headdim), zigzag layout."""
    return zigzag_ring_flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale, causal,
                                       window_size, alibi_slopes, deterministic, return_attn_probs, group,
                                       softcap=softcap, sinks=sinks)


def zigzag_ring_flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                         alibi_slopes=None, deterministic=False, return_attn_probs=False, group=None,
                                         *, softcap=0.0, sinks=None):
    """kv (batch, seqlen_k_local, 2, nheads_k, headdim), zigzag layout."""
    return zigzag_ring_flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal, window_size,
                                       alibi_slopes, deterministic, return_attn_probs, group, softcap=softcap,
                                       sinks=sinks)


def sharded_decode(q, k_cache, v_cache, cache_seqlens=None, block_table=None, softmax_scale=None, causal=False,
                   window_size=(-1, -1), softcap=0.0, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                   group=None, k_scale=None, v_scale=None):
    """Decode over a KV cache sharded along the sequence: every rank of `group` passes the same q and its
    own slice of each sequence's cache, in flash_attn_with_kvcache's conventions (contiguous or paged
    with block_table, quantized with k_scale / v_scale; cache_seqlens: this rank's key counts, an int32
    tensor (batch,), an int, or None for the whole slice). Sequence b's keys are rank 0's
    cache_seqlens[b] keys, then rank 1's, and so on (a rank may hold none). Each rank decodes its slice
    with the whole sequence's masks and ALiBi distances; the partial (out, lse) are gathered and merged
    in rank order (attn.merge_states), so every rank returns bitwise the same out (and lse) for the whole
    sequence. Not differentiable. No append (k, v), rotary or cache_leftpad: append to the last rank's
    slice with flash_attn_with_kvcache before the call."""
    who = "attn.distributed.sharded_decode"
    ring = _Ring(group)

    def check():
        nonlocal k_cache, v_cache, k_scale, v_scale, cache_seqlens
        require_tensors(who, q=q, k_cache=k_cache, v_cache=v_cache)
        require_cpu(who, q, k_cache, v_cache)
        left, right = _window(who, window_size)
        k_cache, v_cache, k_scale, v_scale, cache_type, cache_seqlens = _cache_arguments(
            who, q, k_cache, v_cache, k_scale, v_scale, cache_seqlens, block_table)
        out = q.new_empty(q.shape[:-1] + v_cache.shape[-1:])
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=_partial_dtype(k_cache))
        part = _C.shard_slice(who, _dl(q.detach()), _dl(k_cache.detach()), _dl(v_cache.detach()), _dl(out), _dl(lse),
                              _dl(cache_seqlens), _dl_opt(block_table), num_splits=int(num_splits),
                              k_scale=_dl_opt(k_scale), v_scale=_dl_opt(v_scale), cache_type=cache_type,
                              softmax_scale=None if softmax_scale is None else float(softmax_scale),
                              causal=bool(causal), window_left=left, window_right=right, softcap=float(softcap),
                              alibi_slopes=_dl_opt(alibi_slopes), num_threads=get_num_threads())
        return (part, out, lse), part.shared_fields(), part.seqlens()

    (part, out, lse), seqlens = _agree(who, group, check)
    batch, seqlen_q, heads, head_dim_v = out.shape
    acc = _partial_dtype(k_cache)
    part_out = q.new_empty((batch, seqlen_q, heads, head_dim_v), dtype=acc)
    part_lse = q.new_empty((batch, heads, seqlen_q), dtype=acc)
    part.partial([n for rank in seqlens for n in rank], ring.rank, _dl(part_out), _dl(part_lse))
    outs = [torch.empty_like(part_out) for _ in range(ring.size)]
    lses = [torch.empty_like(part_lse) for _ in range(ring.size)]
    dist.all_gather(outs, part_out, group=group)
    dist.all_gather(lses, part_lse, group=group)
    rows = batch * seqlen_q  # merge_states' states: (rows, ranks, heads, head_dim_v), in rank order
    merged, merged_lse = merge_states(torch.stack([o.reshape(rows, heads, head_dim_v) for o in outs], dim=1),
                                      torch.stack([s.transpose(1, 2).reshape(rows, heads) for s in lses], dim=1))
    out.copy_(merged.view(batch, seqlen_q, heads, head_dim_v))
    lse.copy_(merged_lse.view(batch, seqlen_q, heads).transpose(1, 2))
    return (out, lse) if return_softmax_lse else out


def _partial_dtype(k_cache: Tensor) -> torch.dtype:
    """The partial states' type: f64 for f64 caches, else f32 (attn's accumulator)."""
    return torch.float64 if k_cache.dtype == torch.float64 else torch.float32
