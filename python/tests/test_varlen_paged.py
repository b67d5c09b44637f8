"""flash_attn_varlen_func with block_table (paged keys and values, as in chunked prefill): the same
output and lse as the packed call on the same keys, for any block size; bad tables raise the C++
message; the custom op passes opcheck and torch.compile(fullgraph=True)."""
import pytest
import torch

import attn


def paged_from_packed(k, v, lens_k, page_size, seed=0):
    """The packed keys of each sequence scattered over shuffled blocks (spare blocks hold garbage)."""
    g = torch.Generator().manual_seed(seed)
    batch, hk, d = len(lens_k), k.shape[1], k.shape[2]
    blocks_of = [(n + page_size - 1) // page_size for n in lens_k]
    num_blocks = sum(blocks_of) + 2
    order = torch.randperm(num_blocks, generator=g)
    k_cache = torch.randn(num_blocks, page_size, hk, d, generator=g, dtype=torch.float32).to(k.dtype) * 50
    v_cache = torch.randn(num_blocks, page_size, hk, d, generator=g, dtype=torch.float32).to(v.dtype) * 50
    table = torch.full((batch, max(blocks_of) + 1), -1, dtype=torch.int32)
    used, start = 0, 0
    for b, n in enumerate(lens_k):
        for j in range(blocks_of[b]):
            table[b, j] = order[used]
            used += 1
        for j in range(n):
            blk, slot = table[b, j // page_size], j % page_size
            k_cache[blk, slot], v_cache[blk, slot] = k[start + j], v[start + j]
        start += n
    return k_cache, v_cache, table


def cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


LENS_Q, LENS_K = [5, 1, 40, 0, 17], [9, 1, 70, 3, 17]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16, 256])
def test_paged_varlen_is_the_packed_result(dtype, page_size):
    q = torch.randn(sum(LENS_Q), 4, 32).to(dtype)
    k, v = (torch.randn(sum(LENS_K), 2, 32).to(dtype) for _ in range(2))
    k_cache, v_cache, table = paged_from_packed(k, v, LENS_K, page_size)
    for kw in ({"causal": True}, {"window_size": (6, 2), "softcap": 2.0}):
        want, want_lse, _ = attn.flash_attn_varlen_func(q, k, v, cu(LENS_Q), cu(LENS_K), max(LENS_Q), max(LENS_K),
                                                        return_attn_probs=True, **kw)
        got, got_lse, _ = attn.flash_attn_varlen_func(q, k_cache, v_cache, cu(LENS_Q), cu(LENS_K), max(LENS_Q),
                                                      max(LENS_K), return_attn_probs=True, block_table=table, **kw)
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse)


def test_paged_varlen_is_inference_only():
    q = torch.randn(sum(LENS_Q), 4, 16, requires_grad=True)
    k, v = (torch.randn(sum(LENS_K), 2, 16) for _ in range(2))
    k_cache, v_cache, table = paged_from_packed(k, v, LENS_K, 8)
    out = attn.flash_attn_varlen_func(q, k_cache, v_cache, cu(LENS_Q), cu(LENS_K), 40, 70, block_table=table)
    assert not out.requires_grad


def test_bad_block_table_raises_runtime_error():
    q = torch.randn(sum(LENS_Q), 4, 16)
    k, v = (torch.randn(sum(LENS_K), 2, 16) for _ in range(2))
    k_cache, v_cache, table = paged_from_packed(k, v, LENS_K, 8)
    bad = table.clone()
    bad[2, 0] = k_cache.shape[0]
    with pytest.raises(RuntimeError, match=r"block_table: entry \[2\]\[0\]"):
        attn.flash_attn_varlen_func(q, k_cache, v_cache, cu(LENS_Q), cu(LENS_K), 40, 70, block_table=bad)
    with pytest.raises(RuntimeError, match="cu_seqlens_k: sequence 2 has 70 keys, more than the cache holds"):
        attn.flash_attn_varlen_func(q, k_cache, v_cache, cu(LENS_Q), cu(LENS_K), 40, 70, block_table=table[:, :2])
    with pytest.raises(RuntimeError, match="block_table: must be int32"):
        attn.flash_attn_varlen_func(q, k_cache, v_cache, cu(LENS_Q), cu(LENS_K), 40, 70, block_table=table.long())


def test_paged_custom_op_opcheck_and_compile():
    q = torch.randn(sum(LENS_Q), 4, 16)
    k, v = (torch.randn(sum(LENS_K), 2, 16) for _ in range(2))
    k_cache, v_cache, table = paged_from_packed(k, v, LENS_K, 8)
    args = (q, k_cache, v_cache, cu(LENS_Q), cu(LENS_K), table, None, True, -1, -1, 0.0, None, 0.0, 0, 0, None)
    torch.library.opcheck(torch.ops.attn.varlen_fwd_paged.default, args)
    torch._dynamo.reset()

    def layer(q, k_cache, v_cache, table):
        return attn.flash_attn_varlen_func(q * 2, k_cache, v_cache, cu(LENS_Q), cu(LENS_K), 40, 70, causal=True,
                                           block_table=table).sum(dim=-1)

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(q, k_cache, v_cache, table), layer(q, k_cache, v_cache, table))
