"""Reconnect, don't die: a long task (a tuning run's executor, its heartbeat thread) outlives a database
blip. Django opens a connection per thread and never replaces a broken one by itself inside a task; here
a transient error closes this thread's connection (the next query opens a new one) and the call is tried
again with backoff, for as long as the caller's lease allows.

`FencedSink` is the executor's side of the engine's sink: each call reconnects and retries; a sink that
keeps failing (for `give_up_after_s`, or with a lost lease) stops the engine through its `Abort` instead
of letting it tune on with nobody storing what it measures."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from .sink import DatabaseSink, LeaseLost

log = logging.getLogger(__name__)

TRANSIENT_DB_ERRORS = (OperationalError, InterfaceError)
FIRST_DELAY_S, MAX_DELAY_S = 0.5, 5.0


def heartbeat_interval_s() -> float:
    """How often a live executor proves it is alive: a quarter of the staleness threshold (so a busy
    machine can miss three beats before the run is presumed dead), at least every 2 s."""
    return max(DatabaseSink.HEARTBEAT_EVERY_S, settings.TUNING_STALE_AFTER_S / 4)


def lease_margin_s() -> float:
    """How long an executor that cannot reach the database keeps its engine running: until a quarter of
    the staleness threshold before its lease may be given to another executor (a heartbeat interval)."""
    return max(heartbeat_interval_s(), settings.TUNING_STALE_AFTER_S - heartbeat_interval_s())


def reset_connection() -> None:
    """Drop this thread's (broken) connection; the next query opens a fresh one."""
    with contextlib.suppress(Exception):
        connection.close()


def call_reconnecting(fn: Callable, *args, deadline: float, should_stop: Callable[[], bool] = lambda: False):
    """``fn(*args)``, retried with backoff after a transient database error until ``deadline``
    (``time.monotonic()``) or ``should_stop()``; then the last error is raised."""
    delay = FIRST_DELAY_S
    while True:
        try:
            return fn(*args)
        except TRANSIENT_DB_ERRORS as exc:
            if connection.in_atomic_block:  # the caller's transaction is gone with the connection
                raise
            reset_connection()
            if should_stop() or time.monotonic() + delay > deadline:
                raise
            log.warning("database unreachable (%s); retrying in %.1f s", exc, delay)
            time.sleep(delay)
            delay = min(MAX_DELAY_S, delay * 2)


def _ping() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def wait_for_database(*, within_s: float) -> None:
    """Make sure this thread has a working connection (after a long engine call, the server may have
    dropped it), reconnecting with backoff for up to ``within_s``; the last error when it never comes."""
    call_reconnecting(_ping, deadline=time.monotonic() + within_s)


class FencedSink:
    """Wraps a DatabaseSink for an engine call: the same methods, each reconnecting on a transient error;
    after ``give_up_after_s`` of failing calls (or at a lost lease) ``abort`` is triggered, which kills
    the engine (tuning.engine.process.isolate.Abort)."""

    def __init__(self, sink, abort, *, give_up_after_s: float):
        self._sink, self._abort, self._give_up_after_s = sink, abort, give_up_after_s
        self._failing_since: float | None = None

    def __getattr__(self, name: str):
        method = getattr(self._sink, name)  # AttributeError for a method the sink lacks, as hasattr expects
        if not callable(method) or name.startswith("_"):
            return method

        def call(*args):
            started = self._failing_since if self._failing_since is not None else time.monotonic()
            try:
                value = call_reconnecting(method, *args, deadline=started + self._give_up_after_s,
                                          should_stop=self._abort.is_set)
            except LeaseLost as exc:
                self._abort.trigger(str(exc))
                raise
            except Exception as exc:
                self._failing_since = started
                if time.monotonic() - started >= self._give_up_after_s:
                    self._abort.trigger(f"the platform could not store the run's results for "
                                        f"{self._give_up_after_s:.0f} s (last error: {type(exc).__name__}: {exc})")
                raise
            self._failing_since = None
            return value

        return call
