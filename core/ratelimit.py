"""Counting events in a time window, atomically, in Django's cache (Redis in the compose deployment,
DJANGO_CACHE_URL, so every web worker shares the counts; per process otherwise).

A window opens at the first event of a key and lasts ``period`` seconds. Counts use ``cache.add`` (only
the first writer creates the key) and ``cache.incr`` (atomic in Redis and in the local-memory cache), never
get-then-set: two uploads arriving together cannot both read "59" and both pass a limit of 60.
"""
from __future__ import annotations

import math
import time

from django.core.cache import cache

_DURATIONS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """'60/hour' -> (60, 3600): DRF's rate format (the unit's first letter counts)."""
    count, _, unit = rate.partition("/")
    return int(count), _DURATIONS[unit.strip()[0].lower()]


def hit(key: str, period: int) -> int:
    """Count one event against ``key``'s current window; return the count so far, this event included."""
    if cache.add(key, 1, timeout=period):
        cache.set(f"{key}:opened", time.time(), timeout=period)
        return 1
    try:
        return cache.incr(key)
    except ValueError:  # the window ended between add and incr: this event opens the next one
        cache.add(key, 0, timeout=period)
        cache.add(f"{key}:opened", time.time(), timeout=period)
        return cache.incr(key)


def count(key: str) -> int:
    """The count in ``key``'s current window (0 when none is open); counts nothing."""
    return int(cache.get(key) or 0)


def seconds_left(key: str, period: int) -> int:
    """Whole seconds until ``key``'s current window closes (at least 1)."""
    opened = cache.get(f"{key}:opened")
    if opened is None:
        return period
    return max(1, math.ceil(opened + period - time.time()))


def reset(key: str) -> None:
    cache.delete_many([key, f"{key}:opened"])
