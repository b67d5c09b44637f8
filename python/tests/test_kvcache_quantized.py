"""flash_attn_with_kvcache over quantized caches (torch.int8, float8_e4m3fn, float8_e5m2 with k_scale,
v_scale): the output against the textbook on the dequantized cache (2x rule at f32), appended keys
quantized as PyTorch's own float8 conversion does, per-token scales computed and written, and bad
input named."""
import pytest
import torch

import attn
from test_flash_attn import attention_ref, check_rule

FP8 = [t for t in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, t)]
MAX = {"int8": 127.0, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def dequantized(cache, scale):
    """float(code) * scale in f32, scale broadcast as attn reads it (per kv head, or per token)."""
    codes = cache.float()
    if scale.dim() == 1:  # per kv head
        return codes * scale.view(1, 1, -1, 1)
    return codes * scale.float().unsqueeze(-1) if scale.dim() == 3 else codes * scale.float()


def quantize_per_token(x):
    """int8 with one f32 scale per (position, kv head): amax / 127, round to nearest even."""
    s = x.abs().amax(dim=-1) / 127.0
    q = torch.where(s.unsqueeze(-1) > 0, x / s.unsqueeze(-1), torch.zeros_like(x))
    return torch.round(q).clamp(-127, 127).to(torch.int8), s


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("sq", [1, 3])
def test_int8_per_token_within_twice_the_textbook(paged, sq):
    g = torch.Generator().manual_seed(sq)
    b, hk, group, d, n = 2, 2, 4, 64, 90
    q = torch.randn(b, sq, hk * group, d, generator=g)
    k, v = torch.randn(b, n, hk, d, generator=g), torch.randn(b, n, hk, d, generator=g)
    kc, ks = quantize_per_token(k)
    vc, vs = quantize_per_token(v)
    kd, vd = dequantized(kc, ks), dequantized(vc, vs)
    table = None
    if paged:  # pages of 9 slots, sequence b's page j at b * 10 + j
        kc, vc = kc.reshape(b * 10, 9, hk, d), vc.reshape(b * 10, 9, hk, d)
        ks, vs = ks.reshape(b * 10, 9, hk), vs.reshape(b * 10, 9, hk)
        table = torch.arange(b * 10, dtype=torch.int32).view(b, 10)
    out = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=n, block_table=table, causal=sq > 1,
                                       k_scale=ks, v_scale=vs)
    ref = attention_ref(q, kd, vd, causal=sq > 1)
    textbook = attention_ref(q, kd, vd, causal=sq > 1, upcast=False)
    check_rule(out, ref, textbook, 2, torch.float32, "int8 per token")


@pytest.mark.skipif(not FP8, reason="this PyTorch has no float8 types")
@pytest.mark.parametrize("name", FP8)
def test_fp8_append_matches_torch_and_the_output_the_dequantized_textbook(name):
    """Appended keys are quantized by the given per-kv-head scales exactly as torch's conversion of
    x / scale (round to nearest even; values kept in range), and the output is within 2x the textbook."""
    dt = getattr(torch, name)
    g = torch.Generator().manual_seed(5)
    b, hk, group, d, cap, n, new = 2, 2, 2, 32, 40, 30, 4
    q = torch.randn(b, 1, hk * group, d, generator=g)
    k, v = torch.randn(b, n + new, hk, d, generator=g), torch.randn(b, n + new, hk, d, generator=g)
    # One scale per kv head from the data, with room, so that no x / scale leaves the type's range
    # (torch's float8 conversion gives NaN or Inf there; attn's saturates).
    ks = k.abs().amax(dim=(0, 1, 3)) / MAX[name] * 1.25
    vs = v.abs().amax(dim=(0, 1, 3)) / MAX[name] * 1.25
    kc = torch.zeros(b, cap, hk, d, dtype=dt)
    vc = torch.zeros(b, cap, hk, d, dtype=dt)
    kc[:, :n] = (k[:, :n] / ks.view(1, 1, -1, 1)).to(dt)
    vc[:, :n] = (v[:, :n] / vs.view(1, 1, -1, 1)).to(dt)
    out = attn.flash_attn_with_kvcache(q, kc, vc, k=k[:, n:], v=v[:, n:], cache_seqlens=n, k_scale=ks, v_scale=vs)
    want_k = (k[:, n:] / ks.view(1, 1, -1, 1)).to(dt)
    assert torch.equal(kc[:, n:n + new].view(torch.uint8), want_k.view(torch.uint8))
    kd, vd = dequantized(kc[:, :n + new], ks), dequantized(vc[:, :n + new], vs)
    check_rule(out, attention_ref(q, kd, vd), attention_ref(q, kd, vd, upcast=False), 2, torch.float32, name)


