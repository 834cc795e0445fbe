"""Django's Redis cache, degraded instead of failing when Redis is unreachable.

In the compose deployment the cache (throttle and sign-in counts, figure bodies, live-page cursors) is the
Redis that is also the Celery broker. Django's own RedisCache raises on every call while that Redis is down
or refuses writes (a full disk: MISCONF; out of memory: OOM), and every API request counts against a
throttle, so one outage turned every request into a 500. ``DegradingRedisCache`` catches those errors and
answers from a per-process local-memory cache instead:

* reads are misses at first (figure bodies are rebuilt, a live page's cursor restarts from the full figure);
* throttles and the sign-in lockout keep counting, per web process instead of across all of them: during
  an outage a client gets up to (limit x web processes) - the limits loosen, they do not vanish. This is
  the "fail open" the platform chose: refusing every request while Redis is down (fail closed) would turn
  a cache outage into a full outage, and a limit per process still bounds password guessing and uploads;
* the first error opens an outage window of ``OUTAGE_RETRY_S`` seconds (a top-level key of the CACHES
  entry, default 5) in which Redis is not tried at all, so requests do not each wait on a dead server;
  the first call after the window tries Redis again. A warning is logged when an outage starts (then at
  most once a minute while it lasts) and one when Redis answers again; the URL is logged without its
  password.

Only outage errors are caught (connection refused or lost, timeouts, and the MISCONF/OOM/READONLY/LOADING
refusals); any other Redis error is a bug and is raised.
"""
from __future__ import annotations

import logging
import threading
import time
from urllib.parse import urlsplit, urlunsplit

from django.core.cache.backends.locmem import LocMemCache
from django.core.cache.backends.redis import RedisCache
from redis import exceptions as redis_errors

log = logging.getLogger(__name__)

# Redis refusals that mean "cannot serve now", not "bad command" (the prefix of the server's error reply;
# redis-py strips it for the ones it has a class for, so those are matched by class too).
_REFUSAL_PREFIXES = ("MISCONF", "OOM", "READONLY", "LOADING", "MASTERDOWN", "NOREPLICAS")
_REFUSAL_CLASSES = tuple(getattr(redis_errors, name) for name in ("ReadOnlyError", "OutOfMemoryError")
                         if hasattr(redis_errors, name))

# Bounded so a slow (not refusing) server cannot hold a request for long; any of them can be overridden
# in the CACHES entry's OPTIONS.
DEFAULT_CONNECTION_OPTIONS = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0}
LOG_EVERY_S = 60.0


def _redacted(url: str) -> str:
    """``url`` without its password (``redis://:secret@host`` -> ``redis://:***@host``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def is_cache_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the Redis server cannot serve right now (rather than that a call was wrong)."""
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError, ConnectionError, TimeoutError)):
        return True
    if isinstance(exc, _REFUSAL_CLASSES):
        return True
    return isinstance(exc, redis_errors.ResponseError) and str(exc).lstrip().startswith(_REFUSAL_PREFIXES)


class _Outage:
    """Shared by every thread's instance of one cache alias (Django makes one backend per thread)."""

    def __init__(self):
        self.until = 0.0
        self.logged_at = -LOG_EVERY_S
        self.was_down = False
        self.lock = threading.Lock()

    def active(self) -> bool:
        return time.monotonic() < self.until


_outages: dict[str, _Outage] = {}
_outages_lock = threading.Lock()


def _outage_for(location: str) -> _Outage:
    with _outages_lock:
        return _outages.setdefault(location, _Outage())


class DegradingRedisCache(RedisCache):
    """RedisCache that answers from a per-process local-memory cache while Redis is unreachable."""

    def __init__(self, server, params):
        super().__init__(server, params)
        self._options = {**DEFAULT_CONNECTION_OPTIONS, **self._options}
        self._retry_s = float(params.get("OUTAGE_RETRY_S", 5.0))
        location = server if isinstance(server, str) else ",".join(server)
        self._outage = _outage_for(location)
        self._label = ",".join(_redacted(u) for u in location.split(","))
        self._fallback = LocMemCache(f"degraded-redis:{location}", {
            "TIMEOUT": params.get("TIMEOUT", 300), "KEY_PREFIX": self.key_prefix, "VERSION": self.version,
            "KEY_FUNCTION": self.key_func, "OPTIONS": {"MAX_ENTRIES": 10_000}})

    @property
    def degraded(self) -> bool:
        """True while answers come from the local fallback."""
        return self._outage.active()

    def _call(self, method: str, *args, **kwargs):
        outage = self._outage
        if outage.active():
            return getattr(self._fallback, method)(*args, **kwargs)
        try:
            result = getattr(RedisCache, method)(self, *args, **kwargs)
        except Exception as exc:
            if not is_cache_outage(exc):
                raise
            now = time.monotonic()
            with outage.lock:
                outage.until = now + self._retry_s
                outage.was_down = True
                tell = now - outage.logged_at >= LOG_EVERY_S
                if tell:
                    outage.logged_at = now
            if tell:
                log.warning("cache %s unreachable (%s: %.200s); answering from a per-process local cache, "
                            "retrying Redis every %.0f s", self._label, type(exc).__name__, exc, self._retry_s)
            return getattr(self._fallback, method)(*args, **kwargs)
        if outage.was_down:
            with outage.lock:
                recovered, outage.was_down = outage.was_down, False
            if recovered:
                log.warning("cache %s answers again; back on Redis", self._label)
        return result


def _guard(name: str):
    """Every public call of RedisCache goes through ``_call`` (decr and get_or_set use these)."""

    def method(self, *args, **kwargs):
        return self._call(name, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = getattr(RedisCache, name).__doc__
    return method


for _name in ("add", "get", "set", "touch", "delete", "get_many", "has_key", "incr", "set_many",
              "delete_many", "clear"):
    setattr(DegradingRedisCache, _name, _guard(_name))
