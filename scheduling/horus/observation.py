"""What policies see of a running job's utilization: the observation model between the simulator's
truth and the policies' telemetry.

The replay keeps each job's TRUE standalone utilization and its current slowdown; a policy never reads
them. It reads ``RunningJob.meas_util_pct``, which the replay sets from :func:`observe` when a
telemetry sample arrives. :class:`ObservationModel` says how that sample is taken:

* ``lag_s``: a sample reaches the policy this long after a job starts or its speed changes (NVML
  averages over a sampling period; until the first sample the policy sees the job's prediction).
* ``noise_pct``: Gaussian noise (standard deviation, percentage points) on every sample, seeded by
  the replay; samples are clipped to [0, 100].
* ``level``: ``"process"`` - per-process utilization (the job's own kernels' residency,
  ``1 - (1 - u) / slowdown``, :func:`~.replay.measured_util`); ``"device"`` - only the device
  counter is available (the sum over the GPU's jobs, capped at 100 %), split evenly among the jobs
  on that GPU (no per-process accounting tells them apart); a job on several GPUs gets the mean of
  its GPUs' shares.

Plain Python, no Django.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["ObservationModel", "LEVELS", "per_process_util", "device_share", "observe"]

LEVELS = ("process", "device")


@dataclass(frozen=True)
class ObservationModel:
    """How telemetry samples a running job (module docstring)."""

    lag_s: float = 60.0
    noise_pct: float = 0.0
    level: str = "process"

    def __post_init__(self) -> None:
        if not self.lag_s >= 0.0:  # also rejects NaN
            raise ValueError(f"lag_s must be >= 0, got {self.lag_s!r}")
        if not self.noise_pct >= 0.0:
            raise ValueError(f"noise_pct must be >= 0, got {self.noise_pct!r}")
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {self.level!r}")

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def per_process_util(true_util_pct: float, slowdown: float) -> float:
    """A job's per-process utilization (%) at standalone utilization ``u`` slowed ``slowdown``-fold:
    its GPU phases stretch, its host part does not, so its kernels are resident ``1 - (1 - u)/s``."""
    u = min(max(true_util_pct, 0.0), 100.0) / 100.0
    return 100.0 * (1.0 - (1.0 - u) / max(slowdown, 1.0))


def device_share(process_utils_on_gpu: Sequence[float]) -> float:
    """Each job's share of one GPU's device counter: the per-process utilizations summed, capped at
    100 %, split evenly over the jobs on the GPU."""
    n = len(process_utils_on_gpu)
    if n == 0:
        return 0.0
    return min(100.0, float(sum(process_utils_on_gpu))) / n


def observe(
    model: ObservationModel,
    own_process_util: float,
    gpus_process_utils: Sequence[Sequence[float]],
    noise_draw: float = 0.0,
) -> float:
    """The sample a policy reads for one job: ``own_process_util`` is its per-process utilization,
    ``gpus_process_utils`` the per-process utilizations of all jobs (itself included) on each of its
    GPUs; ``noise_draw`` a standard normal draw (0 for none), scaled by ``model.noise_pct``."""
    if model.level == "device" and gpus_process_utils:
        value = sum(device_share(g) for g in gpus_process_utils) / len(gpus_process_utils)
    else:
        value = float(own_process_util)
    value += model.noise_pct * float(noise_draw)
    return min(max(value, 0.0), 100.0)
