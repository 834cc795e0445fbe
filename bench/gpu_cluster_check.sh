#!/usr/bin/env bash
# GPU cluster check for Horus's live side (scheduling/gpu_isolation.py, scheduling/telemetry.py), under
# 8 minutes: three co-located ONNX jobs on GPU 0, each in its own process with the platform's isolation
# (CUDA_VISIBLE_DEVICES; MPS SM and memory limits where an MPS daemon runs; onnxruntime's gpu_mem_limit;
# the worker's three slots per GPU). Prints per job the predicted vs per-process measured utilization
# and memory, the slowdown against its solo run, whether its memory cap and the slot limit held, and a
# PASS/FAIL line.
#
#   bench/gpu_cluster_check.sh [--iterations N] [--json PATH]
#
# Needs on the GPU host: the checkout's Python environment with onnxruntime-gpu and nvidia-ml-py, and the
# NVIDIA driver. Exit codes: 0 PASS or "no GPU here" (nothing to check on this host), 1 FAIL.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 470 "$PY" bench/gpu_cluster_check.py "$@"
