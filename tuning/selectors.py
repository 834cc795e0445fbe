"""Reads for tuning runs, scoped to the caller's teams."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Min, QuerySet, Sum
from django.utils import timezone

from common.series import thin
from common.units import joules_to_kwh
from core.selectors import energy_model, month_start, teams_for_user

from .models import DopRound, Measurement, TuningRun, TuningTask, team_usage_since


def runs_for_user(user: AbstractBaseUser, *, archived: bool | None = None) -> QuerySet[TuningRun]:
    """The user's teams' runs; ``archived`` False or True keeps only live or archived ones."""
    qs = TuningRun.objects.filter(team__in=teams_for_user(user)).select_related("model", "team")
    if archived is not None:
        qs = qs.filter(archived_at__isnull=not archived)
    return qs


def tasks_of_run(run: TuningRun) -> QuerySet[TuningTask]:
    return TuningTask.objects.filter(run=run).order_by("index")


def tasks_without_measurement(run: TuningRun) -> list[str]:
    """Names of the run's tasks no candidate of which measured successfully: the end-to-end estimate
    (a sum over task bests) leaves them out."""
    return list(TuningTask.objects.filter(run=run, best_latency_s__isnull=True).order_by("index")
                .values_list("name", flat=True))


def measurements_of_run(run: TuningRun) -> QuerySet[Measurement]:
    return Measurement.objects.filter(run=run).select_related("task").order_by("id")


def dop_rounds_of_run(run: TuningRun) -> QuerySet[DopRound]:
    return DopRound.objects.filter(run=run).order_by("round_index")


def _best_so_far(run: TuningRun, *, state: dict | None = None):
    """For each stored measurement of `run`, in the order stored: (trial number, its task index, the best
    valid latency per task so far, when it was stored). The dict is the same object each time.

    `state`, when given, is filled as the rows go by with where the series stand: {"n": trials seen,
    "last_id": the last Measurement id, "best": a copy of the best per task}, the cursor a live poller
    continues from (frontend.presenters.run_live_delta, with measurements_after)."""
    rows = (Measurement.objects.filter(run=run).order_by("id")
            .values_list("task__index", "latency_s", "error", "created_at", "id"))
    best: dict[int, float] = {}
    n, last_id = 0, 0
    for n, (task_index, latency, error, created_at, last_id) in enumerate(rows.iterator(), 1):  # noqa: B007 - read after the loop
        if latency is not None and not error and latency < best.get(task_index, float("inf")):
            best[task_index] = latency
        yield n, task_index, best, created_at
    if state is not None:
        state.update(n=n, last_id=last_id, best=dict(best))


def measurements_after(run: TuningRun, after_id: int, *, limit: int) -> list[tuple]:
    """(id, task index, latency_s, error) of the run's measurements stored after id `after_id`, in the
    order stored, at most `limit` of them: a live poll reads only what is new since its cursor."""
    return list(Measurement.objects.filter(run=run, id__gt=after_id).order_by("id")
                .values_list("id", "task__index", "latency_s", "error")[:limit])


def end_to_end_estimate(tasks: dict[int, TuningTask], best: dict[int, float]) -> float | None:
    """Sum over tasks of weight x best latency; None while a task has no valid measurement."""
    return _end_to_end(tasks, best)


def _end_to_end(tasks: dict[int, TuningTask], best: dict[int, float]) -> float | None:
    """Sum over tasks of weight x best latency; None while a task has no valid measurement."""
    if not tasks or len(best) < len(tasks):
        return None
    return sum(tasks[i].weight * best[i] for i in tasks)


def best_so_far_curve(run: TuningRun, *, max_points: int = 500, state: dict | None = None) -> dict:
    """Per task and end-to-end best latency vs trial number, downsampled server-side.

    Returns {"tasks": {index: {"trials": [...], "best_s": [...]}}, "end_to_end": {"trials", "estimate_s"}}.
    `state` (a dict) receives where the series end (see _best_so_far), read in the same pass.
    """
    tasks = {t.index: t for t in tasks_of_run(run)}
    per_task: dict[int, tuple[list, list]] = {i: ([], []) for i in tasks}
    e2e_trials, e2e_values = [], []
    for n, task_index, best, _ in _best_so_far(run, state=state):
        trials, values = per_task.setdefault(task_index, ([], []))
        trials.append(n)
        values.append(best.get(task_index))
        estimate = _end_to_end(tasks, best)
        if estimate is not None:
            e2e_trials.append(n)
            e2e_values.append(estimate)

    out_tasks = {}
    for index, (xs, ys) in per_task.items():
        xs, ys = thin(xs, ys, max_points)
        out_tasks[index] = {"name": tasks[index].name if index in tasks else str(index), "trials": xs, "best_s": ys}
    xs, ys = thin(e2e_trials, e2e_values, max_points)
    return {"tasks": out_tasks, "end_to_end": {"trials": xs, "estimate_s": ys}}


def time_to_parity(run: TuningRun, goal_s: float | None) -> dict | None:
    """The first stored measurement at which the best-so-far end-to-end estimate reached `goal_s`
    (onnxruntime's latency): {"trials", "wall_s" (from the run's start), "estimate_s"}; None if it never did."""
    if not goal_s:
        return None
    tasks = {t.index: t for t in tasks_of_run(run)}
    for n, _, best, created_at in _best_so_far(run):
        estimate = _end_to_end(tasks, best)
        if estimate is not None and estimate <= goal_s:
            wall = (created_at - run.started_at).total_seconds() if run.started_at else None
            return {"trials": n, "wall_s": max(0.0, wall) if wall is not None else None, "estimate_s": estimate}
    return None


# --- quota reads ---------------------------------------------------------------------

def trials_used_since(team_id: int, since) -> int:
    """Every build+measure done for the team since `since`, from the usage ledger (deleted and archived
    runs included): trials (imported records included: the platform measures them) plus the final serial
    re-measures of its runs."""
    return team_usage_since(team_id, since)[0]


def trials_used_this_month(team_id: int) -> int:
    return trials_used_since(team_id, month_start())


def trials_reserved(team_id: int) -> int:
    """Trials still to come from runs that are queued, running or paused."""
    active = TuningRun.objects.filter(team_id=team_id, status__in=[*TuningRun.ACTIVE, TuningRun.Status.PAUSED])
    total = active.aggregate(budget=Sum("max_trials"), done=Sum("trials_done"))
    return max(0, (total["budget"] or 0) - (total["done"] or 0))


def active_run_count(team_id: int) -> int:
    """The team's runs holding a concurrent-run slot: sent to a worker (queued) or running."""
    return TuningRun.objects.filter(team_id=team_id, status__in=TuningRun.ACTIVE, waiting_since__isnull=True).count()


