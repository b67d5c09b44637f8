"""flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache on CUDA tensors: attn's CUDA
backend (bf16/f16, head dims 64, 128 and 256) against the f64 reference, with flash-attn's rules: 2x the
textbook error for outputs, 3x for gradients (the forward and backward; paged keys and the cache
inference only). Skipped where there is no GPU or the package was built without the
CUDA backend; scripts/gpu-check runs it on a lent GPU."""
import itertools

import pytest
import torch

import attn
from test_flash_attn import attention_ref, check_rule, grads

needs_gpu = pytest.mark.skipif(not (attn._C.has_cuda and torch.cuda.is_available()),
                               reason="needs a CUDA GPU and the package built with ATTN_CUDA=ON")

CASES = [(113, 203, 64), (128, 128, 128), (1, 239, 128), (97, 300, 256)]
MASKS = ["none", "causal", "local", "softcap", "alibi"]


def cuda_qkv(sq, sk, h, hk, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g).to(dtype)
    return make(2, sq, h, d), make(2, sk, hk, d), make(2, sk, hk, d)


def cu_seqlens(lens, device="cpu"):
    """flash-attn's cu_seqlens (int32, 0 then the running sums) of sequences of lengths lens."""
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)


def cuda_varlen_inputs(lens_q, lens_k, h, hk, d, g):
    """Packed bf16 q (sum(lens_q), h, d), k, v (sum(lens_k), hk, d) drawn from g, on the GPU and requiring
    grad, with their cu_seqlens there."""
    draw = lambda n, heads: torch.randn(n, heads, d, generator=g).to(torch.bfloat16).cuda().requires_grad_()
    return (draw(sum(lens_q), h), draw(sum(lens_k), hk), draw(sum(lens_k), hk), cu_seqlens(lens_q, "cuda"),
            cu_seqlens(lens_k, "cuda"))


def mask_kwargs(mask):
    """The keyword options of a MASKS entry (CPU tensors), and the same on the GPU."""
    kw = {"causal": mask in ("causal", "alibi")}
    if mask == "local":
        kw["window_size"] = (17, 5)
    if mask == "softcap":
        kw["softcap"] = 2.5
    if mask == "alibi":
        kw["alibi_slopes"] = torch.rand(2, 4, dtype=torch.float32, generator=torch.Generator().manual_seed(2)) * 0.3
    return kw, {key: (t.cuda() if torch.is_tensor(t) else t) for key, t in kw.items()}


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask", MASKS)
def test_cuda_forward_within_twice_the_textbook_error(dtype, case, mask):
    sq, sk, d = case
    q, k, v = cuda_qkv(sq, sk, 4, 2, d, dtype, seed=sq + d)
    kw, dev = mask_kwargs(mask)
    out, lse, _ = attn.flash_attn_func(q.cuda(), k.cuda(), v.cuda(), return_attn_probs=True, **dev)
    assert out.is_cuda and out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (2, 4, sq)
    ref = attention_ref(q, k, v, **kw)
    textbook = attention_ref(q, k, v, upcast=False, **kw)
    check_rule(out.cpu(), ref, textbook, 2, dtype, "out")
    cpu_out, cpu_lse, _ = attn.flash_attn_func(q.float(), k.float(), v.float(), return_attn_probs=True, **kw)
    torch.testing.assert_close(lse.cpu(), cpu_lse, rtol=1e-3, atol=1e-3)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mask", MASKS)
def test_cuda_gradients_within_thrice_the_textbook_error(dtype, case, mask):
    sq, sk, d = case
    q, k, v = (t.requires_grad_() for t in cuda_qkv(sq, sk, 4, 2, d, dtype, seed=sq + d + 1))
    kw, dev = mask_kwargs(mask)
    on_gpu = [t.detach().cuda().requires_grad_() for t in (q, k, v)]
    out = attn.flash_attn_func(*on_gpu, **dev)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(sq)).to(dtype)
    got = torch.autograd.grad(out, on_gpu, dout.cuda())
    ref, textbook = attention_ref(q, k, v, **kw), attention_ref(q, k, v, upcast=False, **kw)
    for name, g, gr, gt in zip("qkv", got, grads(ref, (q, k, v), dout), grads(textbook, (q, k, v), dout)):
        assert g.is_cuda and g.dtype == dtype
        check_rule(g.cpu(), gr, gt, 3, dtype, "d" + name)


