"""_flash_attn_varlen_forward's and flash_attn_gpu.varlen_fwd's seqused_k (sequence b attends to only the first
seqused_k[b] of its keys, as in flash-attn's mha_varlen_fwd) and num_splits (flash-attn after 2.8: a hint, with
its rule for paged keys): against the reference on the sliced keys (f64, 1e-12) and, bitwise, against the same
call on those keys gathered; with a block_table; the validation errors, named, before anything is written."""
import pytest
import torch

import attn
from attn.flash_attn.flash_attn_gpu import varlen_fwd
from attn.flash_attn.flash_attn_interface import _flash_attn_varlen_forward

WHO = "attn.flash_attn.flash_attn_interface._flash_attn_varlen_forward"

# Three sequences: 3 queries over 7 keys of which 5 are used, 4 over 10 (all used), 2 over 6 (none used).
CU_Q = [0, 3, 7, 9]
CU_K = [0, 7, 17, 23]
USED = [5, 10, 0]


def i32(values):
    return torch.tensor(values, dtype=torch.int32)


def problem(dtype, h=4, hk=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(CU_Q[-1], h, d, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(CU_K[-1], hk, d, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(CU_K[-1], hk, d, generator=g, dtype=torch.float64).to(dtype)
    return q, k, v


def sliced(k, v):
    """The used keys packed, and their cu_seqlens: what seqused_k should behave as."""
    index = torch.cat([torch.arange(CU_K[b], CU_K[b] + n) for b, n in enumerate(USED)])
    cu = [0]
    for n in USED:
        cu.append(cu[-1] + n)
    return k[index], v[index], i32(cu)


def reference(q, k, v, scale, causal, window):
    """f64 attention of each sequence's queries over its first USED[b] keys, causal mask and window aligned to
    the bottom-right corner of (queries, used keys); a row with no key outputs 0."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    groups = q.shape[1] // k.shape[1]
    for b, n in enumerate(USED):
        qb = q[CU_Q[b]:CU_Q[b + 1]].double()
        kb = k[CU_K[b]:CU_K[b] + n].double().repeat_interleave(groups, dim=1)
        vb = v[CU_K[b]:CU_K[b] + n].double().repeat_interleave(groups, dim=1)
        sq = qb.shape[0]
        s = torch.einsum("ihd,jhd->hij", qb, kb) * scale
        i = torch.arange(sq).view(-1, 1) + n - sq  # the diagonal key of row i
        j = torch.arange(n).view(1, -1)
        left, right = window
        allowed = torch.ones(sq, n, dtype=torch.bool)
        if causal:
            right = 0
        if left >= 0:
            allowed &= j >= i - left
        if right >= 0:
            allowed &= j <= i + right
        s = s.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out[CU_Q[b]:CU_Q[b + 1]] = torch.einsum("hij,jhd->ihd", p, vb)
    return out


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (2, 1))])
def test_seqused_k_is_attention_over_the_first_keys(causal, window):
    q, k, v = problem(torch.float64)
    out, lse, _, _ = _flash_attn_varlen_forward(q, k, v, i32(CU_Q), i32(CU_K), 4, 10, 0.0, 0.3, causal, *window,
                                                seqused_k=i32(USED))
    assert out.shape == q.shape and lse.shape == (q.shape[1], q.shape[0])
    assert (out - reference(q, k, v, 0.3, causal, window)).abs().max().item() < 1e-12
    ks, vs, cu_used = sliced(k, v)
    want, want_lse, _, _ = _flash_attn_varlen_forward(q, ks, vs, i32(CU_Q), cu_used, 4, 10, 0.0, 0.3, causal, *window)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_seqused_k_bitwise_as_the_sliced_keys_and_all_keys_as_none(dtype):
    q, k, v = problem(dtype, seed=1)
    ks, vs, cu_used = sliced(k, v)
    got = _flash_attn_varlen_forward(q, k, v, i32(CU_Q), i32(CU_K), 4, 10, 0.0, None, True, seqused_k=i32(USED))
    want = _flash_attn_varlen_forward(q, ks, vs, i32(CU_Q), cu_used, 4, 10, 0.0, None, True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    counts = i32([CU_K[b + 1] - CU_K[b] for b in range(3)])
    full = _flash_attn_varlen_forward(q, k, v, i32(CU_Q), i32(CU_K), 4, 10, 0.0, None, True, seqused_k=counts)
    none = _flash_attn_varlen_forward(q, k, v, i32(CU_Q), i32(CU_K), 4, 10, 0.0, None, True)
    assert torch.equal(full[0], none[0]) and torch.equal(full[1], none[1])


def paged(k, v, page_size, table):
    """Sequence b's keys (from CU_K[b]) in the pages of block_table row b."""
    pages = torch.zeros(int(table.max()) + 1, page_size, *k.shape[1:], dtype=k.dtype)
    vpages = torch.zeros_like(pages)
    for b in range(len(CU_K) - 1):
        for j in range(CU_K[b + 1] - CU_K[b]):
            pages[table[b, j // page_size], j % page_size] = k[CU_K[b] + j]
            vpages[table[b, j // page_size], j % page_size] = v[CU_K[b] + j]
    return pages, vpages


def test_seqused_k_with_a_block_table():
    """With a block_table the first seqused_k[b] keys of sequence b's pages: bitwise the packed call's."""
    q, k, v = problem(torch.float32, seed=2)
    table = i32([[5, 0, 8, 0], [1, 4, 2, 7], [3, 6, 0, 0]])  # 3, 4 and 2 pages of 3 keys
    pages, vpages = paged(k, v, 3, table)
    got = _flash_attn_varlen_forward(q, pages, vpages, i32(CU_Q), i32(CU_K), 4, 10, 0.0, None, True,
                                     block_table=table, seqused_k=i32(USED))
    want = _flash_attn_varlen_forward(q, k, v, i32(CU_Q), i32(CU_K), 4, 10, 0.0, None, True, seqused_k=i32(USED))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    ks, vs, cu_used = sliced(k, v)
    as_counts = _flash_attn_varlen_forward(q, pages, vpages, i32(CU_Q), cu_used, 4, 10, 0.0, None, True,
                                           block_table=table)
    assert torch.equal(got[0], as_counts[0]) and torch.equal(got[1], as_counts[1])


def test_varlen_fwd_takes_seqused_k_and_num_splits():
    q, k, v = problem(torch.bfloat16, seed=3)
    out_ = torch.full_like(q, float("nan"))
    res = varlen_fwd(q, k, v, out_, i32(CU_Q), i32(CU_K), i32(USED), None, None, None, 4, 10, 0.0, 0.25, False,
                     True, -1, -1, 0.0, False, None, 3)
    want = _flash_attn_varlen_forward(q, k, v, i32(CU_Q), i32(CU_K), 4, 10, 0.0, 0.25, True, seqused_k=i32(USED))
    assert res[0] is out_ and torch.equal(out_, want[0]) and torch.equal(res[1], want[1])


@pytest.mark.parametrize("num_splits", [0, 1, 2, 7, 128, 1000, -1])
def test_num_splits_is_a_hint_without_a_block_table(num_splits):
    q, k, v = problem(torch.bfloat16, seed=4)
    args = (q, k, v, i32(CU_Q), i32(CU_K), 4, 10, 0.0, None, True)
    want = _flash_attn_varlen_forward(*args, seqused_k=i32(USED))
    got = _flash_attn_varlen_forward(*args, seqused_k=i32(USED), num_splits=num_splits)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def decode_problem():
    """One query per sequence, 4 query heads over 2 key heads, keys in pages of 4: flash-attn's split-KV decode
    when there is no window, dropout or ALiBi."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 16, generator=g, dtype=torch.float16)
    pages = torch.randn(6, 4, 2, 16, generator=g, dtype=torch.float16)
    vpages = torch.randn(6, 4, 2, 16, generator=g, dtype=torch.float16)
    table = i32([[4, 1, 0], [2, 5, 3]])
    return (q, pages, vpages, i32([0, 1, 2]), i32([0, 9, 21]), 1, 12), table


def test_num_splits_with_a_block_table_follows_flash_attn():
    """flash-attn's mha_varlen_fwd: with paged keys num_splits > 1 raises, except in its split-KV decode (up to
    128); 0 and 1 (and, there, any count up to 128) give the default's bits."""
    args, table = decode_problem()
    used = i32([7, 12])
    plain = dict(block_table=table, seqused_k=used)
    window = dict(window_size_left=-1, window_size_right=0, **plain)  # flash-attn's test: not the decode
    for kw in (plain, window):
        want = _flash_attn_varlen_forward(*args, 0.0, None, False, **kw)
        for n in (0, 1):
            got = _flash_attn_varlen_forward(*args, 0.0, None, False, **kw, num_splits=n)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for n in (2, 64, 128):
        got = _flash_attn_varlen_forward(*args, 0.0, None, False, **plain, num_splits=n)
        want = _flash_attn_varlen_forward(*args, 0.0, None, False, **plain)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(RuntimeError, match="num_splits > 128 not supported") as info:
        _flash_attn_varlen_forward(*args, 0.0, None, False, **plain, num_splits=129)
    assert isinstance(info.value, attn.AttnError) and f"{WHO}: num_splits:" in str(info.value)
    # Not the decode: a window (flash-attn's own test), ALiBi, dropout, or as many query heads as key heads.
    for dropout_p, kw in ((0.0, window), (0.0, dict(alibi_slopes=torch.rand(4), **plain)), (0.1, plain)):
        with pytest.raises(RuntimeError, match="num_splits > 1 is not supported for varlen paged KV") as info:
            _flash_attn_varlen_forward(*args, dropout_p, None, False, **kw, num_splits=2)
        assert isinstance(info.value, attn.AttnError) and f"{WHO}: num_splits:" in str(info.value)
    with pytest.raises(RuntimeError, match="num_splits > 1 is not supported for varlen paged KV"):
        _flash_attn_varlen_forward(args[0][:, :2], *args[1:], 0.0, None, False, **plain, num_splits=2)
    with pytest.raises(attn.AttnError, match="num_splits: must be an int, got float"):
        _flash_attn_varlen_forward(*args, 0.0, None, False, **plain, num_splits=2.0)
    out_ = torch.full_like(args[0], float("nan"))
    with pytest.raises(attn.AttnError, match="varlen_fwd: num_splits: num_splits > 1 is not supported"):
        varlen_fwd(args[0], args[1], args[2], out_, args[3], args[4], used, None, table, None, 1, 12, 0.0, None,
                   False, False, -1, 0, 0.0, False, None, 2)
    assert out_.isnan().all()


BAD = [(torch.tensor(USED), "must be an int32 CPU tensor of shape (batch,) = (3,)"),
       (i32(USED[:2]), "must be an int32 CPU tensor of shape (batch,) = (3,)"),
       (i32([USED]), "must be an int32 CPU tensor of shape (batch,) = (3,)"),
       (i32([8, 10, 0]), "0 <= seqused_k[b] <= cu_seqlens_k[b + 1] - cu_seqlens_k[b] (sequence b's key count), "
                         "got seqused_k[0] = 8 with 7 keys"),
       (i32([5, 10, -1]), "got seqused_k[2] = -1 with 6 keys"),
       ([5, 10, 0], "seqused_k: must be a torch.Tensor, got list")]


@pytest.mark.parametrize("seqused_k,message", BAD)
def test_bad_seqused_k_is_named_before_anything_runs(seqused_k, message):
    q, k, v = problem(torch.float32, seed=6)
    with pytest.raises(attn.AttnError) as info:
        _flash_attn_varlen_forward(q, k, v, i32(CU_Q), i32(CU_K), 4, 10, 0.0, None, False, seqused_k=seqused_k)
    assert f"{WHO}: seqused_k: " in str(info.value) and message in str(info.value), str(info.value)
    out_ = torch.full_like(q, float("nan"))
    state = torch.get_rng_state()
    with pytest.raises(attn.AttnError) as info:  # with dropout: no seed drawn either
        varlen_fwd(q, k, v, out_, i32(CU_Q), i32(CU_K), seqused_k, None, None, None, 4, 10, 0.5, None, False, False,
                   -1, -1, 0.0, False, None)
    assert "attn.flash_attn.flash_attn_gpu.varlen_fwd: seqused_k: " in str(info.value) and message in str(info.value)
    assert out_.isnan().all() and torch.equal(torch.get_rng_state(), state)


def test_bad_cu_seqlens_k_with_seqused_k_is_named_as_the_kernel_names_it():
    """With seqused_k the offsets are read before any kernel runs; they are checked by the kernels' own rule
    (_C.check_cu_seqlens), so the message is the one the call without seqused_k gives, past the caller's name."""
    q, k, v = problem(torch.float32, seed=7)
    for cu, message in ((i32([0, 7, 17]), "cu_seqlens_k: must hold batch + 1 = 4 entries, got 3"),
                        (torch.tensor([0, 7, 17, 23]), "cu_seqlens_k: must be a contiguous 1-D int32 array"),
                        (i32([1, 7, 17, 23]), "cu_seqlens_k: [0] must be 0, got 1"),
                        (i32([0, 7, 5, 23]), "cu_seqlens_k: must be non-decreasing, but [2] = 5 < [1] = 7"),
                        (i32([0, 7, 17, 22]), "cu_seqlens_k: [batch] must equal the packed length 23, got 22")):
        with pytest.raises(attn.AttnError) as info:
            _flash_attn_varlen_forward(q, k, v, i32(CU_Q), cu, 4, 10, 0.0, None, False, seqused_k=i32(USED))
        assert f"{WHO}: {message}" in str(info.value), str(info.value)
        with pytest.raises(attn.AttnError) as kernel:
            _flash_attn_varlen_forward(q, k, v, i32(CU_Q), cu, 4, 10, 0.0, None, False)
        assert str(info.value).split(": ", 1)[1] == str(kernel.value).split(": ", 1)[1]  # past the caller's name
