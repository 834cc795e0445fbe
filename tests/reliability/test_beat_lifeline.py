"""Exactly one beat: the embedded deployment's worker (scripts/worker.sh, beat inside with -B) SIGKILLed
alone, its children left to themselves: its beat ends with it, a second worker's beat that was waiting
for the beat lock takes over, and never do two beats run at once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers import ROOT, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _env(var_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "TEST_DATABASE_URL", "DJANGO_MEDIA_ROOT")}
    return env | {"DLOPT_VAR_DIR": str(var_dir), "PYTHON": sys.executable, "DLOPT_NODE_NAME": "embedded",
                  "WORKER_CONCURRENCY": "1", "PYTHONUNBUFFERED": "1"}


def _worker(env: dict, log_path: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen(["scripts/worker.sh"], cwd=ROOT, env=env | {"WORKER_HOSTNAME": f"{name}@embedded"},
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_killed_worker_takes_its_beat_along_and_the_waiting_beat_takes_over(tmp_path):
    var = tmp_path / "var"
    env = _env(var)
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    lock = var / "celerybeat.lock"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _worker(env, first_log, "first")
    second = None
    try:
        wait_for(lambda: "holds the beat lock" in first_log.read_text(errors="replace"), 120,
                 "the first worker's beat", lambda: first_log.read_text(errors="replace"))
        first_beat = int(lock.read_text())
        assert first_beat != first.pid and _alive(first_beat)  # a child of the worker, as -B makes it
        second = _worker(env, second_log, "second")
        wait_for(lambda: "waiting to take over" in second_log.read_text(errors="replace"), 120,
                 "the second worker's beat to wait", lambda: second_log.read_text(errors="replace"))
        assert int(lock.read_text()) == first_beat  # one beat: the second one waits
        os.kill(first.pid, signal.SIGKILL)  # the worker's main process only
        wait_for(lambda: not _alive(first_beat), 30, "the killed worker's beat to end")
        wait_for(lambda: "holds the beat lock" in second_log.read_text(errors="replace"), 60,
                 "the second beat to take over", lambda: second_log.read_text(errors="replace"))
        second_beat = int(lock.read_text())
        assert second_beat != first_beat and _alive(second_beat)
        assert second_log.read_text(errors="replace").count("holds the beat lock") == 1
    finally:
        _stop(first)
        if second is not None:
            _stop(second)
