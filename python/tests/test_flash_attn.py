"""attn's flash-attn functions against a PyTorch reference, in the manner of flash-attn's
tests/test_flash_attn.py: the reference in f64 is the oracle; the same reference at the input dtype is
"the textbook method at that precision". Outputs may err at most 2x the textbook's (3x for gradients),
plus a rounding slack of a few units in the last place for f32."""
import itertools
import math
import os
import re

import numpy as np
import pytest
import torch

import attn
import attn._ops  # noqa: F401  (registers the custom ops the opcheck tests name)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SLACK = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 1e-3, torch.float16: 1e-4}


def attention_ref(q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, softmax_scale=None,
                  upcast=True):
    """Textbook attention with flash-attn's masks: bottom-right aligned causal and windows, soft-capping
    of the scaled scores, ALiBi -slope * |i + sk - sq - j| added after the cap. Rows that see no key give 0."""
    dtype = q.dtype
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k, v = k.repeat_interleave(h // hk, dim=2), v.repeat_interleave(h // hk, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(d)
    scores = torch.einsum("bthd,bshd->bhts", q, k) * scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    row = torch.arange(sq).view(-1, 1) + sk - sq
    col = torch.arange(sk).view(1, -1)
    left, right = window_size
    if causal:
        right = 0
    hidden = torch.zeros(sq, sk, dtype=torch.bool)
    if right >= 0:
        hidden |= col > row + right
    if left >= 0:
        hidden |= col < row - left
    if alibi_slopes is not None:
        slopes = alibi_slopes.view(-1 if alibi_slopes.dim() == 2 else 1, h, 1, 1).to(scores.dtype)
        scores = scores - slopes * (row - col).abs().to(scores.dtype)
    scores = scores.masked_fill(hidden, float("-inf"))
    p = torch.softmax(scores, dim=-1).masked_fill(hidden.all(dim=-1, keepdim=True), 0.0)
    return torch.einsum("bhts,bshd->bthd", p.to(v.dtype), v).to(dtype)


def random_qkv(b, sq, sk, h, hk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32).to(dtype).requires_grad_()
    return make(b, sq, h, d), make(b, sk, hk, d), make(b, sk, hk, d)


def grads(out, inputs, dout):
    return torch.autograd.grad(out, inputs, dout)


def check_rule(got, ref, textbook, factor, dtype, what):
    err = (got.double() - ref.double()).abs().max().item()
    base = (textbook.double() - ref.double()).abs().max().item()
    scale = max(ref.double().abs().max().item(), 1.0)
    assert err <= factor * base + SLACK[dtype] * scale, f"{what}: error {err} > {factor} x textbook {base}"


CASES = [  # (sq, sk, d): flash-attn's odd pairs and head dims, kept small for a CPU run
    (113, 203, 59), (128, 217, 64), (1, 239, 111), (127, 127, 32), (108, 256, 128), (97, 33, 96), (64, 97, 256),
    (33, 65, 160)]


MASKS = ["none", "causal", "local", "softcap", "alibi"]
HEADS = [(4, 4), (4, 2), (3, 1)]  # MHA, GQA, MQA
# The whole grid with ATTN_PYTEST_FULL=1; else every fourth combination (each dtype, mask, length pair
# and head layout still appears), which keeps `make test` short.
GRID = list(itertools.product(DTYPES, CASES, HEADS, MASKS))
if not os.environ.get("ATTN_PYTEST_FULL"):
    GRID = GRID[::4]


@pytest.mark.parametrize("dtype,case,heads,mask", GRID)
def test_flash_attn_output_and_grads(dtype, case, heads, mask):
    (sq, sk, d), (h, hk) = case, heads
    q, k, v = random_qkv(2, sq, sk, h, hk, d, dtype, seed=sq * 7 + d)
    kw = {}
    if mask == "causal":
        kw["causal"] = True
    elif mask == "local":
        kw["window_size"] = (17, 5)
    elif mask == "softcap":
        kw["softcap"] = 2.5
    elif mask == "alibi":
        kw["alibi_slopes"] = torch.rand(2, h, dtype=torch.float32) * 0.3
        kw["causal"] = True
    out = attn.flash_attn_func(q, k, v, **kw)
    ref = attention_ref(q, k, v, **kw)
    textbook = attention_ref(q, k, v, upcast=False, **kw)
    check_rule(out, ref, textbook, 2, dtype, "out")
    dout = torch.randn_like(out)
    for name, g, gr, gt in zip("qkv", grads(out, (q, k, v), dout), grads(ref, (q, k, v), dout),
                               grads(textbook, (q, k, v), dout)):
        check_rule(g, gr, gt, 3, dtype, "d" + name)


def test_f64_is_exact():
    q, k, v = random_qkv(1, 37, 53, 4, 2, 24, torch.float64, seed=3)
    for kw in ({}, {"causal": True}, {"window_size": (5, 3), "softcap": 1.5}):
        out = attn.flash_attn_func(q, k, v, **kw)
        ref = attention_ref(q, k, v, **kw)
        assert (out - ref).abs().max().item() <= 1e-12
        dout = torch.randn_like(out)
        for g, gr in zip(grads(out, (q, k, v), dout), grads(ref, (q, k, v), dout)):
            assert (g - gr).abs().max().item() <= 1e-12 * max(1.0, gr.abs().max().item())


def test_lse_and_return_values():
    q, k, v = random_qkv(2, 19, 31, 2, 2, 16, torch.float32, seed=5)
    out, lse, s_dmask = attn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert lse.shape == (2, 2, 19) and lse.dtype == torch.float32 and s_dmask.numel() == 0
    scores = torch.einsum("bthd,bshd->bhts", q.double(), k.double()) / math.sqrt(16)
    hidden = torch.arange(31).view(1, -1) > torch.arange(19).view(-1, 1) + 12
    want = torch.logsumexp(scores.masked_fill(hidden, float("-inf")), dim=-1)
    assert (lse.double() - want).abs().max().item() < 1e-5


def test_packed_forms_match_the_separate_call():
    qkv = torch.randn(2, 45, 3, 4, 32, requires_grad=True)
    out = attn.flash_attn_qkvpacked_func(qkv, causal=True)
    ref = attn.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert torch.equal(out, ref)
    out.sum().backward()
    assert qkv.grad is not None and qkv.grad.shape == qkv.shape
    q = torch.randn(2, 45, 4, 32)
    kv = torch.randn(2, 60, 2, 2, 32)
    assert torch.equal(attn.flash_attn_kvpacked_func(q, kv), attn.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1]))


