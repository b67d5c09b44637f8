"""flash_attn_with_kvcache: decode over contiguous and paged caches (any page size, shuffled block
tables), with k/v appended in place, against the PyTorch reference on the cache's first
cache_seqlens + seqlen_new keys; the 2x rule against the textbook at the input dtype."""
import pytest
import torch

import attn
from test_flash_attn import SLACK, attention_ref, check_rule


def make_case(b, sq, hk, group, d, max_len, new, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g).to(dtype)
    q = rand(b, sq, hk * group, d)
    k_cache, v_cache = rand(b, max_len, hk, d), rand(b, max_len, hk, d)
    seqlens = torch.randint(0, max_len - new + 1, (b,), generator=g, dtype=torch.int32)
    k_new, v_new = (rand(b, new, hk, d), rand(b, new, hk, d)) if new else (None, None)
    return q, k_cache, v_cache, seqlens, k_new, v_new


def paged(cache, page):
    """The contiguous cache (b, max_len, hk, d) as pages of `page` slots in a shuffled pool."""
    b, max_len, hk, d = cache.shape
    per_seq = -(-max_len // page)
    padded = torch.zeros(b, per_seq * page, hk, d, dtype=cache.dtype)
    padded[:, :max_len] = cache
    pages = padded.view(b * per_seq, page, hk, d)
    order = torch.randperm(b * per_seq, generator=torch.Generator().manual_seed(page))
    pool = torch.empty_like(pages)
    pool[order] = pages
    return pool, order.view(b, per_seq).to(torch.int32)


def appended(k_cache, v_cache, seqlens, k_new, v_new):
    """The contiguous caches as they must be after k_new, v_new are written at seqlens."""
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for i in range(k_cache.shape[0]):
        n = int(seqlens[i])
        if k_new is not None:
            want_k[i, n:n + k_new.shape[1]], want_v[i, n:n + v_new.shape[1]] = k_new[i], v_new[i]
    return want_k, want_v


def check_each_sequence(out, q, want_k, want_v, seqlens, new, causal, dtype):
    """out (on the CPU) against the reference over each sequence's seqlens + new keys: the 2x rule."""
    for i in range(q.shape[0]):
        n = int(seqlens[i]) + new
        args = (q[i:i + 1], want_k[i:i + 1, :n], want_v[i:i + 1, :n])
        ref = attention_ref(*args, causal=causal)
        textbook = attention_ref(*args, causal=causal, upcast=False)
        check_rule(out[i:i + 1], ref, textbook, 2, dtype, f"sequence {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "paged1", "paged3", "paged16"])
@pytest.mark.parametrize("sq,new,causal", [(1, 0, False), (1, 1, True), (3, 2, True), (4, 0, False)])
def test_kvcache_matches_the_reference(dtype, layout, sq, new, causal):
    b, hk, group, d, max_len = 3, 2, 4, 64, 70
    q, k_cache, v_cache, seqlens, k_new, v_new = make_case(b, sq, hk, group, d, max_len, new, dtype, seed=sq + new)
    want_k, want_v = appended(k_cache, v_cache, seqlens, k_new, v_new)
    block_table = None
    if layout.startswith("paged"):
        page = int(layout[5:])
        k_cache, block_table = paged(k_cache, page)
        v_cache, _ = paged(v_cache, page)
    out, lse = attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                            block_table=block_table, causal=causal, return_softmax_lse=True,
                                            num_splits=0 if layout != "paged3" else 5)
    assert lse.shape == (b, hk * group, sq)
    if block_table is not None:  # back to the contiguous layout to compare the cache
        page = k_cache.shape[1]
        k_cache = k_cache[block_table.long()].reshape(b, -1, hk, d)[:, :max_len]
        v_cache = v_cache[block_table.long()].reshape(b, -1, hk, d)[:, :max_len]
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v), "the cache after the append"
    check_each_sequence(out, q, want_k, want_v, seqlens, new, causal, dtype)


def test_kvcache_int_and_missing_seqlens():
    q, k_cache, v_cache, _, _, _ = make_case(2, 1, 1, 2, 16, 9, 0, torch.float64, seed=1)
    whole = attn.flash_attn_with_kvcache(q, k_cache, v_cache)
    assert (whole - attention_ref(q, k_cache, v_cache)).abs().max().item() <= 1e-12
    five = attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=5)
    assert (five - attention_ref(q, k_cache[:, :5], v_cache[:, :5])).abs().max().item() <= 1e-12


def test_kvcache_bad_input():
    q, k_cache, v_cache, seqlens, _, _ = make_case(2, 1, 1, 2, 16, 9, 0, torch.float32, seed=2)
    with pytest.raises(RuntimeError, match="block_table"):
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                     block_table=torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(attn.AttnError, match="cache.seqlens.*exceeds the cache capacity"):
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([1, 99], dtype=torch.int32))
    with pytest.raises(ValueError, match="rotary: needs k_new"):
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, rotary_cos=torch.ones(9, 4), rotary_sin=torch.ones(9, 4))


