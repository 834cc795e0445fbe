"""The scheduling app's Celery messages, sent from services after commit.

Tasks import services, so services do not import ``scheduling.tasks``: a task is found by the name it is
registered under (the same names ``CELERY_TASK_ROUTES`` routes by). A broker outage is logged and handed to
``on_error`` by ``core.dispatch.send_on_commit``, never raised into the committed work.
"""
from __future__ import annotations

from collections.abc import Callable

from celery import current_app

from core.dispatch import send_on_commit

PLACE_PENDING = "scheduling.place_pending"
RUN_JOB = "scheduling.run_job"
RUN_SIMULATION = "scheduling.run_simulation"


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
