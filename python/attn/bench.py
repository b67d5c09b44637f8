"""python -m attn.bench --vs torch: attn's flash_attn_func beside torch.nn.functional.
scaled_dot_product_attention on the same CPU tensors, forward and forward+backward, in one run, with
ratios (torch seconds / attn seconds: > 1 means attn is faster). Medians of repeated calls.

python -m attn.bench --vs cpp: the cost of the Python layer. flash_attn_func's forward (no grad, and
with inputs that require grad, through autograd) beside the same C++ call timed inside C++
(attn._C.time_forward: attention_tiled on the same tensors, no Python in the loop); the overhead is
the difference of the medians of alternate blocks of calls, the ratio C++ s / Python s.

    python -m attn.bench --vs torch --seq 1024,4096 --head-dim 64,128 --dtype f32 --threads 2
    python -m attn.bench --vs cpp --seq 128,4096 --heads 8 --head-dim 64 --causal 0
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


def interleaved_medians(q, k, v, causal, threads, f, min_total=1.0, block=100):
    """Median seconds of the C++ call (attention_tiled on q, k, v, timed inside C++ by attn._C.time_forward)
    and of f(), in alternate blocks of back-to-back calls (a caller's hot loop), so that both see the same
    machine: on a shared machine the drift between two separate runs is larger than the overhead."""
    out, lse = torch.empty_like(q), torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)
    once = attn._C.time_forward(q, k, v, out, lse, 1, causal=causal, num_threads=threads)[0]
    block = max(1, min(block, int(0.05 / max(once, 1e-7))))
    base, py = [], []
    while len(base) < 5 * block or sum(base) + sum(py) < min_total:
        base += attn._C.time_forward(q, k, v, out, lse, block, causal=causal, num_threads=threads)
        f()  # warm-up of the block
        for _ in range(block):
            t0 = time.perf_counter()
            f()
            py.append(time.perf_counter() - t0)
    return sorted(base)[len(base) // 2], sorted(py)[len(py) // 2]


def vs_cpp(args, dtype):
    print(f"attn {attn.__version__} Python layer vs the C++ call: dtype {args.dtype}, batch {args.batch}, "
          f"heads {args.heads}, threads {args.threads}; overhead = Python median - C++ median (alternate blocks)")
    print(f"{'seq':>6} {'d':>4} {'causal':>6} {'call':>9} {'C++ us':>10} {'Python us':>10} {'overhead us':>11} "
          f"{'C++/Py':>7}", flush=True)
    for d in args.head_dim:
        for s in args.seq:
            for c in args.causal:
                shape = (args.batch, s, args.heads, d)
                q, k, v = (torch.randn(shape, dtype=dtype) for _ in range(3))
                qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
                calls = (("no grad", lambda: attn.flash_attn_func(q, k, v, causal=bool(c))),
                         ("autograd", lambda: attn.flash_attn_func(qg, kg, vg, causal=bool(c))))
                for name, f in calls:
                    base, py = interleaved_medians(q, k, v, bool(c), args.threads, f)
                    print(f"{s:>6} {d:>4} {'yes' if c else 'no':>6} {name:>9} {base * 1e6:>10.1f} {py * 1e6:>10.1f} "
                          f"{(py - base) * 1e6:>11.1f} {base / py:>7.3f}", flush=True)


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
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    attn.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
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
