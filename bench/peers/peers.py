#!/usr/bin/env python3
"""attn beside its peers on the same machine and shapes: PyTorch's scaled_dot_product_attention on the
CPU and ONNX Runtime's attention (com.microsoft MultiHeadAttention / GroupQueryAttention contrib ops),
in one table with ratios (peer seconds / attn seconds: > 1 means attn is faster).

  bench/peers/setup.sh                       # once: creates bench/peers/.venv
  bench/peers/.venv/bin/python bench/peers/peers.py --seq 4096,8192 --head-dim 128 --threads 2
  ... --mode decode --seq 4096,16384         # seqlen_q = 1 over a KV cache of length L (32/8 heads, d=128)
  ... --mode backward --seq 8192 --head-dim 128   # the backward only: out.backward(dout) vs attn bench backward
  ... --mode train --seq 8192 --head-dim 128      # the training step: forward (with lse) + backward
  ... --isa avx2                                  # attn and PyTorch restricted to AVX2 (on an AVX-512 machine)

attn's numbers come from `attn bench prefill --json` (`attn bench backward --json --step` for the
backward and train modes; or --attn-cmd, e.g. the decode bench) run by this script in the same session. Not part of `make test`.
"""
import argparse, json, os, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def median_time(f, min_reps=3, min_total=0.5):
    f()  # warm-up
    ts = []
    while len(ts) < min_reps or sum(ts) < min_total:
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        if len(ts) >= 100: break
    ts.sort()
    return ts[len(ts) // 2]


def shapes(args):
    for d in args.head_dim:
        for s in args.seq:
            for c in args.causal:
                sq = 1 if args.mode == "decode" else s
                yield dict(seq_q=sq, seq_k=s, head_dim=d, causal=bool(c) and args.mode != "decode")


def run_attn(args, sh):
    cmd = [args.attn, "bench", "prefill", "--json", "--no-textbook", "--seq", str(sh["seq_k"]), "--seq-q", str(sh["seq_q"]),
           "--head-dim", str(sh["head_dim"]), "--causal", "1" if sh["causal"] else "0", "--dtype", args.dtype,
           "--threads", str(args.threads), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads),
           "--batch", str(args.batch)]
    if args.mode in ("backward", "train"):
        cmd = [args.attn, "bench", "backward", "--json", "--step", "--seq", str(sh["seq_k"]), "--head-dim",
               str(sh["head_dim"]), "--causal", "1" if sh["causal"] else "0", "--dtype", args.dtype, "--threads",
               str(args.threads), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads), "--batch", str(args.batch)]
    if args.isa:
        cmd[2:2] = ["--isa", args.isa]
    if args.attn_cmd:
        cmd = args.attn_cmd.format(**sh, threads=args.threads, heads=args.heads, kv_heads=args.kv_heads,
                                   batch=args.batch, dtype=args.dtype).split()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    key = "step_seconds" if args.mode == "train" else "seconds"
    if args.mode in ("backward", "train"):  # attn's share of the FMA (or, on AMX tiles, AMX-BF16) peak in its run
        row = rows[0]
        tiles = args.dtype == "bf16" and "AMX tiles" in row.get("kernels", "") and row.get("amx_bf16_peak_gflops", 0) > 0
        peak = row["amx_bf16_peak_gflops"] if tiles else row["peak_gflops"]
        gflops = row["step_gflops"] if args.mode == "train" else row["gflops"]
        print(f"  (attn: {row[key]:.4g} s, {100 * gflops / peak:.0f}% of the {peak:.1f} GFLOP/s "
              f"{'AMX-BF16' if tiles else 'FMA'} peak measured in its run)", flush=True)
    return rows[0][key], rows[0].get("machine", "")


def run_torch(args, sh):
    import torch
    torch.set_num_threads(args.threads)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    b, h, hk, d = args.batch, args.heads, args.kv_heads, sh["head_dim"]
    q = torch.rand(b, h, sh["seq_q"], d, dtype=dt) * 2 - 1
    k = torch.rand(b, hk, sh["seq_k"], d, dtype=dt) * 2 - 1
    v = torch.rand(b, hk, sh["seq_k"], d, dtype=dt) * 2 - 1
    kw = dict(is_causal=sh["causal"])
    if hk != h:
        kw["enable_gqa"] = True
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if args.mode in ("backward", "train"):
        for x in (q, k, v):
            x.requires_grad_(True)
        dout = torch.rand(b, h, sh["seq_q"], d, dtype=dt) * 2 - 1

        def step():  # forward (saving what the backward needs) and backward
            for x in (q, k, v):
                x.grad = None
            sdpa(q, k, v, **kw).backward(dout)

        if args.mode == "train":
            return median_time(step)
        out = sdpa(q, k, v, **kw)

        def backward_only():  # the same graph each time: only the backward is timed
            for x in (q, k, v):
                x.grad = None
            out.backward(dout, retain_graph=True)

        return median_time(backward_only)
    with torch.no_grad():
        return median_time(lambda: sdpa(q, k, v, **kw))


