"""Dashboard test helpers over bench/_support.py's FakeWorker (a pretend tuning worker, no TVM)."""
from __future__ import annotations

from django.db.models import Count

from bench._support import FakeWorker
from tuning.models import TuningRun, TuningTask

__all__ = ["FakeWorker", "make_running_run", "measurements_per_task"]


def make_running_run(*, actor, model, max_trials: int = 64, n_tasks: int = 4, rounds: int = 0,
                     per_round: int = 16, seed: int = 0, **run_fields) -> tuple[TuningRun, FakeWorker]:
    """A queued run (a factory row: these tests are not about start_run's rules) claimed by a FakeWorker
    that has reported `rounds` rounds of `per_round` measurements."""
    from tests.factories import TuningRunFactory

    run = TuningRunFactory(model=model, created_by=actor, max_trials=max_trials, trials_per_round=per_round,
                           **run_fields)
    worker = FakeWorker(run, n_tasks=n_tasks, seed=seed)
    for _ in range(rounds):
        worker.step(per_round)
    run.refresh_from_db()
    return run, worker


def measurements_per_task(run: TuningRun) -> dict[int, int]:
    return dict(TuningTask.objects.filter(run=run).annotate(n=Count("measurements")).values_list("index", "n"))
