"""Head dims: v's own head dim (DeepSeek's 192 / 128) through flash_attn_func and flash_attn_varlen_func,
with their gradients, and MLA decode (576 / 512, V a view of the key cache's first 512 dims, k appended
alone) through flash_attn_with_kvcache, against the PyTorch reference."""
import pytest
import torch

import attn
from test_flash_attn import attention_ref


def rand(g, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_unequal_head_dims_match_the_reference(causal):
    g = torch.Generator().manual_seed(1)
    q, k, v = rand(g, 2, 33, 4, 192), rand(g, 2, 41, 2, 192), rand(g, 2, 41, 2, 128)
    out = attn.flash_attn_func(q, k, v, causal=causal)
    assert out.shape == (2, 33, 4, 128)
    torch.testing.assert_close(out, attention_ref(q, k, v, causal=causal), rtol=0, atol=1e-12)
    cu_q = torch.tensor([0, 33, 66], dtype=torch.int32)
    cu_k = torch.tensor([0, 41, 82], dtype=torch.int32)
    packed = attn.flash_attn_varlen_func(q.reshape(66, 4, 192), k.reshape(82, 2, 192), v.reshape(82, 2, 128), cu_q,
                                         cu_k, 33, 41, causal=causal)
    torch.testing.assert_close(packed.reshape(2, 33, 4, 128), out, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_unequal_head_dims_gradients_match_autograd_of_the_reference(causal):
    g = torch.Generator().manual_seed(2)
    q, k = rand(g, 2, 19, 4, 192).requires_grad_(), rand(g, 2, 23, 2, 192).requires_grad_()
    v = rand(g, 2, 23, 2, 128).requires_grad_()
    dout = rand(g, 2, 19, 4, 128)
    grads = torch.autograd.grad(attn.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    want = torch.autograd.grad(attention_ref(q, k, v, causal=causal), (q, k, v), dout)
    for got, ref, name in zip(grads, want, "qkv"):
        assert got.shape == ref.shape, name
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-11, msg=lambda m: "d" + name + ": " + m)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("page", [0, 16])
def test_mla_decode_reads_the_values_from_the_key_rows(dtype, page):
    g = torch.Generator().manual_seed(3)
    b, n, new, heads = 2, 90, 2, 16
    latent = rand(g, b, n, 1, 576, dtype=dtype)
    q, k_new = rand(g, b, 1, heads, 576, dtype=dtype), rand(g, b, new, 1, 576, dtype=dtype)
    seqlens = torch.full((b,), n - new, dtype=torch.int32)
    want_latent = latent.clone()
    want_latent[:, n - new:] = k_new
    want = attention_ref(q, want_latent, want_latent[..., :512])
    if page:
        per_seq = n // page + 1
        pool = torch.zeros(b * per_seq, page, 1, 576, dtype=dtype)
        table = torch.arange(b * per_seq, dtype=torch.int32).flip(0).view(b, per_seq)
        for s in range(b):
            for j in range(n - new):
                pool[table[s, j // page], j % page] = latent[s, j]
        out = attn.flash_attn_with_kvcache(q, pool, pool[..., :512], k=k_new, cache_seqlens=seqlens,
                                           block_table=table)
    else:
        out = attn.flash_attn_with_kvcache(q, latent, latent[..., :512], k=k_new, cache_seqlens=seqlens)
        torch.testing.assert_close(latent, want_latent, rtol=0, atol=0)  # k_new written in place, whole rows
    assert out.shape == (b, 1, heads, 512)
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(out.double(), want.double(), rtol=0, atol=tol)


def test_mla_view_rules():
    g = torch.Generator().manual_seed(4)
    latent, q = rand(g, 1, 8, 1, 64), rand(g, 1, 1, 2, 64)
    k_new, seqlens = rand(g, 1, 1, 1, 64), torch.tensor([7], dtype=torch.int32)
    with pytest.raises(attn.AttnError, match="v_new: must be null when cache.v views cache.k's rows"):
        attn.flash_attn_with_kvcache(q, latent, latent[..., :32], k=k_new, v=k_new[..., :32], cache_seqlens=seqlens)
