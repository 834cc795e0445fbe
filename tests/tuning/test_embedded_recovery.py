"""The embedded deployment (SQLite + the SQLite-backed broker under DLOPT_VAR_DIR) with its worker started
exactly as `make run` starts it (scripts/worker.sh, beat inside): a worker SIGKILLed mid-run, a second
one started at once, while the dead worker's lease is still live; the run is picked up when the lease
expires and finishes, no measurement stored twice. The killed worker's engine (in process groups of its
own, out of reach of the kill) ends with it; the run stays within its budget plus one round, and its
store and TVM's database agree, with no candidate twice in either."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.workers import ROOT, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STALE_S = 20  # the lease (longer than a worker takes to start); everything else is the embedded default


def _env(var_dir):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "TEST_DATABASE_URL", "DJANGO_MEDIA_ROOT")}
    return env | {"DLOPT_VAR_DIR": str(var_dir), "PYTHON": sys.executable, "TUNING_STALE_AFTER_S": str(STALE_S),
                  "DLOPT_NODE_NAME": "embedded", "WORKER_CONCURRENCY": "1", "PYTHONUNBUFFERED": "1"}


def _state(env, run_id):
    out = subprocess.run([sys.executable, "-m", "tests.tuning.embedded_state", "state", str(run_id)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _worker(env, log_path, name, **extra):
    log = open(log_path, "wb")
    return subprocess.Popen(["scripts/worker.sh"], cwd=ROOT, env=env | {"WORKER_HOSTNAME": f"{name}@embedded"} | extra,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (whatever process group or session it moved to)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    """The process's command line, or "" once it has gone (a short-lived measuring worker can end between
    listing /proc and reading it)."""
    try:
        with open(f"/proc/{pid}/cmdline") as fh:
            return fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_embedded_worker_killed_mid_run_is_recovered_by_the_next_worker(tmp_path):
    env = _env(tmp_path / "var")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    out = subprocess.run([sys.executable, "-m", "tests.tuning.embedded_state", "setup", "12"], cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True, timeout=300)
    run_id = int(out.stdout.strip().splitlines()[-1])
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _worker(env, first_log, "first")
    try:
        wait_for(lambda: _state(env, run_id)["trials_done"] >= 4, 300, "the first measurements",
                 lambda: first_log.read_text(errors="replace"), interval=1.0)
        tree = _descendants(first.pid)  # the worker's pool, its beat, the run's engine and its workers
        [engine] = [p for p in tree if "_isolated_child" in _cmdline(p)]
        engine_tree = {engine} | _descendants(engine)
        with open(f"/proc/{engine}/stat") as fh:
            executor = int(fh.read().rsplit(")", 1)[1].split()[1])
        os.kill(executor, signal.SIGKILL)  # the Celery child running the run, alone
        # the engine leads a process group of its own (its workers too): it must end by itself
        wait_for(lambda: not [p for p in engine_tree if _alive(p)], 30, "the dead executor's engine to end")
    finally:
        _kill(first)
    wait_for(lambda: not [p for p in tree if _alive(p)], 30, "every process of the killed worker to end",
             lambda: str([(p, _cmdline(p)) for p in tree if _alive(p)]))
    assert "beat: Starting" in first_log.read_text(errors="replace")  # make run's worker runs beat
    before = _state(env, run_id)
    assert before["status"] == "running" and before["attempts"] == 1
    # At once, while the dead worker's lease is still live; without beat (whose 60 s sweep would also find
    # the run): only the starting worker's re-check at lease expiry can recover it.
    second = _worker(env, second_log, "second", WORKER_BEAT="0")
    try:
        done = wait_for(lambda: (s := _state(env, run_id))["status"] in ("succeeded", "failed", "cancelled") and s,
                        300, "the run to be recovered and finish", lambda: second_log.read_text(errors="replace"),
                        interval=1.0)
    finally:
        _kill(second)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2 and done["losses"] == 1
    keys = [tuple(k) for k in done["keys"]]
    assert len(keys) == len(set(keys)) == done["trials_done"]  # none doubled
    assert {tuple(k) for k in before["keys"]} <= set(keys)      # none lost
    assert done["trials_done"] <= done["max_trials"] + done["trials_per_round"]  # the budget is a hard cap
    assert done["tvm_duplicates"] == 0  # one engine at a time wrote TVM's database
    assert done["tvm_records"] == done["trials_done"]  # everything TVM stored reached the platform
