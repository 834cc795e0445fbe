"""NVIDIA GPU telemetry through NVML (the one wrapper: ``common.nvml``). No Django here.

Every function takes the NVML module as an argument (``nvml=None`` imports
``pynvml``), so tests pass a fake one. A host without an NVIDIA driver (or
without the library) is not an error: :func:`read_gpus` says so in
``NvmlReading.error`` and returns no GPUs.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from common.nvml import NvmlUnavailable, close_nvml, load_nvml, open_nvml, optional, text, total_energy_mj

__all__ = ["GpuSample", "NvmlReading", "load_nvml", "read_gpus", "normalize_gpu_model", "GpuSampler",
           "NoGpuError", "job_measurement", "require_gpu"]

MB = 1024 * 1024


class NoGpuError(RuntimeError):
    """No NVIDIA GPU can be used here; the message says why (pynvml's error)."""


@dataclass
class GpuSample:
    index: int
    uuid: str
    name: str
    memory_total_mb: float
    util_pct: float
    mem_used_mb: float
    power_w: float | None = None
    temperature_c: float | None = None
    energy_mj: float | None = None
    power_limit_w: float | None = None

    @property
    def gpu_model(self) -> str:
        return normalize_gpu_model(self.name, self.memory_total_mb)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"gpu_model": self.gpu_model}


@dataclass
class NvmlReading:
    available: bool
    error: str = ""
    driver_version: str = ""
    gpus: list[GpuSample] = field(default_factory=list)
    ts: float = field(default_factory=time.time)

    @property
    def summary(self) -> str:
        if not self.available:
            return f"no NVIDIA GPU found (pynvml: {self.error})"
        return f"{len(self.gpus)} GPU(s): " + ", ".join(f"{g.index}:{g.name}" for g in self.gpus)


