"""flash_attn_interface.flash_attn_gpu: flash-attn 2.8's C++ extension (flash_attn_2_cuda) on attn. Each of its
five functions, called with the extension's positional arguments as flash-attn's Python layer calls it,
against attn's public function on the same inputs: the same bits (it is the same kernel), in f32 and bf16;
preallocated outputs written in place and returned; the extension's return lists and their shapes; errors."""
import inspect

import pytest
import torch

import attn
import attn.flash_attn
from attn.flash_attn.flash_attn_interface import flash_attn_gpu as gpu

DTYPES = [torch.float32, torch.bfloat16]


def rand(g, *shape, dtype):
    return torch.randn(*shape, generator=g).to(dtype)


def nan_like(t, shape=None):
    return torch.full(t.shape if shape is None else shape, float("nan"), dtype=t.dtype)


def rounded(n):
    return -(-n // 128) * 128


def test_install_registers_the_extension_and_its_arity():
    attn.flash_attn.install()
    import flash_attn_2_cuda
    from flash_attn.flash_attn_interface import flash_attn_gpu
    assert flash_attn_2_cuda is gpu and flash_attn_gpu is gpu
    # flash-attn 2.8's pybind11 signatures: positional, this many (varlen_fwd: and num_splits, after 2.8).
    arity = {"fwd": 13, "varlen_fwd": 22, "bwd": 19, "varlen_bwd": 24, "fwd_kvcache": 20}
    for name, n in arity.items():
        params = inspect.signature(getattr(gpu, name)).parameters.values()
        assert len(params) == n and all(p.kind is p.POSITIONAL_ONLY for p in params), name


# (causal, window, softcap, alibi) of each case, GQA throughout
OPTIONS = [(False, (-1, -1), 0.0, False), (True, (-1, -1), 0.0, False), (False, (3, 2), 5.0, True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,window,softcap,alibi", OPTIONS)
def test_fwd_and_bwd_equal_the_public_function(dtype, causal, window, softcap, alibi):
    g = torch.Generator().manual_seed(1)
    b, sq, sk, h, hk, d = 2, 9, 13, 4, 2, 16
    q, k, v = rand(g, b, sq, h, d, dtype=dtype), rand(g, b, sk, hk, d, dtype=dtype), rand(g, b, sk, hk, d, dtype=dtype)
    slopes = torch.rand(h, generator=g) if alibi else None
    out_ = nan_like(q)
    res = gpu.fwd(q, k, v, out_, slopes, 0.0, 0.3, causal, window[0], window[1], softcap, False, None)
    assert isinstance(res, list) and len(res) == 4
    out, lse, s_dmask, rng_state = res
    assert out is out_ and lse.shape == (b, h, sq) and lse.dtype == torch.float32
    assert s_dmask.shape == (0,) and rng_state.shape == (2,) and rng_state.dtype == torch.int64
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    want, want_lse, _ = attn.flash_attn_func(qg, kg, vg, 0.0, 0.3, causal, window, softcap, slopes,
                                             return_attn_probs=True)
    assert torch.equal(out, want.detach()) and torch.equal(lse, want_lse.detach())

    dout = rand(g, b, sq, h, d, dtype=dtype)
    want_grads = torch.autograd.grad(want, (qg, kg, vg), dout)
    dq_, dk_, dv_ = nan_like(q), nan_like(k), nan_like(v)
    res = gpu.bwd(dout, q, k, v, out, lse, dq_, dk_, dv_, slopes, 0.0, 0.3, causal, window[0], window[1], softcap,
                  False, None, rng_state)
    assert isinstance(res, list) and len(res) == 4
    assert all(got is given for got, given in zip(res, (dq_, dk_, dv_)))
    assert all(torch.equal(a, w) for a, w in zip(res[:3], want_grads))
    softmax_d = res[3]
    assert softmax_d.shape == (b, h, rounded(sq)) and softmax_d.dtype == torch.float32
    rowsum = (dout.float() * out.float()).sum(-1).transpose(1, 2)
    assert torch.equal(softmax_d[..., :sq], rowsum) and not softmax_d[..., sq:].any()
    # Without preallocated gradients: new ones, the same values.
    res = gpu.bwd(dout, q, k, v, out, lse, None, None, None, slopes, 0.0, 0.3, causal, window[0], window[1], softcap,
                  False, None, rng_state)
    assert all(torch.equal(a, w) for a, w in zip(res[:3], want_grads))


@pytest.mark.parametrize("dtype", DTYPES)
def test_fwd_and_bwd_with_dropout_replay_the_public_function(dtype):
    """gen_ seeds the dropout as torch.manual_seed seeds the public function's; the backward takes the mask
    from rng_state; S_dmask is flash-attn's (batch, nheads, seqlen rounded to 128); softmax_d carries the
    keep probability, as flash-attn's kernel's does."""
    g = torch.Generator().manual_seed(2)
    b, s, h, d, p = 1, 11, 2, 8, 0.3
    q, k, v = (rand(g, b, s, h, d, dtype=dtype) for _ in range(3))
    out, lse, s_dmask, rng_state = gpu.fwd(q, k, v, None, None, p, None, True, -1, -1, 0.0, True,
                                           torch.Generator().manual_seed(7))
    torch.manual_seed(7)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    want, want_lse, want_s = attn.flash_attn_func(qg, kg, vg, p, causal=True, return_attn_probs=True)
    assert torch.equal(out, want.detach()) and torch.equal(lse, want_lse) and torch.equal(s_dmask, want_s)
    assert s_dmask.shape == (b, h, 128, 128) and (s_dmask[:, :, :s, :s] < 0).any()
    dout = rand(g, b, s, h, d, dtype=dtype)
    dq, dk, dv, softmax_d = gpu.bwd(dout, q, k, v, out, lse, None, None, None, None, p, None, True, -1, -1, 0.0,
                                    False, None, rng_state)
    assert all(torch.equal(a, w) for a, w in zip((dq, dk, dv), torch.autograd.grad(want, (qg, kg, vg), dout)))
    rowsum = (dout.float() * out.float()).sum(-1).transpose(1, 2) * (1 - p)
    assert torch.equal(softmax_d[..., :s], rowsum)


def varlen_case(g, dtype):
    cu_q = torch.tensor([0, 5, 5, 12], dtype=torch.int32)  # an empty sequence among them
    cu_k = torch.tensor([0, 7, 10, 19], dtype=torch.int32)
    h, hk, d = 4, 2, 16
    return cu_q, cu_k, rand(g, 12, h, d, dtype=dtype), rand(g, 19, hk, d, dtype=dtype), rand(g, 19, hk, d, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,window,softcap,alibi", OPTIONS)
def test_varlen_fwd_and_bwd_equal_the_public_function(dtype, causal, window, softcap, alibi):
    g = torch.Generator().manual_seed(3)
    cu_q, cu_k, q, k, v = varlen_case(g, dtype)
    slopes = torch.rand(3, 4, generator=g) if alibi else None  # (batch, nheads)
    out_ = nan_like(q)
    res = gpu.varlen_fwd(q, k, v, out_, cu_q, cu_k, None, None, None, slopes, 7, 9, 0.0, 0.25, False, causal,
                         window[0], window[1], softcap, False, None)
    assert isinstance(res, list) and len(res) == 4
    out, lse, s_dmask, rng_state = res
    assert out is out_ and lse.shape == (4, 12) and s_dmask.shape == (0,) and rng_state.shape == (2,)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    want, want_lse, _ = attn.flash_attn_varlen_func(qg, kg, vg, cu_q, cu_k, 7, 9, 0.0, 0.25, causal, window, softcap,
                                                    slopes, return_attn_probs=True)
    assert torch.equal(out, want.detach()) and torch.equal(lse, want_lse.detach())

    dout = rand(g, *q.shape, dtype=dtype)
    want_grads = torch.autograd.grad(want, (qg, kg, vg), dout)
    dq_, dk_, dv_ = nan_like(q), nan_like(k), nan_like(v)
    res = gpu.varlen_bwd(dout, q, k, v, out, lse, dq_, dk_, dv_, cu_q, cu_k, slopes, 7, 9, 0.0, 0.25, False, causal,
                         window[0], window[1], softcap, False, None, rng_state)
    assert isinstance(res, list) and len(res) == 4
    assert all(got is given for got, given in zip(res, (dq_, dk_, dv_)))
    assert all(torch.equal(a, w) for a, w in zip(res[:3], want_grads))
    # flash-attn's layout: sequence b's rows from cu_seqlens_q[b] + 128 b, (nheads, total_q + 128 batch)
    softmax_d = res[3]
    assert softmax_d.shape == (4, 12 + 3 * 128) and softmax_d.dtype == torch.float32
    rowsum = (dout.float() * out.float()).sum(-1).transpose(0, 1)
    want_d = torch.zeros_like(softmax_d)
    for i in range(3):
        a, z = int(cu_q[i]), int(cu_q[i + 1])
        want_d[:, a + 128 * i:z + 128 * i] = rowsum[:, a:z]
    assert torch.equal(softmax_d, want_d)


def test_varlen_fwd_paged_and_with_dropout():
    g = torch.Generator().manual_seed(4)
    cu_q, cu_k, q, k, v = varlen_case(g, torch.float32)
    # k and v in pages of 4 keys, each sequence's pages in reverse order
    lengths = cu_k.diff().tolist()
    table = torch.zeros(3, 3, dtype=torch.int32)
    kp, vp = torch.zeros(9, 4, 2, 16), torch.zeros(9, 4, 2, 16)
    for b, n in enumerate(lengths):
        for j in range(n):
            page = 3 * b + 2 - j // 4
            table[b, j // 4] = page
            kp[page, j % 4], vp[page, j % 4] = k[int(cu_k[b]) + j], v[int(cu_k[b]) + j]
    out, lse, _, _ = gpu.varlen_fwd(q, kp, vp, None, cu_q, cu_k, None, None, table, None, 7, 9, 0.0, None, False, True,
                                    -1, -1, 0.0, False, None, 0)
    want, want_lse, _ = attn.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 7, 9, causal=True, block_table=table,
                                                    return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)

    torch.manual_seed(5)
    want, _, want_s = attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 9, 0.2, return_attn_probs=True)
    torch.manual_seed(5)  # gen_=None: torch's default generator, as the public function draws from
    out, _, s_dmask, _ = gpu.varlen_fwd(q, k, v, None, cu_q, cu_k, None, None, None, None, 7, 9, 0.2, None, False,
                                        False, -1, -1, 0.0, True, None)
    assert torch.equal(out, want) and torch.equal(s_dmask, want_s) and s_dmask.shape == (3, 4, 128, 128)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("paged", [False, True])
def test_fwd_kvcache_equals_the_public_function(dtype, paged):
    g = torch.Generator().manual_seed(6)
    b, sq, h, hk, d, slots, new = 2, 3, 4, 2, 16, 16, 2
    q = rand(g, b, sq, h, d, dtype=dtype)
    shape = (8, 4, hk, d) if paged else (b, slots, hk, d)
    k_cache, v_cache = rand(g, *shape, dtype=dtype), rand(g, *shape, dtype=dtype)
    k_new, v_new = rand(g, b, new, hk, d, dtype=dtype), rand(g, b, new, hk, d, dtype=dtype)
    seqlens = torch.tensor([5, 9], dtype=torch.int32)
    table = torch.tensor([[7, 1, 2, 3], [4, 5, 6, 0]], dtype=torch.int32) if paged else None
    caches = (k_cache.clone(), v_cache.clone())
    want, want_lse = attn.flash_attn_with_kvcache(q, *caches, k_new, v_new, cache_seqlens=seqlens, block_table=table,
                                                  causal=True, window_size=(6, -1), softcap=3.0,
                                                  return_softmax_lse=True)
    out_ = nan_like(q)
    res = gpu.fwd_kvcache(q, k_cache, v_cache, k_new, v_new, seqlens, None, None, None, None, table, None, out_, None,
                          True, 6, -1, 3.0, True, 0)
    assert isinstance(res, list) and len(res) == 2 and res[0] is out_
    assert torch.equal(res[0], want) and torch.equal(res[1], want_lse) and res[1].shape == (b, h, sq)
    assert torch.equal(k_cache, caches[0]) and torch.equal(v_cache, caches[1])  # k_, v_ appended in place


def test_bad_input_is_named_and_nothing_is_written():
    g = torch.Generator().manual_seed(8)
    q, k, v = (rand(g, 1, 4, 2, 8, dtype=torch.float32) for _ in range(3))
    args = lambda out_=None, gen_=None, ret=False, p=0.0: (q, k, v, out_, None, p, None, False, -1, -1, 0.0, ret, gen_)
    wrong = nan_like(q, (1, 4, 2, 4))
    cases = [(lambda: gpu.fwd(*args(out_=wrong)), "flash_attn_gpu.fwd: out_: must have shape (1, 4, 2, 8)"),
             (lambda: gpu.fwd(*args(out_=wrong.bfloat16())), "flash_attn_gpu.fwd: out_:"),
             (lambda: gpu.fwd(*args(gen_=torch.empty(1))), "flash_attn_gpu.fwd: gen_: the RNG `generator` argument "
                                                           "is no longer supported and must be None"),
             (lambda: gpu.fwd(*args(ret=True)), "flash_attn_gpu.fwd: return_softmax: needs p_dropout > 0"),
             (lambda: gpu.fwd([1.0], k, v, None, None, 0.0, None, False, -1, -1, 0.0, False, None),
              "flash_attn_gpu.fwd: q: must be a torch.Tensor, got list"),
             (lambda: gpu.bwd(q, q, k, v, q, torch.zeros(1, 2, 4), wrong, None, None, None, 0.0, None, False, -1, -1,
                              0.0, False, None, None), "flash_attn_gpu.bwd: dq_: must have shape (1, 4, 2, 8)"),
             (lambda: gpu.fwd(*args()[:5], 0.0, None, False, (3,), -1, 0.0, False, None), "window")]
    for call, message in cases:
        with pytest.raises(attn.AttnError) as info:
            call()
        assert message in str(info.value), str(info.value)
        assert wrong.isnan().all()
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(attn.AttnError, match="varlen_fwd: leftpad_k: is not supported"):
        gpu.varlen_fwd(q[0], k[0], v[0], None, cu, cu, None, cu[1:], None, None, 4, 4, 0.0, None, False, False, -1,
                       -1, 0.0, False, None)
    with pytest.raises(attn.AttnError, match="cu_seqlens"):  # the kernel's own rule, named
        gpu.varlen_bwd(q[0], q[0], k[0], v[0], q[0], torch.zeros(2, 4), None, None, None, cu, cu[:1], None, 4, 4,
                       0.0, None, False, False, -1, -1, 0.0, False, None, None)
    k_cache = torch.zeros(1, 8, 2, 8)
    with pytest.raises(attn.AttnError, match="fwd_kvcache: out_:"):  # before the append
        gpu.fwd_kvcache(q, k_cache, k_cache.clone(), k, v, torch.tensor([0], dtype=torch.int32), None, None, None,
                        None, None, None, wrong, None, False, -1, -1, 0.0, True, 0)
    assert not k_cache.any()


@pytest.mark.parametrize("bad", [torch.empty(1), 0, "default"])
def test_generator_slot_takes_none_or_a_generator(bad):
    """flash-attn after 2.8: the four functions' generator slot must be None, anything else raises a RuntimeError
    with "the RNG `generator` argument is no longer supported" (its tests/test_flash_attn.py's
    test_flash_attn_generator_arg_must_be_none); flash-attn 2.8's torch.Generator is still taken. The error is
    attn's, named, and comes before anything is written or drawn."""
    g = torch.Generator().manual_seed(9)
    q, k, v, o = (rand(g, 1, 3, 2, 8, dtype=torch.bfloat16) for _ in range(4))
    lse = torch.zeros(1, 2, 3)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    out_ = nan_like(q)
    calls = {"fwd": lambda gen: gpu.fwd(q, k, v, out_, None, 0.5, 0.3, True, -1, -1, 0.0, False, gen),
             "bwd": lambda gen: gpu.bwd(q, q, k, v, o, lse, out_, None, None, None, 0.5, 0.3, True, -1, -1, 0.0,
                                        False, gen, None),
             "varlen_fwd": lambda gen: gpu.varlen_fwd(q[0], k[0], v[0], out_[0], cu, cu, None, None, None, None, 3, 3,
                                                      0.5, 0.3, False, True, -1, -1, 0.0, False, gen, 0),
             "varlen_bwd": lambda gen: gpu.varlen_bwd(q[0], q[0], k[0], v[0], o[0], lse[0], out_[0], None, None, cu,
                                                      cu, None, 3, 3, 0.5, 0.3, False, True, -1, -1, 0.0, False, gen,
                                                      None)}
    state = torch.get_rng_state()
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=r"generator` argument is no longer supported") as info:
            call(bad)
        assert isinstance(info.value, attn.AttnError)
        assert f"attn.flash_attn.flash_attn_gpu.{name}: gen_: the RNG `generator` argument is no longer supported " \
               f"and must be None" in str(info.value) and type(bad).__name__ in str(info.value)
        assert out_.isnan().all() and torch.equal(torch.get_rng_state(), state)
    for name, call in calls.items():  # flash-attn 2.8's generator: the seed drawn from it, so it replays
        first = [t.clone() for t in call(torch.Generator().manual_seed(4))[:3]]
        again = call(torch.Generator().manual_seed(4))[:3]
        assert all(torch.equal(a, b) for a, b in zip(first, again)), name
        assert torch.equal(torch.get_rng_state(), state)
