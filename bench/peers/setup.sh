#!/usr/bin/env bash
# Creates bench/peers/.venv (gitignored) with the peers: PyTorch (CPU use only), ONNX Runtime, numpy.
# PyTorch's PyPI wheel depends on ~3 GB of CUDA libraries that a CPU run never uses, so torch is
# installed with --no-deps, with its small pure-Python dependencies and only the NVIDIA libraries its
# libtorch_cuda.so must find to load (cufile, cuSPARSELt, NVSHMEM, NCCL); on a machine with a CUDA
# toolkit in the loader path the rest (cudart, cuBLAS, ...) already resolve, elsewhere add them the
# same way (`ldd .venv/lib/python3*/site-packages/torch/lib/libtorch_cuda.so | grep 'not found'`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install -q --upgrade pip
"$pip" install -q numpy onnx onnxruntime
"$pip" install -q filelock typing-extensions sympy networkx jinja2 fsspec
"$pip" install -q --no-deps torch
"$pip" install -q --no-deps nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13 nvidia-nccl-cu13
"$venv/bin/python" -c "import torch, onnxruntime, numpy; print('torch', torch.__version__, 'onnxruntime', onnxruntime.__version__, 'numpy', numpy.__version__)"
