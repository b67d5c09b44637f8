"""attn.distributed over torch.distributed (gloo): every rank a process of its own (torch.multiprocessing,
spawn), for 1, 2, 3 and 4 ranks, against attn's single-process calls on the whole sequence: f64 within
1e-12, bf16 within 2x (outputs) and 3x (gradients) the single-process call's error against an f64 oracle;
bad input on one rank raising the same error on every rank; a rank that leaves ending the others' call.
Sizes are tiny: each world size is one spawn that runs every case."""
import datetime
import os
import tempfile
import time

import pytest
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import attn  # noqa: E402
import attn.distributed as ad  # noqa: E402

EXACT = 1e-12


def _spawn(world, case, *args, timeout_s=60):
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_worker, args=(world, os.path.join(folder, "store"), timeout_s, case, args), nprocs=world, join=True)


def _worker(rank, world, store, timeout_s, case, args):
    torch.set_num_threads(1)  # two shared cores: one thread per rank
    attn.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        case(rank, world, *args)
    finally:
        dist.destroy_process_group()


def _rows(x, lengths, rank, zigzag, dim=1):
    """Rank `rank`'s rows of the whole x (along dim) under the layout: the test's own oracle of it."""
    if not zigzag:
        return x.narrow(dim, sum(lengths[:rank]), lengths[rank])
    world = len(lengths)
    sizes = [lengths[c if c < world else 2 * world - 1 - c] // 2 for c in range(2 * world)]
    chunk = lambda c: x.narrow(dim, sum(sizes[:c]), sizes[c])
    return torch.cat([chunk(rank), chunk(2 * world - 1 - rank)], dim)


def _whole(seed, batch, lq, lk, heads, kv_heads, d):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)
    return (rand(batch, sum(lq), heads, d), rand(batch, sum(lk), kv_heads, d), rand(batch, sum(lk), kv_heads, d),
            rand(batch, sum(lq), heads, d))


def _single(q, k, v, dout, kw):
    """attn's single-process forward and backward on the whole sequence: out, lse, dq, dk, dv (dsink)."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    sinks = kw.get("sinks")
    if sinks is not None:
        sinks = sinks.clone().requires_grad_()
        kw = dict(kw, sinks=sinks)
    out, lse, _ = attn.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    out.backward(dout.to(out.dtype))
    return out.detach(), lse, q.grad, k.grad, v.grad, None if sinks is None else sinks.grad


def _ring(func, rank, q, k, v, dout, lq, lk, zigzag, kw):
    """This rank's ring call: its rows of out, lse, dq, dk, dv (and the whole dsink)."""
    mine = lambda x, lengths: _rows(x, lengths, rank, zigzag).clone().requires_grad_()
    ql, kl, vl = mine(q, lq), mine(k, lk), mine(v, lk)
    sinks = kw.get("sinks")
    if sinks is not None:
        sinks = sinks.clone().requires_grad_()
        kw = dict(kw, sinks=sinks)
    out, lse, none = func(ql, kl, vl, return_attn_probs=True, **kw)
    assert none is None
    out.backward(_rows(dout, lq, rank, zigzag).to(out.dtype))
    return out.detach(), lse, ql.grad, kl.grad, vl.grad, None if sinks is None else sinks.grad


def _max_diff(a, b):
    """The largest |a - b|, equal infinities (the lse of a row that sees no key) counting as 0."""
    a, b = a.double(), b.double()
    return torch.where(a == b, 0.0, (a - b).abs()).max().item() if a.numel() else 0.0


# (layout, kw, lengths of q and k per rank as a function of the world size, heads, kv_heads, head dim)
F64_CASES = [
    ("contiguous", dict(causal=True), lambda w: [3, 5, 2, 6][:w], None, 4, 2, 8),
    ("contiguous", dict(), lambda w: [4] * w, lambda w: [3, 1, 4, 2][:w], 2, 2, 8),
    ("zigzag", dict(causal=True), lambda w: [4, 2, 6, 4][:w], None, 4, 1, 8),
    ("zigzag", dict(window_size=(3, 1), softcap=2.0), lambda w: [4] * w, None, 2, 2, 16),
    ("contiguous", dict(causal=True, window_size=(4, 0), alibi_slopes=torch.tensor([0.5, 0.25], dtype=torch.float32)),
     lambda w: [5, 3, 4, 4][:w], None, 2, 1, 8),
    ("zigzag", dict(causal=True, sinks=torch.tensor([0.3, -1.0], dtype=torch.float32)), lambda w: [2] * w, None, 2,
     2, 8),
]


