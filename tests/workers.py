"""Start real Celery worker processes against the test database and the test Redis."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def database_url_for_workers() -> str:
    """The URL of the database the tests are using right now (the test DB)."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        raise RuntimeError("worker processes cannot share an in-memory SQLite test database")
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def worker_env(broker_url: str, **extra) -> dict:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url_for_workers(),
        CELERY_BROKER_URL=broker_url,
        DJANGO_MEDIA_ROOT=str(settings.MEDIA_ROOT),
        DLOPT_VAR_DIR=str(settings.VAR_DIR),
        PYTHONUNBUFFERED="1",
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


class WorkerProcess:
    def __init__(self, proc: subprocess.Popen, log_path: Path, hostname: str):
        self.proc, self.log_path, self.hostname = proc, log_path, hostname

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self, sig=signal.SIGKILL) -> None:
        """Kill the whole worker (main process and pool children), as a crash would."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.kill()


def start_worker(*, broker_url: str, queues: str, log_dir: Path, name: str = "test", pool: str = "solo",
                 concurrency: int = 1, env_extra: dict | None = None, timeout: float = 60.0) -> WorkerProcess:
    log_path = log_dir / f"worker-{name}-{time.time_ns()}.log"
    hostname = f"{name}-{os.getpid()}-{time.time_ns() % 10**6}@testhost"
    cmd = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queues, "--pool", pool,
           "--concurrency", str(concurrency), "--hostname", hostname, "--loglevel", "INFO",
           "--without-gossip", "--without-mingle"]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=worker_env(broker_url, **(env_extra or {})), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    worker = WorkerProcess(proc, log_path, hostname)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited early:\n{worker.log()[-3000:]}")
        if " ready." in worker.log():
            return worker
        time.sleep(0.2)
    worker.kill()
    raise RuntimeError(f"worker not ready in {timeout}s:\n{worker.log()[-3000:]}")


@contextmanager
def running_worker(**kwargs):
    worker = start_worker(**kwargs)
    try:
        yield worker
    finally:
        worker.stop()


def wait_for(predicate, timeout: float, what: str, log=lambda: "", interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy (returned); on timeout fail with the tail of
    ``log()`` (a worker's log, say)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{log()[-4000:]}")