def run_ort(args, sh):
    import numpy as np, onnx, onnxruntime as ort
    from onnx import helper, TensorProto
    if args.dtype != "f32":
        raise RuntimeError("ORT peer: f32 only here")
    if args.mode in ("backward", "train"):
        raise RuntimeError("ORT peer: inference only (no attention backward)")
    b, h, hk, d, sq, sk = args.batch, args.heads, args.kv_heads, sh["head_dim"], sh["seq_q"], sh["seq_k"]
    if sh["causal"] or sq == 1:
        # GroupQueryAttention is causal by construction (past/present KV-cache semantics); a single
        # query at the last position sees every key, which is decode.
        node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total_len"], ["o"],
                                domain="com.microsoft", num_heads=h, kv_num_heads=hk)
        inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, sq, h * d]),
                  helper.make_tensor_value_info("k", TensorProto.FLOAT, [b, sk, hk * d]),
                  helper.make_tensor_value_info("v", TensorProto.FLOAT, [b, sk, hk * d]),
                  helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [b]),
                  helper.make_tensor_value_info("total_len", TensorProto.INT32, [])]
    else:
        if hk != h:
            raise RuntimeError("ORT MultiHeadAttention: no GQA without causal here")
        node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=h)
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, s, h * d]) for n, s in (("q", sq), ("k", sk), ("v", sk))]
    graph = helper.make_graph([node], "attn", inputs, [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions(); so.intra_op_num_threads = args.threads; so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"q": np.random.uniform(-1, 1, (b, sq, h * d)).astype(np.float32),
            "k": np.random.uniform(-1, 1, (b, sk, hk * d)).astype(np.float32),
            "v": np.random.uniform(-1, 1, (b, sk, hk * d)).astype(np.float32)}
    if sh["causal"] or sq == 1:
        feed["seqlens_k"] = np.full((b,), sk - 1, dtype=np.int32)
        feed["total_len"] = np.array(sk, dtype=np.int32)
    return median_time(lambda: sess.run(None, feed))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lst = lambda s: [int(x.replace("k", "")) * (1024 if "k" in x else 1) for x in s.split(",")]
    p.add_argument("--mode", choices=["prefill", "decode", "backward", "train"], default="prefill")
    p.add_argument("--seq", type=lst, default=None, help="key lengths (default prefill 1024,4096,8192; decode 4096,16384)")
    p.add_argument("--head-dim", type=lst, default=None)
    p.add_argument("--causal", type=lst, default=None, help="0,1 (prefill only)")
    p.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--attn", default=os.path.join(ROOT, "build", "tools", "attn"), help="the attn binary")
    p.add_argument("--attn-cmd", default=None, help="command template replacing `attn bench prefill`, e.g. "
                   "'build/tools/attn bench decode --json --cache {seq_k} ...' ({seq_q} {seq_k} {head_dim} {threads} ...)")
    p.add_argument("--peers", default="torch,ort")
    p.add_argument("--isa", default="", help="e.g. avx2: attn bench --isa avx2 and PyTorch with "
                   "ATEN_CPU_CAPABILITY=avx2, and its MKL and oneDNN matmuls with MKL_ENABLE_INSTRUCTIONS and "
                   "ONEDNN_MAX_CPU_ISA (ONNX Runtime has no such switch: it keeps its best code path)")
    args = p.parse_args()
    if args.isa:  # before torch is imported (run_torch imports it)
        isa = args.isa.split(",")[0]
        os.environ["ATEN_CPU_CAPABILITY"] = isa.lower()
        # ATen's capability does not reach the BLAS: without these, SDPA's matmuls kept AVX-512 on an
        # Intel Xeon (0.75 s at --isa avx2 against 0.68 s unrestricted, above the 256-bit FMA peak).
        os.environ["MKL_ENABLE_INSTRUCTIONS"] = isa.upper()
        os.environ["ONEDNN_MAX_CPU_ISA"] = isa.upper()
    dec = args.mode == "decode"
    args.seq = args.seq or ([4096, 16384] if dec else [1024, 4096, 8192])
    args.head_dim = args.head_dim or ([128] if dec or args.mode != "prefill" else [64, 128])
    args.causal = args.causal or ([0] if dec else [0, 1])
    args.heads = args.heads or (32 if dec else 16)
    args.kv_heads = args.kv_heads or (8 if dec else args.heads)
    peers = {"torch": run_torch, "ort": run_ort}
    chosen = [x for x in args.peers.split(",") if x]
    machine = ""
    print(f"mode {args.mode}, dtype {args.dtype}, batch {args.batch}, heads {args.heads}/{args.kv_heads}, threads {args.threads}")
    hdr = f"{'seq_q':>6} {'seq_k':>6} {'d':>4} {'causal':>6} {'attn s':>10}" + "".join(f" {n + ' s':>10} {n + '/attn':>10}" for n in chosen)
    print(hdr)
    for sh in shapes(args):
        a, machine = run_attn(args, sh)
        line = f"{sh['seq_q']:>6} {sh['seq_k']:>6} {sh['head_dim']:>4} {('yes' if sh['causal'] else 'no'):>6} {a:>10.4g}"
        for n in chosen:
            try:
                t = peers[n](args, sh)
                line += f" {t:>10.4g} {t / a:>10.2f}"
            except Exception as e:  # a peer that cannot run this shape says so in the table
                line += f" {'n/a':>10} {'':>10}"
                print(f"  ({n}: {type(e).__name__}: {str(e).splitlines()[0][:100]})", file=sys.stderr)
        print(line, flush=True)
    print(f"machine: {machine}; ratios = peer seconds / attn seconds (> 1: attn faster)")


if __name__ == "__main__":
    main()