def _ring_f64_cases(rank, world):
    for seed, (layout, kw, lq_of, lk_of, heads, kv_heads, d) in enumerate(F64_CASES):
        zigzag = layout == "zigzag"
        lq = lq_of(world)
        lk = lk_of(world) if lk_of else lq
        q, k, v, dout = _whole(seed, 2, lq, lk, heads, kv_heads, d)
        want = _single(q, k, v, dout, kw)
        func = ad.zigzag_ring_flash_attn_func if zigzag else ad.ring_flash_attn_func
        got = _ring(func, rank, q, k, v, dout, lq, lk, zigzag, kw)
        rows = [(lq, 1), (lq, 2), (lq, 1), (lk, 1), (lk, 1)]  # out, lse (dim 2), dq, dk, dv
        for name, g, w, (lengths, dim) in zip(("out", "lse", "dq", "dk", "dv"), got, want, rows):
            diff = _max_diff(g, _rows(w, lengths, rank, zigzag, dim))
            assert diff <= EXACT, f"case {seed} ({layout}, {kw}), rank {rank}/{world}: {name} differs by {diff}"
        if kw.get("sinks") is not None:
            assert _max_diff(got[5], want[5]) <= EXACT, f"case {seed}: dsink"


def _ring_bf16_case(rank, world):
    """bf16: the ring's error against the f64 oracle within 2x (out) / 3x (gradients) the single call's."""
    lq = [8, 4, 6, 6][:world]
    q, k, v, dout = _whole(11, 1, lq, lq, 4, 2, 16)
    q, k, v, dout = (t.to(torch.bfloat16) for t in (q, k, v, dout))
    kw = dict(causal=True)
    oracle = _single(*(t.double() for t in (q, k, v, dout)), kw)
    single = _single(q, k, v, dout, kw)
    got = _ring(ad.zigzag_ring_flash_attn_func, rank, q, k, v, dout, lq, lq, True, kw)
    for i, (name, bound) in enumerate((("out", 2), ("lse", 2), ("dq", 3), ("dk", 3), ("dv", 3))):
        dim = 2 if name == "lse" else 1
        single_err = _max_diff(single[i], oracle[i])
        ring_err = _max_diff(got[i], _rows(oracle[i], lq, rank, True, dim))
        assert got[i].dtype == (torch.float32 if name == "lse" else torch.bfloat16)
        assert ring_err <= bound * single_err, f"bf16 {name}, rank {rank}/{world}: {ring_err} vs single {single_err}"


def _ring_is_deterministic(rank, world):
    """The same bits for any thread count; the packed forms are the same call."""
    lq = [4] * world
    q, k, v, dout = _whole(5, 1, lq, lq, 4, 2, 8)
    kw = dict(causal=True)
    runs = []
    for threads in (1, 2):
        attn.set_num_threads(threads)
        runs.append(_ring(ad.zigzag_ring_flash_attn_func, rank, q, k, v, dout, lq, lq, True, kw))
    attn.set_num_threads(1)
    for a, b in zip(runs[0][:5], runs[1][:5]):
        assert torch.equal(a, b)
    qkv = torch.stack([_rows(t, lq, rank, True) for t in (q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2))], 2)
    packed = ad.zigzag_ring_flash_attn_qkvpacked_func(qkv, causal=True)
    plain = ad.zigzag_ring_flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert torch.equal(packed, plain)


def _decode_slices(world, seed, dtype=torch.float64):
    """The whole caches of 2 sequences and each rank's slices of them (rank r's keys of sequence b are
    counts[r][b], a rank may hold none)."""
    counts = [[5, 0], [2, 7], [0, 3], [4, 1]][:world]
    totals = [sum(c[b] for c in counts) for b in range(2)]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, 4, 8, generator=g, dtype=torch.float64).to(dtype)
    whole_k = torch.randn(2, max(totals), 2, 8, generator=g, dtype=torch.float64).to(dtype)
    whole_v = torch.randn(2, max(totals), 2, 8, generator=g, dtype=torch.float64).to(dtype)
    slices = []
    for r in range(world):
        width = max(max(c) for c in counts)
        k, v = torch.zeros(2, width, 2, 8, dtype=dtype), torch.zeros(2, width, 2, 8, dtype=dtype)
        for b in range(2):
            start = sum(c[b] for c in counts[:r])
            k[b, :counts[r][b]] = whole_k[b, start:start + counts[r][b]]
            v[b, :counts[r][b]] = whole_v[b, start:start + counts[r][b]]
        slices.append((k, v, torch.tensor(counts[r], dtype=torch.int32)))
    return q, whole_k, whole_v, torch.tensor(totals, dtype=torch.int32), slices


