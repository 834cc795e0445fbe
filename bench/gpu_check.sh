#!/usr/bin/env bash
# GPU check for DOPpler's GPU mechanism (CUDA MPS; see tuning/engine/gpu_slots.py), under 8 minutes.
#
#   bench/gpu_check.sh                       # on a host with an NVIDIA GPU: build (or use prebuilt) CUDA
#                                            # candidates, measure serially and at DOP 2/4/8, print the
#                                            # error and speed-up per DOP, NVML energy, PASS/FAIL
#   bench/gpu_check.sh --window-only         # the platform's ways only (no concurrent ablation): ~half the time
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
# GPU's timing lock ("window", the platform's way: tuning/engine/measure.py timing_window).
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
    *) echo "usage: $0 [--prepare [--arch sm_XY]] [--window-only]" >&2; exit 2 ;;
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
exec timeout 470 "$PY" - "$MODE" "$ARCH" "$WAYS" <<'PYEOF'
import json, os, signal, statistics, sys, time

# `timeout` ends this with SIGTERM: unwind, so the finally blocks stop the MPS daemon and the workers
signal.signal(signal.SIGTERM, lambda *_: sys.exit("gpu_check: stopped by its time limit"))
from pathlib import Path

MODE, ARCH, WAYS = sys.argv[1], sys.argv[2] or None, sys.argv[3]
CAND = Path("bench/gpu_candidates")
DOPS = [2, 4, 8]


def schedules():
    """A few tasks, each in several thread-binding variants (the candidates a GPU search measures)."""
    import tvm
    from tvm import s_tir
    from tuning.engine.testing import depthwise_conv2d_primfunc, matmul_primfunc

    tasks = {"matmul1024": matmul_primfunc(1024), "matmul512": matmul_primfunc(512),
             "dwconv": depthwise_conv2d_primfunc(1, 128, 56, 56, 3, 1, 1)}
    for name, func in tasks.items():
        for threads in (32, 64, 128, 256, 512, 1024):
            sch = s_tir.Schedule(tvm.IRModule({"main": func}))
            for block in sch.get_child_blocks(sch.get_sblock("root"))[:-1]:
                sch.compute_inline(block)  # e.g. padding: one kernel per candidate
            loops = sch.get_loops(sch.get_child_blocks(sch.get_sblock("root"))[-1])
            spatial = loops[:2] if len(loops) > 2 else loops
            fused = sch.fuse(*spatial)
            bx, tx = sch.split(fused, [None, threads])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            yield f"{name}_t{threads}", sch.mod, func


