"""Dropout through flash_attn_func: the output is the reference attention with the returned factors
(S_dmask) applied to the softmax weights; the same torch seed replays the same mask."""
import pytest
import torch

import attn
from test_flash_attn import attention_ref


def dropped_ref(q, k, v, mask, causal):
    """attention_ref's softmax weights multiplied by the dropout factors, in f64."""
    b, sq, h, d = q.shape
    s = torch.einsum("bthd,bshd->bhts", q.double(), k.double()) / d ** 0.5
    if causal:
        hidden = torch.arange(k.shape[1]).view(1, -1) > torch.arange(sq).view(-1, 1) + k.shape[1] - sq
        s = s.masked_fill(hidden, float("-inf"))
    p = torch.softmax(s, dim=-1) * mask.double()
    return torch.einsum("bhts,bshd->bthd", p, v.double())


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_output_is_the_masked_reference(causal):
    q, k, v = (torch.randn(2, 37, 3, 16, dtype=torch.float64) for _ in range(3))
    torch.manual_seed(5)
    out, lse, mask = attn.flash_attn_func(q, k, v, dropout_p=0.25, causal=causal, return_attn_probs=True)
    assert mask.shape == (2, 3, 37, 37)
    kept = (mask > 0).double().mean().item()
    assert 0.65 < kept < 0.85
    assert mask.dtype == torch.float64 and set(mask.unique().tolist()) <= {0.0, 1 / 0.75}
    assert (out - dropped_ref(q, k, v, mask, causal)).abs().max().item() <= 1e-12
    assert (lse - attn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[1]).abs().max() == 0
    torch.manual_seed(5)
    again = attn.flash_attn_func(q, k, v, dropout_p=0.25, causal=causal)
    assert torch.equal(out, again)


def test_bad_dropout_p_is_named():
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises(attn.AttnError, match="dropout_p"):
        attn.flash_attn_func(q, q, q, dropout_p=1.0)


def test_dropout_gradients_are_those_of_the_masked_reference():
    q, k, v = (torch.randn(1, 29, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    torch.manual_seed(11)
    out, _, mask = attn.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True)
    ref = dropped_ref(q, k, v, mask, True)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for g, w in zip(got, want):
        assert (g - w).abs().max().item() <= 1e-12 * max(1.0, w.abs().max().item())