def _sharded_decode_cases(rank, world):
    alibi = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float32)
    for seed, kw in enumerate((dict(), dict(causal=True), dict(causal=True, window_size=(3, 0), alibi_slopes=alibi),
                               dict(softcap=1.5, num_splits=2))):
        q, whole_k, whole_v, totals, slices = _decode_slices(world, seed)
        want, want_lse = attn.flash_attn_with_kvcache(q, whole_k, whole_v, cache_seqlens=totals,
                                                      return_softmax_lse=True, **kw)
        k, v, counts = slices[rank]
        out, lse = ad.sharded_decode(q, k, v, cache_seqlens=counts, return_softmax_lse=True, **kw)
        assert _max_diff(out, want) <= EXACT and _max_diff(lse, want_lse) <= EXACT, f"decode case {seed}, rank {rank}"
        everyone = [torch.empty_like(out) for _ in range(world)]
        dist.all_gather(everyone, out)
        assert all(torch.equal(o, everyone[0]) for o in everyone), "ranks' outputs differ"


def _raises_everywhere(world, call, expected):
    """call() raises AttnError with message `expected` on this rank; every rank got the same message."""
    with pytest.raises(attn.AttnError) as e:
        call()
    messages = [None] * world
    dist.all_gather_object(messages, str(e.value))
    assert messages == [expected] * world, messages


def _bad_input_cases(rank, world):
    last = world - 1
    lq = [4] * world
    q, k, v, _ = _whole(3, 1, lq, lq, 2, 2, 8)
    mine = lambda x: _rows(x, lq, rank, True)
    ql, kl, vl = mine(q), mine(k), mine(v)
    who = "attn.distributed.zigzag_ring_flash_attn_func"
    odd = ql[:, :3] if rank == last else ql
    _raises_everywhere(world, lambda: ad.zigzag_ring_flash_attn_func(odd, kl, vl),
                       f"{who}: q: seqlen must be even with the zigzag layout (two halves) (rank {last})")
    window = "wide" if rank == last else (-1, -1)
    _raises_everywhere(world, lambda: ad.zigzag_ring_flash_attn_func(ql, kl, vl, window_size=window),
                       f"{who}: window_size: must be a pair (left, right) of ints, got 'wide' (rank {last})")
    _raises_everywhere(world, lambda: ad.ring_flash_attn_func(ql, kl, vl, dropout_p=0.1),
                       "attn.distributed.ring_flash_attn_func: dropout_p: must be 0 (ring attention does not drop "
                       "(the keep mask needs whole-sequence counters) without dropout), got 0.1 (rank 0)")
    if world > 1:
        _raises_everywhere(world, lambda: ad.zigzag_ring_flash_attn_func(ql, kl, vl, causal=rank == last),
                           f"{who}: opts: window_right (causal, window) must be the same on every rank (rank 0: -1, "
                           f"rank {last}: 0)")
    q, _, _, _, slices = _decode_slices(world, 0)
    k, v, counts = slices[rank]
    too_many = int(slices[last][2][0]) + 100
    counts = counts + 100 if rank == last else counts
    _raises_everywhere(world, lambda: ad.sharded_decode(q, k, v, cache_seqlens=counts),
                       f"attn.distributed.sharded_decode: cache.seqlens: seqlens[0] + seqlen_new ({too_many} + 0) "
                       f"exceeds the cache capacity ({k.shape[1]} = max_seqlen) (rank {last})")
    # The call after the failures works: no rank was left behind in a collective.
    out = ad.ring_flash_attn_func(ql, kl, vl)
    assert out.shape == ql.shape


def _all_cases(rank, world):
    _ring_f64_cases(rank, world)
    _ring_bf16_case(rank, world)
    _ring_is_deterministic(rank, world)
    _sharded_decode_cases(rank, world)
    _bad_input_cases(rank, world)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_and_sharded_decode_match_one_process(world):
    _spawn(world, _all_cases)


def _rank_leaves(rank, world, report):
    if rank == 1:
        return  # leaves the group: its process ends while rank 0 waits for its chunk
    start = time.monotonic()
    q = torch.randn(1, 4, 2, 8, dtype=torch.float64)
    try:
        ad.ring_flash_attn_func(q, q, q)
        outcome = "returned"
    except Exception as e:  # gloo's error: the peer closed the connection, or the group's timeout
        outcome = type(e).__name__
    with open(report, "w") as f:
        f.write(f"{outcome} {time.monotonic() - start:.1f}")


def test_a_rank_that_leaves_ends_the_call_on_the_others():
    with tempfile.TemporaryDirectory() as folder:
        report = os.path.join(folder, "report")
        _spawn(2, _rank_leaves, report, timeout_s=10)
        outcome, seconds = open(report).read().split()
    assert outcome != "returned" and float(seconds) < 30, (outcome, seconds)
