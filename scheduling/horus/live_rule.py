"""The simulator's re-placement rule, for the live path (no Django), moving the job that caused the
over-subscription.

:class:`~scheduling.horus.policies.HorusMigrate` decides in the simulator which running job leaves an
over-subscribed GPU and where it goes: a GPU whose MEASURED demand exceeds ``100 + tolerance_pct`` moves
the smallest single-GPU job whose departure ends the over-subscription. Live, a move is a RESTART of
that job (its work is lost, its team pays the time again), so the live rule chooses differently:

* it acts only where the GPU's PREDICTED load was within the bound: there the over-subscription is the
  predictions' error, which is what re-placement corrects (a GPU the policy knowingly filled past the
  bound is the policy's choice, not a surprise);
* it acts only where every job on the GPU was measured: a Kubernetes pod (never measured per process) or
  a job whose worker has not reported per-process figures counts at its prediction, and what it really
  does is unknown (an idle pod makes an over-subscription that is not there, a pod past its prediction
  makes its partners read high), so such a GPU moves nobody;
* the job moved is the CAUSE: the one whose measured utilization exceeds, the most and by more than
  ``tolerance_pct``, what it would read if every prediction on its GPU held (:func:`expected_readings`:
  a job slowed by its partners keeps its kernels resident longer and reads more than it uses alone, the
  lighter the more, by the simulator's own telemetry and interference models). Ties: the lowest job id.
  A GPU read over the bound only because its partners stretch each other has no cause;
* if the cause cannot be moved (a gang, moved ``max_migrations`` times already, on its GPU less than
  ``min_runtime_s``, or no GPU takes it within 100 % with memory headroom), NOTHING on that GPU moves:
  the other jobs there, whose predictions held, are never restarted for it. The over-subscription then
  stays until the cause ends or can move.

So a restart's cost (the lost work, the GPU time held before it, the time to run again) always falls on
the cause's own team. Where the cause goes is HorusMigrate's choice (the GPU of lowest Horus cost that
takes it within 100 %), and each round's moves see each other, as in the simulator.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from .cluster import ClusterView, RunningJob
from .interference import FittedInterference, stretched_speeds
from .observation import per_process_util
from .policies import HorusMigrate

__all__ = ["InterferenceMove", "expected_readings", "interference_moves", "over_prediction_cause"]

#: what the moved job is, in each move's record
CHOSEN_AS = "cause: measured furthest over what its prediction reads beside its partners"


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
    job_expected_util_pct: float

    def why(self) -> dict[str, float | int | str]:
        return {
            "rule": HorusMigrate.name,
            "chosen_as": CHOSEN_AS,
            "gpu_measured_util_pct": round(self.gpu_measured_util_pct, 2),
            "gpu_predicted_util_pct": round(self.gpu_predicted_util_pct, 2),
            "bound_pct": self.bound_pct,
            "job_measured_util_pct": round(self.job_measured_util_pct, 2),
            "job_predicted_util_pct": round(self.job_predicted_util_pct, 2),
            "job_expected_util_pct": round(self.job_expected_util_pct, 2),
        }


@lru_cache(maxsize=1)
def _fitted_interference() -> FittedInterference:
    return FittedInterference.from_data()


def expected_readings(pred_utils_pct: Sequence[float], gpu_model: str) -> list[float]:
    """What the per-process figures of jobs sharing one ``gpu_model`` GPU read if each job's standalone
    utilization is its prediction: stretched by its partners (the fitted interference model), its kernels
    resident ``1 - (1 - u)/slowdown`` of the time (the simulator's telemetry model)."""
    fit = _fitted_interference().params_for(gpu_model)
    utils = [min(max(float(p), 0.0), 100.0) for p in pred_utils_pct]
    speeds = stretched_speeds([u / 100.0 for u in utils], fit.capacity, fit.interference)
    return [per_process_util(u, 1.0 / s) for u, s in zip(utils, speeds)]


def _id_order(job_id: str) -> tuple[int, int, str]:
    """Job ids in number order ("999999" before "1000000"), others after them by their text."""
    return (0, int(job_id), "") if job_id.isascii() and job_id.isdigit() else (1, 0, job_id)


def over_prediction_cause(
    jobs: Iterable[RunningJob], *, expected: Mapping[str, float] | None = None, margin_pct: float = 0.0
) -> RunningJob | None:
    """The job whose measured utilization exceeds the most, and by more than ``margin_pct``, what it was
    expected to read (``expected`` by job id; its prediction where none is given), lowest id on a tie; or
    None when no job is that far over."""

    def excess(rj: RunningJob) -> float:
        base = rj.view.pred_util_pct if expected is None else expected.get(rj.view.job_id, rj.view.pred_util_pct)
        return rj.meas_util_pct - base

    over = [rj for rj in jobs if excess(rj) > margin_pct]
    if not over:
        return None
    return min(over, key=lambda rj: (-excess(rj), _id_order(rj.view.job_id)))


def interference_moves(
    view: ClusterView,
    now: float,
    *,
    tolerance_pct: float = 5.0,
    max_migrations: int = 2,
    min_runtime_s: float = 60.0,
    unmeasured: Collection[str] = (),
) -> list[InterferenceMove]:
    """The causes to move off the GPUs of ``view`` (flat GPU indices) whose measured load is over the bound
    while their predicted load was within it (see the module's docstring for the rule). ``unmeasured``: ids
    of the jobs counted at their prediction (no per-process figures); their GPUs move nobody."""
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
        jobs = view.jobs_on(g)
        if any(rj.view.job_id in unmeasured for rj in jobs):
            continue  # a load counted at its prediction: the over-subscription cannot be told
        expected = dict(
            zip(
                (rj.view.job_id for rj in jobs),
                expected_readings([rj.view.pred_util_pct for rj in jobs], view.gpu_model[g]),
            )
        )
        cause = over_prediction_cause(jobs, expected=expected, margin_pct=tolerance_pct)
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
                job_expected_util_pct=float(expected[cause.view.job_id]),
            )
        )
        scratch.move(cause, g, to, rule.max_jobs)
    return moves
