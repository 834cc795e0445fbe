#!/usr/bin/env bash
# Per-process GPU utilization and memory (NVML) of 10 model families (CNNs, transformers, recurrent nets,
# an MLP) at several batch sizes, inference and a TVM Relax training step, each run in its own child
# process on GPU 0, within one 15-minute run (a 13-minute budget for starting runs). Writes a profile
# JSON with "source": "measured" and the device's name. Without a GPU: prints "no GPU here" and exits 0.
#
#   bench/gpu_profile.sh [--json PATH] [--budget-s S] [--iterations N] [--dry-run]
#
# Needs on the GPU host: the checkout's Python environment (nvidia-ml-py, TVM with CUDA or onnxruntime-gpu)
# and the NVIDIA driver. Exit codes: 0 measured or "no GPU here", 2 a GPU but no runtime that can use it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 890 "$PY" bench/gpu_profile.py "$@"