def test_cache_batch_idx_and_leftpad():
    q, k_cache, v_cache, _, _, _ = make_case(3, 1, 2, 2, 16, 30, 0, torch.float64, seed=7)
    k_cache, v_cache = torch.cat((k_cache, k_cache.flip(0))), torch.cat((v_cache, v_cache.flip(0)))  # 6 rows
    batch_idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    leftpad = torch.tensor([3, 0, 9], dtype=torch.int32)
    seqlens = torch.tensor([12, 7, 30], dtype=torch.int32)
    k_new, v_new = torch.randn(3, 1, 2, 16, dtype=torch.float64), torch.randn(3, 1, 2, 16, dtype=torch.float64)
    seqlens[2] = 29  # room for the append
    out = attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                       cache_batch_idx=batch_idx, cache_leftpad=leftpad, causal=True)
    for b in range(3):
        r, first, end = int(batch_idx[b]), int(leftpad[b]), int(seqlens[b]) + 1
        assert torch.equal(k_cache[r, end - 1], k_new[b, 0])
        ref = attention_ref(q[b:b + 1], k_cache[r:r + 1, first:end], v_cache[r:r + 1, first:end], causal=True)
        assert (out[b] - ref[0]).abs().max().item() <= 1e-12
    with pytest.raises(attn.AttnError, match="cache.batch_idx: sequences 0 and 1 append into cache row 4"):
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                     cache_batch_idx=torch.tensor([4, 4, 2], dtype=torch.int32))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal,sq", [(False, 1), (True, 3), (False, 2)])
def test_rotary_matches_flash_attn_layers_rotary(interleaved, causal, sq):
    from attn.flash_attn.layers.rotary import apply_rotary_emb
    b, hk, group, d, max_len, new = 2, 2, 2, 32, 40, 3
    q, k_cache, v_cache, seqlens, k_new, v_new = make_case(b, sq, hk, group, d, max_len, new, torch.float64, seed=11)
    angle = torch.rand(64, 8, dtype=torch.float64) * 6
    cos, sin = angle.cos(), angle.sin()
    want_k = k_cache.clone()
    out = attn.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                       cache_seqlens=seqlens, causal=causal, rotary_interleaved=interleaved)
    for i in range(b):
        n = int(seqlens[i])
        k_rot = apply_rotary_emb(k_new[i:i + 1], cos, sin, interleaved=interleaved, seqlen_offsets=n)
        want_k[i, n:n + new] = k_rot[0]
        q_rot = (apply_rotary_emb(q[i:i + 1], cos, sin, interleaved=interleaved, seqlen_offsets=n) if causal else
                 apply_rotary_emb(q[i:i + 1], cos[n:n + 1].expand(sq, -1), sin[n:n + 1].expand(sq, -1),
                                  interleaved=interleaved))
        assert (k_cache[i] - want_k[i]).abs().max().item() <= 1e-14
        ref = attention_ref(q_rot, want_k[i:i + 1, :n + new], v_cache[i:i + 1, :n + new], causal=causal)
        assert (out[i] - ref[0]).abs().max().item() <= 1e-12


def test_keys_per_split_makes_decode_batch_invariant():
    g = torch.Generator().manual_seed(11)
    q = torch.randn(16, 1, 8, 64, generator=g)
    k_cache, v_cache = (torch.randn(16, 900, 2, 64, generator=g) for _ in range(2))
    lens = torch.randint(1, 900, (16,), generator=g, dtype=torch.int32)
    together = attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, keys_per_split=128)
    for b in (0, 5, 15):
        alone = attn.flash_attn_with_kvcache(q[b:b + 1], k_cache[b:b + 1], v_cache[b:b + 1],
                                             cache_seqlens=lens[b:b + 1], keys_per_split=128)
        assert torch.equal(alone, together[b:b + 1])


@pytest.mark.parametrize("append", [False, True])
def test_past_the_block_tables_capacity_is_a_runtime_error_naming_block_table(append):
    """flash-attn's test_flash_attn_kvcache_paged_block_table_bounds: a sequence longer than its block
    table row can hold raises RuntimeError naming block_table; exactly at capacity does not."""
    page = 256
    k_cache, v_cache = (torch.randn(4, page, 1, 64, dtype=torch.float16) for _ in range(2))
    table = torch.zeros(1, 1, dtype=torch.int32)
    q = torch.randn(1, 1, 1, 64, dtype=torch.float16)
    new = dict(k=torch.randn(1, 1, 1, 64, dtype=torch.float16), v=torch.randn(1, 1, 1, 64, dtype=torch.float16))
    seqlens = torch.full((1,), page if append else page + 1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="block_table"):
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                     **(new if append else {}))
    attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.full((1,), page, dtype=torch.int32),
                                 block_table=table)
