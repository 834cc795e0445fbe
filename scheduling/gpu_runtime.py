"""Run an ONNX model on an NVIDIA GPU and measure what it used. No Django here.

Run for a placed GPU job in the job's own child process (``scheduling.job_process``, started by the
``scheduling.run_job`` Celery task: never in the worker itself), and by the ``profile_gpu`` command
(profile records for the predictor). Two runtimes:

* ``onnxruntime`` with the CUDA execution provider (needs the onnxruntime-gpu
  build; the pinned CPU wheel has no CUDA provider and is refused clearly);
* ``tvm``: the model compiled for ``{"kind": "cuda"}`` by the tuning engine's
  Relax pipeline (needs a CUDA-enabled TVM build).

``auto`` tries onnxruntime, then TVM. A training job (kind ``train``) runs a training step loop
(:mod:`scheduling.train_step`: TVM Relax training, forward + backward + optimizer update) on TVM's
CUDA target: onnxruntime-training is not installed, so TVM is its only runtime. With no GPU every entry point raises
:class:`~scheduling.telemetry.NoGpuError` ("no NVIDIA GPU found (pynvml: ...)").
"""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .gpu_isolation import ort_cuda_options
from .telemetry import GpuSampler, NoGpuError, require_gpu

__all__ = ["DurationReached", "GpuRuntimeError", "JobStopped", "gpu_facts", "rebatch", "run_data_parallel",
           "run_model_on_gpu", "NoGpuError"]

# How often a running job asks whether it should stop (a database read in the worker).
STOP_CHECK_EVERY_S = 1.0
# TVM's evaluator times `number` runs in one call: a long job is timed in chunks so it can stop between them.
TVM_CHUNK = 50


class GpuRuntimeError(RuntimeError):
    """The model cannot be run on the GPU with the requested runtime (the message says why)."""


class JobStopped(Exception):
    """The run was asked to stop (its job was cancelled) and stopped between two inferences."""


class DurationReached(JobStopped):
    """The run reached the GPU time its job declared (``duration_estimate_s``) and stopped."""

    def __init__(self, limit_s: float):
        super().__init__(f"stopped: the job reached its declared duration of {limit_s:g} s")
        self.limit_s = limit_s


class StopCheck:
    """Raises JobStopped when ``should_stop`` (asked at most every ``every_s`` seconds) says yes, and
    DurationReached once ``limit_s`` seconds have passed since ``started`` (a monotonic time; default now)."""

    def __init__(self, should_stop: Callable[[], bool] | None, every_s: float = STOP_CHECK_EVERY_S, *,
                 limit_s: float | None = None, started: float | None = None):
        self.should_stop, self.every_s, self.limit_s = should_stop, every_s, limit_s
        self._last = time.monotonic()
        self.deadline = None if limit_s is None else (started if started is not None else self._last) + limit_s

    def __call__(self) -> None:
        if self.deadline is not None and time.monotonic() >= self.deadline:  # no database read: every call
            raise DurationReached(self.limit_s)
        if self.should_stop is None or time.monotonic() - self._last < self.every_s:
            return
        self._last = time.monotonic()
        if self.should_stop():
            raise JobStopped("stopped on request (the job was cancelled)")


def timed_iterations(run_once: Callable[[], Any], iterations: int, check: StopCheck) -> list[float]:
    """Wall seconds of each of ``iterations`` calls, checking for a stop request between them."""
    lat: list[float] = []
    for _ in range(iterations):
        check()
        t = time.perf_counter()
        run_once()
        lat.append(time.perf_counter() - t)
    return lat


def rebatch(model_bytes: bytes, batch_size: int):
    """The ONNX model with the leading dimension of every graph input set to ``batch_size``
    (outputs and intermediate shapes left for the runtime to infer)."""
    import onnx

    model = onnx.load_from_string(model_bytes)
    init = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_value = int(batch_size)
    del model.graph.value_info[:]
    for vi in model.graph.output:
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_param = "batch"
    return model