def test_varlen_matches_each_sequence_alone():
    lens_q, lens_k = [5, 0, 33, 17], [9, 4, 33, 0]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    q = torch.randn(sum(lens_q), 4, 40, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(lens_k), 2, 40, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(lens_k), 2, 40, dtype=torch.float64, requires_grad=True)
    out, lse, _ = attn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                              return_attn_probs=True)
    assert lse.shape == (4, sum(lens_q))
    dout = torch.randn_like(out)
    dq, dk, dv = grads(out, (q, k, v), dout)
    for b in range(len(lens_q)):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        qb, kb, vb = (t[s].detach().unsqueeze(0).requires_grad_() for t, s in ((q, qs), (k, ks), (v, ks)))
        ref = attention_ref(qb, kb, vb, causal=True)
        assert (out[qs] - ref[0]).abs().max().item() <= 1e-12 if lens_q[b] else True
        rq, rk, rv = grads(ref, (qb, kb, vb), dout[qs].unsqueeze(0))
        for got, want in ((dq[qs], rq[0]), (dk[ks], rk[0]), (dv[ks], rv[0])):
            assert (got - want).abs().max().item() <= 1e-12 * max(1.0, want.abs().max().item()) if got.numel() else True


def test_gradients_are_deterministic():
    q, k, v = random_qkv(1, 150, 170, 4, 1, 64, torch.float32, seed=9)
    dout = torch.randn(1, 150, 4, 64)
    first = grads(attn.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
    for threads in (1, 2, 0):
        attn.set_num_threads(threads)
        again = grads(attn.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    attn.set_num_threads(0)


def test_bad_input_raises_the_cpp_message():
    q, k, v = (torch.randn(1, 8, 4, 16) for _ in range(3))
    with pytest.raises(attn.AttnError, match="k: dtype must match q's"):
        attn.flash_attn_func(q, k.double(), v)
    with pytest.raises(RuntimeError, match="heads"):
        attn.flash_attn_func(q, torch.randn(1, 8, 3, 16), torch.randn(1, 8, 3, 16))
    with pytest.raises(ValueError, match="softcap"):
        attn.flash_attn_func(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match="dtype must be"):
        attn.flash_attn_func(q.int(), k, v)
    with pytest.raises(ValueError, match="set_num_threads"):
        attn.set_num_threads(-1)


def _entry_points(q, k, v):
    """Each public function that takes window_size, called on q, k, v (batch 1) and forwarding **kw: the
    plain inference call (flash_attn_func's short path), the general path (return_attn_probs), the
    autograd path, NumPy inputs, the packed and varlen forms, the paged varlen call and the kvcache call."""
    cu = torch.tensor([0, q.shape[1]], dtype=torch.int32)
    cu_k = torch.tensor([0, k.shape[1]], dtype=torch.int32)
    table = torch.zeros(1, 1, dtype=torch.int32)
    n = q.shape[1]
    return {
        "flash_attn_func": lambda **kw: attn.flash_attn_func(q, k, v, **kw),
        "flash_attn_func, return_attn_probs": lambda **kw: attn.flash_attn_func(q, k, v, return_attn_probs=True, **kw),
        "flash_attn_func, grad": lambda **kw: attn.flash_attn_func(q.detach().requires_grad_(), k, v, **kw),
        "flash_attn_func, NumPy": lambda **kw: attn.flash_attn_func(q.numpy(), k.numpy(), v.numpy(), **kw),
        "flash_attn_qkvpacked_func": lambda **kw: attn.flash_attn_qkvpacked_func(torch.stack((q, k, v), 2), **kw),
        "flash_attn_kvpacked_func": lambda **kw: attn.flash_attn_kvpacked_func(q, torch.stack((k, v), 2), **kw),
        "flash_attn_varlen_func": lambda **kw: attn.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu_k, n, n, **kw),
        "flash_attn_varlen_func, paged": lambda **kw: attn.flash_attn_varlen_func(q[0], k, v, cu, cu_k, n, n,
                                                                                 block_table=table, **kw),
        "flash_attn_varlen_qkvpacked_func": lambda **kw: attn.flash_attn_varlen_qkvpacked_func(
            torch.stack((q[0], k[0], v[0]), 1), cu, n, **kw),
        "flash_attn_varlen_kvpacked_func": lambda **kw: attn.flash_attn_varlen_kvpacked_func(
            q[0], torch.stack((k[0], v[0]), 1), cu, cu_k, n, n, **kw),
        "flash_attn_with_kvcache": lambda **kw: attn.flash_attn_with_kvcache(q, k, v, **kw),
    }


def test_window_size_that_is_not_a_pair_of_ints_gets_a_named_error():
    q, k, v = (torch.randn(1, 8, 2, 16) for _ in range(3))
    for name, call in _entry_points(q, k, v).items():
        call(window_size=[3, np.int64(1)])  # a list and NumPy's ints are a pair of ints
        for bad in ((3,), (1, 2, 3), 3, None, (1.5, 2), ("a", "b")):
            with pytest.raises(attn.AttnError, match=re.escape(
                    f"window_size: must be a pair (left, right) of ints, got {bad!r}")):
                call(window_size=bad)


def test_arrays_that_are_not_tensors_get_a_named_error():
    from attn.flash_attn import flash_attn_interface as private
    t = torch.randn(1, 8, 2, 16)
    as_list = t.tolist()
    cases = [  # (who, the call, the argument that is a list)
        ("flash_attn_func", lambda: attn.flash_attn_func(as_list, t, t), "q"),
        ("flash_attn_func", lambda: attn.flash_attn_func(t, as_list, t), "k"),  # the short path reads k first
        ("flash_attn_func", lambda: attn.flash_attn_func(t, t, as_list, return_attn_probs=True), "v"),
        ("flash_attn_func", lambda: attn.flash_attn_func(t.numpy(), as_list, t.numpy()), "k"),
        ("flash_attn_varlen_func", lambda: attn.flash_attn_varlen_func(as_list[0], t[0], t[0], *_cu(8), 8, 8), "q"),
        ("flash_attn_varlen_func", lambda: attn.flash_attn_varlen_func(t[0], t[0], as_list[0], *_cu(8), 8, 8), "v"),
        ("flash_attn_varlen_func", lambda: attn.flash_attn_varlen_func(
            t[0], as_list, t, *_cu(8), 8, 8, block_table=torch.zeros(1, 1, dtype=torch.int32)), "k"),
        ("flash_attn_with_kvcache", lambda: attn.flash_attn_with_kvcache(as_list, t, t), "q"),
        ("flash_attn_with_kvcache", lambda: attn.flash_attn_with_kvcache(t, t, as_list), "v_cache"),
        ("flash_attn_with_kvcache", lambda: attn.flash_attn_with_kvcache(t, t, t, k=as_list, v=t), "k"),
        ("_flash_attn_forward", lambda: private._flash_attn_forward(t, t, as_list, 0.0, None, False, -1, -1, 0.0, None,
                                                                    False), "v"),
    ]
    for who, call, name in cases:
        with pytest.raises(attn.AttnError, match=f"{who}: {name}: must be a .*, got list"):
            call()


def _cu(n):
    return torch.tensor([0, n], dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32)


def test_options_are_named_in_the_order_of_the_ops_parameters():
    """The options travel as attn._options.AttentionOptions, read by name, and reach the custom ops (and
    their eager wrappers, which take the same parameters) as *options: each field must land on the op's
    parameter of its name."""
    from attn._options import AttentionOptions
    fields = list(AttentionOptions._fields)
    for op, tensors in ((torch.ops.attn.fwd, 3), (torch.ops.attn.bwd, 6), (torch.ops.attn.varlen_fwd, 5),
                        (torch.ops.attn.varlen_fwd_paged, 6), (torch.ops.attn.varlen_bwd, 8)):
        assert [a.name for a in op.default._schema.arguments[tensors:]] == fields, op
    opts = attn.interface._options("who", 0.25, 0.5, 1, (np.int64(4), 0), 2, None)
    assert isinstance(opts, AttentionOptions)
    assert (opts.softmax_scale, opts.causal, opts.window_left, opts.window_right, opts.softcap, opts.dropout_p,
            opts.num_threads) == (0.5, True, 4, 0, 2.0, 0.25, attn.get_num_threads())


def test_numpy_inputs():
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 21, 2, 8)) for _ in range(3))
    out = attn.flash_attn_func(q, k, v, causal=True)
    ref = attention_ref(*(torch.from_numpy(x) for x in (q, k, v)), causal=True)
    assert isinstance(out, np.ndarray) and abs(out - ref.numpy()).max() <= 1e-12