def prepare(arch):
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tuning.engine.cuda_binaries import precompile_kernels
    from tuning.engine.measure import _jsonable

    if not arch:
        from tuning.engine.gpu_slots import require_gpus
        arch = require_gpus()[0].arch  # the target arch comes from the device
    target = tvm.target.Target({"kind": "cuda", "arch": arch, "host": {"kind": "llvm"}})
    CAND.mkdir(parents=True, exist_ok=True)
    manifest = {"arch": arch, "candidates": []}
    for name, mod, func in schedules():
        try:
            lib = tvm.compile(mod, target=target)
        except Exception as exc:  # noqa: BLE001 - an invalid variant is skipped, as a search would
            print(f"  build {name}: skipped ({str(exc).splitlines()[-1][:100]})")
            continue
        path = CAND / f"{name}.so"
        lib.export_library(str(path))
        # TVM 0.27 keeps the kernel as CUDA source and compiles it at load time; a runtime-only
        # worker takes this binary instead (tuning/engine/cuda_binaries.py)
        precompile_kernels(lib, arch, CAND / "cuda_bin")
        args = [_jsonable(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(func)]
        manifest["candidates"].append({"name": name, "path": str(path), "args_info": args})
    (CAND / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in CAND.rglob("*") if p.is_file())
    print(f"gpu_check: {len(manifest['candidates'])} CUDA candidates for {arch} in {CAND} ({size / 2**20:.2f} MiB)")


def energy_j(meter):
    return meter.read().joules if meter is not None else None


def check():
    from tuning.engine import sandbox
    from tuning.engine.gpu_slots import (TIMING_LOCK_VAR, GpuSlotGroup, ensure_mps, gpu_slot_groups, mps_pipe_dir,
                                         require_gpus, stop_mps, timing_lock_path)
    from tuning.engine.plugins import gpu_worker_slots
    from tuning.engine.runner import MeasureJob, PooledAsyncRunner
    from tuning.engine.timer import default_evaluator

    gpus = require_gpus()
    if not (CAND / "manifest.json").exists():
        prepare(gpus[0].arch)
    manifest = json.loads((CAND / "manifest.json").read_text())
    if manifest["arch"] != gpus[0].arch:
        print(f"gpu_check: candidates built for {manifest['arch']}, device is {gpus[0].arch}: rebuilding")
        prepare(gpus[0].arch)
        manifest = json.loads((CAND / "manifest.json").read_text())
    try:
        from tuning.engine.energy import NvmlMeter
        meter = NvmlMeter(gpu_indices=[gpus[0].index])
    except Exception as exc:  # noqa: BLE001
        meter = None
        print(f"  NVML energy: unavailable ({exc})")
    # Workers load each kernel from the binaries built beside the candidates (cuda_bin/); what they must
    # compile here (nvcc, the device's arch) lands in a fresh cache, counted below (DLOPT_CUDA_* is on
    # the sandbox's allow-list, so the variable reaches the workers)
    from tuning.engine.cuda_binaries import CACHE_DIR_VAR
    import tempfile
    compiled_here = Path(tempfile.mkdtemp(prefix="gpu-check-nvcc-"))
    os.environ[CACHE_DIR_VAR] = str(compiled_here)
    jobs = [MeasureJob(path=str(Path(c["path"]).resolve()), device_type="cuda", args_info=c["args_info"]) for c in manifest["candidates"]]
    cores = sorted(os.sched_getaffinity(0))
    print(f"gpu_check: {gpus[0].name} ({gpus[0].arch}), {len(jobs)} candidates, {len(cores)} cores")

    names = [c["name"] for c in manifest["candidates"]]

    def make_runner(group):
        # The runner's plain Python object (``_cls``): its TVM-facing wrapper needs the compiler
        # library, and a GPU host may carry TVM's runtime only. Limits as a GPU worker has them.
        return PooledAsyncRunner._cls(evaluator=default_evaluator("cuda"), threads=1, dop=1,
                                      slots=gpu_worker_slots(group, cores), worker_env=group.env, timeout_sec=60,
                                      worker_limits=sandbox.default_limits(gpu=True))

    def measure_setting(setting, variants, dops):
        """Serial twice on the first variant (the reference and its noise floor), then each variant
        at each DOP; errors against the mean serial timing."""
        serial_walls, serial_runs = [], []
        runner = make_runner(variants[0][1])
        try:
            runner._measure(jobs[:1], 1)  # warm the serial worker (CUDA context, module loader)
            for _ in range(2):
                t0, e0 = time.perf_counter(), energy_j(meter)
                outcomes = [o for o, _ in runner._measure(jobs, 1)]
                serial_walls.append(time.perf_counter() - t0)
                e_serial = (energy_j(meter) - e0) if meter else None
                failed = [o.error for o in outcomes if o.error]
                if failed:
                    print(f"  {setting} serial: {len(failed)} of {len(jobs)} candidates failed; first error:\n    "
                          + failed[0].strip().replace("\n", "\n    ")[-1500:])
                if len(failed) == len(jobs):
                    return None
                serial_runs.append([statistics.mean(o.run_secs) if o.run_secs else None for o in outcomes])
        finally:
            runner.shutdown()
        ser = [statistics.mean(pair) if all(pair) else None for pair in zip(*serial_runs)]
        noise = [abs(a - b) / min(a, b) for a, b in zip(*serial_runs) if a and b]
        t_serial = statistics.mean(serial_walls)
        print(f"  {setting:18s} serial  wall {t_serial:6.2f} s  serial-vs-serial {statistics.mean(noise):.2%} "
              f"(max {max(noise):.2%})  energy {e_serial if e_serial is None else round(e_serial, 1)} J")
        rows = []
        for label, group in variants:
            runner = make_runner(group)
            try:
                for dop in dops:
                    runner._measure(jobs[:dop], dop)  # start the DOP workers before timing
                    t0, e0 = time.perf_counter(), energy_j(meter)
                    par = [statistics.mean(o.run_secs) if o.run_secs else None for o, _ in runner._measure(jobs, dop)]
                    wall, joules = time.perf_counter() - t0, (energy_j(meter) - e0) if meter else None
                    per = {n: (p - s) / s for n, p, s in zip(names, par, ser) if p and s}
                    errs = [abs(v) for v in per.values()]
                    err = statistics.mean(errs) if errs else float("nan")
                    speed = t_serial / wall if wall else float("nan")
                    good = err <= 0.05 and speed >= 1.2
                    rows.append({"mechanism": label, "dop": dop, "error": err, "error_max": max(errs, default=None),
                                 "signed_median": statistics.median(per.values()) if per else None,
                                 "speedup": speed, "wall_s": wall, "energy_j": joules, "measured": len(errs),
                                 "ok": good, "per_candidate_signed_error": per})
                    print(f"  {label:18s} DOP {dop}   wall {wall:6.2f} s  speed-up x{speed:.2f}  mean error {err:.2%} "
                          f"(max {max(errs, default=float('nan')):.2%}, signed median {rows[-1]['signed_median'] or 0:+.2%})  "
                          f"energy {joules if joules is None else round(joules, 1)} J  {'ok' if good else '-'}")
                    runner.retire_pools({1})
            finally:
                runner.shutdown()
        return {"serial_s": t_serial, "serial_noise": statistics.mean(noise), "serial_energy_j": e_serial,
                "per_candidate_serial_s": dict(zip(names, ser)), "rows": rows}

    # Without MPS the driver time-slices the workers' contexts; measured first, before an MPS daemon
    # exists. "concurrent": candidates timed at the same time (the ablation); "window": the platform's
    # way, prepared in parallel and timed one at a time under the GPU's timing lock.
    plain = {"CUDA_VISIBLE_DEVICES": gpus[0].uuid or str(gpus[0].index)}
    windowed = dict(plain, **{TIMING_LOCK_VAR: timing_lock_path(gpus[0])})
    concurrent_too = WAYS == "all"  # --window-only: the platform's ways alone (a shorter run)
    results = {"no-mps": measure_setting("no MPS", [
        *([("no MPS, concurrent", GpuSlotGroup(gpus[0], max(DOPS), False, plain))] if concurrent_too else []),
        ("no MPS, window", GpuSlotGroup(gpus[0], max(DOPS), False, windowed))], DOPS)}
    mps = ensure_mps(mps_pipe_dir())
    print(f"  MPS: {'on (' + mps.reason + ')' if mps.running else 'OFF: ' + mps.reason}")
    try:
        if mps.running:
            results["mps"] = measure_setting("MPS", [
                *([("MPS, concurrent", gpu_slot_groups(gpus[:1], mps, max(DOPS), exclusive_timing=False)[0])]
                  if concurrent_too else []),
                ("MPS, window", gpu_slot_groups(gpus[:1], mps, max(DOPS))[0])], DOPS)
    finally:
        stop_mps(mps)  # a daemon this check started goes with it
    platform = "MPS, window" if mps.running else "no MPS, window"
    ok = any(r["ok"] for res in results.values() if res for r in res["rows"] if r["mechanism"] == platform)
    n_compiled = len(list(compiled_here.glob("*.fatbin")))
    print(f"  kernels compiled on this host (not found among the prebuilt binaries): {n_compiled}")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check.json").write_text(json.dumps(
            {"gpu": gpus[0].name, "arch": gpus[0].arch, "mps": mps.running, "mps_reason": mps.reason,
             "kernels_compiled_on_host": n_compiled,
             "energy": "NVML, measured" if meter else None, "candidates": len(jobs), "results": results,
             "overall": {"pass": ok, "platform_mechanism": platform,
                         "best": max((r for res in results.values() if res for r in res["rows"]
                                      if r["mechanism"] == platform and r["ok"]),
                                     key=lambda r: r["speedup"], default=None)}},
            indent=1))
    if all(res is None for res in results.values()):
        print("gpu_check: FAIL (no candidate could be measured on this GPU)")
        return 1
    print(f"gpu_check: PASS ({platform})" if ok else
          f"gpu_check: FAIL (no DOP > 1 of {platform} with error <= 5 % and speed-up >= 1.2x)")
    return 0 if ok else 1


try:
    sys.exit(prepare(ARCH) or 0 if MODE == "prepare" else check())
except Exception as exc:  # noqa: BLE001
    from tuning.engine.gpu_slots import NeedsGPU
    if isinstance(exc, NeedsGPU):
        print(f"gpu_check: no GPU here ({exc}). Exit 0.")
        sys.exit(0)
    raise
PYEOF