def _inputs(model, seed: int = 0) -> dict[str, np.ndarray]:
    from onnx import helper

    rng = np.random.default_rng(seed)
    init = {i.name for i in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in t.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.floating):
            out[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            out[vi.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            out[vi.name] = rng.integers(0, 10, shape).astype(dtype)
    return out


def _run_onnxruntime(model, inputs, iterations: int, device_index: int, sampler_factory,
                     check: StopCheck, *, mem_limit_mb: float | None = None) -> dict[str, Any]:
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - pinned dependency
        raise GpuRuntimeError(f"onnxruntime is not installed ({exc})") from None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise GpuRuntimeError(
            "onnxruntime has no CUDAExecutionProvider here (the CPU wheel is installed; a GPU worker needs "
            f"onnxruntime-gpu). Available: {', '.join(ort.get_available_providers())}")
    sess = ort.InferenceSession(model.SerializeToString(),
                                providers=[("CUDAExecutionProvider", ort_cuda_options(device_index, mem_limit_mb))])
    if sess.get_providers()[0] != "CUDAExecutionProvider":
        raise GpuRuntimeError(f"onnxruntime fell back to {sess.get_providers()[0]}: CUDA could not be initialised")
    sess.run(None, inputs)  # warm-up (kernel selection, allocations)
    with sampler_factory() as sampler:
        lat = timed_iterations(lambda: sess.run(None, inputs), iterations, check)
    return {"runtime": "onnxruntime", "provider": "CUDAExecutionProvider", "latencies_s": lat,
            "gpu_mem_limit_mb": mem_limit_mb, **sampler.result()}


def _run_tvm(model, inputs, iterations: int, device_index: int, sampler_factory,
             check: StopCheck) -> dict[str, Any]:
    try:
        import tvm
    except ImportError as exc:  # pragma: no cover
        raise GpuRuntimeError(f"TVM is not installed ({exc})") from None
    if not tvm.cuda(device_index).exist:
        raise GpuRuntimeError("TVM sees no CUDA device (a TVM build without CUDA, or no GPU)")
    from tuning.engine.compile.pipeline import compile_model, run_and_time

    target = {"kind": "cuda"}
    exe = compile_model(model, target)
    run_and_time(exe, inputs, target, number=1, repeat=1, device_index=device_index)  # warm-up
    lat: list[float] = []  # mean latency of each chunk of up to TVM_CHUNK runs, timed on the device
    left = max(1, iterations)
    with sampler_factory() as sampler:
        while left:
            check()
            n = min(TVM_CHUNK, left)
            _, mean_s = run_and_time(exe, inputs, target, number=n, repeat=1, device_index=device_index)
            lat.append(mean_s)
            left -= n
    return {"runtime": "tvm", "provider": "cuda", "latencies_s": lat, **sampler.result()}


def _train_tvm(model, inputs, iterations: int, device_index: int, sampler_factory, check: StopCheck, *,
               optimizer: str = "adam", learning_rate: float | None = None) -> dict[str, Any]:
    try:
        import tvm
    except ImportError as exc:  # pragma: no cover
        raise GpuRuntimeError(f"TVM is not installed ({exc})") from None
    if not tvm.cuda(device_index).exist:
        raise GpuRuntimeError("TVM sees no CUDA device (a TVM build without CUDA, or no GPU)")
    from tuning.engine.compile.pipeline import make_target

    from .train_step import (
        TrainingUnsupported,
        build_training_program,
        run_training_steps,
    )

    device = tvm.cuda(device_index)
    try:
        program = build_training_program(model, inputs, target=make_target({"kind": "cuda"}), device=device,
                                         optimizer=optimizer, lr=learning_rate)
    except TrainingUnsupported as exc:
        raise GpuRuntimeError(f"the model cannot be trained here: {exc}") from None
    with sampler_factory() as sampler:
        out = run_training_steps(program, iterations, check, sync=device.sync)
    return {"runtime": "tvm", "provider": "cuda", **out, **sampler.result()}


# The GPU runtimes a job may ask for, tried in this order for "auto". Each takes (model, inputs,
# iterations, device_index, sampler_factory, check) and returns {"runtime", "latencies_s", sampler figures};
# those in CAPPED_RUNTIMES also take ``mem_limit_mb`` (a memory cap the runtime enforces).
RUNTIMES: dict[str, Callable[..., dict[str, Any]]] = {"onnxruntime": _run_onnxruntime, "tvm": _run_tvm}
CAPPED_RUNTIMES = frozenset({"onnxruntime"})
# The runtimes of a training job (kind "train"): same arguments, plus ``optimizer``; the result also has
# the per-step ``losses``; they take ``optimizer`` and ``learning_rate``.
TRAIN_RUNTIMES: dict[str, Callable[..., dict[str, Any]]] = {"tvm": _train_tvm}
KINDS = ("inference", "train")


def gpu_facts(sample: Any) -> dict[str, Any]:
    """What a run reports about its GPU, from an NVML sample taken before the run (``mem_used_mb``: the
    memory in use before the job created its CUDA context). JSON, so a job's child is handed it."""
    return {"name": sample.name, "gpu_model": sample.gpu_model, "memory_total_mb": sample.memory_total_mb,
            "mem_used_mb": sample.mem_used_mb}


def run_model_on_gpu(
    model_bytes: bytes,
    *,
    batch_size: int,
    iterations: int = 100,
    device_index: int = 0,
    runtime: str = "auto",
    nvml: Any = None,
    should_stop: Callable[[], bool] | None = None,
    max_seconds: float | None = None,
    mem_limit_mb: float | None = None,
    report: Callable[[dict[str, float | None]], None] | None = None,
    nvml_index: int | None = None,
    gpu: dict[str, Any] | None = None,
    kind: str = "inference",
    optimizer: str = "adam",
    learning_rate: float | None = None,
) -> dict[str, Any]:
    """Run ``iterations`` inferences (``kind="inference"``) or training steps with ``optimizer``
    (``kind="train"``, at ``learning_rate`` or the optimizer's default) at ``batch_size`` on GPU ``device_index`` while sampling NVML.

    ``device_index`` is the CUDA ordinal the runtime opens; ``nvml_index`` (default: the same) is the
    GPU's NVML index, which differs in a job's child, where ``CUDA_VISIBLE_DEVICES`` renumbers its GPUs
    from 0 and NVML still counts every GPU of the host. ``gpu`` (:func:`gpu_facts`) is the GPU as the
    caller found it with NVML: given, this call does not look for a GPU itself.

    ``should_stop`` is asked about once a second between inferences; when it answers True the run
    ends with :class:`JobStopped` (a cancelled job frees its GPU at once and must not keep using it).
    ``max_seconds`` (the job's declared duration) counts from this call, model loading and compiling
    included: between inferences past it the run ends with :class:`DurationReached`. ``mem_limit_mb``
    caps the memory onnxruntime's CUDA provider may hold (``gpu_mem_limit``); TVM has no such cap.
    ``report`` gets this process's latest per-process NVML figures (``{"util_pct", "mem_mb"}``) each
    time the stop check asks, about once a second.

    Returns ``{"runtime", "latency_ms", "throughput_per_s", "util_mean_pct", "mem_peak_mb",
    "mem_used_by_job_mb", "power_mean_w", "energy_j", "gpu_name", ...}``. Raises NoGpuError
    without a GPU and GpuRuntimeError when no runtime can use it.
    """
    started = time.monotonic()
    nvml_index = device_index if nvml_index is None else int(nvml_index)
    if gpu is None:
        reading = require_gpu(nvml)
        if nvml_index >= len(reading.gpus):
            raise NoGpuError(f"no NVIDIA GPU #{nvml_index} on this host ({reading.summary})")
        gpu = gpu_facts(reading.gpus[nvml_index])
    model = rebatch(model_bytes, batch_size)
    inputs = _inputs(model)

    samplers: list[GpuSampler] = []

    def sampler():
        samplers.append(GpuSampler(nvml_index, nvml=nvml, pid=os.getpid()))
        return samplers[-1]

    def stop_or_report() -> bool:
        if report is not None and samplers:
            report(samplers[-1].latest_process())
        return bool(should_stop is not None and should_stop())

    if kind not in KINDS:
        raise GpuRuntimeError(f"unknown job kind {kind!r}; use {' or '.join(KINDS)}")
    registry = TRAIN_RUNTIMES if kind == "train" else RUNTIMES
    order = list(registry) if runtime == "auto" else [runtime]
    if runtime != "auto" and runtime not in registry:
        raise GpuRuntimeError(f"runtime {runtime!r} cannot run a{'' if kind == 'train' else 'n'} {kind} job; "
                              f"use auto, {' or '.join(registry)}")
    errors = []
    for name in order:
        try:
            if kind == "train":
                options: dict[str, Any] = {"optimizer": optimizer, "learning_rate": learning_rate}
            else:
                options = {"mem_limit_mb": mem_limit_mb} if mem_limit_mb is not None and name in CAPPED_RUNTIMES else {}
            out = registry[name](model, inputs, iterations, device_index, sampler,
                                 StopCheck(stop_or_report if (should_stop or report) else None,
                                           limit_s=max_seconds, started=started), **options)
            break
        except GpuRuntimeError as exc:
            errors.append(str(exc))
    else:
        raise GpuRuntimeError("no GPU runtime could run the model: " + "; ".join(errors))
    lat = out.pop("latencies_s")
    median = statistics.median(lat) if lat else None
    # Baseline: memory in use before this process created its CUDA context, so
    # the job's figure includes context, weights and activations (as profiles do).
    peak, base = out.get("mem_peak_mb"), gpu["mem_used_mb"]
    return {
        **out,
        "kind": kind,
        "batch_size": batch_size,
        "iterations": iterations,
        "latency_ms": median * 1000 if median is not None else None,
        "throughput_per_s": batch_size / median if median else None,
        "mem_used_by_job_mb": max(0.0, peak - base) if peak is not None else None,
        "gpu_index": nvml_index,
        "gpu_name": gpu["name"],
        "gpu_model": gpu["gpu_model"],
        "gpu_memory_total_mb": gpu["memory_total_mb"],
        "runtime_errors": errors,
    }


def run_data_parallel(model_bytes: bytes, *, device_indices: list[int], nvml_indices: list[int] | None = None,
                      gpus: list[dict[str, Any]] | None = None, **kwargs: Any) -> dict[str, Any]:
    """A gang: :func:`run_model_on_gpu` on each of ``device_indices`` at once (one replica per GPU, each
    at the job's batch size). The lead replica runs in the calling thread and alone calls ``should_stop``
    and ``report`` (they may read a database); the others run in threads and stop when the lead is told
    to stop or any replica fails. A failure is raised. The result is the lead GPU's, with the gang's
    throughput (the sum), its slowest replica's latency, the mean per-process utilization and the summed
    memory, and every replica's result under ``"replicas"``. ``nvml_indices`` and ``gpus`` are each
    replica's ``nvml_index`` and ``gpu`` (see :func:`run_model_on_gpu`)."""
    def where(i: int) -> dict[str, Any]:
        return {"device_index": device_indices[i], "nvml_index": nvml_indices[i] if nvml_indices else None,
                "gpu": gpus[i] if gpus else None}

    if len(device_indices) == 1:
        return run_model_on_gpu(model_bytes, **where(0), **kwargs)
    import threading

    outer_stop = kwargs.pop("should_stop", None)
    followers_kwargs = {**kwargs, "report": None}
    failed, stopped = threading.Event(), threading.Event()
    results: dict[int, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def lead_stop() -> bool:
        if failed.is_set():
            return True
        if outer_stop is not None and outer_stop():
            stopped.set()
            return True
        return False

    def follower(i: int, device: int) -> None:
        try:
            results[i] = run_model_on_gpu(model_bytes, **where(i),
                                          should_stop=lambda: failed.is_set() or stopped.is_set(),
                                          **followers_kwargs)
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)
            failed.set()

    threads = [threading.Thread(target=follower, args=(i, d), name=f"gang-gpu{d}", daemon=True)
               for i, d in enumerate(device_indices) if i > 0]
    for t in threads:
        t.start()
    try:
        results[0] = run_model_on_gpu(model_bytes, **where(0), should_stop=lead_stop, **kwargs)
    except BaseException as exc:
        errors.insert(0, exc)
        failed.set()
    for t in threads:
        while t.is_alive():
            t.join(STOP_CHECK_EVERY_S)
            if t.is_alive() and not stopped.is_set() and outer_stop is not None and outer_stop():
                stopped.set()
    if errors:
        # the first real failure, not the JobStopped it caused in the other replicas
        raise next((e for e in errors if not isinstance(e, JobStopped) or isinstance(e, DurationReached)), errors[0])
    replicas = [results[i] for i in range(len(device_indices))]

    def mean(key: str) -> float | None:
        vals = [r[key] for r in replicas if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    def total(key: str) -> float | None:
        vals = [r[key] for r in replicas if r.get(key) is not None]
        return sum(vals) if vals else None

    latencies = [r["latency_ms"] for r in replicas if r.get("latency_ms") is not None]
    return {**replicas[0], "gpu_indices": list(nvml_indices or device_indices),
            "latency_ms": max(latencies) if latencies else None,
            "throughput_per_s": total("throughput_per_s"), "util_mean_pct": mean("util_mean_pct"),
            "proc_util_mean_pct": mean("proc_util_mean_pct"), "proc_mem_peak_mb": total("proc_mem_peak_mb"),
            "mem_used_by_job_mb": total("mem_used_by_job_mb"), "energy_j": total("energy_j"),
            "replicas": replicas}