class _Producer:
    """Another framework's array as far as attn can tell: only the DLPack protocol (a NumPy array inside)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None, **kwargs):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_other_dlpack_producers():
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(1)
    for dtype in (np.float64, np.float32, np.float16):
        q, k, v = (rng.standard_normal((1, 19, 2, 16)).astype(dtype) for _ in range(3))
        out = attn.flash_attn_func(_Producer(q), _Producer(k), _Producer(v), causal=True)
        assert isinstance(out, np.ndarray) and out.dtype == dtype
        assert np.array_equal(out, attn.flash_attn_func(q, k, v, causal=True))
    bf16 = torch.from_numpy(k.astype(np.float32)).bfloat16()  # NumPy has no bf16: a named error, not a crash
    with pytest.raises(attn.AttnError, match="flash_attn_func: k: a DLPack array that NumPy cannot take"):
        attn.flash_attn_func(q, _Producer(bf16), v)


def test_custom_ops_pass_opcheck():
    q, k, v = random_qkv(1, 12, 20, 2, 1, 8, torch.float32, seed=1)
    sinks = torch.tensor([0.5, -1.0], requires_grad=True)
    for s in (None, sinks):
        args = (q, k, v, None, True, -1, -1, 0.0, None, 0.0, 0, 0, s)
        torch.library.opcheck(torch.ops.attn.fwd.default, args)
        out, lse = torch.ops.attn.fwd(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
        torch.library.opcheck(torch.ops.attn.bwd.default,
                              (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, None, True, -1, -1,
                               0.0, None, 0.0, 0, 0, None if s is None else s.detach()))


def test_torch_compile_fullgraph_matches_eager():
    torch._dynamo.reset()
    q, k, v = random_qkv(2, 33, 33, 2, 2, 16, torch.float32, seed=4)

    def layer(q, k, v):
        return attn.flash_attn_func(q * 2, k, v, causal=True).sum(dim=-1)

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    eager = layer(q, k, v)
    got = compiled(q, k, v)
    assert torch.equal(got, eager)
    g_eager = torch.autograd.grad(eager.sum(), (q, k, v))
    g_compiled = torch.autograd.grad(compiled(q, k, v).sum(), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(g_eager, g_compiled))


def test_torch_compile_inductor_matches_eager():
    """The default backend: inductor compiles the code around the custom ops to C++ and calls attn's
    kernels from it; the ops' fake implementations give it the shapes."""
    torch._dynamo.reset()
    q, k, v = random_qkv(1, 17, 23, 2, 1, 16, torch.float32, seed=5)

    def layer(q, k, v):
        return (attn.flash_attn_func(q * 0.5, k, v, causal=True) + 1).square().sum(dim=-1)

    compiled = torch.compile(layer, fullgraph=True)
    eager = layer(q, k, v)
    torch.testing.assert_close(compiled(q, k, v), eager, rtol=1e-6, atol=1e-6)
    g_eager = torch.autograd.grad(eager.sum(), (q, k, v))
    g_compiled = torch.autograd.grad(compiled(q, k, v).sum(), (q, k, v))
    for a, b in zip(g_eager, g_compiled):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_inference_calls_match_the_autograd_path():
    q, k, v = random_qkv(2, 40, 57, 4, 2, 32, torch.float32, seed=6)
    with_grad, lse, _ = attn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    with torch.no_grad():
        plain = attn.flash_attn_func(q, k, v, causal=True)
        plain_lse = attn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)[1]
    detached = attn.flash_attn_func(q.detach(), k.detach(), v.detach(), causal=True)
    assert with_grad.requires_grad and not plain.requires_grad and not detached.requires_grad
    assert torch.equal(plain, with_grad.detach()) and torch.equal(detached, plain) and torch.equal(plain_lse, lse)


