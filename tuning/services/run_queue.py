"""How runs are sent to the `tuning` queue, and the team's queue of runs waiting for a concurrent-run slot.

A run started (or resumed) while all of its team's `max_concurrent_runs` slots are taken is not refused:
it is stored `queued` with `waiting_since` set and sent to a worker, oldest first, when a slot frees
(a run of the team ends, pauses or is cancelled). Like the simulations' queue
(scheduling/services/simulation_queue.py), each dispatch holds the team's quota lock and re-checks the
slot, so two callers never send more runs than the quota allows.
"""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from core.dispatch import send_on_commit
from core.services import lock_team_quota
from tuning import selectors
from tuning.models import TuningRun



def enqueue_run(run: TuningRun) -> None:
    """Send the run to the `tuning` queue once the transaction commits.

    The run is committed by then, so a broker outage must not turn the request into a 500: the run is
    paused instead (nothing it did is lost; resume it once the broker is back), with the reason in
    `error`, in the database and on `run`, which the caller answers with."""

    def pause_for_broker(exc: BaseException) -> None:
        run.status = TuningRun.Status.PAUSED
        run.error = (f"Could not be queued: the task broker is unreachable ({exc}). The run is paused; "
                     "resume it when the broker is back.")
        TuningRun.objects.filter(pk=run.pk, status=TuningRun.Status.QUEUED).update(
            status=run.status, error=run.error, lease="")

    send_on_commit(lambda: _tasks().execute_run.delay(run.pk), what=f"tuning run {run.pk}",
                   on_error=pause_for_broker)


def _tasks():
    from tuning import tasks  # services import tasks only when they send one (tasks import services)

    return tasks


def dispatch_run(run: TuningRun) -> None:
    """How every service sends a run (tests replace `enqueue_run`, looked up here at call time)."""
    enqueue_run(run)


def dispatch_waiting_runs(*, team_id: int) -> list[int]:
    """Send the team's waiting runs that free slots allow now, oldest first; returns their ids."""
    sent: list[int] = []
    with transaction.atomic():
        quota = lock_team_quota(team_id)
        free = quota.max_concurrent_runs - selectors.active_run_count(team_id)
        for run in list(selectors.waiting_runs(team_id).select_for_update()[:max(0, free)]):
            TuningRun.objects.filter(pk=run.pk).update(waiting_since=None)
            run.waiting_since = None
            dispatch_run(run)
            sent.append(run.pk)
    return sent


def dispatch_when_slot_frees(team_id: int) -> None:
    """After the current transaction commits (a run of the team left its slot), send the next waiting runs."""
    transaction.on_commit(lambda: dispatch_waiting_runs(team_id=team_id))


def dispatch_all_waiting_runs() -> list[int]:
    """Every team's dispatch (the periodic recovery calls it: a slot freed by a crash is not missed)."""
    teams = set(TuningRun.objects.filter(status=TuningRun.Status.QUEUED, waiting_since__isnull=False)
                .values_list("team_id", flat=True))
    return [pk for team_id in sorted(teams) for pk in dispatch_waiting_runs(team_id=team_id)]


def wait_for_slot(run: TuningRun) -> None:
    """Put `run` (queued, saved by the caller) at the back of its team's queue."""
    run.waiting_since = timezone.now()