def normalize_gpu_model(name: str, memory_total_mb: float | None = None) -> str:
    """The GPU model name the predictor's datasheet table knows ('Tesla V100-SXM2-32GB' -> 'V100M32').

    Unknown boards keep their cleaned name (e.g. 'H200'); the predictor then uses
    V100 datasheet numbers and marks them assumed (see horus.profiles.gpu_spec).
    """
    clean = re.sub(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", "", name.strip(), flags=re.I)
    clean = re.sub(r"^(NVIDIA|Tesla)\s+", "", clean, flags=re.I)
    tokens = re.split(r"[\s\-_]+", clean.upper())
    if "V100" in tokens or clean.upper().startswith("V100"):
        big = (memory_total_mb or 0) > 20_000 or "32GB" in clean.upper()
        return "V100M32" if big else "V100"
    for known in ("P100", "T4", "A10"):
        if tokens and tokens[0] == known:
            return known
    return tokens[0] if tokens and tokens[0] else (clean or "unknown")


def read_gpus(nvml: Any = None) -> NvmlReading:
    """One sample of every NVIDIA GPU on this host (utilization, memory, power, temperature, energy)."""
    if nvml is None:
        nvml, why = load_nvml()
        if nvml is None:
            return NvmlReading(available=False, error=why)
    try:
        open_nvml(nvml)
    except NvmlUnavailable as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded on a GPU-less host
        return NvmlReading(available=False, error=str(exc))
    try:
        driver = optional(nvml.nvmlSystemGetDriverVersion)
        count = int(nvml.nvmlDeviceGetCount())
        gpus: list[GpuSample] = []
        temp_sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        for i in range(count):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            util = optional(nvml.nvmlDeviceGetUtilizationRates, h)
            power_mw = optional(nvml.nvmlDeviceGetPowerUsage, h)
            limit_mw = optional(nvml.nvmlDeviceGetEnforcedPowerLimit, h) if hasattr(
                nvml, "nvmlDeviceGetEnforcedPowerLimit") else None
            temp = optional(nvml.nvmlDeviceGetTemperature, h, temp_sensor)
            energy = total_energy_mj(nvml, h)
            gpus.append(GpuSample(
                index=i,
                uuid=text(optional(nvml.nvmlDeviceGetUUID, h) or ""),
                name=text(optional(nvml.nvmlDeviceGetName, h) or f"GPU {i}"),
                memory_total_mb=float(mem.total) / MB,
                util_pct=float(util.gpu) if util is not None else 0.0,
                mem_used_mb=float(mem.used) / MB,
                power_w=float(power_mw) / 1000.0 if power_mw is not None else None,
                temperature_c=float(temp) if temp is not None else None,
                energy_mj=float(energy) if energy is not None else None,
                power_limit_w=float(limit_mw) / 1000.0 if limit_mw is not None else None,
            ))
        return NvmlReading(available=count > 0, error="" if count else "NVML found no devices",
                           driver_version=text(driver or ""), gpus=gpus)
    except Exception as exc:
        return NvmlReading(available=False, error=f"NVML query failed: {exc}")
    finally:
        close_nvml(nvml)


def require_gpu(nvml: Any = None) -> NvmlReading:
    """The reading, or :class:`NoGpuError` ('no NVIDIA GPU found (pynvml: ...)')."""
    reading = read_gpus(nvml)
    if not reading.available:
        raise NoGpuError(reading.summary)
    return reading


class GpuSampler:
    """Samples one GPU in a background thread while work runs on it::

        with GpuSampler(index=0) as s:
            run()
        s.result()  # {"util_mean_pct", "util_max_pct", "mem_peak_mb", "mem_baseline_mb", "power_mean_w", "energy_j"}
    """

    def __init__(self, index: int = 0, *, interval_s: float = 0.05, nvml: Any = None, pid: int | None = None,
                 descendants: bool = False):
        if nvml is None:
            nvml, why = load_nvml()
            if nvml is None:
                raise NoGpuError(f"no NVIDIA GPU found (pynvml: {why})")
        self.nvml, self.index, self.interval_s = nvml, index, interval_s
        #: the process whose own utilization and memory are sampled too (NVML per-process accounting)
        self.pid = pid
        #: the pid's descendants count as the pid (the worker watching a job's child: a process the child
        #: starts is the job's too); each sample then lists them (a /proc walk: for second-scale intervals)
        self.descendants = descendants
        self.proc_utils: list[float] = []
        self.proc_mems: list[float] = []
        self._proc_ts = 0  # NVML returns per-process samples newer than this (microseconds)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.utils: list[float] = []
        self.mems: list[float] = []
        self.powers: list[float] = []
        self.baseline_mb = 0.0
        self.energy0 = self.energy1 = None
        self.t0 = self.t1 = 0.0

    def __enter__(self) -> GpuSampler:
        try:
            open_nvml(self.nvml)
        except NvmlUnavailable as exc:
            raise NoGpuError(f"no NVIDIA GPU found (pynvml: {exc})") from None
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(self.index)
        self.baseline_mb = float(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used) / MB
        self.energy0 = total_energy_mj(self.nvml, self.handle)
        self.t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def _sample(self) -> None:
        util = optional(self.nvml.nvmlDeviceGetUtilizationRates, self.handle)
        mem = optional(self.nvml.nvmlDeviceGetMemoryInfo, self.handle)
        power = optional(self.nvml.nvmlDeviceGetPowerUsage, self.handle)
        if util is not None:
            self.utils.append(float(util.gpu))
        if mem is not None:
            self.mems.append(float(mem.used) / MB)
        if power is not None:
            self.powers.append(float(power) / 1000.0)
        if self.pid is not None:
            self._sample_process()

    def _watched_pids(self) -> set[int]:
        """The pid and its descendants: a process the job started is the job's too, and its GPU memory and
        work must not escape the job's share and figures."""
        import psutil

        pids = {self.pid}
        try:
            pids.update(c.pid for c in psutil.Process(self.pid).children(recursive=True))
        except psutil.Error:
            pass
        return pids

    def _sample_process(self) -> None:
        """The pid's SM utilization (``nvmlDeviceGetProcessUtilization``, samples since the last call) and
        the memory it holds (``nvmlDeviceGetComputeRunningProcesses``), its descendants' added; nothing
        when the GPU or driver does not report them."""
        samples = optional(getattr(self.nvml, "nvmlDeviceGetProcessUtilization", None) or _none,
                           self.handle, self._proc_ts) or []
        procs = optional(getattr(self.nvml, "nvmlDeviceGetComputeRunningProcesses", None) or _none, self.handle) or []
        pids = self._watched_pids() if self.descendants and (samples or procs) else {self.pid}
        with self._lock:
            utils: dict[int, list[float]] = {}
            for smp in samples:
                self._proc_ts = max(self._proc_ts, int(getattr(smp, "timeStamp", 0) or 0))
                if getattr(smp, "pid", None) in pids:
                    utils.setdefault(smp.pid, []).append(float(smp.smUtil))
            if set(utils) <= {self.pid}:  # the process alone: every sample, as NVML gave them
                self.proc_utils.extend(utils.get(self.pid, []))
            else:  # several processes: their mean utilizations over these samples, added
                self.proc_utils.append(min(100.0, sum(sum(v) / len(v) for v in utils.values())))
            mems = [float(proc.usedGpuMemory) / MB for proc in procs
                    if getattr(proc, "pid", None) in pids and getattr(proc, "usedGpuMemory", None) is not None]
            if mems:
                self.proc_mems.append(sum(mems))

    def latest_process(self) -> dict[str, float | None]:
        """The pid's latest measured utilization and memory so far, and the GPU's latest memory in use by
        every process (``gpu_mem_used_mb``; None where none was reported)."""
        with self._lock:
            return {"util_pct": self.proc_utils[-1] if self.proc_utils else None,
                    "mem_mb": self.proc_mems[-1] if self.proc_mems else None,
                    "gpu_mem_used_mb": self.mems[-1] if self.mems else None}

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sample()
        self.t1 = time.perf_counter()
        self.energy1 = total_energy_mj(self.nvml, self.handle)
        close_nvml(self.nvml)

    def result(self) -> dict[str, float | None]:
        energy_j = None
        if self.energy0 is not None and self.energy1 is not None:
            energy_j = (float(self.energy1) - float(self.energy0)) / 1000.0
        elif self.powers:
            energy_j = sum(self.powers) / len(self.powers) * (self.t1 - self.t0)
        return {
            "util_mean_pct": sum(self.utils) / len(self.utils) if self.utils else None,
            "util_max_pct": max(self.utils) if self.utils else None,
            "mem_peak_mb": max(self.mems) if self.mems else None,
            "mem_baseline_mb": self.baseline_mb,
            "power_mean_w": sum(self.powers) / len(self.powers) if self.powers else None,
            "energy_j": energy_j,
            "energy_source": "nvml-counter" if self.energy0 is not None else ("nvml-power" if self.powers else None),
            "seconds": self.t1 - self.t0,
            "samples": len(self.utils),
            # the process's own figures (None when NVML reported none for it, e.g. no per-process accounting)
            "proc_util_mean_pct": sum(self.proc_utils) / len(self.proc_utils) if self.proc_utils else None,
            "proc_util_max_pct": max(self.proc_utils) if self.proc_utils else None,
            "proc_mem_peak_mb": max(self.proc_mems) if self.proc_mems else None,
            "proc_samples": len(self.proc_utils),
        }


def _none(*args) -> None:
    return None


def job_measurement(result: dict[str, Any]) -> tuple[float | None, float | None, str]:
    """``(utilization %, memory MB, source)`` a finished run measured for its job: the process's own NVML
    figures (``nvml-process``) where the driver reported them, else the device's (``nvml-device``:
    the GPU's utilization while the job ran, its partners' work included)."""
    util, mem = result.get("proc_util_mean_pct"), result.get("proc_mem_peak_mb")
    if util is not None:
        return util, mem if mem is not None else result.get("mem_used_by_job_mb"), "nvml-process"
    return result.get("util_mean_pct"), result.get("mem_used_by_job_mb"), "nvml-device"
