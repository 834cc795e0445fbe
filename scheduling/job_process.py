"""A GPU job's model runs in its own short-lived child process of the worker, never in the worker. No Django.

The worker (``services.execution``) keeps what needs the database or the node's view of its GPUs: the
NVML check that the job's GPUs exist, the cancel check, the live per-process figures of the child's pid.
The child (``python -m common._sandbox_child``, a fresh interpreter, never a fork of a process that may
have initialised CUDA: :func:`common.sandbox.run_in_child`) does everything that touches the team's
model: parsing, rebatching, building the inputs, compiling (TVM) or loading (onnxruntime), the timed
inferences. It gets

- an allow-listed environment (no database URL, secret key or broker) plus the job's isolation env
  (:func:`scheduling.gpu_isolation.isolation_env`): ``CUDA_VISIBLE_DEVICES`` of its GPUs only, so it
  opens them as CUDA devices ``0..N-1``, and the MPS share and memory limit where MPS runs;
- resource limits that CUDA tolerates: no address-space cap (the driver maps huge virtual ranges), CPU
  seconds from the job's time cap, open files, no core dumps; it dies with the worker
  (``PR_SET_PDEATHSIG``) and its process group is killed at the job's wall-clock cap;
- the sandbox account's user id (:func:`common.privileges.drop_privileges`);

and answers with JSON only (latencies, measured memory, ...). Failures come back as the runtime's own
exceptions (:class:`~scheduling.gpu_runtime.GpuRuntimeError` and friends) with a readable message.
"""
from __future__ import annotations

import importlib
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

from common.sandbox import PRIVILEGE_DROP_HOOK, SandboxFailure, run_in_child

from . import gpu_runtime
from .gpu_isolation import isolation_env, mps_pipe_directory
from .gpu_runtime import DurationReached, GpuRuntimeError, JobStopped, gpu_facts
from .telemetry import GpuSampler, NoGpuError, require_gpu

__all__ = ["JobOutOfMemory", "JobProcessLimits", "child_entry", "run_job_in_child"]

log = logging.getLogger(__name__)

