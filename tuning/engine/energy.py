"""Energy meters: measured where a meter exists, modeled otherwise, always labeled.

- ``RaplMeter``: CPU package energy from Linux powercap (``/sys/class/powercap``,
  ``intel-rapl:N/energy_uj``; AMD exposes the same interface), wrap-around handled.
- ``NvmlMeter``: NVIDIA GPU total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules since driver load, Volta and newer) per GPU.
- ``ModeledMeter``: CPU-seconds of this process tree x watts per core, plus
  GPU-busy-seconds x board power; labeled ``modeled``.

Every reading carries its ``source``; figures built from several sources say so.
Django-free: settings come in as arguments.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from common.nvml import open_nvml, total_energy_mj
from common.units import JOULES_PER_KWH

__all__ = [
    "EnergySample",
    "RaplMeter",
    "NvmlMeter",
    "ModeledMeter",
    "CompositeMeter",
    "EnergyAccount",
    "available_meters",
    "best_cpu_meter",
    "carbon_grams",
    "JOULES_PER_KWH",
]


@dataclasses.dataclass(frozen=True)
class EnergySample:
    """Cumulative joules at a point in time, from one source."""

    joules: float
    source: str  # "rapl" | "nvml" | "modeled"
    at: float


def carbon_grams(joules: float, grid_g_per_kwh: float) -> float:
    return joules / JOULES_PER_KWH * grid_g_per_kwh


class RaplMeter:
    """Package-level RAPL counters. Raises OSError at construction when none is readable."""

    source = "rapl"

    def __init__(self, root: str | os.PathLike = "/sys/class/powercap"):
        self.root = Path(root)
        self.domains: list[tuple[Path, int]] = []
        for energy in sorted(glob.glob(str(self.root / "intel-rapl:*" / "energy_uj"))):
            domain = Path(energy).parent
            if domain.name.count(":") != 1:  # sub-domains (core, uncore, dram) are inside the package
                continue
            try:
                int((domain / "energy_uj").read_text())
                max_range = int((domain / "max_energy_range_uj").read_text())
            except (OSError, ValueError):
                continue
            self.domains.append((domain / "energy_uj", max_range))
        if not self.domains:
            raise OSError(f"no readable RAPL package domain under {self.root} (needs root or powercap access)")
        self._last = [int(p.read_text()) for p, _ in self.domains]
        self._total_uj = 0

    def read(self) -> EnergySample:
        for i, (path, max_range) in enumerate(self.domains):
            now = int(path.read_text())
            delta = now - self._last[i]
            if delta < 0:  # the counter wrapped around
                delta += max_range + 1
            self._total_uj += delta
            self._last[i] = now
        return EnergySample(self._total_uj / 1e6, self.source, time.time())


class NvmlMeter:
    """Sum of the NVML total-energy counters of the given GPUs (all by default)."""

    source = "nvml"

    def __init__(self, nvml=None, gpu_indices: Sequence[int] | None = None):
        try:
            self.nvml = nvml = open_nvml(nvml)  # common.nvml: the one NVML wrapper
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded...
            raise OSError(f"NVML unavailable: {exc}") from exc
        indices = list(range(count)) if gpu_indices is None else list(gpu_indices)
        if not indices:
            raise OSError("NVML reports no GPU")
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        self._start_mj = self._counters_mj()

    def _counters_mj(self) -> list[float]:
        counters: list[float] = []
        for handle in self.handles:
            mj = total_energy_mj(self.nvml, handle)
            if mj is None:  # a board without the counter: the caller falls back to a modeled meter
                raise OSError("NVML: a GPU has no total-energy counter")
            counters.append(mj)
        return counters

    def read(self) -> EnergySample:
        now = self._counters_mj()
        return EnergySample(sum(n - s for n, s in zip(now, self._start_mj)) / 1e3, self.source, time.time())


def _process_tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) of a process and all its live and reaped children."""
    import psutil

    proc = psutil.Process(pid or os.getpid())
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
        except psutil.Error:
            continue
    return total


