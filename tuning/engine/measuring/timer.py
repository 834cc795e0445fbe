"""High-precision timing of a built tensor program, per device type.

CPU: TVM's ``time_evaluator`` (C++ loop, ``std::chrono`` around ``number``
calls, the first call discarded as warm-up) in a process whose TVM thread pool
has a *fixed* size (``TVM_NUM_THREADS``, ``TVM_BIND_THREADS=0`` and an explicit
CPU affinity set by the measuring worker), so every candidate is timed with the
same thread count the model will be deployed with.

CUDA (and other GPUs): the same ``time_evaluator`` call on a ``cuda`` device
uses TVM's device timer (``profiling.timer.cuda``: CUDA events recorded on the
stream around the ``number`` launches, then synchronised), i.e. the time is
taken *on the device*, not from CPU timestamps, so kernel-launch jitter of a
busy host does not enter the number. This is the DOPpler requirement that
makes parallel measurement on a shared host safe.

Importable with TVM's runtime only (``TVM_USE_RUNTIME_LIB=1``): nothing here
touches the compiler library. That import skips TVM's device backends, whose
runtime parts live in sidecar libraries (``libtvm_runtime_cuda.so``: the CUDA
device API, module loader and event timer), so :func:`check_device` loads the
sidecar a GPU needs before anything is loaded onto it.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "EvaluatorConfig",
    "default_evaluator",
    "COLD_CPU_EVALUATOR",
    "CPU_CACHE_FLUSH",
    "EvaluatorChoice",
    "choose_evaluator",
    "host_llc_bytes",
    "cpu_caches",
    "time_module",
    "check_device",
    "load_device_runtime",
    "DeviceUnavailable",
]


class DeviceUnavailable(RuntimeError):
    """The requested device does not exist on this host."""


@dataclasses.dataclass(frozen=True)
class EvaluatorConfig:
    """How one candidate is timed.

    number: calls averaged into one sample; repeat: samples returned;
    min_repeat_ms: ``number`` is raised until one sample lasts at least this
    long; enable_cpu_cache_flush: flush the CPU cache (all args but the first)
    before every sample. Defaults equal TVM MetaSchedule's own defaults.
    """

    number: int = 3
    repeat: int = 1
    min_repeat_ms: int = 100
    enable_cpu_cache_flush: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_any(cls, value: EvaluatorConfig | Mapping[str, Any] | None) -> EvaluatorConfig:
        if value is None:
            return cls()
        if isinstance(value, EvaluatorConfig):
            return value
        if isinstance(value, Mapping):
            fields = {f.name for f in dataclasses.fields(cls)}
            return cls(**{k: v for k, v in value.items() if k in fields})
        # a tvm.s_tir.meta_schedule.runner.EvaluatorConfig (NamedTuple)
        return cls(
            number=int(value.number),
            repeat=int(value.repeat),
            min_repeat_ms=int(value.min_repeat_ms),
            enable_cpu_cache_flush=bool(value.enable_cpu_cache_flush),
        )


def default_evaluator(device_type: str) -> EvaluatorConfig:
    """Per-device defaults: TVM's on CPU; on GPUs three samples of at least 5 ms each (device-side events
    are precise and kernels short) and no CPU cache flush.

    Measured on an H200 (``bench/gpu_check.sh --budgets``, 18 candidates of 3 tasks, two runs,
    ``bench/results/gpu_check_h200_s20_budgets*.json``): against 10 x 3 samples of >= 50 ms (the previous
    default), serial measuring took x0.20-x0.22 of the time, serial-vs-serial noise 0.14-0.26 %
    (0.05-0.09 %), 0.20-0.40 % from the longer budget's timings, the same ranking (Spearman 1.000) and
    the same best candidate per task (3 samples of >= 1 ms picked a 0.27 % slower one once); the timing
    window (DOPpler's DOP on a GPU) gains x1.8-2.2 at DOP 2-4 instead of x1.1, a candidate's preparation
    now being a larger share of its measurement."""
    if device_type in ("cpu", "llvm"):
        return EvaluatorConfig(number=3, repeat=1, min_repeat_ms=100, enable_cpu_cache_flush=False)
    return EvaluatorConfig(number=1, repeat=3, min_repeat_ms=5, enable_cpu_cache_flush=False)


# One call per sample with every argument but the data input flushed from the CPU caches first (TVM's
# documented cache-flush option), ten samples: a kernel is timed reading its weights from memory.
COLD_CPU_EVALUATOR = EvaluatorConfig(number=1, repeat=10, min_repeat_ms=0, enable_cpu_cache_flush=True)
# TVM's registered ``f_preproc`` that flushes every argument but the first from the CPU caches
CPU_CACHE_FLUSH = "cache_flush_cpu_non_first_arg"

_SYSFS_CACHE = "/sys/devices/system/cpu/cpu0/cache"


@dataclasses.dataclass(frozen=True)
class EvaluatorChoice:
    """The evaluator a run's candidates are timed with, and why (shown on the run)."""

    config: EvaluatorConfig
    regime: str  # "cold" (caches flushed before each sample), "warm" (back to back), "gpu"
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.config.to_dict(), "regime": self.regime, "why": self.why}


