"""Celery application.

Broker: Redis when REDIS_URL is set (deployment), otherwise kombu's SQLAlchemy
transport over a local SQLite file, so a fresh machine needs no server.
Workers are always real processes; eager mode is used nowhere in the product.

Routes live in settings.CELERY_TASK_ROUTES only (never on a task's decorator); time limits per queue
in settings.CELERY_QUEUE_TIME_LIMITS, stamped on each message as it is published (below), so a task
sent to a per-node queue (``measure.<node>.gpu0``) gets that queue's limits too.
"""
import os
from fnmatch import fnmatchcase

from celery import Celery
from celery.signals import before_task_publish

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


@before_task_publish.connect(weak=False, dispatch_uid="dlopt-queue-time-limits")
def stamp_queue_time_limits(sender=None, headers=None, routing_key=None, **_):
    """Give a message without limits of its own those of its queue (the routing key is the queue name:
    every queue here is a direct one). The worker enforces the header's (hard, soft) pair."""
    if headers is None or not routing_key:
        return
    hard, soft = headers.get("timelimit") or (None, None)
    if hard is not None or soft is not None:
        return  # the sender chose (apply_async(time_limit=..., soft_time_limit=...))
    limits = queue_time_limits(routing_key)
    if limits is not None:
        headers["timelimit"] = (limits[1], limits[0])
