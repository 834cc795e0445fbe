"""Celery plumbing for the engine's DistributedRunner (the engine itself stays Celery-free).

`celery_submit(payload)` sends one built candidate to its device queue
(`measure.<host>.cpu` or `measure.<host>.gpu<i>`) and returns a
concurrent.futures.Future that resolves to the worker's outcome dict, so the
tuning host keeps searching and building while remote devices measure.
"""
from __future__ import annotations

import concurrent.futures
import threading

_waiters: concurrent.futures.ThreadPoolExecutor | None = None
_lock = threading.Lock()
RESULT_TIMEOUT_S = 600.0


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _waiters
    with _lock:
        if _waiters is None:
            _waiters = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="measure-wait")
        return _waiters


def _wait(async_result) -> dict:
    from django.db import connection

    try:
        # Short polling interval: a candidate measures in milliseconds to seconds.
        return async_result.get(timeout=RESULT_TIMEOUT_S, interval=0.02, propagate=True)
    finally:
        connection.close()  # the result backend's DB connection belongs to this waiter thread


def celery_submit(payload: dict) -> concurrent.futures.Future:
    from .tasks import measure_candidate

    queue = payload.get("queue")
    if not queue:
        raise ValueError("payload has no device queue")
    result = measure_candidate.apply_async(args=[payload], queue=queue)
    return _pool().submit(_wait, result)
