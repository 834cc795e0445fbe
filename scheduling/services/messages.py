"""The scheduling app's Celery messages, sent from services after commit.

Tasks import services, so services do not import ``scheduling.tasks``: a task is found by the name it is
registered under (the same names ``CELERY_TASK_ROUTES`` routes by). A broker outage is logged and handed to
``on_error`` by ``core.dispatch.send_on_commit``, never raised into the committed work.
"""
from __future__ import annotations

from collections.abc import Callable

from celery import current_app

from core.dispatch import send_on_commit
from core.services import notify_terminal

PLACE_PENDING = "scheduling.place_pending"
RUN_JOB = "scheduling.run_job"
RUN_SIMULATION = "scheduling.run_simulation"
TRAIN_PREDICTOR = "scheduling.train_predictor"


def send_after_commit(task_name: str, *, args: list | None = None, queue: str | None = None, what: str,
                      on_error: Callable[[BaseException], None] | None = None) -> None:
    """``task_name`` with ``args`` (to ``queue``, else its route) once the current transaction commits."""
    def send():
        task = current_app.tasks[task_name]
        if queue is None:
            task.delay(*(args or []))
        else:
            task.apply_async(args=list(args or []), queue=queue)

    send_on_commit(send, what=what, on_error=on_error)


def send_with_id_after_commit(task_name: str, *, task_id: str, kwargs: dict, what: str,
                              on_error: Callable[[BaseException], None] | None = None) -> None:
    """``task_name`` with ``kwargs`` under a task id chosen by the sender (whose result row it polls)."""
    send_on_commit(lambda: current_app.tasks[task_name].apply_async(kwargs=kwargs, task_id=task_id),
                   what=what, on_error=on_error)


def announce_job_end(job) -> None:
    """Tell the team's webhook (if it has one) that the GPU job ended; call it where a job becomes
    terminal, inside that transaction (core.services.webhooks sends after commit, once per job)."""
    notify_terminal(team_id=job.team_id, kind="gpu_job", object_id=job.pk, state=job.state, data={
        "model_id": job.model_id, "batch_size": job.batch_size, "error": (job.error or "")[:500]})