def test_per_token_scales_of_the_appended_keys_are_computed_and_written():
    g = torch.Generator().manual_seed(9)
    b, hk, d, cap = 1, 2, 64, 8
    kc, vc = torch.zeros(b, cap, hk, d, dtype=torch.int8), torch.zeros(b, cap, hk, d, dtype=torch.int8)
    ks, vs = torch.zeros(b, cap, hk), torch.zeros(b, cap, hk)
    k, v = torch.randn(b, 3, hk, d, generator=g), torch.randn(b, 3, hk, d, generator=g)
    q = torch.randn(b, 1, 4, d, generator=g)
    attn.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=2, k_scale=ks, v_scale=vs)
    want_codes, want_scales = quantize_per_token(k)
    assert torch.equal(ks[:, 2:5], want_scales)
    assert torch.equal(kc[:, 2:5], want_codes)
    assert torch.equal(ks[:, :2], torch.zeros(b, 2, hk)) and torch.equal(ks[:, 5:], torch.zeros(b, 3, hk))


def test_bad_quantized_input_is_named():
    q = torch.randn(1, 1, 2, 32)
    kc = torch.zeros(1, 4, 1, 32, dtype=torch.int8)
    with pytest.raises(attn.AttnError, match="k_scale: required for a quantized cache"):
        attn.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=4)
    with pytest.raises(attn.AttnError, match="cache.k_scale: groups"):
        attn.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=4, k_scale=torch.ones(1, 4, 1, 5),
                                     v_scale=torch.ones(1, 4, 1, 1))
    with pytest.raises(attn.AttnError, match="cache.v_scale: dtype must be f32 or f16"):
        attn.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=4, k_scale=torch.ones(1, 4, 1),
                                     v_scale=torch.ones(1, 4, 1, dtype=torch.bfloat16))
    with pytest.raises(attn.AttnError, match="v_cache: dtype must match k_cache"):
        attn.flash_attn_with_kvcache(q, kc, torch.zeros(1, 4, 1, 32), cache_seqlens=4, k_scale=torch.ones(1),
                                     v_scale=torch.ones(1))


def rounded_rows(q):
    """q with each row rounded as quantized_query rounds it: scale = amax / 127 (f32), code = q / scale
    to nearest even (torch.round), value code * scale; a row below f32's normal range becomes zero."""
    s = q.abs().amax(dim=-1, keepdim=True) / 127.0
    ok = s >= torch.finfo(torch.float32).tiny
    return torch.where(ok, torch.round(q / torch.where(ok, s, torch.ones_like(s))) * s, torch.zeros_like(q))


@pytest.mark.parametrize("blocks", [False, True])
def test_quantized_query_within_twice_the_textbook_of_the_rounded_queries(blocks):
    """quantized_query=True: where attn.info() says its kernel runs, the output is within 2x the textbook's
    error of the oracle on the rounded q (per token or q8_0 blocks of 32); elsewhere of the one on q."""
    g = torch.Generator().manual_seed(17)
    b, hk, group, d, n = 2, 2, 4, 128, 150
    q = torch.randn(b, 1, hk * group, d, generator=g)
    k, v = torch.randn(b, n, hk, d, generator=g), torch.randn(b, n, hk, d, generator=g)
    if blocks:  # q8_0: a scale per 32 dims
        kc, ks = quantize_per_token(k.view(b, n, hk, d // 32, 32))
        kc, ks = kc.view(b, n, hk, d), ks
        kd = kc.float().view(b, n, hk, d // 32, 32).mul(ks.unsqueeze(-1)).view(b, n, hk, d)
    else:
        kc, ks = quantize_per_token(k)
        kd = dequantized(kc, ks)
    vc, vs = quantize_per_token(v)
    vd = dequantized(vc, vs)
    out = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs, quantized_query=True)
    qs = rounded_rows(q) if attn.info()["quantized_query"] else q
    check_rule(out, attention_ref(qs, kd, vd), attention_ref(qs, kd, vd, upcast=False), 2, torch.float32,
               "quantized_query")
    exact = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=n, k_scale=ks, v_scale=vs)
    if attn.info()["quantized_query"]:
        assert not torch.equal(out, exact), "quantized_query ran the exact kernel"


def test_quantized_query_on_another_cache_is_named():
    q = torch.randn(1, 1, 2, 64)
    kc = torch.zeros(1, 4, 1, 64)
    with pytest.raises(attn.AttnError, match="quantized_query: needs an int8 cache"):
        attn.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=4, quantized_query=True)
