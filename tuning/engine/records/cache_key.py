"""The record cache's key, engine side: what makes two runs' records interchangeable.

A cache entry is one tuning record the platform measured *serially* itself, keyed by

- the workload's structural hash under MetaSchedule's module equality (:func:`structural_hash`, what
  ``JSONDatabase`` matches records with: ``tvm_ffi.structural_hash`` of the task's IRModule);
- the run's canonical target key (``targets.canonical_key``: ``mcpu``/``arch`` included) and, when the
  run has one, the graph-pass pipeline key and cold timing (:func:`cache_target_key` joins them);
- a hardware fingerprint (:func:`hardware_fingerprint`: CPU model and core layout, or GPU name, memory
  and driver);
- the TVM version (:func:`tvm_version`).

One entry per (key, schedule): :func:`trace_digest`. TVM is imported inside the functions that need it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tuning.engine.compile.target_schema import target_kind

__all__ = [
    "tvm_version",
    "cpu_fingerprint",
    "gpu_fingerprint",
    "hardware_fingerprint",
    "cache_target_key",
    "trace_digest",
    "structural_hash",
]


def tvm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"apache-tvm {version('apache-tvm')}, tvm-ffi {version('apache-tvm-ffi')}"
    except PackageNotFoundError:
        return "unknown"


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_fingerprint(cpuinfo: str | None = None, online: str | None = None) -> str:
    """CPU model and core layout: ``"<model> | <sockets>s x <cores>c x <threads/core>t | cpus <online>"``
    from /proc/cpuinfo and /sys (the machine, not this process's affinity)."""
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    model, sockets, cores, siblings = "", set(), 0, 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("model name", "Model", "CPU part") and not model:
            model = value
        elif key == "physical id":
            sockets.add(value)
        elif key == "cpu cores":
            cores = int(value or 0)
        elif key == "siblings":
            siblings = int(value or 0)
    online = (_read("/sys/devices/system/cpu/online") if online is None else online).strip()
    tpc = siblings // cores if cores and siblings else 1
    return f"{model or 'unknown cpu'} | {max(1, len(sockets))}s x {cores or '?'}c x {tpc}t | cpus {online or '?'}"


def gpu_fingerprint(device_index: int = 0, nvml: Any = None) -> str:
    """GPU name, memory and driver through NVML (``common.nvml``); ``"unknown gpu"`` without one."""
    from common.nvml import NvmlUnavailable, close_nvml, open_nvml, optional, text

    try:
        nv = open_nvml(nvml)
    except NvmlUnavailable as exc:
        return f"unknown gpu ({exc})"
    try:
        handle = nv.nvmlDeviceGetHandleByIndex(device_index)
        name = text(optional(nv.nvmlDeviceGetName, handle) or "gpu")
        mem = optional(nv.nvmlDeviceGetMemoryInfo, handle)
        driver = text(optional(nv.nvmlSystemGetDriverVersion) or "?")
        mib = int(mem.total) // (1 << 20) if mem is not None else 0
        return f"{name} | {mib} MiB | driver {driver}"
    finally:
        close_nvml(nv)


def hardware_fingerprint(target: Any) -> str:
    """The machine a target's measurements describe: this host's CPU for llvm, its GPU otherwise."""
    return cpu_fingerprint() if target_kind(target) == "llvm" else gpu_fingerprint()


def cache_target_key(target_key: str, pipeline_key: str | None = None, *, cold_timing: bool = False) -> str:
    """The target part of the cache key: the run's canonical target key and, when the run has one, the
    graph-pass pipeline that made its tasks (records of another pipeline schedule other workloads), and
    ``timing=cold`` for records timed with the CPU caches flushed (``timer.choose_evaluator``): a schedule
    that wins timed warm may lose timed cold, so the two never settle each other's tasks. Warm CPU keys
    are the ones written before every CPU run was timed cold."""
    key = f"{target_key}|pipeline={pipeline_key}" if pipeline_key else target_key
    return f"{key}|timing=cold" if cold_timing else key


def trace_digest(trace_text: str) -> str:
    """sha1 of a trace's canonical JSON (``events.trace_json``): one entry per (key, schedule)."""
    return hashlib.sha1(trace_text.encode()).hexdigest()


def structural_hash(mod) -> str:
    import tvm_ffi

    return str(int(tvm_ffi.structural_hash(mod)))
