#!/usr/bin/env bash
# GPU check for DOPpler's GPU mechanism (CUDA MPS; see tuning/engine/gpu_slots.py), under 8 minutes.
#
#   bench/gpu_check.sh                       # on a host with an NVIDIA GPU: build (or use prebuilt) CUDA
#                                            # candidates, measure serially and at DOP 2/4/8, print the
#                                            # error and speed-up per DOP, NVML energy, PASS/FAIL
#   bench/gpu_check.sh --prepare [--arch sm_90]
#                                            # on any host with TVM's compiler and nvcc: prebuild the
#                                            # candidates into bench/gpu_candidates/ (< 2 MiB) so the GPU
#                                            # host needs TVM's runtime only (TVM_USE_RUNTIME_LIB=1)
#
# Needs on the GPU host: python3 with numpy and the tvm package (runtime libs suffice with prebuilt
# candidates: everything beyond the checkout fits in 64 MiB), the NVIDIA driver (nvidia-smi), and
# nvidia-cuda-mps-control for DOP > 1 (without MPS every DOP is reported as "no MPS: serial only").
# Exit codes: 0 PASS or "no GPU here" (nothing to check on this host), 1 FAIL, 2 setup error.
# PASS: some DOP > 1 keeps the mean parallel-vs-serial error <= 5 % (DOPpler's threshold) with a
# measuring speed-up >= 1.2x over serial.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
MODE=check
ARCH=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prepare) MODE=prepare ;;
    --arch) ARCH="$2"; shift ;;
    *) echo "usage: $0 [--prepare [--arch sm_XY]]" >&2; exit 2 ;;
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
exec timeout 470 "$PY" - "$MODE" "$ARCH" <<'PYEOF'
import json, os, statistics, sys, time
from pathlib import Path

MODE, ARCH = sys.argv[1], sys.argv[2] or None
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
        args = [_jsonable(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(func)]
        manifest["candidates"].append({"name": name, "path": str(path), "args_info": args})
    (CAND / "manifest.json").write_text(json.dumps(manifest, indent=1))
    size = sum(p.stat().st_size for p in CAND.iterdir())
    print(f"gpu_check: {len(manifest['candidates'])} CUDA candidates for {arch} in {CAND} ({size / 2**20:.2f} MiB)")


def energy_j(meter):
    return meter.read().joules if meter is not None else None


def check():
    from tuning.engine.gpu_slots import ensure_mps, gpu_slot_groups, require_gpus
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
    mps = ensure_mps(os.path.join("/tmp", f"dlopt-mps-{os.getuid()}"))
    group = gpu_slot_groups(gpus[:1], mps, max_dop_per_gpu=max(DOPS))[0]
    try:
        from tuning.engine.energy import NvmlMeter
        meter = NvmlMeter(gpu_indices=[gpus[0].index])
    except Exception as exc:  # noqa: BLE001
        meter = None
        print(f"  NVML energy: unavailable ({exc})")
    print(f"gpu_check: {gpus[0].name} ({gpus[0].arch}), MPS {'on' if mps.running else 'OFF: ' + mps.reason}, "
          f"{len(manifest['candidates'])} candidates")
    jobs = [MeasureJob(path=c["path"], device_type="cuda", args_info=c["args_info"]) for c in manifest["candidates"]]
    cores = sorted(os.sched_getaffinity(0))
    runner = PooledAsyncRunner(evaluator=default_evaluator("cuda"), threads=1, dop=1, slots=gpu_worker_slots(group, cores),
                               worker_env=group.env, timeout_sec=60)
    inner = getattr(runner, "_inst", runner)
    rows, ok = [], False
    try:
        inner._measure(jobs[:1], 1)  # warm the serial worker (CUDA context, module loader)
        t0, e0 = time.perf_counter(), energy_j(meter)
        serial = [o.run_secs for o, _ in inner._measure(jobs, 1)]
        t_serial, e_serial = time.perf_counter() - t0, (energy_j(meter) - e0) if meter else None
        ser = [statistics.mean(s) if s else None for s in serial]
        print(f"  serial  wall {t_serial:6.2f} s  energy {e_serial if e_serial is None else round(e_serial, 1)} J (NVML, measured)")
        for dop in DOPS if group.max_dop > 1 else []:
            inner._measure(jobs[:dop], dop)  # start the DOP workers before timing
            t0, e0 = time.perf_counter(), energy_j(meter)
            par = [statistics.mean(o.run_secs) if o.run_secs else None for o, _ in inner._measure(jobs, dop)]
            wall, joules = time.perf_counter() - t0, (energy_j(meter) - e0) if meter else None
            errs = [abs(p - s) / p for p, s in zip(par, ser) if p and s]
            err = statistics.mean(errs) if errs else float("nan")
            speed = t_serial / wall if wall else float("nan")
            good = err <= 0.05 and speed >= 1.2
            ok = ok or good
            rows.append({"dop": dop, "error": err, "speedup": speed, "energy_j": joules})
            print(f"  DOP {dop}   wall {wall:6.2f} s  speed-up x{speed:.2f}  mean error {err:.3%}  "
                  f"energy {joules if joules is None else round(joules, 1)} J  {'ok' if good else '-'}")
            inner.retire_pools({1})
    finally:
        runner.shutdown()
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check.json").write_text(json.dumps({"gpu": gpus[0].name, "arch": gpus[0].arch,
                                                           "mps": mps.running, "serial_s": t_serial, "rows": rows}))
    print("gpu_check: PASS" if ok else "gpu_check: FAIL (no DOP > 1 with error <= 5 % and speed-up >= 1.2x)")
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
