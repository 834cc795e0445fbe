"""GPU-job runtimes that behave as a hostile job child would (no Django: the real job child imports them by
name through SCHEDULING_JOB_RUNTIMES). Each stands for code a team got to run in the child; each starts from
tests.scheduling.job_runtimes' CPU stand-in so the rest of the child's path is the real one."""
from __future__ import annotations

import json
import time

from tests.scheduling.job_runtimes import onnxruntime_on_cpu


def forges_its_figures(model, inputs, iterations, device_index, sampler_factory, check, **options):
    """Answers per-process figures and a GPU model of its choosing (what it would do to poison the predictor)."""
    out = onnxruntime_on_cpu(model, inputs, iterations, device_index, sampler_factory, check, **options)
    return {**out, "proc_util_mean_pct": 0.5, "proc_mem_peak_mb": 1.0, "gpu_model": "A100", "power_mean_w": 1e9}


def answers_nan(model, inputs, iterations, device_index, sampler_factory, check, **options):
    """Makes the child's answer carry NaN and Infinity (json.dumps patched where the child writes it)."""
    dumps = json.dumps
    json.dumps = lambda obj, **kw: dumps(obj, **{**kw, "allow_nan": True})
    out = onnxruntime_on_cpu(model, inputs, iterations, device_index, sampler_factory, check, **options)
    return {**out, "latency_ms": float("nan"), "loss_last": float("inf")}


#: resident memory hoards_host_memory takes (tests set the cap below it)
HOARD_MB = 800


def hoards_host_memory(model, inputs, iterations, device_index, sampler_factory, check, **options):
    """Takes HOARD_MB of host memory (touched, so resident) and holds it, as a model whose import or
    training build explodes would."""
    hoard = b"\x01" * (HOARD_MB << 20)
    time.sleep(6)
    out = onnxruntime_on_cpu(model, inputs, iterations, device_index, sampler_factory, check, **options)
    return {**out, "hoarded": len(hoard)}


def starts_a_gpu_grandchild(model, inputs, iterations, device_index, sampler_factory, check, **options):
    """Starts a process of its own (which would hold the GPU memory), then runs as usual."""
    import subprocess
    import sys

    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(8)"])
    return onnxruntime_on_cpu(model, inputs, iterations, device_index, sampler_factory, check, **options)


def runs_a_while_then_raises(model, inputs, iterations, device_index, sampler_factory, check, **options):
    """Runs long enough for the worker to sample it (holding what the test's NVML says it holds), then fails
    with an error that is no allocation failure."""
    from tests.scheduling.job_runtimes import RUNS_AT_LEAST_S

    time.sleep(RUNS_AT_LEAST_S)
    raise RuntimeError("a plain bug of the team's, not an allocation failure")
