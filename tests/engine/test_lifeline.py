"""The engine lives and dies with its executor: a killed executor takes its engine child and every
process under it along (death signal, watchdog, process group); an abort stops a running call; one
engine at a time owns a work dir, and a dead holder's lock is free at once."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.workers import wait_for
from tuning.engine.process.isolate import Abort, EngineStopped, call_isolated
from tuning.engine.process.lifeline import WorkDirBusy, lock_work_dir

ROOT = str(Path(__file__).resolve().parents[2])
HELPERS = "tests.engine.lifeline_helpers"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def _python(*args, **kw) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", HELPERS, *args], cwd=ROOT, env=env, **kw)


def _reap_later(pids):
    for pid in pids:  # leave nothing behind if an assertion failed
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sigkilled_executor_takes_its_engine_and_the_engine_workers_along(tmp_path):
    pid_file = tmp_path / "pids.json"
    executor = _python("executor_main", str(pid_file))
    pids = {}
    try:
        pids = wait_for(lambda: pid_file.exists() and json.loads(pid_file.read_text()), 120,
                        "the engine to start its workers")
        assert all(_alive(p) for p in pids.values())
        executor.kill()  # SIGKILL the executor alone: its children are in process groups of their own
        executor.wait(timeout=30)
        wait_for(lambda: not any(_alive(p) for p in pids.values()), 30,
                 "the engine, its pool worker and its compiler to end",
                 lambda: str({name: _alive(p) for name, p in pids.items()}))
    finally:
        executor.kill()
        _reap_later(pids.values())


def test_abort_kills_a_running_engine_call_and_refuses_the_next(tmp_path):
    pid_file = tmp_path / "pids.json"
    abort = Abort()
    outcome = {}

    def call():
        try:
            call_isolated(f"{HELPERS}:engine_tree_then_hang", str(pid_file), what="hanging", abort=abort)
        except Exception as exc:  # noqa: BLE001 - examined below
            outcome["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    pids = {}
    try:
        pids = wait_for(lambda: pid_file.exists() and json.loads(pid_file.read_text()), 120, "the engine to start")
        abort.trigger("the run's lease was lost")
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert isinstance(outcome.get("error"), EngineStopped) and "lease was lost" in str(outcome["error"])
        wait_for(lambda: not any(_alive(p) for p in pids.values()), 30, "the engine's processes to end")
        with pytest.raises(EngineStopped):
            call_isolated("os:getpid", what="a call after the abort", abort=abort)
    finally:
        abort.trigger("test over")
        thread.join(timeout=60)
        _reap_later(pids.values())


def test_a_call_without_abort_still_ends_its_process_group(tmp_path):
    """A normal call: the child answered, and nothing it left in its group lives on."""
    pid = call_isolated(f"{HELPERS}:leave_a_grandchild", what="leaving a grandchild behind")
    wait_for(lambda: not _alive(pid), 30, "the grandchild to be killed with its group")


def test_second_engine_on_a_work_dir_refuses_while_the_first_lives_and_starts_once_it_died(tmp_path):
    work_dir, ready = tmp_path / "work", tmp_path / "ready"
    holder = _python("hold_work_dir", str(work_dir), str(ready))
    try:
        wait_for(ready.exists, 120, "the first engine to take the work dir")
        with pytest.raises(WorkDirBusy, match="another engine"):
            with lock_work_dir(str(work_dir), wait_s=0.5):
                pass
        holder.kill()  # its lock goes with it: nothing to break, no stale file to trust
        holder.wait(timeout=30)
        with lock_work_dir(str(work_dir), wait_s=10) as path:
            assert Path(path).read_text() == str(os.getpid())
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_second_engine_waits_for_a_dying_one(tmp_path):
    work_dir, ready = tmp_path / "work", tmp_path / "ready"
    holder = _python("hold_work_dir", str(work_dir), str(ready))
    try:
        wait_for(ready.exists, 120, "the first engine to take the work dir")
        threading.Timer(1.0, holder.kill).start()  # dies while the second one waits
        with lock_work_dir(str(work_dir), wait_s=60):
            assert holder.wait(timeout=30) == -signal.SIGKILL
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_run_tuning_refuses_a_work_dir_another_engine_holds(tmp_path, cpu_target):
    from tuning.engine.config import TuningConfig
    from tuning.engine.session import run_tuning
    from tuning.engine.testing import matmul_primfunc

    work_dir, ready = tmp_path / "work", tmp_path / "ready"
    holder = _python("hold_work_dir", str(work_dir), str(ready))
    try:
        wait_for(ready.exists, 120, "the first engine to take the work dir")
        cfg = TuningConfig(target=cpu_target, max_trials=4, work_dir=str(work_dir), work_dir_wait_s=0.5)
        with pytest.raises(WorkDirBusy):
            run_tuning(matmul_primfunc(32), cfg)
        assert not (work_dir / "database_tuning_record.json").exists()  # it wrote nothing
    finally:
        holder.kill()
        holder.wait(timeout=30)
