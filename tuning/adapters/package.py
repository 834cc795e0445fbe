"""A run's rows and files as the engine's deployment package (tuning.engine.deploy.package)."""
from __future__ import annotations

from tuning.engine.deploy.package import MEMBERS, USAGE, build_package
from tuning.models import TuningRun

__all__ = ["MEMBERS", "USAGE", "package_bytes"]


def _latency(run: TuningRun) -> dict:
    outcome = run.result_verdict
    timer = (run.summary or {}).get("tuned_timer") or {}  # absent for runs finished before it was recorded
    return {
        "tuned_median_s": run.tuned_latency_s, "tuned_iqr_s": run.tuned_latency_iqr_s,
        "untuned_median_s": run.untuned_latency_s,
        "onnxruntime_median_s": run.ort_latency_s, "onnxruntime_iqr_s": run.ort_latency_iqr_s,
        "ratio_to_onnxruntime": run.ratio_to_ort, "verdict": outcome.label if outcome else None,
        "verdict_sentence": run.deploy_verdict, "verdict_flag": run.verdict_flag, "timing_load": run.timing_load,
        "estimate_s": run.estimated_latency_s, "estimate_gap": run.estimate_gap,
        "threads": run.threads or (run.engine_target or {}).get("num-cores"),
        "timer": "median and IQR over repeats on the build host (tuned module: TVM time_evaluator; "
                 "onnxruntime: perf_counter), same inputs and thread count",
        # the tuned module's timer (repeats of at least min_repeat_ms of runs): run.py times it the same way
        "repeats": timer.get("repeat"), "min_repeat_ms": timer.get("min_repeat_ms"),
    }


def package_bytes(run: TuningRun) -> bytes:
    """The zip of `run`'s tuned module, manifest and run.py. The run must have a module file."""
    summary = run.summary or {}
    with run.module_file.open("rb") as fh:
        module = fh.read()
    with run.model.file.open("rb") as fh:
        model = fh.read()
    return build_package(
        module_bytes=module, model_bytes=model, target=run.engine_target,
        build_host=summary.get("build_host"),
        identity={"target_key": run.target_key, "pipeline_key": run.pipeline_key,
                  "result_identity": run.result_identity},
        latency=_latency(run),
        run={"id": run.pk, "model_name": run.model.name, "model_sha256": run.model.sha256},
        versions=(summary.get("build_host") or {}).get("versions"),
    )
