"""Celery tasks: thin, idempotent wrappers over tuning.services.

TVM is imported inside the tasks, never at worker start: forking after TVM's
thread pool has run hangs the child (TVM 0.27's thread pool does not survive fork).

Time limits, per queue: a soft limit raises inside the task (a tuning run then fails, saying so); the
hard limit, a minute or more later, kills a task that ignored it. A run's limit stays under the Redis
visibility timeout (CELERY_VISIBILITY_TIMEOUT), so a live run is never re-delivered.
"""
from __future__ import annotations

import socket

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from tuning.engine.measuring.measure import measure_payload_isolated

from . import selectors, services

RUN_SOFT_LIMIT_S = settings.TUNING_RUN_TIME_LIMIT_S  # `tuning` queue
RECOVERY_SOFT_LIMIT_S = 120  # `tuning` queue, a few queries per stale run
SETTLE_SOFT_LIMIT_S = 300  # `tuning` queue, a TVM open (a child process) per unsettled run, a few a sweep
MEASURE_SOFT_LIMIT_S = settings.TUNING_MEASURE_TIMEOUT_S  # `measure.<node>.*` queues: the runner's own deadline
HARD_AFTER_SOFT_S = 60


@shared_task(name="tuning.execute_run", bind=True, acks_late=True, reject_on_worker_lost=True,
             soft_time_limit=RUN_SOFT_LIMIT_S, time_limit=RUN_SOFT_LIMIT_S + 5 * HARD_AFTER_SOFT_S)
def execute_run(self, run_id: int) -> str | None:
    return services.execute_run(run_id=run_id, worker=self.request.hostname or socket.gethostname())


@shared_task(name="tuning.recover_stale_runs", soft_time_limit=RECOVERY_SOFT_LIMIT_S,
             time_limit=RECOVERY_SOFT_LIMIT_S + HARD_AFTER_SOFT_S)
def recover_stale_runs(recheck: bool = False) -> list[int]:
    """Beat runs it periodically; a starting worker runs it with `recheck`: a run whose dead executor's
    lease has not expired yet is checked again the moment it expires (once), not only at the next beat."""
    recovered = services.recover_stale_runs()
    services.dispatch_all_waiting_runs()  # a slot freed where no dispatch followed (a crash) is not missed
    if recheck:
        delay = selectors.seconds_until_next_stale()
        if delay is not None:
            recover_stale_runs.apply_async(queue="tuning", countdown=delay + 1.0)
    return recovered


@shared_task(name="tuning.settle_ended_runs", soft_time_limit=SETTLE_SOFT_LIMIT_S,
             time_limit=SETTLE_SOFT_LIMIT_S + HARD_AFTER_SOFT_S)
def settle_ended_runs() -> list[int]:
    """Beat runs it each minute: ended runs whose TVM database lags their stored results are settled."""
    return services.sweep_unsettled_runs()


@shared_task(name="tuning.settle_run_database", soft_time_limit=SETTLE_SOFT_LIMIT_S,
             time_limit=SETTLE_SOFT_LIMIT_S + HARD_AFTER_SOFT_S)
def settle_run_database(run_id: int) -> int | None:
    """Sent when a run ends with no live executor (a cancel of a queued or paused run, recovery)."""
    return services.settle_ended_run(run_id=run_id)


@shared_task(name="tuning.measure_candidate", acks_late=True, soft_time_limit=MEASURE_SOFT_LIMIT_S,
             time_limit=MEASURE_SOFT_LIMIT_S + HARD_AFTER_SOFT_S)
def measure_candidate(payload: dict) -> dict:
    """Measure one built candidate shipped by a DistributedRunner (needs only TVM's runtime), in a
    sandboxed subprocess: the candidate never loads into this worker, next to its credentials."""
    return measure_payload_isolated(payload)


@worker_ready.connect
def _recover_on_start(sender=None, **kwargs):
    # A restarted worker picks up runs orphaned by a crash without waiting for beat.
    app = getattr(sender, "app", None)
    consuming = getattr(app.amqp.queues, "consume_from", None) if app is not None else None
    if consuming and "tuning" in consuming:
        recover_stale_runs.apply_async(kwargs={"recheck": True}, queue="tuning", countdown=1)
