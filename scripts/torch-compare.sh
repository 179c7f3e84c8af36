#!/usr/bin/env bash
# ckptd.torch beside torch.save/torch.load and PyTorch DCP's async_save/load
# on the same model and Adam state (bench/torch_compare.py): builds ckptd,
# makes (once, then reuses) a virtual environment with torch 2.x from PyPI,
# and prints the table of stall, durable and restart times. A benchmark, not
# a test; the download is large (about 3 GB with torch's CUDA libraries).
#   CKPTD_TORCH_VENV=DIR  the virtual environment (default ~/.cache/ckptd-bench/torch-venv)
# Arguments go to bench/torch_compare.py (--params-m M, --dir DIR, --json).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target ckptd-agent ckptd_shared

VENV="${CKPTD_TORCH_VENV:-$HOME/.cache/ckptd-bench/torch-venv}"
if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(int(torch.__version__.split(".")[0]) < 2)' 2>/dev/null; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "torch>=2.3" numpy
fi
PYTHONPATH="$PWD/python" CKPTD_LIBRARY="$PWD/build/lib/libckptd.so" CKPTD_AGENT="$PWD/build/bin/ckptd-agent" \
  "$VENV/bin/python" bench/torch_compare.py "$@"
