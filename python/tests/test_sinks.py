"""Attention sinks (sinks=, gpt-oss's): outputs and gradients (sinks included) against a PyTorch
reference that appends the sink as one more logit of each row, the way gpt-oss's reference does; exact
in f64, within the 2x / 3x rules in f32; the lse includes the sink; varlen and kvcache take it too."""
import math

import pytest
import torch

import attn


def sinks_ref(q, k, v, sinks, causal=False):
    """Textbook attention with a sink column: softmax over [scores, sink], the sink's weight dropped."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(h // hk, dim=2), v.repeat_interleave(h // hk, dim=2)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(d)
    if causal:
        hidden = torch.arange(sk).view(1, -1) > torch.arange(sq).view(-1, 1) + sk - sq
        scores = scores.masked_fill(hidden, float("-inf"))
    sink = sinks.to(scores.dtype).view(1, h, 1, 1).expand(b, h, sq, 1)
    full = torch.cat([scores, sink], dim=-1)
    p = torch.softmax(full, dim=-1)[..., :-1]
    return torch.einsum("bhts,bshd->bthd", p, v), torch.logsumexp(full, dim=-1)


def make(dtype, seed=0, b=2, sq=37, sk=53, h=4, hk=2, d=32):
    g = torch.Generator().manual_seed(seed)
    t = lambda *s: torch.randn(*s, generator=g).to(dtype).requires_grad_()
    sinks = torch.tensor([0.5, -1.0, 3.0, -float("inf")])[:h].requires_grad_()
    return t(b, sq, h, d), t(b, sk, hk, d), t(b, sk, hk, d), sinks


@pytest.mark.parametrize("causal", [False, True])
def test_f64_outputs_and_gradients_are_exact(causal):
    q, k, v, sinks = make(torch.float64)
    out, lse, _ = attn.flash_attn_func(q, k, v, causal=causal, sinks=sinks, return_attn_probs=True)
    ref, ref_lse = sinks_ref(q, k, v, sinks, causal)
    assert (out - ref).abs().max().item() <= 1e-12
    assert (lse - ref_lse).abs().max().item() <= 1e-12
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, sinks), dout)
    want = torch.autograd.grad(ref, (q, k, v, sinks), dout)
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        tol = 1e-12 if name != "dsinks" else 1e-6  # dsinks is f32, like the sinks
        assert (g.double() - w.double()).abs().max().item() <= tol * max(1.0, w.abs().max().item()), name


def test_f32_within_the_textbook_rules():
    q, k, v, sinks = make(torch.float32, seed=3, sq=120, sk=130, d=64)
    out = attn.flash_attn_func(q, k, v, causal=True, sinks=sinks)
    ref64 = sinks_ref(q.double(), k.double(), v.double(), sinks.double(), True)[0]
    book = sinks_ref(q, k, v, sinks, True)[0]
    base = (book.double() - ref64).abs().max().item()
    assert (out.double() - ref64).abs().max().item() <= 2 * base + 2e-6
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, sinks), dout)
    want = torch.autograd.grad(ref64, (q, k, v, sinks), dout.double())
    book_g = torch.autograd.grad(book, (q, k, v, sinks), dout)
    for g, w, t in zip(got, want, book_g):
        base = (t.double() - w.double()).abs().max().item()
        assert (g.double() - w.double()).abs().max().item() <= 3 * base + 2e-6 * max(1.0, w.abs().max().item())


def test_varlen_and_kvcache_take_sinks():
    q, k, v, sinks = make(torch.float64, seed=5, b=2, sq=6, sk=20)
    ref, _ = sinks_ref(q, k, v, sinks, causal=True)
    cu_q = torch.tensor([0, 6, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 40], dtype=torch.int32)
    out = attn.flash_attn_varlen_func(q.reshape(12, 4, 32), k.reshape(40, 2, 32), v.reshape(40, 2, 32), cu_q, cu_k, 6,
                                      20, causal=True, sinks=sinks)
    assert (out.reshape(ref.shape) - ref).abs().max().item() <= 1e-12
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (sinks,), dout)[0]
    want = torch.autograd.grad(ref, (sinks,), dout.reshape(ref.shape))[0]
    assert (got.double() - want.double()).abs().max().item() <= 1e-6 * max(1.0, want.abs().max().item())
    with torch.no_grad():
        dec = attn.flash_attn_with_kvcache(q, k, v, cache_seqlens=20, causal=True, sinks=sinks.detach(), num_splits=3)
    assert (dec - ref).abs().max().item() <= 1e-12


def test_compiled_sinks_match_eager():
    torch._dynamo.reset()
    q, k, v, sinks = make(torch.float32, seed=7)
    layer = lambda q, k, v, s: attn.flash_attn_func(q, k, v, causal=True, sinks=s).sum(dim=-1)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    eager = layer(q, k, v, sinks)
    assert torch.equal(compiled(q, k, v, sinks), eager)
    g_eager = torch.autograd.grad(eager.sum(), (q, k, v, sinks))
    g_compiled = torch.autograd.grad(compiled(q, k, v, sinks).sum(), (q, k, v, sinks))
    assert all(torch.equal(a, b) for a, b in zip(g_eager, g_compiled))


def test_bad_sinks_raise():
    q, k, v, _ = make(torch.float32)
    with pytest.raises(attn.AttnError, match=r"sinks: must be float32 \[heads = 4\]"):
        attn.flash_attn_func(q, k, v, sinks=torch.zeros(3))
    with pytest.raises(attn.AttnError, match="sinks: must be float32"):
        attn.flash_attn_func(q, k, v, sinks=torch.zeros(4, dtype=torch.float64))
