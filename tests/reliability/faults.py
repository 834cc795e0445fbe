"""Fault injection for the reliability tests: fail the Nth SQL statement, run a private Redis server, point
the cache at a Redis that is not there."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

# --- failing the Nth SQL statement --------------------------------------------------------------

class FailNth:
    """connection.execute_wrapper that raises a real database error on the Nth matching statement
    (counting from 1); `pattern` filters statements (a regex on the SQL, e.g. r'^\\s*INSERT'); `message` is
    the error's text (e.g. a full disk's "could not extend file ...: No space left on device")."""

    def __init__(self, n: int, pattern: str = r"^\s*INSERT", message: str | None = None):
        self.n, self.regex, self.seen, self.failed_sql = n, re.compile(pattern, re.I), 0, None
        self.message = message

    def __call__(self, execute, sql, params, many, context):
        if self.regex.search(sql):
            self.seen += 1
            if self.seen == self.n:
                from django.db import OperationalError

                self.failed_sql = sql
                raise OperationalError(self.message or f"injected failure of statement #{self.n}: {sql[:80]}")
        return execute(sql, params, many, context)


@contextmanager
def fail_nth(n: int, pattern: str = r"^\s*INSERT", message: str | None = None):
    wrapper = FailNth(n, pattern, message)
    with connection.execute_wrapper(wrapper):
        yield wrapper


def count_statements(fn, pattern: str = r"^\s*INSERT") -> int:
    """How many statements matching `pattern` fn() runs (inside a rolled-back savepoint)."""
    from django.db import transaction

    counter = FailNth(10**9, pattern)
    with transaction.atomic():
        with connection.execute_wrapper(counter):
            fn()
        transaction.set_rollback(True)
    return counter.seen


# --- a cache whose Redis is not there ----------------------------------------------------------------

DEAD_REDIS_URL = "redis://127.0.0.1:1/0"  # port 1: nothing listens, a connection is refused at once


def dead_cache(settings) -> None:
    """Point Django's cache at a Redis nothing listens on, with the deployment's backend. Setting CACHES
    through pytest-django's ``settings`` makes Django drop its cache handlers (setting_changed), so the
    next ``cache`` call builds the new backend; the old ones come back when the test ends."""
    settings.CACHES = {"default": {"BACKEND": "core.cache.DegradingRedisCache", "LOCATION": DEAD_REDIS_URL,
                                   "OUTAGE_RETRY_S": 60.0}}
    from django.core.cache import cache

    cache.clear()  # the per-process fallback outlives a test: start from zero counts, as with Redis


# --- a private Redis server ------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """redis-server on a free loopback port in a temp dir; kill() and start() keep the port and the dir.
    `aof=True` persists like the deployment's Redis (docker-compose.yml: --appendonly yes)."""

    def __init__(self, *, aof: bool = False):
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            pytest.skip("redis-server is not installed (scripts/test.sh installs it)")
        self.binary, self.port = binary, free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="dlopt-redis-"))
        self.proc: subprocess.Popen | None = None
        self.aof = aof

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> None:
        log = open(self.dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.aof else "no", "--dir", str(self.dir)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError((self.dir / "redis.log").read_text(errors="replace")[-2000:])
            time.sleep(0.1)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