@needs_gpu
def test_cuda_sinks_gradient_matches_the_cpu():
    q, k, v = cuda_qkv(64, 80, 4, 2, 64, torch.bfloat16, seed=21)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(22)).to(torch.bfloat16)
    def run(device):
        tensors = [t.to(device).requires_grad_() for t in (q, k, v, sinks)]
        out = attn.flash_attn_func(*tensors[:3], causal=True, sinks=tensors[3])
        return [g.cpu().double() for g in torch.autograd.grad(out, tensors, dout.to(device))]
    for name, g, want in zip(("dq", "dk", "dv", "dsinks"), run("cuda"), run("cpu")):
        assert (g - want).abs().max().item() <= 0.05 * max(want.abs().max().item(), 1.0), name


@needs_gpu
def test_cuda_varlen_gradients_equal_each_sequence_alone():
    lens_q, lens_k, h, hk, d = [17, 1, 64], [40, 33, 64], 4, 2, 128
    g = torch.Generator().manual_seed(13)
    q, k, v, cu_q, cu_k = cuda_varlen_inputs(lens_q, lens_k, h, hk, d, g)
    out = attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    dout = torch.randn(out.shape, generator=g).to(torch.bfloat16).cuda()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    for i in range(len(lens_q)):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        alone = [t[None, s].detach().requires_grad_() for t, s in ((q, qs), (k, ks), (v, ks))]
        o = attn.flash_attn_func(*alone, causal=True)
        want = torch.autograd.grad(o, alone, dout[None, qs])
        for name, got, w in zip(("dq", "dk", "dv"), (dq[qs], dk[ks], dv[ks]), want):
            assert torch.equal(got, w[0]), f"sequence {i}: {name}"


@needs_gpu
def test_cuda_private_forward_and_backward_equal_the_autograd_path():
    """flash-attn's _flash_attn_forward / _flash_attn_backward (what ring-flash-attn calls per block) on CUDA
    tensors: the same kernels as flash_attn_func's autograd, so the same bits."""
    from attn.flash_attn.flash_attn_interface import _flash_attn_backward, _flash_attn_forward
    q, k, v = (t.cuda().requires_grad_() for t in cuda_qkv(70, 90, 4, 2, 64, torch.bfloat16, seed=31))
    out, lse, _, rng = _flash_attn_forward(q, k, v, 0.0, None, True, -1, -1, 0.0, None, False)
    want_out, want_lse, _ = attn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(32)).to(torch.bfloat16).cuda()
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    _flash_attn_backward(dout, q, k, v, out, lse, dq, dk, dv, 0.0, None, True, -1, -1, 0.0, None, False, rng)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), torch.autograd.grad(want_out, (q, k, v), dout)):
        assert torch.equal(got, want), name


@needs_gpu
def test_cuda_private_varlen_forward_and_backward_equal_the_autograd_path():
    """_flash_attn_varlen_forward / _flash_attn_varlen_backward (ring-flash-attn's varlen rings) on CUDA tensors."""
    from attn.flash_attn.flash_attn_interface import _flash_attn_varlen_backward, _flash_attn_varlen_forward
    lens_q, lens_k, h, hk, d = [17, 1, 64], [40, 33, 64], 4, 2, 64
    g = torch.Generator().manual_seed(33)
    q, k, v, cu_q, cu_k = cuda_varlen_inputs(lens_q, lens_k, h, hk, d, g)
    args = (cu_q, cu_k, max(lens_q), max(lens_k))
    out, lse, _, rng = _flash_attn_varlen_forward(q, k, v, *args, 0.0, None, True)
    want_out, want_lse, _ = attn.flash_attn_varlen_func(q, k, v, *args, causal=True, return_attn_probs=True)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    dout = torch.randn(out.shape, generator=g).to(torch.bfloat16).cuda()
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    _flash_attn_varlen_backward(dout, q, k, v, out, lse, dq, dk, dv, *args, 0.0, None, True, -1, -1, 0.0, None, False,
                                rng)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), torch.autograd.grad(want_out, (q, k, v), dout)):
        assert torch.equal(got, want), name