def cpu_caches(cache_dir: str = _SYSFS_CACHE) -> dict[str, str]:
    """This host's data and unified CPU caches as sysfs gives them for its first core (``{"L1d": "32K",
    "L2": "512K", "L3": "32768K"}``; instruction caches left out); empty where sysfs does not say."""
    caches: dict[str, str] = {}
    for index in sorted(Path(cache_dir).glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip() if (index / "type").exists() else "Unified"
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and size:
            caches[f"L{level}" + ("d" if kind == "Data" else "")] = size
    return caches


def host_llc_bytes(cache_dir: str = _SYSFS_CACHE) -> int | None:
    """Size of this host's last-level CPU cache as one core sees it (:func:`cpu_caches`' highest level
    whose size reads; on AMD the L3 of its core complex), None where sysfs does not say."""
    by_level = sorted(cpu_caches(cache_dir).items(), key=lambda item: int(item[0][1:].rstrip("d")), reverse=True)
    for _, size in by_level:
        text = size.upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        try:
            return int(text.rstrip("KMG")) * scale
        except ValueError:
            continue
    return None


def choose_evaluator(device_type: str) -> EvaluatorChoice:
    """How a target's candidates are timed.

    CPUs: cold (:data:`COLD_CPU_EVALUATOR`: the caches flushed, one call a sample), whatever the model's
    size. Inside a model a layer runs once per inference, after the other layers evicted what it read;
    timed back to back (TVM's default) its operands stay in L1/L2 and the first, slow call is averaged
    away, so it reads faster alone than it runs in the model. Measured (AMD EPYC ``znver4``, five zoo
    models, ``bench/tuned_tasks.py --profile``; research notes' "which way of timing a kernel alone
    predicts it in the model"): summed over each model's tuned kernels, cold timing came within -14..+7 %
    of their time in the compiled model, warm -4..-18 %, and closer on all five, small_cnn (0.3 MiB of
    weights) included; on an Intel ``rocketlake`` whose 480 MiB L3 holds every zoo model, cold +0.5 % and
    +8.9 % (resnet18, mobilenet_v2), warm -13.7 % and -21.6 %. mobilenet_v2 tuned cold for 30 minutes had
    its estimate 5 % from its compiled model (warm: 26-39 %) and ran faster, one cold sample costing a few
    calls instead of >= 100 ms (27-45 % more trials per budget). GPUs: the device default
    (:func:`default_evaluator`)."""
    if device_type not in ("cpu", "llvm"):
        return EvaluatorChoice(default_evaluator(device_type), "gpu", "timed on the device (CUDA events)")
    return EvaluatorChoice(
        COLD_CPU_EVALUATOR,
        "cold",
        "each sample flushes the CPU caches and makes one call, as a layer runs inside the model "
        "after the others evicted its operands (timed back to back it reads faster than it runs there)",
    )


def load_device_runtime(device_type: str) -> None:
    """Make TVM's runtime for ``device_type`` usable in this process.

    A full ``import tvm`` loads the device sidecars itself (silently skipping one
    whose own libraries are missing); a runtime-only import loads none. Raises
    :class:`DeviceUnavailable` with the loader's reason (e.g. ``libcudart.so.13``
    not on the library path) when the device's API cannot be registered."""
    import tvm  # noqa: F401 - loads libtvm_runtime
    import tvm_ffi
    from tvm.base import _LOADED_LIBS

    if device_type in ("cpu", "llvm") or tvm_ffi.get_global_func(f"device_api.{device_type}", allow_missing=True):
        return
    sidecar = f"tvm_runtime_{device_type}"
    runtime_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    if not (runtime_dir / f"lib{sidecar}.so").exists():
        return  # built into libtvm_runtime, or not built at all: device() says which
    from tvm_ffi.libinfo import load_lib_ctypes

    try:
        _LOADED_LIBS[sidecar] = load_lib_ctypes(
            package="tvm", target_name=sidecar, extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL"
        )
    except (OSError, RuntimeError) as exc:
        raise DeviceUnavailable(
            f"TVM's {device_type} runtime (lib{sidecar}.so) cannot be loaded on host "
            f"{socket.gethostname()}: {str(exc).replace(str(runtime_dir), '<tvm>/lib').strip()[:300]}; "
            f"a {device_type} gpu worker needs the "
            f"driver and the toolkit's runtime libraries on its library path"
        ) from None


def check_device(device_type: str, index: int = 0):
    """Return ``tvm.runtime.device(device_type, index)`` or raise a clear
    :class:`DeviceUnavailable` when it is not present on this host."""
    import tvm  # runtime only (module doc); lazy: the session and web processes import this module

    load_device_runtime(device_type)
    dev = tvm.runtime.device(device_type, index)
    if device_type not in ("cpu", "llvm") and not dev.exist:
        raise DeviceUnavailable(
            f"no {device_type} device #{index} on host {socket.gethostname()}: candidates for "
            f"this target can be built here but must be measured by a worker on a machine with "
            f"that GPU (queue measure.<host>.gpu<i>)"
        )
    if device_type == "cuda":
        # TVM 0.27 compiles a candidate's CUDA source when it is loaded (cuda_binaries' doc)
        from tuning.engine.measuring.cuda_binaries import install_runtime_compiler

        install_runtime_compiler("sm_" + dev.compute_version.replace(".", ""))
    return dev


def time_module(rt_mod, device, args, cfg: EvaluatorConfig | Mapping | None = None) -> list[float]:
    """Time ``rt_mod``'s entry function on ``device`` with ``args``; return
    ``cfg.repeat`` samples in seconds (each the mean of >= ``cfg.number`` calls).
    On GPUs the samples come from device-side event timing (see module doc)."""
    cfg = EvaluatorConfig.from_any(cfg)
    is_cpu = device.dlpack_device_type() == 1 if hasattr(device, "dlpack_device_type") else True
    f_preproc = CPU_CACHE_FLUSH if (cfg.enable_cpu_cache_flush and is_cpu) else ""
    evaluator = rt_mod.time_evaluator(
        rt_mod.entry_name,
        device,
        number=cfg.number,
        repeat=cfg.repeat,
        min_repeat_ms=cfg.min_repeat_ms,
        f_preproc=f_preproc,
    )
    device.sync()
    res = evaluator(*args)
    device.sync()
    return [float(x) for x in res.results]
