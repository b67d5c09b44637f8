#!/usr/bin/env python3
"""f32 attention on bf16 tiles, by splitting each f32 into bf16 parts (issue "amx", item 6; oneMKL's
float_to_bf16x2 / float_to_bf16x3 compute modes): how far is its error from the f32 textbook's?

x = x0 + x1 (+ x2), each part the bf16 nearest to what the earlier parts left. A product a b becomes the
sum of the part products that matter: 3 for two parts (a0 b0 + a0 b1 + a1 b0), 6 for three (adding a0 b2,
a1 b1, a2 b0). Every part product runs as TDPBF16PS does it (src/amx/amx_emulator.cpp): bf16 x bf16
exact in f32, per 16-pair step an even and an odd f32 sum from zero, then C += even + odd, in f32.
Both block products (S = Q K^T and O = P V) are split; the softmax between them is f32, P split after it.

The error of each method is the largest |O - O_f64| over the output, against the f64 oracle, divided by
the f32 textbook's (S, P and O in f32, each dot product summed in order). The rule for an f32 path
(AGENTS.md, "Exact means exact") is a ratio of at most 2.

  .venv/bin/python bench/micro/f32_split_accuracy.py [--seeds 4] [--seq 256,1024] [--dim 64,128]
"""
import argparse

import numpy as np


def bf16(x):
    """x (f32) rounded to the nearest bf16 (ties to even), as f32; subnormals to zero, as TDPBF16PS
    reads them."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32)
    r = u.view(np.float32)
    return np.where(np.abs(r) < np.finfo(np.float32).tiny, np.float32(0), r).astype(np.float32)


def split(x, parts):
    out, rest = [], x.astype(np.float32)
    for _ in range(parts):
        p = bf16(rest)
        out.append(p)
        rest = (rest - p).astype(np.float32)
    return out


# Which part products each method sums, in the order it adds them into the same accumulators.
METHODS = {
    "bf16 (one part)": (1, [(0, 0)]),
    "bf16x2, 3 products": (2, [(0, 0), (0, 1), (1, 0)]),
    "bf16x3, 6 products, large first": (3, [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0)]),
    "bf16x3, 6 products, small first": (3, [(2, 0), (1, 1), (0, 2), (1, 0), (0, 1), (0, 0)]),
}


def split_product(a, b, method):
    """a @ b on the tiles, a and b f32 split into bf16 parts; one accumulator over every part product."""
    parts, pairs = METHODS[method]
    ap, bp = split(a, parts), split(b, parts)
    c = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for i, j in pairs:  # each pair's product summed into the same C, as successive TDPBF16PS would
        c = accumulate(c, ap[i], bp[j])
    return c


def accumulate(c, a, b):
    """C += a @ b as TDPBF16PS sums it: per 32 columns of K (one tile), even and odd pair sums from zero
    (each step an exact product and one f32 rounding), then C = C + (even + odd)."""
    k = a.shape[1]
    for k0 in range(0, k, 32):
        even = np.zeros_like(c)
        odd = np.zeros_like(c)
        for x in range(k0, min(k0 + 32, k), 2):
            even = (even + np.outer(a[:, x], b[x, :]).astype(np.float32)).astype(np.float32)
            if x + 1 < k:
                odd = (odd + np.outer(a[:, x + 1], b[x + 1, :]).astype(np.float32)).astype(np.float32)
        c = (c + (even + odd).astype(np.float32)).astype(np.float32)
    return c


def sequential_product(a, b):
    """a @ b in f32, each dot product summed in order (the textbook's loop)."""
    c = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for x in range(a.shape[1]):
        c = (c + np.outer(a[:, x], b[x, :]).astype(np.float32)).astype(np.float32)
    return c


def softmax_rows(s):
    m = s.max(axis=1, keepdims=True)
    p = np.exp(s - m)
    return p, p.sum(axis=1, keepdims=True)


def attention(q, k, v, scale, product):
    s = (product(q, k.T) * np.float32(scale)).astype(np.float32)
    p, l = softmax_rows(s)
    return (product(p.astype(np.float32), v) / l).astype(np.float32)


def oracle(q, k, v, scale):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ k.T * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ v) / p.sum(axis=1, keepdims=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--seq", default="256,512")
    ap.add_argument("--dim", default="64,128")
    ap.add_argument("--spread", default="1,4", help="standard deviations of q and k (4: peaky rows)")
    args = ap.parse_args()
    print("| seq | d | q, k spread | seed | textbook f32 max err | " + " | ".join(METHODS) + " |")
    print("|---" * (5 + len(METHODS)) + "|")
    worst = {name: 0.0 for name in METHODS}
    for n in map(int, args.seq.split(",")):
        for d in map(int, args.dim.split(",")):
            for spread in map(float, args.spread.split(",")):
                for seed in range(args.seeds):
                    rng = np.random.default_rng(seed)
                    q, k = (rng.normal(0, spread, (n, d)).astype(np.float32) for _ in range(2))
                    v = rng.normal(0, 1, (n, d)).astype(np.float32)
                    scale = 1 / np.sqrt(d)
                    exact = oracle(q, k, v, scale)
                    base = np.abs(attention(q, k, v, scale, sequential_product) - exact).max()
                    row = []
                    for name in METHODS:
                        err = np.abs(attention(q, k, v, scale, lambda a, b: split_product(a, b, name)) - exact).max()
                        worst[name] = max(worst[name], err / base)
                        row.append(f"{err / base:.2f}x")
                    print(f"| {n} | {d} | {spread:g} | {seed} | {base:.2e} | " + " | ".join(row) + " |", flush=True)
    print("\nworst ratio to the textbook (the rule: at most 2):")
    for name, r in worst.items():
        print(f"  {name}: {r:.2f}x")


if __name__ == "__main__":
    main()
