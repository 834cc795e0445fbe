"""Celery plumbing for the engine's DistributedRunner (the engine itself stays Celery-free).

`celery_submit(payload)` sends one built candidate to its device queue
(`measure.<host>.cpu` or `measure.<host>.gpu<i>`) and returns a
concurrent.futures.Future that resolves to the worker's outcome dict, so the
tuning host keeps searching and building while remote devices measure.

The tuning engine runs in a child process of the Celery worker (tuning.engine.process.isolate), never in task
context, and the waiters below never call `AsyncResult.get()`: they poll the task's state in the result
backend. The measuring deadline starts when a worker reports the task STARTED (task_track_started), not
at submission: a candidate waiting in a busy queue is not a failed one. Everything that is not the
worker's own answer (nobody took it, it took too long, the task raised) resolves the future with an
exception, which the DistributedRunner reports as an infrastructure failure (kept out of the cost model).
"""
from __future__ import annotations

import concurrent.futures
import threading
import time

_waiters: concurrent.futures.ThreadPoolExecutor | None = None
_lock = threading.Lock()


class MeasurementLost(RuntimeError):
    """The measurement task gave no outcome (never taken, too slow, or the task itself failed)."""


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _waiters
    with _lock:
        if _waiters is None:
            _waiters = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="measure-wait")
        return _waiters


def _poll(async_result, queue: str, *, run_timeout: float, queue_timeout: float) -> dict:
    from celery import states

    submitted, started, interval = time.monotonic(), None, 0.02
    while True:
        state = async_result.state  # a result-backend read, no join
        now = time.monotonic()
        if state in states.READY_STATES:
            break
        if state == states.STARTED and started is None:
            started = now
        if started is not None and now - started > run_timeout:
            raise MeasurementLost(f"{queue}: no result {run_timeout:g} s after a worker started measuring")
        if started is None and now - submitted > queue_timeout:
            raise MeasurementLost(f"{queue}: no worker took the measurement in {queue_timeout:g} s")
        time.sleep(interval)
        interval = min(0.25, interval * 1.5)
    if state != states.SUCCESS:
        raise MeasurementLost(f"{queue}: the measurement task ended {state}: {async_result.result!r}")
    return async_result.result


def _wait(async_result, queue: str) -> dict:
    from django.conf import settings
    from django.db import connection

    try:
        return _poll(async_result, queue, run_timeout=settings.TUNING_MEASURE_TIMEOUT_S,
                     queue_timeout=settings.TUNING_MEASURE_QUEUE_TIMEOUT_S)
    finally:
        connection.close()  # the result backend's DB connection belongs to this waiter thread


def celery_submit(payload: dict, target: dict | None = None) -> concurrent.futures.Future:
    """Send `payload` to its queue. `target`: what the candidate was built for; the measuring worker
    refuses it when its own CPU is another (tuning.engine.compile.targets.measurable_refusal)."""
    from .tasks import measure_candidate

    if target:
        payload = {**payload, "target": target}
    queue = payload.get("queue")
    if not queue:
        raise ValueError("payload has no device queue")
    result = measure_candidate.apply_async(args=[payload], queue=queue)
    return _pool().submit(_wait, result, queue)
