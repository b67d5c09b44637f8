"""Dropout through flash_attn_func: the output is the reference attention with the dropout pattern that
S_dmask encodes (flash-attn's layout: the softmax weights exp(s - m), negated where dropped, padded to
multiples of 128) applied to the softmax weights; the same torch seed replays the same mask."""
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


def factors(s_dmask, sq, sk, p):
    """The dropout factors (0 or 1 / (1 - p)) S_dmask encodes: kept where its entry is >= 0."""
    return (s_dmask[:, :, :sq, :sk] >= 0).double() / (1 - p)


def unnormalized_ref(q, k, causal):
    """exp(s - rowmax) for the visible keys, 0 for the hidden: S_dmask's magnitudes."""
    b, sq, h, d = q.shape
    s = torch.einsum("bthd,bshd->bhts", q.double(), k.double()) / d ** 0.5
    if causal:
        hidden = torch.arange(k.shape[1]).view(1, -1) > torch.arange(sq).view(-1, 1) + k.shape[1] - sq
        s = s.masked_fill(hidden, float("-inf"))
    return torch.exp(s - s.amax(dim=-1, keepdim=True))


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_output_is_the_masked_reference(causal):
    q, k, v = (torch.randn(2, 37, 3, 16, dtype=torch.float64) for _ in range(3))
    torch.manual_seed(5)
    out, lse, s_dmask = attn.flash_attn_func(q, k, v, dropout_p=0.25, causal=causal, return_attn_probs=True)
    assert s_dmask.shape == (2, 3, 128, 128) and s_dmask.dtype == torch.float64
    assert (s_dmask[:, :, 37:] == 0).all() and (s_dmask[:, :, :, 37:] == 0).all()
    mask = factors(s_dmask, 37, 37, 0.25)
    weights = unnormalized_ref(q, k, causal)
    visible = weights > 0  # a hidden key's entry is 0, which reads as kept: count the visible ones
    kept = ((mask > 0) & visible).double().sum().item() / visible.double().sum().item()
    assert 0.65 < kept < 0.85
    assert (s_dmask[:, :, :37, :37].abs() - weights).abs().max().item() <= 1e-13
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
    out, _, s_dmask = attn.flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True)
    ref = dropped_ref(q, k, v, factors(s_dmask, 29, 29, 0.3), True)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for g, w in zip(got, want):
        assert (g - w).abs().max().item() <= 1e-12 * max(1.0, w.abs().max().item())


def test_s_dmask_rebuilds_the_probabilities_as_flash_attn_tests_do():
    """flash-attn's tests take the dropout pattern as S_dmask >= 0 and the probabilities as |S_dmask| times
    exp(m_block - lse), m_block the running maximum of each key block of _get_block_size_n keys: attn's one
    block makes that the row maximum."""
    from attn.flash_attn.flash_attn_interface import _flash_attn_forward, _get_block_size_n
    q, k, v = (torch.randn(2, 20, 2, 16, dtype=torch.float64) for _ in range(3))
    torch.manual_seed(3)
    out, lse, s_dmask = attn.flash_attn_func(q, k, v, dropout_p=0.2, window_size=(4, 2), return_attn_probs=True)
    assert _get_block_size_n(q.device, 16, True, False) >= s_dmask.shape[-1]
    s = torch.einsum("bthd,bshd->bhts", q, k) / 4.0
    i, j = torch.arange(20).view(-1, 1), torch.arange(20).view(1, -1)
    s = s.masked_fill((j < i - 4) | (j > i + 2), float("-inf"))
    probs = torch.softmax(s, dim=-1)
    rebuilt = s_dmask[:, :, :20, :20].abs() * torch.exp(s.amax(dim=-1, keepdim=True) - torch.logsumexp(s, -1, True))
    assert (rebuilt - probs).abs().max().item() <= 1e-13
    keep = (s_dmask[:, :, :20, :20] >= 0).double() / 0.8
    assert (out - torch.einsum("bhts,bshd->bthd", probs * keep, v)).abs().max().item() <= 1e-12
    torch.manual_seed(3)  # the private forward draws the same seed: the same S_dmask
    _, _, private, _ = _flash_attn_forward(q, k, v, 0.2, None, False, 4, 2, 0.0, None, True)
    assert torch.equal(private, s_dmask)


def test_varlen_s_dmask_holds_each_sequence_at_its_batch_index():
    lens = [7, 12, 3]
    cu = torch.tensor([0, 7, 19, 22], dtype=torch.int32)
    q, k, v = (torch.randn(22, 2, 8, dtype=torch.float64) for _ in range(3))
    out, lse, s_dmask = attn.flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, dropout_p=0.1, causal=True,
                                                    return_attn_probs=True)
    assert s_dmask.shape == (3, 2, 128, 128)
    for b, n in enumerate(lens):
        alone = attn.flash_attn_func(q[cu[b]:cu[b + 1]].unsqueeze(0), k[cu[b]:cu[b + 1]].unsqueeze(0),
                                     v[cu[b]:cu[b + 1]].unsqueeze(0), dropout_p=0.1, causal=True,
                                     return_attn_probs=True)[2]
        assert torch.equal(s_dmask[b, :, :n, :n].abs(), alone[0, :, :n, :n].abs())
        assert (s_dmask[b, :, n:] == 0).all() and (s_dmask[b, :, :, n:] == 0).all()
