#!/usr/bin/env python3
"""Reads the JSON lines of attn_gpu_bench and torch_bench.py and prints the table scripts/gpu-check ends
with: forward TFLOP/s and decode GB/s as ratios to torch and to the ceilings measured in the same run;
then, when attn_gpu_bench ran with --variants, every kernel configuration it timed."""
import json, sys

rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.startswith("{")]
get = lambda what, impl_prefix, **kw: next((r for r in rows if r["what"] == what and r["impl"].startswith(impl_prefix)
                                            and all(r.get(k) == v for k, v in kw.items())), None)
nan = float("nan")
ratio = lambda a, b: a / b if b else nan
dev = next((r for r in rows if r["what"] == "device"), {})
copy = max((r["gbps"] for r in rows if r["what"] == "copy"), default=nan)
mm = get("matmul", "torch")
mm_t = mm["tflops"] if mm else nan
print(f"device: {dev.get('name', '?')}   copy ceiling {copy:.0f} GB/s (best of cudaMemcpy, torch copy_)   "
      f"bf16 matmul ceiling {mm_t:.0f} TFLOP/s")
print(f"{'case':44} {'attn':>10} {'torch':>10} {'attn/torch':>10} {'attn/ceiling':>12}")
for what, shape in (("forward", "s8192"), ("backward", "s4096")):
    for causal in (False, True):
        a, t = get(what, "attn", causal=causal), get(what, "torch", causal=causal)
        if a:
            tt = t["tflops"] if t else nan
            print(f"{what + ' bf16 d128 ' + shape + ' b4 h32' + (' causal' if causal else ''):44} {a['tflops']:7.0f} TF "
                  f"{tt:7.0f} TF {ratio(a['tflops'], tt):10.2f} {ratio(a['tflops'], mm_t):12.2f}")
t = get("decode", "torch")
tg = t["gbps"] if t else nan
for layout in ("keys", "kv-heads"):
    a = get("decode", "attn", layout=layout)
    if a:
        print(f"{'decode bf16 d128 128k 32/8 heads, ' + layout:44} {a['gbps']:5.0f} GB/s {tg:5.0f} GB/s "
              f"{ratio(a['gbps'], tg):10.2f} {ratio(a['gbps'], copy):12.2f}")
a = get("decode", "attn")
if a:
    print(f"  (attn decode splits {a.get('splits')}; cache layouts: keys = [1, N, 8, 128] (flash-attn), "
          f"kv-heads = [1, 8, N, 128]; torch: {t['impl'] + ', kv-heads layout' if t else 'none ran'})")
print("targets (issue 6): forward >= 1.0x torch flash; decode >= 0.85 of the copy ceiling")
oracle = [r for r in rows if r["what"] == "oracle"]
if oracle:
    verdict = lambda r: "" if r["max_err"] <= r["tolerance"] else f" (OVER {r['tolerance']})"
    print("library vs the f64 oracle on sampled rows: " +
          ", ".join(f"{r['case']} {r['max_err']:.2g}{verdict(r)}" for r in oracle))

# The fastest configuration of each case among the variants that agree with the library's output: what
# making it the library's configuration would give (the same kernel template, the same run).
ok = lambda r: "error" not in r and r["max_diff_vs_library"] <= 0.05
best = []
for causal in (False, True):
    cands = [r for r in rows if r["what"] == "forward_variant" and r["causal"] == causal and ok(r)]
    if cands:
        r, t = max(cands, key=lambda r: r["tflops"]), get("forward", "torch", causal=causal)
        best.append(f"  forward{' causal' if causal else '       '}  {r['name']:42} {r['tflops']:7.0f} TF "
                    f"{ratio(r['tflops'], t['tflops'] if t else 0):5.2f}x torch")
for layout in ("keys", "kv-heads"):
    cands = [r for r in rows if r["what"] == "decode_variant" and r["layout"] == layout and ok(r)]
    if cands:
        r = max(cands, key=lambda r: r["gbps"])
        best.append(f"  decode {layout:9} {r['name'] + ', splits ' + str(r['splits']):42} {r['gbps']:7.0f} GB/s "
                    f"{ratio(r['gbps'], copy):5.2f} of copy")
if best:
    print("\nfastest variant per case (attn_gpu_bench --variants; output within 0.05 of the library's)")
    print("\n".join(best))

fv = [r for r in rows if r["what"] == "forward_variant"]
if fv:
    print("\nforward variants (bf16 d128; attn_gpu_bench --variants; diff = max |out - library out|)")
    for r in fv:
        if "error" in r:
            print(f"  {r['name']:42} {'causal' if r['causal'] else '      '} FAILED: {r['error']}")
            continue
        base = get("forward", "attn", causal=r["causal"])
        print(f"  {r['name']:42} {'causal' if r['causal'] else '      '} {r['tflops']:7.1f} TF "
              f"{ratio(r['tflops'], base['tflops'] if base else 0):6.2f}x library  diff {r['max_diff_vs_library']:.3g}")
dv = [r for r in rows if r["what"] == "decode_variant"]
if dv:
    print("\ndecode variants (bf16 d128 128k; splits 0 = automatic)")
    for r in dv:
        if "error" in r:
            print(f"  {r['layout']:8} {r['name']:46} splits {r['splits']:4} FAILED: {r['error']}")
            continue
        print(f"  {r['layout']:8} {r['name']:46} splits {r['splits']:4} {r['gbps']:7.0f} GB/s "
              f"{ratio(r['gbps'], copy):5.2f} of copy  diff {r['max_diff_vs_library']:.3g}")