def test_inference_path_takes_the_argument_forms_the_general_path_takes():
    """flash_attn_func's plain inference call runs its own short path (attn._ops.inference_forward); the
    loose argument forms flash-attn accepts (an int causal, an int or NumPy scale, a list window, an int
    softcap, a tensor subclass) must give the general path's result (return_attn_probs takes that one)."""
    import numpy as np
    q, k, v = (t.detach() for t in random_qkv(1, 33, 45, 4, 2, 32, torch.float32, seed=8))
    forms = [dict(causal=1), dict(softmax_scale=1), dict(softmax_scale=np.float32(0.3)),
             dict(window_size=[5, 0]), dict(window_size=(np.int64(3), np.int64(2))), dict(softcap=2)]
    for kw in forms:
        general = attn.flash_attn_func(q, k, v, return_attn_probs=True, **kw)[0]
        assert torch.equal(attn.flash_attn_func(q, k, v, **kw), general), kw
    param = torch.nn.Parameter(q.clone(), requires_grad=False)
    assert torch.equal(attn.flash_attn_func(param, k, v), attn.flash_attn_func(q, k, v))


def test_tensors_off_the_cpu_get_a_named_error():
    q = torch.empty(1, 8, 2, 16, device="meta")  # any non-CPU device: the check is the same for CUDA
    k = v = torch.randn(1, 8, 2, 16)
    with pytest.raises(attn.AttnError, match="flash_attn_func: q: must be a CPU tensor, got one on meta"):
        attn.flash_attn_func(q, k, v)
    with pytest.raises(attn.AttnError, match="flash_attn_with_kvcache: q: must be a CPU tensor"):
        attn.flash_attn_with_kvcache(q, k, v)
