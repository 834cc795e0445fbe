"""The simulator's re-placement rule, for the live path (no Django).

:class:`~scheduling.horus.policies.HorusMigrate` decides in the simulator which running job leaves an
over-subscribed GPU and where it goes: a GPU whose MEASURED demand exceeds ``100 + tolerance_pct`` moves
the smallest single-GPU job whose departure ends the over-subscription, to the lowest-cost GPU that can
take it within 100 %, at most ``max_migrations`` times per job, after ``min_runtime_s`` on its GPU. The
live path calls the very same ``rebalance`` on the live cluster view (per-process NVML figures as each
job's measured utilization) and acts only where the GPU's PREDICTED load was within the bound: there the
over-subscription is the predictions' error, which is what re-placement corrects (a GPU the policy knowingly
filled past the bound is the policy's choice, not a surprise).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import ClusterView
from .policies import HorusMigrate

__all__ = ["InterferenceMove", "interference_moves"]


@dataclass(frozen=True)
class InterferenceMove:
    """One job the rule moves off an over-subscribed GPU, and why (every figure as the rule saw it)."""

    job_id: str
    from_gpu: int
    to_gpu: int
    gpu_measured_util_pct: float
    gpu_predicted_util_pct: float
    bound_pct: float
    job_measured_util_pct: float
    job_predicted_util_pct: float

    def why(self) -> dict[str, float | int | str]:
        return {
            "rule": HorusMigrate.name,
            "gpu_measured_util_pct": round(self.gpu_measured_util_pct, 2),
            "gpu_predicted_util_pct": round(self.gpu_predicted_util_pct, 2),
            "bound_pct": self.bound_pct,
            "job_measured_util_pct": round(self.job_measured_util_pct, 2),
            "job_predicted_util_pct": round(self.job_predicted_util_pct, 2),
        }


def interference_moves(
    view: ClusterView, now: float, *, tolerance_pct: float = 5.0, max_migrations: int = 2, min_runtime_s: float = 60.0
) -> list[InterferenceMove]:
    """HorusMigrate's moves on ``view`` (flat GPU indices), kept where the source GPU's predicted load
    was within the bound (its measured load is over it because a prediction was wrong)."""
    rule = HorusMigrate(tolerance_pct=tolerance_pct, max_migrations=max_migrations, min_runtime_s=min_runtime_s)
    bound = 100.0 + float(tolerance_pct)
    where: dict[str, tuple[int, float, float]] = {}
    for g in range(view.n_gpus):
        for rj in view.jobs_on(g):
            where.setdefault(rj.view.job_id, (g, rj.meas_util_pct, rj.view.pred_util_pct))
    moves = []
    for job_id, gpus in rule.rebalance(view, now):
        src, meas, pred = where[job_id]
        if float(view.pred_util_pct[src]) > bound:
            continue
        moves.append(
            InterferenceMove(
                job_id=job_id,
                from_gpu=src,
                to_gpu=int(gpus[0]),
                gpu_measured_util_pct=float(view.demand_util_pct[src]),
                gpu_predicted_util_pct=float(view.pred_util_pct[src]),
                bound_pct=bound,
                job_measured_util_pct=float(meas),
                job_predicted_util_pct=float(pred),
            )
        )
    return moves
