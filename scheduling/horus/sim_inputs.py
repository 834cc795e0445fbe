"""What both experiment methods (replay and fill) do to their inputs: check the jobs, add the
predictor-error knob to the predictions, build the policy's views, and ask a policy for a placement
that the cluster then re-checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .cluster import ClusterState, ClusterView, JobView, PlacementError
from .policies import PlacementPolicy
from .traces import Job

__all__ = [
    "validate_jobs",
    "noisy_predictions",
    "job_views",
    "checked_placement",
    "SimulationStopped",
    "STOP_CHECK_EVERY",
    "StopCheck",
]

#: event batches (replay) or submitted pods (fill) between two calls of a run's ``should_stop``
STOP_CHECK_EVERY = 64

#: ``should_stop()``: True when the caller wants the run abandoned (a cancelled simulation)
StopCheck = Callable[[], bool]


class SimulationStopped(Exception):
    """A run was abandoned because its ``should_stop`` said so; ``completed`` names the policies that had
    finished (their results are not returned: a partial comparison is not a result)."""

    def __init__(self, message: str = "the simulation was stopped", *, completed: Sequence[str] = ()):
        super().__init__(message)
        self.completed = list(completed)


def validate_jobs(jobs: Sequence[Job]) -> None:
    """Raise ``ValueError`` unless every job has true and predicted util/memory."""
    for j in jobs:
        if j.true_util_pct is None or j.true_mem_mb is None or j.pred_util_pct is None or j.pred_mem_mb is None:
            raise ValueError(f"job {j.job_id} has no utilization/memory: call traces.assign_workloads first")


def noisy_predictions(jobs: Sequence[Job], sigma: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The jobs' predicted utilization and memory, each times ``exp(N(0, sigma))`` (seeded) when sigma > 0."""
    pu = np.array([j.pred_util_pct for j in jobs], float)
    pm = np.array([j.pred_mem_mb for j in jobs], float)
    if sigma > 0:
        rng = np.random.default_rng([seed, 0x5EED])
        pu = np.clip(pu * np.exp(rng.normal(0, sigma, len(jobs))), 1.0, 100.0)
        pm = np.maximum(pm * np.exp(rng.normal(0, sigma, len(jobs))), 1.0)
    return pu, pm


def job_views(jobs: Sequence[Job], pu: np.ndarray, pm: np.ndarray) -> list[JobView]:
    """What a policy sees of each job: its request and (noisy) predictions, never its truth."""
    return [
        JobView(
            j.job_id,
            float(j.submit_time),
            int(j.num_gpus),
            int(j.gpu_milli),
            float(u),
            float(m),
            int(j.cpu_milli),
            int(j.ram_mib),
            bool(j.single_node),
            j.model,
            j.batch_size,
            gpu_type=j.gpu_type,
        )
        for j, u, m in zip(jobs, pu, pm)
    ]


def checked_placement(
    policy: PlacementPolicy, view: JobView, state: ClusterState, cv: ClusterView, now: float, *, where: str = ""
) -> list[int] | None:
    """The policy's GPUs for ``view`` (None: leave it waiting), after the cluster's hard-constraint check;
    a policy that breaks a constraint raises :class:`PlacementError` naming it (and ``where``)."""
    gpus = policy.place(view, cv, now)
    if gpus is None:
        return None
    gpus = [int(g) for g in gpus]
    try:
        state.check_placement(view, gpus)
    except PlacementError as e:
        raise PlacementError(f"policy {policy.name!r}{where}: {e}") from None
    return gpus