@needs_gpu
def test_cuda_packed_forms_and_the_plain_call():
    q, k, v = (t.cuda() for t in cuda_qkv(64, 64, 4, 4, 128, torch.bfloat16, seed=3))
    plain = attn.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(attn.flash_attn_qkvpacked_func(torch.stack((q, k, v), dim=2), causal=True), plain)
    assert torch.equal(attn.flash_attn_kvpacked_func(q, torch.stack((k, v), dim=2), causal=True), plain)


@needs_gpu
def test_cuda_bad_input_gets_a_named_error():
    q, k, v = (t.cuda() for t in cuda_qkv(16, 16, 2, 2, 64, torch.bfloat16, seed=4))
    with pytest.raises(attn.AttnError, match="k: must be on q's device"):
        attn.flash_attn_func(q, k.cpu(), v)
    with pytest.raises(attn.AttnError, match="dropout"):
        attn.flash_attn_func(q.detach().requires_grad_(), k, v, dropout_p=0.1)
    with pytest.raises(attn.AttnError, match="head_dim"):
        attn.flash_attn_func(*(t[..., :48].contiguous() for t in (q.detach(), k, v)))
    with pytest.raises(attn.AttnError, match="dropout"):
        attn.flash_attn_func(q.detach(), k, v, dropout_p=0.1)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_varlen_within_twice_the_textbook_error(dtype, causal):
    lens_q, lens_k, h, hk, d = [17, 1, 64], [40, 33, 64], 4, 2, 128
    g = torch.Generator().manual_seed(9)
    q = torch.randn(sum(lens_q), h, d, generator=g).to(dtype)
    k, v = (torch.randn(sum(lens_k), hk, d, generator=g).to(dtype) for _ in range(2))
    cu_q, cu_k = cu_seqlens(lens_q), cu_seqlens(lens_k)
    out, lse, _ = attn.flash_attn_varlen_func(q.cuda(), k.cuda(), v.cuda(), cu_q.cuda(), cu_k.cuda(), max(lens_q),
                                              max(lens_k), causal=causal, return_attn_probs=True)
    assert out.is_cuda and lse.shape == (h, sum(lens_q))
    for i in range(len(lens_q)):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        args = (q[None, qs], k[None, ks], v[None, ks])
        check_rule(out[None, qs].cpu(), attention_ref(*args, causal=causal),
                   attention_ref(*args, causal=causal, upcast=False), 2, dtype, f"sequence {i}")


@needs_gpu
@pytest.mark.parametrize("page_size", [1, 16, 48, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_varlen_paged_equals_the_packed_call(page_size, causal):
    from test_varlen_paged import paged_from_packed
    lens_q, lens_k, h, hk, d = [17, 0, 70], [40, 9, 300], 4, 2, 64
    g = torch.Generator().manual_seed(11)
    q = torch.randn(sum(lens_q), h, d, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(sum(lens_k), hk, d, generator=g).to(torch.bfloat16) for _ in range(2))
    k_cache, v_cache, table = paged_from_packed(k, v, lens_k, page_size, seed=page_size)
    args = (cu_seqlens(lens_q, "cuda"), cu_seqlens(lens_k, "cuda"), max(lens_q), max(lens_k))
    want, want_lse, _ = attn.flash_attn_varlen_func(q.cuda(), k.cuda(), v.cuda(), *args, causal=causal,
                                                    return_attn_probs=True)
    got, got_lse, _ = attn.flash_attn_varlen_func(q.cuda(), k_cache.cuda(), v_cache.cuda(), *args, causal=causal,
                                                  return_attn_probs=True, block_table=table.cuda())
    assert got.is_cuda and torch.equal(got, want) and torch.equal(got_lse, want_lse)


@needs_gpu
def test_cuda_varlen_paged_bad_table_gets_the_cpu_message():
    from test_varlen_paged import paged_from_packed
    q = torch.randn(5, 2, 64).to(torch.bfloat16).cuda()
    k = torch.randn(12, 2, 64).to(torch.bfloat16)
    k_cache, v_cache, table = paged_from_packed(k, k, [12], 4)
    table[0, 1] = 99
    cu = lambda *x: torch.tensor(x, dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match=r"block_table: entry \[0\]\[1\]"):
        attn.flash_attn_varlen_func(q, k_cache.cuda(), v_cache.cuda(), cu(0, 5), cu(0, 12), 5, 12,
                                    block_table=table.cuda())
    with pytest.raises(attn.AttnError, match="block_table: must be on q's device"):
        attn.flash_attn_varlen_func(q, k_cache.cuda(), v_cache.cuda(), cu(0, 5), cu(0, 12), 5, 12, block_table=table)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "paged16"])