def waiting_runs(team_id: int):
    """The team's runs waiting for a concurrent-run slot, first to be sent first."""
    return TuningRun.objects.filter(team_id=team_id, status=TuningRun.Status.QUEUED,
                                    waiting_since__isnull=False).order_by("waiting_since", "pk")



def energy_joules_this_month(team_id: int, *, exclude_run: int | None = None) -> float:
    """The team's energy this month from the usage ledger (deleted and archived runs included)."""
    return team_usage_since(team_id, month_start(), exclude_run=exclude_run)[1]


def joules_per_trial_estimate(team_id: int) -> tuple[float, str]:
    """Energy one trial costs, from the team's finished runs, else the platform default."""
    done = TuningRun.objects.filter(team_id=team_id, status=TuningRun.Status.SUCCEEDED, trials_done__gt=0,
                                    energy_joules__gt=0).aggregate(j=Sum("energy_joules"), n=Sum("trials_done"))
    if done["n"]:
        return done["j"] / done["n"], f"the team's past runs ({done['n']} trials)"
    return energy_model().joules_per_trial_estimate, "the platform default per-trial estimate"


def usage_since(team_id: int, since) -> dict:
    """The tuning app's part of a team's usage (core.selectors' usage provider)."""
    trials, joules = team_usage_since(team_id, since)
    return {"concurrent_runs": active_run_count(team_id), "tuning_trials_this_month": trials,
            "energy_kwh_this_month": joules_to_kwh(joules)}


def seconds_until_next_stale() -> float | None:
    """When the first running run still holding a live lease goes stale if its executor sends no more
    heartbeats (None when there is none): a worker that starts while a dead worker's lease is still
    live checks again then."""
    beats = TuningRun.objects.filter(status=TuningRun.Status.RUNNING, heartbeat_at__isnull=False)
    first = beats.aggregate(m=Min("heartbeat_at"))["m"]
    if first is None:
        return None
    return max(0.0, (first - timezone.now()).total_seconds() + settings.TUNING_STALE_AFTER_S)
