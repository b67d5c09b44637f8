#!/usr/bin/env bash
# Creates bench/peers/.venv (gitignored) with the peers: PyTorch (CPU use only, scripts/install-torch),
# ONNX Runtime, numpy.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip="$venv/bin/pip"
"$pip" install -q --upgrade pip
"$pip" install -q numpy onnx onnxruntime
"$here/../../scripts/install-torch" "$pip"
"$venv/bin/python" -c "import torch, onnxruntime, numpy; print('torch', torch.__version__, 'onnxruntime', onnxruntime.__version__, 'numpy', numpy.__version__)"