@pytest.mark.parametrize("sq,new,causal", [(1, 0, False), (1, 1, True), (3, 2, True)])
def test_cuda_kvcache_within_twice_the_textbook_error(dtype, layout, sq, new, causal):
    from test_kvcache import appended, check_each_sequence, make_case, paged
    b, hk, group, d, max_len = 3, 2, 4, 128, 300
    q, k_cache, v_cache, seqlens, k_new, v_new = make_case(b, sq, hk, group, d, max_len, new, dtype, seed=sq + new)
    want_k, want_v = appended(k_cache, v_cache, seqlens, k_new, v_new)
    block_table = None
    if layout == "paged16":
        k_cache, block_table = paged(k_cache, 16)
        v_cache, _ = paged(v_cache, 16)
        block_table = block_table.cuda()
    cuda = lambda t: None if t is None else t.cuda()
    kc, vc = k_cache.cuda(), v_cache.cuda()
    out, lse = attn.flash_attn_with_kvcache(q.cuda(), kc, vc, cuda(k_new), cuda(v_new), cache_seqlens=seqlens.cuda(),
                                            block_table=block_table, causal=causal, return_softmax_lse=True)
    assert out.is_cuda and lse.is_cuda and lse.shape == (b, hk * group, sq)
    if block_table is not None:
        bt = block_table.long().cpu()
        kc, vc = (c.cpu()[bt].reshape(b, -1, hk, d)[:, :max_len] for c in (kc, vc))
    assert torch.equal(kc.cpu(), want_k) and torch.equal(vc.cpu(), want_v), "the cache after the append"
    check_each_sequence(out.cpu(), q, want_k, want_v, seqlens, new, causal, dtype)


@needs_gpu
def test_cuda_kvcache_bad_input_gets_a_named_error():
    from test_kvcache import make_case
    q, k_cache, v_cache, seqlens, _, _ = make_case(2, 1, 1, 2, 64, 40, 0, torch.bfloat16, seed=5)
    q, k_cache, v_cache = q.cuda(), k_cache.cuda(), v_cache.cuda()
    with pytest.raises(attn.AttnError, match="cache_seqlens: must be on q's device"):
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)
    k8 = torch.zeros(2, 40, 1, 64, dtype=torch.int8, device="cuda")
    scale = torch.ones(2, 40, 1, device="cuda")
    with pytest.raises(attn.AttnError, match="CPU-only"):
        attn.flash_attn_with_kvcache(q, k8, k8, cache_seqlens=seqlens.cuda(), k_scale=scale, v_scale=scale)


