#!/usr/bin/env python3
"""Reads the JSON lines of attn_gpu_bench and torch_bench.py and prints the table scripts/gpu-check ends
with: forward TFLOP/s and decode GB/s as ratios to torch and to the ceilings measured in the same run."""
import json, sys

rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.startswith("{")]
get = lambda what, impl_prefix, **kw: next((r for r in rows if r["what"] == what and r["impl"].startswith(impl_prefix)
                                            and all(r.get(k) == v for k, v in kw.items())), None)
dev = next((r for r in rows if r["what"] == "device"), {})
copy = max((r["gbps"] for r in rows if r["what"] == "copy"), default=float("nan"))
mm = get("matmul", "torch")
mm_t = mm["tflops"] if mm else float("nan")
print(f"device: {dev.get('name', '?')}   copy ceiling {copy:.0f} GB/s (best of cudaMemcpy, torch copy_)   "
      f"bf16 matmul ceiling {mm_t:.0f} TFLOP/s")
print(f"{'case':38} {'attn':>10} {'torch':>10} {'attn/torch':>10} {'attn/ceiling':>12}")
for causal in (False, True):
    a, t = get("forward", "attn", causal=causal), get("forward", "torch", causal=causal)
    if a:
        tt = t["tflops"] if t else float("nan")
        print(f"{'forward bf16 d128 s8192 b4 h32' + (' causal' if causal else ''):38} {a['tflops']:8.0f} TF {tt:8.0f} TF "
              f"{a['tflops'] / tt:10.2f} {a['tflops'] / mm_t:12.2f}")
a, t = get("decode", "attn"), get("decode", "torch")
if a:
    tg = t["gbps"] if t else float("nan")
    print(f"{'decode bf16 d128 128k 32/8 heads':38} {a['gbps']:6.0f} GB/s {tg:6.0f} GB/s {a['gbps'] / tg:10.2f} "
          f"{a['gbps'] / copy:12.2f}")
    print(f"  (decode splits {a.get('splits')}; torch decode impl: {t['impl'] if t else 'none ran'})")
print("targets (issue 6): forward >= 1.0x torch flash; decode >= 0.85 of the copy ceiling")
