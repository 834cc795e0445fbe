"""Reads for tuning runs, scoped to the caller's teams."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from core.selectors import teams_for_user

from .models import DopRound, Measurement, TuningRun, TuningTask


def runs_for_user(user: AbstractBaseUser) -> QuerySet[TuningRun]:
    return TuningRun.objects.filter(team__in=teams_for_user(user)).select_related("model", "team")


def tasks_of_run(run: TuningRun) -> QuerySet[TuningTask]:
    return TuningTask.objects.filter(run=run).order_by("index")


def measurements_of_run(run: TuningRun) -> QuerySet[Measurement]:
    return Measurement.objects.filter(run=run).select_related("task").order_by("id")


def dop_rounds_of_run(run: TuningRun) -> QuerySet[DopRound]:
    return DopRound.objects.filter(run=run).order_by("round_index")


def best_so_far_curve(run: TuningRun, *, max_points: int = 500) -> dict:
    """Per task and end-to-end best latency vs trial number, downsampled server-side.

    Returns {"tasks": {index: {"trials": [...], "best_s": [...]}}, "end_to_end": {"trials", "estimate_s"}}.
    """
    tasks = {t.index: t for t in tasks_of_run(run)}
    rows = (Measurement.objects.filter(run=run).order_by("id")
            .values_list("task__index", "latency_s", "error"))
    best: dict[int, float] = {}
    per_task: dict[int, tuple[list, list]] = {i: ([], []) for i in tasks}
    e2e_trials, e2e_values = [], []
    for n, (task_index, latency, error) in enumerate(rows.iterator(), 1):
        if latency is not None and not error and latency < best.get(task_index, float("inf")):
            best[task_index] = latency
        trials, values = per_task.setdefault(task_index, ([], []))
        trials.append(n)
        values.append(best.get(task_index))
        if tasks and len(best) == len(tasks):
            e2e_trials.append(n)
            e2e_values.append(sum(tasks[i].weight * best[i] for i in tasks))

    def thin(xs, ys):
        if len(xs) <= max_points:
            return xs, ys
        step = len(xs) / max_points
        idx = sorted({int(i * step) for i in range(max_points)} | {len(xs) - 1})
        return [xs[i] for i in idx], [ys[i] for i in idx]

    out_tasks = {}
    for index, (xs, ys) in per_task.items():
        xs, ys = thin(xs, ys)
        out_tasks[index] = {"name": tasks[index].name if index in tasks else str(index), "trials": xs, "best_s": ys}
    xs, ys = thin(e2e_trials, e2e_values)
    return {"tasks": out_tasks, "end_to_end": {"trials": xs, "estimate_s": ys}}