@needs_gpu
def test_cuda_keys_per_split_makes_decode_batch_invariant():
    g = torch.Generator().manual_seed(11)
    q = torch.randn(16, 1, 8, 64, generator=g).to(torch.bfloat16).cuda()
    k_cache, v_cache = (torch.randn(16, 900, 2, 64, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
    lens = torch.randint(1, 900, (16,), generator=g, dtype=torch.int32).cuda()
    together = attn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, keys_per_split=128)
    for b in (0, 5, 15):
        alone = attn.flash_attn_with_kvcache(q[b:b + 1], k_cache[b:b + 1], v_cache[b:b + 1],
                                             cache_seqlens=lens[b:b + 1], keys_per_split=128)
        assert torch.equal(alone, together[b:b + 1])


@needs_gpu
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("causal,sq", [(False, 1), (True, 3)])
def test_cuda_kvcache_rotary_matches_flash_attn_layers_rotary(interleaved, causal, sq):
    """q and the appended keys rotated as flash_attn.layers.rotary rotates them (at the cache position,
    q per row when causal), then the 2x rule against the f64 reference on the rotated inputs."""
    from attn.flash_attn.layers.rotary import apply_rotary_emb
    from test_kvcache import make_case
    b, hk, group, d, max_len, new = 2, 2, 4, 64, 200, 3
    q, k_cache, v_cache, seqlens, k_new, v_new = make_case(b, sq, hk, group, d, max_len, new, torch.bfloat16, seed=13)
    angle = torch.rand(256, 16, dtype=torch.float64) * 6  # rotary_dim 32 of d 64
    cos, sin = angle.cos().float(), angle.sin().float()
    kc = k_cache.cuda()
    out = attn.flash_attn_with_kvcache(q.cuda(), kc, v_cache.cuda(), k_new.cuda(), v_new.cuda(), rotary_cos=cos.cuda(),
                                       rotary_sin=sin.cuda(), cache_seqlens=seqlens.cuda(), causal=causal,
                                       rotary_interleaved=interleaved).cpu()
    c64, s64 = cos.double(), sin.double()
    for i in range(b):
        n = int(seqlens[i])
        k_rot = apply_rotary_emb(k_new[i:i + 1].double(), c64, s64, interleaved=interleaved, seqlen_offsets=n)
        torch.testing.assert_close(kc[i, n:n + new].cpu().double(), k_rot[0], rtol=1e-2, atol=1e-2)
        q_rot = (apply_rotary_emb(q[i:i + 1].double(), c64, s64, interleaved=interleaved, seqlen_offsets=n) if causal
                 else apply_rotary_emb(q[i:i + 1].double(), c64[n:n + 1].expand(sq, -1), s64[n:n + 1].expand(sq, -1),
                                       interleaved=interleaved))
        keys = torch.cat((k_cache[i:i + 1, :n].double(), k_rot), dim=1)
        values = v_cache[i:i + 1, :n + new].clone()
        values[0, n:] = v_new[i]
        # The oracle on the exact rotations; the textbook on them rounded to bf16, as the kernels store them.
        textbook = attention_ref(q_rot.to(torch.bfloat16), keys.to(torch.bfloat16), values, causal=causal,
                                 upcast=False)
        check_rule(out[i:i + 1], attention_ref(q_rot, keys, values, causal=causal), textbook, 2, torch.bfloat16,
                   f"sequence {i}")


@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_kvcache_batch_idx_and_leftpad_equal_the_compacted_cache(causal):
    """cache_batch_idx and cache_leftpad only move where keys are read and appended: the same keys
    compacted into rows 0..batch-1 from position 0 give the same out and lse bit for bit."""
    g = torch.Generator().manual_seed(21)
    rows, cap, hk, d = 5, 96, 2, 64
    seqlens, leftpad, batch_idx = [40, 90, 7], [3, 0, 7], [4, 0, 2]
    big_k, big_v = (torch.randn(rows, cap, hk, d, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(3, 2, 4, d, generator=g).to(torch.bfloat16)
    k_new, v_new = (torch.randn(3, 1, hk, d, generator=g).to(torch.bfloat16) for _ in range(2))
    small_k, small_v = (torch.zeros(3, cap, hk, d, dtype=torch.bfloat16) for _ in range(2))
    for b in range(3):
        keys = slice(leftpad[b], seqlens[b])
        small_k[b, :keys.stop - keys.start] = big_k[batch_idx[b], keys]
        small_v[b, :keys.stop - keys.start] = big_v[batch_idx[b], keys]
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")
    kc, vc = big_k.cuda(), big_v.cuda()
    got, got_lse = attn.flash_attn_with_kvcache(q.cuda(), kc, vc, k_new.cuda(), v_new.cuda(),
                                                cache_seqlens=i32(seqlens), cache_batch_idx=i32(batch_idx),
                                                cache_leftpad=i32(leftpad), causal=causal, return_softmax_lse=True)
    want, want_lse = attn.flash_attn_with_kvcache(q.cuda(), small_k.cuda(), small_v.cuda(), k_new.cuda(),
                                                  v_new.cuda(),
                                                  cache_seqlens=i32([s - l for s, l in zip(seqlens, leftpad)]),
                                                  causal=causal, return_softmax_lse=True)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
    for b in range(3):
        assert torch.equal(kc[batch_idx[b], seqlens[b]].cpu(), k_new[b, 0]), "the append, at row batch_idx[b]"
