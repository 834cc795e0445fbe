"""Celery application.

Broker: Redis when REDIS_URL is set (deployment), otherwise kombu's SQLAlchemy
transport over a local SQLite file, so a fresh machine needs no server.
Workers are always real processes; eager mode is used nowhere in the product.

Routes live in settings.CELERY_TASK_ROUTES only (never on a task's decorator). Time limits: a task's
own (``soft_time_limit``/``time_limit`` on its decorator, or given to ``apply_async``) win; a task
without any gets those of the queue its message is published to, from settings.CELERY_QUEUE_TIME_LIMITS,
stamped on the message (below), so a task sent to a per-node queue (``measure.<node>.gpu0``) gets that
queue's limits too.
"""
import os
from fnmatch import fnmatchcase

from celery import Celery
from celery.signals import beat_init, before_task_publish

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("dlopt")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def queue_time_limits(queue: str) -> tuple[float, float] | None:
    """(soft, hard) seconds for messages on ``queue``: the first matching pattern of the settings' table."""
    from django.conf import settings

    for pattern, limits in settings.CELERY_QUEUE_TIME_LIMITS.items():
        if fnmatchcase(queue, pattern):
            return limits
    return None


def _declares_own_limits(task_name: str) -> bool:
    task = app.tasks.get(task_name)
    if task is None:  # a publisher that sends by name: load every app's tasks once, then look again
        app.loader.import_default_modules()
        task = app.tasks.get(task_name)
    return task is not None and (task.time_limit is not None or task.soft_time_limit is not None)


@before_task_publish.connect(weak=False, dispatch_uid="dlopt-queue-time-limits")
def stamp_queue_time_limits(sender=None, headers=None, routing_key=None, **_):
    """Give a message whose task has no limits of its own those of its queue (the routing key is the
    queue name: every queue here is a direct one). The worker enforces the header's (hard, soft) pair
    before the task's, so the header is left empty wherever the task or its sender chose."""
    if headers is None or not routing_key:
        return
    hard, soft = headers.get("timelimit") or (None, None)
    if hard is not None or soft is not None or _declares_own_limits(sender):
        return
    limits = queue_time_limits(routing_key)
    if limits is not None:
        headers["timelimit"] = (limits[1], limits[0])


# --- exactly one beat ------------------------------------------------------------------------------------
# `scripts/worker.sh` runs beat inside the worker (-B): a forked child of the worker's main process. A
# SIGKILLed worker used to leave it running, so the restarted worker's beat made two, and every periodic
# task ran twice. The embedded beat now dies with its worker (death signal + parent watchdog), and any
# beat holds VAR_DIR/celerybeat.lock for its life: a second beat on this host waits for the first to end
# and then takes over (one beat per deployment on one host; on several hosts run beat on one of them).
_beat_lock_fd = None


def _is_embedded_beat() -> bool:
    """In the process `celery worker -B` forks for beat (celery.beat's embedded service names it "Beat")."""
    from billiard.process import current_process

    return current_process().name == "Beat"


@beat_init.connect(weak=False, dispatch_uid="dlopt-one-beat")
def _one_beat_at_a_time(sender=None, **_):
    import logging

    from django.conf import settings

    from tuning.engine.process.lifeline import take_lock

    global _beat_lock_fd
    log = logging.getLogger("celery.beat")
    if _is_embedded_beat():  # first: a beat still waiting for the lock must not outlive its worker either
        from tuning.engine.process.lifeline import die_with_parent

        die_with_parent(parent=os.getppid())  # forked by the worker's main thread, which lives as long as it
    path = str(settings.VAR_DIR / "celerybeat.lock")
    _beat_lock_fd = take_lock(path, wait_s=None, poll_s=1.0, on_wait=lambda holder: log.warning(
        "beat: another beat (%s) holds %s; waiting to take over when it ends", holder, path))
    log.info("beat: holds the beat lock (%s)", path)
