"""Timeouts and process hygiene of the measuring runner: nothing waits forever, nothing is left behind."""

import concurrent.futures
import os
import time

import pytest

from tuning.engine.process.procpool import WorkerProcess, WorkerSpec, WorkerTimeout
from tuning.engine.runners.measure_jobs import INFRASTRUCTURE_ERROR, MeasureJob
from tuning.engine.runners.pooled import PooledAsyncRunner
from tuning.engine.measuring.slots import Slot
from tuning.engine.measuring.timer import EvaluatorConfig

FAST = EvaluatorConfig(number=1, repeat=1, min_repeat_ms=1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _job(path="x.so"):
    return MeasureJob(path=path, device_type="cpu", args_info=[], future=concurrent.futures.Future())


def test_a_killed_worker_takes_its_process_group(tmp_path):
    pid_file = tmp_path / "child.pid"
    worker = WorkerProcess(WorkerSpec(name="hygiene"))
    try:
        with pytest.raises(WorkerTimeout):
            worker.call("tests.engine.hang_helpers:spawn_then_hang", str(pid_file), timeout=8)
        child = int(pid_file.read_text())
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the hung worker's child survived the kill"
    finally:
        worker.kill()


def test_a_hung_measurement_ends_the_round_with_errors():
    runner = PooledAsyncRunner(evaluator=FAST, threads=1, dop=1, timeout_sec=2,
                               slots=[Slot(0, (os.sched_getaffinity(0).pop(),), 1)])
    runner.measure_func = "tests.engine.hang_helpers:hang"
    try:
        jobs = [_job(), _job()]
        runner._batches.put(jobs)
        with runner._pending_lock:
            runner._pending += 1
            runner._pending_jobs += len(jobs)
        assert runner.wait_idle(timeout=120)
        for job in jobs:
            secs, error = job.future.result(timeout=0)
            assert secs is None and "timeout" in error
        assert runner.ledger.rounds[0].n_failures == 2
    finally:
        runner.shutdown()


class _SilentPool:
    """A pool whose calls never answer (its threads are stuck)."""

    def __init__(self):
        self.killed = False

    def __len__(self):
        return 1

    def submit(self, *args, **kwargs):
        return concurrent.futures.Future()

    def kill(self):
        self.killed = True

    def shutdown(self):
        pass


def test_a_pool_that_never_answers_is_killed_at_the_round_deadline():
    runner = PooledAsyncRunner(evaluator=FAST, threads=1, dop=1, timeout_sec=0.1, start_timeout=0.2,
                               slots=[Slot(0, (os.sched_getaffinity(0).pop(),), 1)])
    try:
        silent = _SilentPool()
        runner._pools[1] = silent
        out = runner._measure([_job(), _job()], 1)
        assert all(o.error.startswith(INFRASTRUCTURE_ERROR) for o, _ in out)
        assert silent.killed and 1 not in runner._pools  # retired: a fresh pool next time
    finally:
        runner.shutdown()


def test_wait_idle_returns_when_the_measuring_thread_is_gone():
    runner = PooledAsyncRunner(evaluator=FAST, threads=1, dop=1, slots=[Slot(0, (0,), 1)])
    runner.shutdown()
    runner._thread.join(timeout=10)
    with runner._pending_lock:
        runner._pending += 1  # a batch nobody will measure
    assert runner.wait_idle(timeout=30) is False


def test_slots_decide_dop_and_the_serial_reference():
    slots = [Slot(0, (0,), 1), Slot(1, (1,), 1)]
    runner = PooledAsyncRunner(evaluator=FAST, threads=1, dop="auto", slots=slots)
    try:
        assert runner.rule.max_dop == 2
        assert runner.worker_layout(1) == [([0], 1)]  # serial: T threads on slot 0, the others idle
        assert runner.worker_layout(2) == [([0], 1), ([1], 1)]  # same T per worker: same program
        assert runner.is_serial_config(1) and not runner.is_serial_config(2)
    finally:
        runner.shutdown()
    wide = PooledAsyncRunner(evaluator=FAST, threads=2, dop="auto", slots=[Slot(0, (0, 1), 2)])
    try:
        assert wide.rule.max_dop == 1  # T = every core: no room for a second slot
    finally:
        wide.shutdown()


def test_a_parallel_pool_reuses_the_serial_worker_on_slot_0():
    """DOP auto starts with a probe: its parallel workers are started with the serial one, and slot 0's
    worker is the serial reference's own process (retiring the parallel pool leaves it running)."""
    slots = [Slot(0, (0,), 1), Slot(1, (1,), 1)]
    runner = PooledAsyncRunner(evaluator=FAST, threads=1, dop="auto", slots=slots)
    try:
        assert runner.rule.dop == 2 and set(runner._pools) == {1, 2}  # both started at once
        serial, parallel = runner._pools[1], runner._pools[2]
        assert len(parallel) == 2 and parallel.workers[0] is serial.workers[0]
        assert parallel.workers[1].spec.cpu_ids == [1]
        runner.wait_ready()  # what a benchmark waits on before its clock starts
        assert all(w._ready and w.alive for w in parallel.workers)
        runner.retire_pools({1})
        assert set(runner._pools) == {1}
        assert serial.workers[0].alive and not parallel.workers[1].alive
    finally:
        runner.shutdown()


def test_pools_of_abandoned_dops_are_retired():
    runner = PooledAsyncRunner(evaluator=FAST, threads=1, dop=1, slots=[Slot(0, (0,), 1), Slot(1, (1,), 1)])
    try:
        runner._pools[2] = _SilentPool()
        runner.retire_pools({1})
        assert set(runner._pools) == {1}
    finally:
        runner.shutdown()