CHILD_TARGET = "scheduling.job_process:child_entry"
#: What the runtime needs from the worker's environment beyond common.sandbox's allow-list (where the
#: operator installed CUDA); set by the operator, never by a team.
GPU_ENV_PASS = ("LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
WHAT = "running the job's model"


class JobOutOfMemory(GpuRuntimeError):
    """The job's process SAID it ran out of memory: its error or its output has the words of an allocation
    failure (the child has no address-space cap). Those are the child's words, and the child runs the team's
    model, so they decide nothing: the worker takes a failure for a GPU out-of-memory on its own NVML
    figures only (``services.execution``)."""


@dataclass(frozen=True)
class JobProcessLimits:
    """The child's limits beyond the job's own duration. ``grace_s``: added to the declared duration for
    the wall-clock kill (the child stops itself at the duration between inferences; the kill is for one
    that does not: a compile or an inference that never returns). ``cpu_per_wall``: CPU seconds allowed
    per wall second (the runtimes' host threads). ``runtimes``: runtime name -> ``"module:function"``
    replacing :data:`scheduling.gpu_runtime.RUNTIMES` entries in the child (tests name a CPU runtime)."""

    grace_s: float = 60.0
    cpu_per_wall: float = 2.0
    nofile: int = 4096
    #: resident host memory the child (and what it started) may hold, checked at each poll (about a
    #: second): CUDA forbids an address-space cap, and without this a crafted model (a constant the import
    #: folds, a training build that explodes) takes the node's memory from the worker and other jobs
    host_memory_mb: float = 16384.0
    preexec: str | None = PRIVILEGE_DROP_HOOK
    runtimes: dict[str, str] = field(default_factory=dict)  # "train:<name>" keys: training runtimes


def _resolve(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"runtime {path!r} is not 'module:function'")
    return getattr(importlib.import_module(module), name)


def child_entry(*, data: bytes, nvml_indices: list[int], gpus: list[dict[str, Any]], batch_size: int,
                iterations: int, runtime: str, max_seconds: float | None, mem_limit_mb: float | None,
                runtimes: dict[str, str] | None = None, kind: str = "inference",
                optimizer: str = "adam", learning_rate: float | None = None) -> dict[str, Any]:
    """In the child: the job's run on CUDA devices ``0..N-1`` (its GPUs, renumbered by
    ``CUDA_VISIBLE_DEVICES``), sampled with NVML at their host indices ``nvml_indices``. Returns the
    run's figures (JSON)."""
    for name, path in (runtimes or {}).items():  # "train:<name>" replaces a training runtime
        registry = gpu_runtime.TRAIN_RUNTIMES if name.startswith("train:") else gpu_runtime.RUNTIMES
        registry[name.removeprefix("train:")] = _resolve(path)
    return gpu_runtime.run_data_parallel(
        data, device_indices=list(range(len(nvml_indices))), nvml_indices=list(nvml_indices), gpus=gpus,
        batch_size=batch_size, iterations=iterations, runtime=runtime, max_seconds=max_seconds,
        mem_limit_mb=mem_limit_mb, kind=kind, optimizer=optimizer, learning_rate=learning_rate)


def run_job_in_child(
    data: bytes,
    *,
    device_indices: list[int],
    batch_size: int,
    iterations: int,
    runtime: str,
    max_seconds: float,
    mem_limit_mb: float | None,
    predicted_util_pct: float | None,
    limits: JobProcessLimits,
    nvml: Any = None,
    should_stop: Callable[[], bool] | None = None,
    report: Callable[[dict[str, float | None]], None] | None = None,
    kind: str = "inference",
    optimizer: str = "adam",
    learning_rate: float | None = None,
) -> dict[str, Any]:
    """Run the job (its model ``data`` on GPUs ``device_indices``, NVML indices of this node) in a child
    and return its figures, as :func:`scheduling.gpu_runtime.run_data_parallel` does in-process.

    ``should_stop`` and ``report`` run here, about once a second: the first kills the child when it says
    yes (:class:`JobStopped`), the second gets the child's own NVML figures (sampled for its pid).
    Raises NoGpuError, DurationReached, JobStopped, JobOutOfMemory or GpuRuntimeError, each with a
    readable message."""
    reading = require_gpu(nvml)
    for index in device_indices:
        if index >= len(reading.gpus):
            raise NoGpuError(f"no NVIDIA GPU #{index} on this host ({reading.summary})")
    env = isolation_env(device_indices, predicted_util_pct=predicted_util_pct, mem_limit_mb=mem_limit_mb,
                        mps_pipe_dir=mps_pipe_directory())
    env.update({k: os.environ[k] for k in GPU_ENV_PASS if os.environ.get(k)})
    wall_s = float(max_seconds) + limits.grace_s
    cpu_s = math.ceil(wall_s * limits.cpu_per_wall)
    live: list[GpuSampler] = []
    child: list[int] = []
    over_host_mb: list[float] = []

    def on_start(pid: int) -> None:  # the worker samples the child's pid on the lead GPU
        child.append(pid)
        if report is None:
            return
        try:
            sampler = GpuSampler(device_indices[0], nvml=nvml, pid=pid, interval_s=gpu_runtime.STOP_CHECK_EVERY_S,
                                 descendants=True)
            sampler.__enter__()
        except Exception as exc:  # live figures are optional: the job runs without them
            log.warning("GPU job child %s: no live NVML sampling (%s)", pid, exc)
            return
        live.append(sampler)

    def poll() -> bool:
        rss_mb = _tree_rss_mb(child[0]) if child and limits.host_memory_mb else 0.0
        if rss_mb > limits.host_memory_mb:
            over_host_mb.append(rss_mb)
            return True
        if report is not None and live:
            report(live[0].latest_process())
        return bool(should_stop is not None and should_stop())

    kwargs = {"nvml_indices": list(device_indices), "gpus": [gpu_facts(reading.gpus[i]) for i in device_indices],
              "batch_size": batch_size, "iterations": iterations, "runtime": runtime, "max_seconds": max_seconds,
              "mem_limit_mb": mem_limit_mb, "runtimes": dict(limits.runtimes), "kind": kind, "optimizer": optimizer,
              "learning_rate": learning_rate}
    try:
        return run_in_child(CHILD_TARGET, kwargs=kwargs, data=data, memory_mb=0, cpu_s=cpu_s, wall_s=wall_s,
                            nofile=limits.nofile, preexec=limits.preexec, what=WHAT, env=env,
                            on_start=on_start, poll=poll)
    except SandboxFailure as exc:
        if over_host_mb:
            raise GpuRuntimeError(
                f"the job's process held {over_host_mb[0]:.0f} MB of host memory, over the {limits.host_memory_mb:g} MB "
                f"a job's process may hold (SCHEDULING_JOB_MAX_HOST_MEMORY_MB), and was stopped while {WHAT}") from None
        if exc.reason != "stopped":
            log.warning("GPU job child failed (%s): %s\n%s", exc.reason, exc.message, exc.stderr_tail[-2000:])
        raise _job_error(exc, max_seconds=max_seconds, wall_s=wall_s, cpu_s=cpu_s) from None
    finally:
        for sampler in live:
            sampler.__exit__(None, None, None)


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of the process ``pid`` and its descendants, in MB (0 once it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def _job_error(exc: SandboxFailure, *, max_seconds: float, wall_s: float, cpu_s: int) -> Exception:
    """The exception the worker records for a child that gave no result."""
    text = exc.error_message or exc.message
    if exc.reason == "stopped":
        return JobStopped("stopped on request (the job was cancelled)")
    if exc.reason == "raised" and exc.error_type == "DurationReached":
        return DurationReached(max_seconds)
    if exc.reason == "raised" and exc.error_type == "JobStopped":
        return JobStopped(text)
    if exc.reason == "raised" and exc.error_type == "NoGpuError":
        return NoGpuError(text)
    if exc.reason == "memory":  # from the child's words (its GPU job has no address-space cap)
        return JobOutOfMemory(f"the job's process reported running out of memory ({text}) while {WHAT}")
    if exc.reason == "wall_clock":
        return GpuRuntimeError(
            f"the job's process was killed at its wall-clock cap of {wall_s:g} s (its declared duration of "
            f"{max_seconds:g} s plus {wall_s - max_seconds:g} s to load and report) while {WHAT}")
    if exc.reason == "cpu_time":
        return GpuRuntimeError(f"the job's process was killed at its CPU-time limit of {cpu_s} s while {WHAT}")
    if exc.reason == "raised":
        return GpuRuntimeError(text if exc.error_type == "GpuRuntimeError" else f"{exc.error_type}: {text}")
    return GpuRuntimeError(f"the job's process {exc.message}")  # crashed, or an answer that is not JSON
