#!/usr/bin/env bash
# GPU check for DOPpler's GPU mechanism (CUDA MPS; see tuning/engine/measuring/gpu_slots.py), under 8 minutes.
#
#   bench/gpu_check.sh                       # on a host with an NVIDIA GPU: build (or use prebuilt) CUDA
#                                            # candidates, measure serially and at DOP 2/4/8, print the
#                                            # error and speed-up per DOP, NVML energy, PASS/FAIL
#   bench/gpu_check.sh --window-only         # the platform's ways only (no concurrent ablation): ~half the time
#   bench/gpu_check.sh --budgets             # the evaluator budget: serial noise, ranking and window speed-up
#                                            # per budget against the GPU default (gpu_check_budgets.json)
#   bench/gpu_check.sh --prepare [--arch sm_90]
#                                            # on any host with TVM's compiler and nvcc: prebuild the
#                                            # candidates into bench/gpu_candidates/ (< 2 MiB) so the GPU
#                                            # host needs TVM's runtime only (TVM_USE_RUNTIME_LIB=1)
#
# Needs on the GPU host: python3 with numpy and the tvm package (runtime libs suffice with prebuilt
# candidates: everything beyond the checkout fits in 64 MiB), the NVIDIA driver (nvidia-smi), and
# nvidia-cuda-mps-control for DOP > 1 (without MPS every DOP is reported as "no MPS: serial only").
# Exit codes: 0 PASS or "no GPU here" (nothing to check on this host), 1 FAIL, 2 setup error.
# Measures four ways on one GPU, each against its own serial reference: without MPS and with it, and
# candidates timed concurrently (the ablation) or prepared in parallel and timed one at a time under the
# GPU's timing lock ("window", the platform's way: tuning/engine/measuring/measure.py timing_window).
# PASS: the platform's way (MPS + window; no MPS + window where MPS is missing) at some DOP > 1 keeps the
# mean parallel-vs-serial error <= 5 % (DOPpler's threshold) with a measuring speed-up >= 1.2x over serial.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MODE=check
ARCH=""
WAYS=all
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) MODE=prepare ;;
    --arch) ARCH="$2"; shift ;;
    --window-only) WAYS=window ;;
    --budgets) WAYS=budgets ;;
    *) echo "usage: $0 [--prepare [--arch sm_XY]] [--window-only | --budgets]" >&2; exit 2 ;;
  esac
  shift
done
if [ "$MODE" = check ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "gpu_check: no GPU here (nvidia-smi not found): needs a GPU; nothing measured. Exit 0."
  exit 0
fi
if [ "$MODE" = check ] && [ -f bench/gpu_candidates/manifest.json ]; then
  export TVM_USE_RUNTIME_LIB=1  # prebuilt candidates: the runtime is all it needs
fi
export TVM_FFI_DISABLE_TORCH_C_DLPACK=1  # where PyTorch is installed, tvm_ffi would import it and JIT an extension
# TVM's CUDA runtime (libtvm_runtime_cuda.so) needs the toolkit's libcudart of its own major version: when
# the loader does not know that one, take the toolkit's or the one pip's nvidia packages hold (PyTorch hosts).
if [ "$MODE" = check ]; then
  TVM_LIB=$("$PY" -c 'import importlib.util, os; print(os.path.join(os.path.dirname(importlib.util.find_spec("tvm").origin), "lib"))' 2>/dev/null || true)
  CUDART=$(grep -ao 'libcudart\.so\.[0-9]*' "$TVM_LIB/libtvm_runtime_cuda.so" 2>/dev/null | head -1 || true)
  CUDART=${CUDART:-libcudart.so}
  if ! ldconfig -p 2>/dev/null | grep -qF "$CUDART"; then
    for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/targets/x86_64-linux/lib \
             $("$PY" -c 'import nvidia, os; print(" ".join(os.path.join(p, q, "lib") for p in nvidia.__path__ for q in sorted(os.listdir(p))))' 2>/dev/null); do
      if ls "$d/$CUDART"* >/dev/null 2>&1; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "gpu_check: $CUDART from $d"
        break
      fi
    done
  fi
fi
# a module, so that bench/ (its common.py) does not shadow the platform's common package
exec timeout 470 "$PY" -m bench.gpu_check "$MODE" "$ARCH" "$WAYS"
