#!/usr/bin/env python3
"""PyTorch side of the GPU benchmark (scripts/gpu-check): SDPA forward and backward (flash backend) and decode, a
device-to-device copy and a bf16 matmul, timed with CUDA events (median after warm-up), random data.
One JSON object per line, the shapes of bench/gpu/attn_gpu_bench.cpp."""
import json, statistics, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

quick = "--quick" in sys.argv
dev = torch.device("cuda")


def median_ms(fn, warmup=3, reps=20, inner=1):
    """Median time of one call; `inner` calls per timed repetition keep the queue full (as attn's bench)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record(); b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def emit(**kw):
    print(json.dumps(kw), flush=True)


emit(what="device", name=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda)

n = 1 << 30  # copy: 1 GiB, bytes = read + write
x = torch.randn(n // 2, device=dev, dtype=torch.bfloat16); y = torch.empty_like(x)
ms = median_ms(lambda: y.copy_(x), reps=5 if quick else 30)
emit(what="copy", impl="torch copy_", ms=ms, gbps=2 * n / ms / 1e6)
del x, y

m = 8192  # bf16 matmul ceiling
a = torch.randn(m, m, device=dev, dtype=torch.bfloat16); b = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
ms = median_ms(lambda: a @ b, reps=5 if quick else 30)
emit(what="matmul", impl="torch bf16 8192^3", ms=ms, tflops=2 * m ** 3 / ms / 1e9)
del a, b

B, S, H, D = 4, 8192, 32, 128
q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
for causal in (False, True):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps=3 if quick else 15)
    emit(what="forward", causal=causal, impl="torch sdpa flash", ms=ms,
         tflops=4 * B * H * S * S * D * (0.5 if causal else 1.0) / ms / 1e9)
del q, k, v

S = 4096  # backward: attn_gpu_bench's shape; FLOPs 2.5x the forward's
q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
for causal in (False, True):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        dout = torch.randn_like(out)
        ms = median_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), reps=3 if quick else 10)
    emit(what="backward", causal=causal, impl="torch sdpa flash", ms=ms,
         tflops=2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0) / ms / 1e9)
del q, k, v, out, dout

N, H, HK = 131072, 32, 8
q = torch.randn(1, H, 1, D, device=dev, dtype=torch.bfloat16)
kc, vc = (torch.randn(1, HK, N, D, device=dev, dtype=torch.bfloat16) for _ in range(2))
bytes_ = 2 * N * HK * D * 2
for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                      ("math", SDPBackend.MATH)):
    try:
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            fn(); torch.cuda.synchronize()
            ms = median_ms(fn, warmup=5, reps=5 if quick else 30, inner=10)
        emit(what="decode", impl=f"torch sdpa {name} (enable_gqa)", ms=ms, gbps=bytes_ / ms / 1e6)
        break
    except RuntimeError as e:
        emit(what="decode-skip", impl=f"torch sdpa {name}", error=str(e).splitlines()[0][:200])
