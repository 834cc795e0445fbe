"""The compiled model's final timing: tuned and untuned TVM and onnxruntime, timed the same way, and the
verdict they support (:mod:`tuning.engine.verdict`)."""

from __future__ import annotations

import os
import statistics
from typing import Any

import numpy as np

from tuning.engine import verdict as verdict_rule
from tuning.engine import yardstick
from tuning.engine.compile.pipeline import (
    compile_model,
    random_inputs,
    run_and_time_samples,
    target_device_type,
)
from tuning.engine.compile.targets import TargetMismatch, check_measurable_here
from tuning.engine.workdir import open_database

__all__ = ["compile_and_compare", "build_host_facts", "onnxruntime_comparison", "FINAL_REPEATS", "FINAL_MIN_REPEAT_MS"]

# Final timings: like onnxruntime's (yardstick), repeats of at least FINAL_MIN_REPEAT_MS each, the median and
# IQR over FINAL_REPEATS of them.
FINAL_REPEATS = 15
FINAL_MIN_REPEAT_MS = 50


def _load_now() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def build_host_facts(target) -> dict:
    """What the package needs to check a host without TVM's compiler: the build host's CPU flags, and of
    them the instruction sets code built for ``target`` may use (none for a portable mcpu)."""
    from tuning.engine.compile.targets import (
        PORTABLE_CPUS,
        canonical_target,
        host_cpu_flags,
        isa_flags,
    )
    from tuning.engine.deploy.package import runtime_versions

    spec = canonical_target(target)
    cpu = dict(spec.get("host") or {}) if spec.get("kind") != "llvm" else spec
    flags = host_cpu_flags()
    portable = str(cpu.get("mcpu") or "") in PORTABLE_CPUS
    return {
        "cpu_flags": flags,
        "required_cpu_flags": [] if portable else isa_flags(flags, cpu.get("mtriple", "")),
        "versions": runtime_versions(),
    }


