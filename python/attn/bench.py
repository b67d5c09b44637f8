"""python -m attn.bench --vs torch: attn's flash_attn_func beside torch.nn.functional.
scaled_dot_product_attention on the same CPU tensors, forward and forward+backward, in one run, with
ratios (torch seconds / attn seconds: > 1 means attn is faster). Medians of repeated calls.

python -m attn.bench --vs cpp: the cost of the Python layer. flash_attn_func's forward (no grad, and
with inputs that require grad, through autograd): each call's wall time less the time the same call
spent in the C++ entry point (attn._C.last_forward_seconds), the median over calls; beside it the C++
call alone on preallocated outputs (attn._C.time_forward, no Python in the loop).

    python -m attn.bench --vs torch --seq 1024,4096 --head-dim 64,128 --dtype f32 --threads 2
    python -m attn.bench --vs cpp --seq 128,4096 --heads 8 --head-dim 64 --causal 0

python -m attn.bench --model llama|qwen2|gemma2: a small random transformers model's prefill and decode
tokens per second with attn_implementation="attn" against "sdpa", same run (attn/bench_models.py).
"""
import argparse
import time

import torch

import attn

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


def median_seconds(f, min_reps=3, min_total=0.5):
    f()  # warm-up
    times = []
    while len(times) < min_reps or (sum(times) < min_total and len(times) < 100):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def measure(fn, q, k, v, dout, train):
    if not train:
        with torch.no_grad():
            return median_seconds(lambda: fn(q, k, v))

    def step():
        for t in (q, k, v):
            t.grad = None
        fn(q, k, v).backward(dout)
    return median_seconds(step)


def per_call_overhead(q, k, v, causal, threads, f, min_total=1.0, block=100, before=None):
    """Medians over calls of f()'s wall time, of the C++ call inside it (attn._C.last_forward_seconds:
    the same call's time in attention_tiled, validation included), and of their difference per call:
    the Python layer's overhead, measured on each call so that the machine's drift (which moves a 300 us
    kernel by more than the overhead between two runs) cancels. Also the C++ call alone on preallocated
    outputs (attn._C.time_forward), in blocks alternating with f's, which would show a cost the Python
    call leaves inside the kernel (an output's first touch). `before`, if given, runs untimed before each
    call."""
    out, lse = torch.empty_like(q), torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    once = attn._C.time_forward(q, k, v, out, lse, 1, causal=causal, num_threads=threads)[0]
    block = max(1, min(block, int(0.05 / max(once, 1e-7))))
    alone, wall, inner, over = [], [], [], []
    while len(wall) < 5 * block or sum(alone) + sum(wall) < min_total:
        alone += attn._C.time_forward(q, k, v, out, lse, block, causal=causal, num_threads=threads)
        f()  # warm-up of the block
        for _ in range(block):
            if before is not None:
                before()
            t0 = time.perf_counter()
            f()
            t = time.perf_counter() - t0
            c = attn._C.last_forward_seconds()
            wall.append(t)
            inner.append(c)
            over.append(t - c)
    med = lambda x: sorted(x)[len(x) // 2]
    return med(alone), med(inner), med(wall), med(over), sorted(over)[len(over) * 9 // 10]


def vs_cpp(args, dtype):
    print(f"attn {attn.__version__} Python layer vs the C++ call: dtype {args.dtype}, batch {args.batch}, "
          f"heads {args.heads}, threads {args.threads}; medians over calls. overhead = Python call - the C++ call "
          "inside it, per call; C++ alone = attention_tiled on preallocated outputs, no Python (alternate blocks)")
    print("cold = the overhead when the caches were flushed (an 8 MiB write) just before each call: the "
          "interpreter's path as it runs after a kernel that evicted it")
    print(f"{'seq':>6} {'d':>4} {'causal':>6} {'call':>9} {'C++ alone us':>12} {'C++ in call':>11} "
          f"{'Python us':>10} {'overhead us':>11} {'p90 us':>7} {'cold us':>8}", flush=True)
    flush = torch.empty(2 * 1024 * 1024)
    flush_caches = lambda: flush.fill_(1.0)
    for d in args.head_dim:
        for s in args.seq:
            for c in args.causal:
                shape = (args.batch, s, args.heads, d)
                q, k, v = (torch.randn(shape, dtype=dtype) for _ in range(3))
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
                calls = (("no grad", lambda: attn.flash_attn_func(q, k, v, causal=bool(c))),
                         ("autograd", lambda: attn.flash_attn_func(qg, kg, vg, causal=bool(c))))
                for name, f in calls:
                    alone, inner, wall, over, p90 = per_call_overhead(q, k, v, bool(c), args.threads, f)
                    cold = per_call_overhead(q, k, v, bool(c), args.threads, f, min_total=0.5, before=flush_caches)[3]
                    print(f"{s:>6} {d:>4} {'yes' if c else 'no':>6} {name:>9} {alone * 1e6:>12.1f} {inner * 1e6:>11.1f} "
                          f"{wall * 1e6:>10.1f} {over * 1e6:>11.1f} {p90 * 1e6:>7.1f} {cold * 1e6:>8.1f}", flush=True)


def main(argv=None):
    ints = lambda s: [int(x) for x in s.split(",")]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vs", default="torch", choices=["torch", "cpp"])
    p.add_argument("--seq", type=ints, default=[1024, 4096])
    p.add_argument("--head-dim", type=ints, default=[64, 128])
    p.add_argument("--causal", type=ints, default=[0, 1])
    p.add_argument("--dtype", default="f32", choices=list(DTYPES))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--model", choices=["llama", "qwen2", "gemma2"], help="time a small transformers model instead")
    p.add_argument("--prompt", type=int, default=1024, help="--model: prompt tokens")
    p.add_argument("--new-tokens", type=int, default=16, help="--model: generated tokens")
    p.add_argument("--layers", type=int, default=4, help="--model: layers")
    p.add_argument("--hidden", type=int, default=1024, help="--model: hidden size (head dim = hidden / heads)")
    p.add_argument("--kv-heads", type=int, default=4, help="--model: kv heads")
    p.add_argument("--reps", type=int, default=3, help="--model: repetitions per median")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    attn.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    if args.model:
        from . import bench_models
        return bench_models.run(args, dtype)
    if args.vs == "cpp":
        return vs_cpp(args, dtype)
    print(f"attn {attn.__version__} vs torch {torch.__version__}: dtype {args.dtype}, batch {args.batch}, "
          f"heads {args.heads}, threads {args.threads}; ratio = torch s / attn s")
    print(f"{'seq':>6} {'d':>4} {'causal':>6} {'pass':>8} {'attn s':>10} {'torch s':>10} {'ratio':>7}")
    for d in args.head_dim:
        for s in args.seq:
            for c in args.causal:
                shape = (args.batch, s, args.heads, d)
                q, k, v = (torch.randn(shape, dtype=dtype).requires_grad_() for _ in range(3))
                dout = torch.randn(shape, dtype=dtype)
                ours = lambda q, k, v: attn.flash_attn_func(q, k, v, causal=bool(c))
                # sdpa takes (batch, heads, seq, d): the same tensors through transposed views
                theirs = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=bool(c)).transpose(1, 2)
                for name, train in (("forward", False), ("fwd+bwd", True)):
                    a = measure(ours, q, k, v, dout, train)
                    t = measure(theirs, q, k, v, dout, train)
                    print(f"{s:>6} {d:>4} {'yes' if c else 'no':>6} {name:>8} {a:>10.4g} {t:>10.4g} {t / a:>7.2f}",
                          flush=True)


if __name__ == "__main__":
    main()
