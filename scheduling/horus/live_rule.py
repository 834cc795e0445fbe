"""The simulator's re-placement rule, for the live path (no Django), moving the job that caused the
over-subscription.

:class:`~scheduling.horus.policies.HorusMigrate` decides in the simulator which running job leaves an
over-subscribed GPU and where it goes: a GPU whose MEASURED demand exceeds ``100 + tolerance_pct`` moves
the smallest single-GPU job whose departure ends the over-subscription. Live, a move is a RESTART of
that job (its work is lost, its team pays the time again), so the live rule chooses differently:

* it acts only where the GPU's PREDICTED load was within the bound: there the over-subscription is the
  predictions' error, which is what re-placement corrects (a GPU the policy knowingly filled past the
  bound is the policy's choice, not a surprise);
* the job moved is the CAUSE: the one whose measured utilization exceeds its prediction the most
  (ties: lowest job id). Where the predicted load was within the bound and the measured one is over it,
  such a job exists (jobs without per-process figures, and Kubernetes pods, count at their prediction);
* if the cause cannot be moved (a gang, moved ``max_migrations`` times already, on its GPU less than
  ``min_runtime_s``, or no GPU takes it within 100 % with memory headroom), NOTHING on that GPU moves:
  the other jobs there, whose predictions held, are never restarted for it. The over-subscription then
  stays until the cause ends or can move.

So a restart's cost (the lost work, the GPU time held before it, the time to run again) always falls on
the cause's own team. Where the cause goes is HorusMigrate's choice (the GPU of lowest Horus cost that
takes it within 100 %), and each round's moves see each other, as in the simulator.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .cluster import ClusterView, RunningJob
from .policies import HorusMigrate

__all__ = ["InterferenceMove", "interference_moves", "over_prediction_cause"]

#: what the moved job is, in each move's record
CHOSEN_AS = "cause: measured furthest over its prediction"


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
            "chosen_as": CHOSEN_AS,
            "gpu_measured_util_pct": round(self.gpu_measured_util_pct, 2),
            "gpu_predicted_util_pct": round(self.gpu_predicted_util_pct, 2),
            "bound_pct": self.bound_pct,
            "job_measured_util_pct": round(self.job_measured_util_pct, 2),
            "job_predicted_util_pct": round(self.job_predicted_util_pct, 2),
        }


def over_prediction_cause(jobs: Iterable[RunningJob]) -> RunningJob | None:
    """The job whose measured utilization exceeds its prediction the most (lowest id on a tie), or None
    when every job is at or under its prediction."""
    over = [rj for rj in jobs if rj.meas_util_pct > rj.view.pred_util_pct]
    if not over:
        return None
    return min(over, key=lambda rj: (-(rj.meas_util_pct - rj.view.pred_util_pct), rj.view.job_id))


def interference_moves(
    view: ClusterView, now: float, *, tolerance_pct: float = 5.0, max_migrations: int = 2, min_runtime_s: float = 60.0
) -> list[InterferenceMove]:
    """The causes to move off the GPUs of ``view`` (flat GPU indices) whose measured load is over the bound
    while their predicted load was within it (see the module's docstring for the rule)."""
    rule = HorusMigrate(tolerance_pct=tolerance_pct, max_migrations=max_migrations, min_runtime_s=min_runtime_s)
    bound = 100.0 + float(tolerance_pct)
    scratch = rule.scratch(view)
    excess = scratch.dem - bound
    hot = [
        g for g in range(view.n_gpus) if excess[g] > 0 and view.n_jobs[g] >= 2 and float(view.pred_util_pct[g]) <= bound
    ]
    moves = []
    # the most over-subscribed first; at most `max_examined` GPUs per call, as in the simulator
    for g in sorted(hot, key=lambda g: (-float(excess[g]), g))[: rule.max_examined]:
        cause = over_prediction_cause(view.jobs_on(g))
        if cause is None or not rule.may_move(cause, now):
            continue  # the cause stays, and so does everyone else
        to = rule.target_gpu(view, scratch, cause, g)
        if to is None:
            continue
        moves.append(
            InterferenceMove(
                job_id=cause.view.job_id,
                from_gpu=g,
                to_gpu=to,
                gpu_measured_util_pct=float(view.demand_util_pct[g]),
                gpu_predicted_util_pct=float(view.pred_util_pct[g]),
                bound_pct=bound,
                job_measured_util_pct=float(cause.meas_util_pct),
                job_predicted_util_pct=float(cause.view.pred_util_pct),
            )
        )
        scratch.move(cause, g, to, rule.max_jobs)
    return moves