def compile_and_compare(
    model,
    database_dir: str,
    target,
    threads: int | None = None,
    *,
    number: int = 1,
    repeat: int = FINAL_REPEATS,
    min_repeat_ms: int = FINAL_MIN_REPEAT_MS,
    rtol: float = 1e-4,
    atol: float = 1e-4,
    seed: int = 0,
    export_path: str | None = None,
) -> dict[str, Any]:
    """Compile ``model`` tuned (database in ``database_dir``) and untuned, run
    both on the same random inputs: latencies, max |diff|, outputs match.
    ``export_path``: also export the tuned executable there (a ``.so``).

    The tuned module and onnxruntime are timed back to back, each as ``repeat`` repeats (median and IQR),
    with the host's load sampled before, between and after; the verdict is :func:`verdict.verdict`'s. A
    timing on an overloaded host is repeated once; if the host is still overloaded the result is flagged.

    A target this host cannot run (another CPU's ``mcpu``, another GPU: a run measured on a remote host)
    is still compiled, tuned and untuned, and exported, so the tuning is kept; nothing is timed or
    compared here, and ``not_measured_here`` says why (timings of code built for another machine would
    describe neither)."""
    try:
        check_measurable_here(target, check_cores=False)
        why = None
    except TargetMismatch as exc:
        why = f"compiled, not timed or compared on this host: {exc}"
    tuned = compile_model(model, target, database=open_database(database_dir))
    untuned = compile_model(model, target, database=None)
    if export_path:
        tuned.export_library(export_path)
    build_host = build_host_facts(target)
    if why is not None:
        return {
            "tuned_latency_s": None,
            "untuned_latency_s": None,
            "speedup": None,
            "max_abs_diff": None,
            "outputs_match": None,
            "threads": threads,
            "onnxruntime": None,
            "not_measured_here": why,
            "onnxruntime_error": why,
            "build_host": build_host,
        }
    inputs = random_inputs(model, seed=seed)

    def timed(executable) -> tuple[list[np.ndarray], list[float]]:
        return run_and_time_samples(
            executable, inputs, target, number=number, repeat=repeat, threads=threads, min_repeat_ms=min_repeat_ms
        )

    out_u, samples_u = timed(untuned)
    cores = int(threads or (target.get("num-cores") if isinstance(target, dict) else None) or 1)
    attempts = []
    for _ in range(2):  # an overloaded host gets one more try
        loads = [_load_now()]
        out_t, samples_t = timed(tuned)
        loads.append(_load_now())
        ort = onnxruntime_comparison(model, inputs, out_t, target, threads, seed=seed)
        loads.append(_load_now())
        known = [x for x in loads if x is not None]
        load = verdict_rule.HostLoad(max(known), cores) if known else None
        outcome = verdict_rule.verdict(samples_t, ort.pop("samples_s", None), load)
        attempts.append({"load": load.load if load else None, "cores": cores, "label": outcome.label})
        if outcome.label != verdict_rule.FLAGGED:
            break
    diffs = [
        float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) if a.size else 0.0
        for a, b in zip(out_t, out_u)
    ]
    match = len(out_t) == len(out_u) and all(
        np.allclose(a, b, rtol=rtol, atol=atol * max(1.0, float(np.max(np.abs(b))) if b.size else 1.0))
        for a, b in zip(out_t, out_u)
    )
    lat_t, lat_u = outcome.tuned_median, float(statistics.median(samples_u))
    ort_s = outcome.ort_median
    return {
        "tuned_latency_s": lat_t,
        "tuned_latency_iqr_s": outcome.tuned_iqr,
        "tuned_samples_s": samples_t,
        "untuned_latency_s": lat_u,
        "speedup": (lat_u / lat_t) if lat_t else None,
        "max_abs_diff": max(diffs) if diffs else 0.0,
        "outputs_match": bool(match),
        "threads": threads,
        **ort,
        "onnxruntime_latency_s": ort_s,
        "onnxruntime_latency_iqr_s": outcome.ort_iqr,
        "ratio_to_onnxruntime": outcome.ratio,
        "untuned_ratio_to_onnxruntime": (lat_u / ort_s) if ort_s else None,
        "faster_engine": outcome.faster_engine,
        "verdict": outcome.to_dict(),
        "timing_attempts": attempts,
        # how the tuned module was timed: the deployment package's run.py times it the same way
        "tuned_timer": {"number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms},
        "build_host": build_host,
    }


def onnxruntime_comparison(model, inputs, tvm_outputs, target, threads, *, seed=0) -> dict:
    """The same ONNX model under onnxruntime (same inputs, thread count and device kind): its timing
    samples (seconds, one per repeat; ``samples_s``) and whether its outputs agree with the tuned module's.
    A model that is not ONNX, or an onnxruntime that cannot run it here, gives the reason instead: the
    yardstick must not fail a run whose tuned module is fine."""
    if not hasattr(model, "graph"):
        return {"onnxruntime": None, "onnxruntime_error": "not an ONNX model: no onnxruntime comparison"}
    device = "cuda" if target_device_type(target) == "cuda" else "cpu"
    try:
        ort = yardstick.measure_onnxruntime(
            model,
            inputs,
            threads=int(threads or 1),
            device=device,
            tvm_outputs=tvm_outputs,
            seed=seed,
            repeat=FINAL_REPEATS,
            min_repeat_ms=FINAL_MIN_REPEAT_MS,
        )
    except Exception as exc:  # noqa: BLE001 - ProviderUnavailable, or an op onnxruntime lacks
        return {"onnxruntime": None, "onnxruntime_error": f"{type(exc).__name__}: {exc}"}
    return {
        "onnxruntime": ort.to_dict(),
        "samples_s": [ms / 1e3 for ms in ort.samples_ms],
        "onnxruntime_outputs_agree": ort.outputs_agree,
        "onnxruntime_error": "",
    }
