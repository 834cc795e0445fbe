"""Three co-located GPU jobs on one GPU with the platform's isolation, against Horus's predictions.

Driven by ``bench/gpu_cluster_check.sh``. On a host with an NVIDIA GPU and onnxruntime's CUDA provider:

1. predicts each job's utilization and memory with the Horus predictor trained on the shipped profiles
   (``data/profiles``; synthetic until ``profile_gpu`` records real ones), as submit_job does;
2. runs each job alone, then the three together on GPU 0, each in its own process with the
   environment ``scheduling.gpu_isolation`` builds (``CUDA_VISIBLE_DEVICES``; MPS SM and memory limits
   where an MPS daemon runs), holding one of the GPU's three worker slots, with onnxruntime's
   ``gpu_mem_limit`` cap, sampled by ``gpu_runtime.run_model_on_gpu`` (device and per-process NVML);
3. prints per job: predicted vs per-process measured utilization and memory, latency alone and
   together (slowdown), whether its memory stayed under its cap, and whether a fourth job was refused
   a slot; then one ``PASS``/``FAIL`` line.

Without a GPU it prints ``no GPU here (...)`` and exits 0. Jobs run ``run_model_on_gpu`` directly in
child processes (what the worker's ``execute_job`` calls), not through Celery and a database.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# bench/common.py would shadow the project's `common` package (the script's folder comes first on the path)
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
# (zoo model, batch size): a light, a medium and a heavy job
JOBS = [("small_cnn", 64), ("mobilenet_v2", 8), ("resnet18", 16)]
#: what a process holds outside onnxruntime's arena (CUDA context, cuDNN/cuBLAS handles and kernels)
CUDA_CONTEXT_ALLOWANCE_MB = 1024.0


def gpu_or_reason() -> tuple[bool, str]:
    from common.nvml import load_nvml
    from scheduling.telemetry import read_gpus

    nvml, why = load_nvml()
    if nvml is None:
        return False, f"pynvml: {why}"
    reading = read_gpus(nvml)
    if not reading.available or not reading.gpus:
        return False, reading.summary
    return True, reading.summary


def predictions(models: list[tuple[str, int, bytes]], gpu_model: str) -> list[tuple[float, float]]:
    import onnx

    from core.onnx_models.features import compute_features
    from scheduling.horus.predictor import UtilizationPredictor
    from scheduling.horus.profiles import DEFAULT_SEED_PROFILES_PATH, load_profiles

    trained = UtilizationPredictor(n_estimators=100).train(load_profiles(DEFAULT_SEED_PROFILES_PATH), k_folds=2)
    out = []
    for _, batch, data in models:
        feats = compute_features(onnx.load_from_string(data), batch_size=batch).to_dict()
        util, mem = trained.predict(feats, gpu_model=gpu_model)
        out.append((float(util), float(mem)))
    return out


def run_child(spec: dict) -> dict:
    """One job in this (child) process: its slot held (taken first, before the slow imports), its cap
    given to onnxruntime."""
    from scheduling.gpu_isolation import GpuSlots, NoFreeSlot

    slots = GpuSlots(spec["slots_dir"], spec["gpu"])
    try:
        slot = slots.acquire()
    except NoFreeSlot as exc:
        return {"refused": str(exc)}
    try:
        from scheduling import gpu_runtime

        data = Path(spec["model_path"]).read_bytes()
        result = gpu_runtime.run_model_on_gpu(data, batch_size=spec["batch"], iterations=spec["iterations"],
                                              device_index=0, runtime="onnxruntime",
                                              mem_limit_mb=spec["mem_limit_mb"])
        if spec.get("hold_s"):
            time.sleep(spec["hold_s"])
        return {**result, "slot": slot, "pid": os.getpid(), "env": {k: os.environ.get(k) for k in spec["env"]}}
    finally:
        slots.release()


def launch(spec: dict) -> subprocess.Popen:
    env = {**os.environ, **spec["env"]}
    return subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(proc: subprocess.Popen, timeout_s: float) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"error": f"timed out after {timeout_s:g} s"}
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (err or out)[-600:]}
    return json.loads(lines[-1])


def fmt(x, spec="6.1f") -> str:
    return "   n/a" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_child(json.loads(a.child)), default=str))
        return 0

    ok, why = gpu_or_reason()
    if not ok:
        print(f"no GPU here ({why}); nothing to check on this host.")
        return 0
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"GPU found ({why}) but onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu).")
        print("FAIL: cannot run GPU jobs")
        return 1

    from core.onnx_models.zoo import build_model
    from scheduling.gpu_isolation import isolation_env, job_memory_limit_mb, mps_pipe_directory
    from common.nvml import load_nvml
    from scheduling.telemetry import read_gpus

    nvml, _ = load_nvml()
    gpu = read_gpus(nvml).gpus[0]
    tmp = Path(tempfile.mkdtemp(prefix="dlopt-gpu-check-"))
    models = []
    for name, batch in JOBS:
        path = tmp / f"{name}.onnx"
        data = build_model(name, batch_size=batch).SerializeToString()
        path.write_bytes(data)
        models.append((name, batch, data))
    preds = predictions(models, gpu.gpu_model)
    mps = mps_pipe_directory()
    print(f"GPU 0: {gpu.name} ({gpu.memory_total_mb:.0f} MB); MPS: {'yes, ' + mps if mps else 'no (no SM partition)'}")

    def spec(i: int, slots_dir: Path, hold_s: float = 0.0) -> dict:
        name, batch, _ = models[i]
        util, mem = preds[i]
        cap = job_memory_limit_mb(mem, gpu.memory_total_mb)
        return {"model_path": str(tmp / f"{name}.onnx"), "batch": batch, "iterations": a.iterations, "gpu": 0,
                "slots_dir": str(slots_dir), "mem_limit_mb": cap, "hold_s": hold_s,
                "env": isolation_env([0], predicted_util_pct=util, mem_limit_mb=cap, mps_pipe_dir=mps)}

    solo = [collect(launch(spec(i, tmp / "solo")), 240) for i in range(len(models))]
    together_dir = tmp / "together"
    procs = [launch(spec(i, together_dir, hold_s=20.0)) for i in range(len(models))]
    # once the three hold their slots (each writes its pid into its slot file), a fourth must be refused
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(
            (together_dir / "gpu0" / f"slot{k}").is_file() and (together_dir / "gpu0" / f"slot{k}").stat().st_size
            for k in range(3)):
        time.sleep(0.1)
    fourth = collect(launch(spec(0, together_dir)), 120)
    together = [collect(p, 300) for p in procs]

    rows, failures = [], []
    print(f"{'job':<16}{'pred util':>10}{'meas util':>10}{'pred MB':>9}{'meas MB':>9}{'cap MB':>8}"
          f"{'solo ms':>9}{'co ms':>8}{'slowdown':>9}  isolation")
    for i, (name, batch, _) in enumerate(models):
        s, t = solo[i], together[i]
        if "error" in s or "error" in t or "refused" in t:
            failures.append(f"{name}: {s.get('error') or t.get('error') or t.get('refused')}")
            print(f"{name:<16} did not run: {failures[-1]}")
            continue
        cap, mem = t.get("gpu_mem_limit_mb"), t.get("proc_mem_peak_mb")
        # the cap bounds onnxruntime's arena; the process's CUDA context and kernels sit outside it
        cap_held = cap is None or mem is None or mem <= cap + CUDA_CONTEXT_ALLOWANCE_MB
        env_held = t["env"].get("CUDA_VISIBLE_DEVICES") == "0"
        slowdown = t["latency_ms"] / s["latency_ms"] if s.get("latency_ms") and t.get("latency_ms") else None
        if not cap_held:
            failures.append(f"{name}: {mem:.0f} MB over its {cap:.0f} MB cap")
        if not env_held:
            failures.append(f"{name}: CUDA_VISIBLE_DEVICES not set")
        iso = ("cap held" if cap_held else "CAP BROKEN") + (", env ok" if env_held else ", ENV MISSING")
        print(f"{name + ' b' + str(batch):<16}{fmt(preds[i][0]):>10}{fmt(t.get('proc_util_mean_pct')):>10}"
              f"{fmt(preds[i][1], '8.0f'):>9}{fmt(mem, '8.0f'):>9}{fmt(cap, '7.0f'):>8}"
              f"{fmt(s.get('latency_ms'), '8.2f'):>9}{fmt(t.get('latency_ms'), '7.2f'):>8}"
              f"{fmt(slowdown, '8.2f'):>9}  {iso}")
        rows.append({"job": name, "batch": batch, "pred_util_pct": preds[i][0], "pred_mem_mb": preds[i][1],
                     "solo": s, "together": t, "slowdown": slowdown, "cap_held": cap_held})
        if t.get("proc_util_mean_pct") is None:
            print(f"  note: no per-process utilization for {name} (driver without per-process accounting)")
    slot_held = "refused" in fourth
    print(f"fourth job on the GPU: {'refused a slot (at most 3 per GPU)' if slot_held else 'NOT refused'}")
    if not slot_held:
        failures.append("a fourth job got a slot")
    if a.json:
        Path(a.json).write_text(json.dumps({"gpu": gpu.name, "mps": bool(mps), "jobs": rows,
                                            "fourth_refused": slot_held, "failures": failures}, default=str))
    print("PASS: 3 co-located jobs ran isolated; caps and slots held" if not failures
          else "FAIL: " + "; ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
