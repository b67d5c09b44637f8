"""attn.flash_attn: `import flash_attn` after install() gives attn's functions and flash-attn's helper
modules (bert_padding, layers.rotary, the private _flash_attn_forward/_backward)."""
import torch

import attn.flash_attn

attn.flash_attn.install()

import flash_attn  # noqa: E402
from flash_attn import flash_attn_func, flash_attn_varlen_func  # noqa: E402
from flash_attn.bert_padding import pad_input, unpad_input  # noqa: E402
from flash_attn.flash_attn_interface import (_flash_attn_backward, _flash_attn_forward,  # noqa: E402
                                             _flash_attn_varlen_backward, _flash_attn_varlen_forward)
from flash_attn.layers.rotary import RotaryEmbedding, apply_rotary_emb  # noqa: E402


def test_flash_attn_is_attn():
    assert flash_attn.flash_attn_func is attn.flash_attn_func
    assert flash_attn.__version__.startswith("2.")


def test_unpad_varlen_pad_equals_padded_attention():
    b, s, h, d = 3, 11, 2, 8
    x = torch.randn(b, s, h * 3 * d, dtype=torch.float64)
    mask = torch.arange(s).view(1, -1) < torch.tensor([11, 4, 7]).view(-1, 1)
    packed, indices, cu, max_len, used = unpad_input(x, mask)
    assert packed.shape[0] == 22 and cu.tolist() == [0, 11, 15, 22] and max_len == 11 and used.tolist() == [11, 4, 7]
    assert torch.equal(pad_input(packed, indices, b, s)[mask], x[mask])
    qkv = packed.view(-1, 3, h, d)
    out = flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu, cu, max_len, max_len, causal=True)
    padded = pad_input(out.reshape(-1, h * d), indices, b, s).view(b, s, h, d)
    for i, n in enumerate((11, 4, 7)):
        q = x[i:i + 1, :n].view(1, n, 3, h, d)
        alone = flash_attn_func(q[:, :, 0], q[:, :, 1], q[:, :, 2], causal=True)
        assert (padded[i, :n] - alone[0]).abs().max().item() <= 1e-12