class ModeledMeter:
    """Energy = CPU-seconds x watts per core (+ GPU-busy-seconds x board power). Labeled "modeled"."""

    source = "modeled"

    def __init__(
        self,
        *,
        cpu_watts_per_core: float,
        gpu_board_watts: float = 0.0,
        cpu_seconds: Callable[[], float] = _process_tree_cpu_seconds,
        gpu_busy_seconds: Callable[[], float] | None = None,
    ):
        self.cpu_watts_per_core = cpu_watts_per_core
        self.gpu_board_watts = gpu_board_watts
        self._cpu_seconds = cpu_seconds
        self._gpu_seconds = gpu_busy_seconds or (lambda: 0.0)
        self._cpu0, self._gpu0 = self._cpu_seconds(), self._gpu_seconds()
        # Children reaped between reads leave the live tree; keep the max so the
        # cumulative figure never goes backwards.
        self._high = 0.0

    def read(self) -> EnergySample:
        cpu = max(0.0, self._cpu_seconds() - self._cpu0)
        gpu = max(0.0, self._gpu_seconds() - self._gpu0)
        self._high = max(self._high, cpu * self.cpu_watts_per_core + gpu * self.gpu_board_watts)
        return EnergySample(self._high, self.source, time.time())


class CompositeMeter:
    """CPU meter + optional GPU meter; the source label lists both (e.g. "rapl+nvml")."""

    def __init__(self, meters: Sequence):
        self.meters = list(meters)
        self.source = "+".join(m.source for m in self.meters)

    def read(self) -> EnergySample:
        samples = [m.read() for m in self.meters]
        return EnergySample(sum(s.joules for s in samples), self.source, time.time())


def best_cpu_meter(*, cpu_watts_per_core: float, rapl_root: str = "/sys/class/powercap"):
    try:
        return RaplMeter(rapl_root)
    except OSError:
        return ModeledMeter(cpu_watts_per_core=cpu_watts_per_core)


def available_meters(
    *,
    cpu_watts_per_core: float,
    gpu_board_watts: float,
    want_gpu: bool = False,
    nvml=None,
    rapl_root: str = "/sys/class/powercap",
):
    """The best meter this host offers: RAPL or modeled for CPUs, plus NVML when GPUs are used."""
    meters = [best_cpu_meter(cpu_watts_per_core=cpu_watts_per_core, rapl_root=rapl_root)]
    if want_gpu:
        try:
            meters.append(NvmlMeter(nvml))
        except (OSError, ImportError):
            meters.append(
                ModeledMeter(cpu_watts_per_core=0.0, gpu_board_watts=gpu_board_watts, cpu_seconds=lambda: 0.0)
            )
    return meters[0] if len(meters) == 1 else CompositeMeter(meters)


class EnergyAccount:
    """Attributes a meter's energy to phases ("build", "measure", "search") by wall intervals.

    ``with account.phase("build"): ...`` adds the joules read across the block
    to that phase. Phases never overlap in the tuning loop's thread, so the
    attribution is exact for the meter's resolution.
    """

    def __init__(self, meter):
        self.meter = meter
        self.source = meter.source
        self.by_phase: dict[str, float] = {}
        self._start = meter.read().joules

    def phase(self, name: str):
        account = self

        class _Phase:
            def __enter__(self):
                self.j0 = account.meter.read().joules
                return self

            def __exit__(self, *exc):
                account.by_phase[name] = account.by_phase.get(name, 0.0) + account.meter.read().joules - self.j0
                return False

        return _Phase()

    def total_joules(self) -> float:
        return self.meter.read().joules - self._start

    def to_dict(self) -> dict:
        total = self.total_joules()
        return {
            "source": self.source,
            "total_joules": total,
            "total_kwh": total / JOULES_PER_KWH,
            "by_phase_joules": dict(self.by_phase),
        }
