#!/usr/bin/env bash
# The AMX measurements docs/prefill.md still lacks, in one run on an Intel Xeon with AMX (2 threads, 16
# heads, d 128, batch 1): what a session on such a machine runs first. Each A/B pair alternates twice on
# the same build (these VMs drift 30% between minutes); every table names its command, and the log
# starts with the CPU and the date. About 10-15 minutes on 2 cores once the build and bench/peers/.venv
# exist (the first `make build` and bench/peers/setup.sh take longer).
#   bench/amx/measure.sh [LOG]          # default build/amx-measure.log
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
log="${1:-build/amx-measure.log}"
attn=build/tools/attn
if ! grep -q amx_bf16 /proc/cpuinfo; then
  echo "bench/amx/measure.sh: this CPU has no AMX (no amx_bf16 in /proc/cpuinfo): nothing to measure" >&2
  exit 2
fi
[ -x "$attn" ] || make build
[ -x bench/peers/.venv/bin/python ] || bench/peers/setup.sh
mkdir -p "$(dirname "$log")"
exec > >(tee "$log") 2>&1
run() {  # prints the command, then runs it
  echo
  echo "\$ $*"
  "$@"
}
echo "== $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC'); $(git rev-parse --short HEAD)"
run "$attn" info --peaks

echo; echo "== 1. The AMX kernels' tests on the CPU's tiles (they compare with the emulator bit for bit)"
run ctest --test-dir build -R 'Amx|amx' -j2 --output-on-failure

echo; echo "== 2. bf16 prefill against PyTorch's SDPA (targets: 1.5x at seq 4096, 1.3x at 1024 and 2048 causal)"
run bench/peers/.venv/bin/python bench/peers/peers.py --seq 1024,2048,4096 --head-dim 128 --causal 0,1 \
  --dtype bf16 --threads 2 --heads 16 --peers torch

echo; echo "== 3. bf16 prefill, tiles against the vector kernel (and the tile peak share)"
for _ in 1 2; do
  for amx in on off; do
    run "$attn" bench --amx "$amx" prefill --seq 4096 --head-dim 128 --causal 0,1 --dtype bf16 --threads 2 --no-textbook
  done
done

echo; echo "== 4. What dropout costs on the tiles"
run "$attn" bench --amx on prefill --seq 4096 --head-dim 128 --causal 0 --dtype bf16 --dropout 0,0.1 --threads 2 \
  --no-textbook

echo; echo "== 5. f32 on the tiles by bf16 parts (ATTN_AMX_F32=bf16x3) against the f32 vector kernel"
for _ in 1 2; do
  for parts in bf16x3 off; do
    run env ATTN_AMX_F32="$parts" "$attn" bench --amx on prefill --seq 4096 --head-dim 128 --causal 0,1 --dtype f32 \
      --threads 2 --no-textbook
  done
done

echo; echo "== 6. f16 (on the tiles only where the CPU has AMX-FP16: attn info says)"
run "$attn" bench --amx on prefill --seq 4096 --head-dim 128 --causal 0,1 --dtype f16 --threads 2 --no-textbook

echo; echo "== 7. The backward against PyTorch's (target 1.5x), and MLA decode against the vector kernel (3x)"
run bench/peers/.venv/bin/python bench/peers/peers.py --mode backward --seq 4096 --head-dim 128 --causal 0,1 \
  --dtype bf16 --threads 2 --heads 16 --peers torch
for amx in on off; do
  run "$attn" bench --amx "$amx" mla --threads 2
done
echo; echo "== done: $log"