def test_rotary_matches_complex_multiplication():
    b, s, h, d = 2, 9, 3, 16
    x = torch.randn(b, s, h, d, dtype=torch.float64)
    theta = torch.rand(s, d // 4, dtype=torch.float64) * 6  # rotary_dim = d / 2
    cos, sin = theta.cos(), theta.sin()
    for interleaved in (False, True):
        got = apply_rotary_emb(x, cos, sin, interleaved=interleaved)
        rot = x[..., : d // 2]
        pairs = (rot.unflatten(-1, (-1, 2)) if interleaved else rot.unflatten(-1, (2, -1)).transpose(-1, -2))
        z = torch.view_as_complex(pairs.contiguous()) * torch.polar(torch.ones_like(theta), theta)[None, :, None]
        want = torch.view_as_real(z)
        want = want.flatten(-2) if interleaved else want.transpose(-1, -2).flatten(-2)
        assert (got[..., : d // 2] - want).abs().max().item() < 1e-12
        assert torch.equal(got[..., d // 2:], x[..., d // 2:])
    q, k = RotaryEmbedding(d)(x, x)
    assert q.shape == x.shape and torch.allclose(q.norm(dim=-1), x.norm(dim=-1))


def test_rotary_in_16_bits_rounds_once():
    """bf16 and f16 inputs are rotated in f32 and rounded to their dtype once, as flash-attn's kernel does:
    each result y is within one unit in the last place (eps * |y|) of the f64 rotation, but for f32's own
    rounding of the two products and their difference (under 2^-22 of the row's largest |x|), which shows
    only where the products cancel. Rotating in 16 bits rounds cos, sin, the products and the difference
    each at 2^-9 (bf16) or 2^-12 (f16) and fails this where they cancel."""
    b, s, h, d = 2, 64, 4, 64
    g = torch.Generator().manual_seed(3)
    theta = torch.rand(s, d // 4, generator=g, dtype=torch.float64) * 100  # rotary_dim = d / 2
    cos, sin = theta.cos().float(), theta.sin().float()
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(b, s, h, d, generator=g).to(dtype)
        size = x[..., : d // 2].double().abs().amax(dim=-1, keepdim=True)
        for interleaved in (False, True):
            got = apply_rotary_emb(x, cos, sin, interleaved=interleaved)
            want = apply_rotary_emb(x.double(), cos.double(), sin.double(), interleaved=interleaved)[..., : d // 2]
            err = (got[..., : d // 2].double() - want).abs()
            assert got.dtype == dtype
            assert (err <= torch.finfo(dtype).eps * want.abs() + 2**-21 * size).all(), (dtype, interleaved)
            assert torch.equal(got[..., d // 2:], x[..., d // 2:])


def test_private_forward_and_backward_match_autograd():
    q, k, v = (torch.randn(1, 13, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, lse, _, rng = _flash_attn_forward(q, k, v, 0.0, None, True, -1, -1, 0.0, None, False)
    ref = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, ref.detach())
    dout = torch.randn_like(out)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    d = _flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, None, True, -1, -1, 0.0, None, False, rng)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), want))
    assert d.shape == (1, 2, 13) and (d - (dout * out).sum(-1).transpose(1, 2)).abs().max().item() < 1e-12


def test_private_varlen_forward_and_backward_match_autograd():
    """flash-attn 2.8's _flash_attn_varlen_forward/_backward (what ring-flash-attn calls): the same out, lse
    and gradients as flash_attn_varlen_func under autograd, dq/dk/dv written in place."""
    cu = torch.tensor([0, 5, 5, 17], dtype=torch.int32)
    q, k, v = (torch.randn(17, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, lse, _, rng = _flash_attn_varlen_forward(q, k, v, cu, cu, 12, 12, 0.0, None, True)
    ref, ref_lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, causal=True, return_attn_probs=True)
    assert torch.equal(out, ref.detach()) and torch.equal(lse, ref_lse) and lse.shape == (4, 17)
    dout = torch.randn_like(out)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    d = _flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, cu, cu, 12, 12, 0.0, None, True, -1, -1, 0.0,
                                    None, False, rng)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), want))
    assert d.shape == (4, 17) and (d - (dout * out).sum(-1).transpose(0, 1)).abs().max().item() < 1e-12


def test_private_varlen_forward_paged_and_its_refusals():
    """block_table: k and v as a paged cache give what the packed keys give; leftpad_k raises a named error
    (seqused_k: test_flash_attn_seqused_k.py)."""
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 6, 16], dtype=torch.int32)
    q = torch.randn(7, 2, 8, dtype=torch.float64)
    k, v = torch.randn(16, 2, 8, dtype=torch.float64), torch.randn(16, 2, 8, dtype=torch.float64)
    want, want_lse, _, _ = _flash_attn_varlen_forward(q, k, v, cu_q, cu_k, 4, 10, 0.0, None, False)
    # Pages of 4 keys: sequence 0's 6 keys in pages 3, 0; sequence 1's 10 in pages 1, 4, 2 (each padded).
    pages = torch.zeros(5, 4, 2, 8, dtype=torch.float64)
    table = torch.tensor([[3, 0, 0], [1, 4, 2]], dtype=torch.int32)
    for b, (start, n) in enumerate(((0, 6), (6, 10))):
        for j in range(n):
            pages[table[b, j // 4], j % 4] = k[start + j]
    vpages = torch.zeros_like(pages)
    for b, (start, n) in enumerate(((0, 6), (6, 10))):
        for j in range(n):
            vpages[table[b, j // 4], j % 4] = v[start + j]
    got, got_lse, _, _ = _flash_attn_varlen_forward(q, pages, vpages, cu_q, cu_k, 4, 10, 0.0, None, False,
                                                    block_table=table)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
    for name in ("leftpad_k",):
        try:
            _flash_attn_varlen_forward(q, k, v, cu_q, cu_k, 4, 10, 0.0, None, False,
                                       **{name: torch.zeros(2, dtype=torch.int32)})
        except Exception as e:  # attn's AttnError: named argument and rule
            assert name in str(e) and "_flash_attn_varlen_forward" in str(e)
        else:
            raise AssertionError(f"{name} was accepted")
