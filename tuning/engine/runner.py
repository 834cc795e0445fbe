"""Measuring runners: a local pool with core partitioning and DOPpler's
adaptive parallelism, and a distributed one that ships ``.so`` files to
per-device measurement queues.

``PooledAsyncRunner.run`` returns at once; a background thread measures the
batch as one DOPpler *round*:

1. the batch is measured DOP candidates at a time, by DOP persistent worker
   processes that each own ``len(cores) // DOP`` cores (affinity set,
   ``TVM_BIND_THREADS=0``, ``TVM_NUM_THREADS`` = min(threads, own cores)):
   workers x threads never exceed the cores;
2. unless that configuration *is* the serial one (DOP 1 at the deployment
   thread count), a sample chosen by :class:`DOPController` (outliers + a
   share of good candidates) and every failed candidate are re-measured by the
   serial worker (``threads`` threads on the measuring cores);
3. the controller updates DOP for the next round from the mean error; the
   other latencies are corrected, or re-measured serially when the error is
   too large to correct (``remeasure_on_large_error``);
4. the futures resolve - the task scheduler joins them later, so measuring a
   task overlaps the search and build of the next one (unless the session
   asks builds to wait, see ``wait_idle``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerInput, RunnerResult

from .doppler import DOPController
from .measure import MeasureOutcome, _jsonable, make_payload
from .procpool import ProcessPool, WorkerError, WorkerSpec, WorkerTimeout, available_cpus
from .rounds import latency_of, measure_round
from .timer import EvaluatorConfig

__all__ = [
    "PooledAsyncRunner",
    "DistributedRunner",
    "CandidateMeta",
    "RoundReport",
    "MeasureLedger",
    "MeasureJob",
    "partition_cores",
    "device_index_from_queue",
]

# Prefix of a runner error that says nothing about the candidate (a lost message, a dead measuring worker,
# no answer in time): such results never reach the cost model (see search.skip_infrastructure_failures).
INFRASTRUCTURE_ERROR = "infrastructure: "


def is_infrastructure_failure(error_msg) -> bool:
    return bool(error_msg) and str(error_msg).startswith(INFRASTRUCTURE_ERROR)


def partition_cores(cores: Sequence[int], dop: int, threads: int) -> list[tuple[list[int], int]]:
    """Split ``cores`` among ``dop`` workers -> [(cpu_ids, threads)], with
    sum(threads) <= len(cores). ``dop`` is clamped to [1, len(cores)]."""
    cores = list(cores)
    if not cores:
        raise ValueError("no cores to measure on")
    dop = max(1, min(int(dop), len(cores)))
    threads = max(1, int(threads))
    if dop == 1:
        t = min(threads, len(cores))
        return [(cores[:t], t)]
    base, extra = divmod(len(cores), dop)
    out, start = [], 0
    for i in range(dop):
        size = base + (1 if i < extra else 0)
        group = cores[start : start + size]
        start += size
        t = min(threads, len(group))
        out.append((group[:t], t))
    return out


def device_index_from_queue(name: str) -> int:
    m = re.search(r"gpu(\d+)$", name)
    return int(m.group(1)) if m else 0


@dataclasses.dataclass
class CandidateMeta:
    round_index: int
    dop: int
    worker: str | None
    run_wall_secs: float | None
    parallel_secs: float | None
    remeasured_serially: bool = False
    serial_secs: float | None = None


@dataclasses.dataclass
class RoundReport:
    round_index: int
    dop: int
    dop_after: int
    mean_error: float | None
    n_candidates: int
    n_remeasured: int
    n_failures: int
    wall_secs: float
    correction_applied: bool = False


class MeasureLedger:
    """Per-candidate facts the runner knows and the measure callback reports
    (keyed by artifact path; thread-safe)."""

    def __init__(self) -> None:
        self._meta: dict[str, CandidateMeta] = {}
        self.rounds: dict[int, RoundReport] = {}
        self._lock = threading.Lock()

    def put(self, path: str, meta: CandidateMeta) -> None:
        with self._lock:
            self._meta[path] = meta

    def pop(self, path: str | None) -> CandidateMeta | None:
        if path is None:
            return None
        with self._lock:
            return self._meta.pop(path, None)

    def add_round(self, report: RoundReport) -> None:
        with self._lock:
            self.rounds[report.round_index] = report


@derived_object
class _EngineFuture(PyRunnerFuture):
    """RunnerFuture over a ``concurrent.futures.Future`` resolving to
    ``(run_secs | None, error | None)``."""

    def __init__(self, fut: concurrent.futures.Future, timeout_sec: float | None = None) -> None:
        super().__init__()
        self.fut = fut
        self.deadline = None if timeout_sec is None else time.monotonic() + timeout_sec
        self.timeout_sec = timeout_sec

    def done(self) -> bool:
        return self.fut.done() or (self.deadline is not None and time.monotonic() > self.deadline)

    def result(self) -> RunnerResult:
        try:
            remaining = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            run_secs, error = self.fut.result(timeout=remaining)
        except concurrent.futures.TimeoutError:
            return RunnerResult(None, f"Runner: no result after {self.timeout_sec} s")
        except Exception as exc:  # noqa: BLE001
            return RunnerResult(None, f"Runner: {type(exc).__name__}: {exc}")
        if error is not None or not run_secs:
            return RunnerResult(None, error or "Runner: no measurement")
        return RunnerResult([float(x) for x in run_secs], None)


@dataclasses.dataclass
class MeasureJob:
    """One built candidate to measure: its ``.so``, device type and args-info JSON (``future``: where
    the pooled runner answers the search; None for measurements outside the search)."""

    path: str
    device_type: str
    args_info: list
    future: concurrent.futures.Future | None = None


@derived_object
class PooledAsyncRunner(PyRunner):
    """Asynchronous local runner with a persistent, core-partitioned pool and
    DOPpler's DOP control (see module doc).

    ``threads``: deployment thread count = the serial reference (default: all
    measuring cores). ``cpu_ids``: cores to measure on (default: this
    process's affinity set). ``dop``: ``"auto"`` (DOPpler) or a fixed int.
    """

    def __init__(
        self,
        *,
        evaluator: EvaluatorConfig | dict | None = None,
        threads: int | None = None,
        cpu_ids: Sequence[int] | None = None,
        dop: str | int = "auto",
        controller: DOPController | None = None,
        timeout_sec: float = 30.0,
        max_uses: int | None = 2000,
        remeasure_on_large_error: bool = True,
        probe_first: bool = True,
        device_index: int = 0,
        ledger: MeasureLedger | None = None,
        worker_limits: dict | None = None,
    ) -> None:
        super().__init__()
        self.evaluator = EvaluatorConfig.from_any(evaluator)
        self.worker_limits = worker_limits  # RLIMITs of the measuring workers (None: sandbox defaults)
        self.cores = list(cpu_ids) if cpu_ids else available_cpus()
        self.threads = max(1, min(int(threads or len(self.cores)), len(self.cores)))
        if controller is None:
            if dop == "auto":
                controller = DOPController(max_dop=len(self.cores))
            else:
                controller = DOPController(max_dop=len(self.cores), initial_dop=int(dop), adaptive=False)
        self.controller = controller
        self.controller.max_dop = min(self.controller.max_dop, len(self.cores))
        self.controller.dop = max(1, min(self.controller.dop, self.controller.max_dop))
        self.timeout_sec = float(timeout_sec)
        self.max_uses = max_uses
        self.remeasure_on_large_error = remeasure_on_large_error
        self.probe_first = probe_first
        self._validated: set[int] = set()
        self.device_index = device_index
        self.ledger = ledger or MeasureLedger()
        self._pools: dict[int, ProcessPool] = {}
        self._pool_lock = threading.Lock()
        self._batches: queue.Queue = queue.Queue()
        self._pending = 0
        self._pending_lock = threading.Condition()
        self.round_index = 0
        self.on_round: Callable[[RoundReport], None] | None = None
        self._closed = False
        self._pool(1)  # spawn the serial worker now (it imports TVM while we search)
        self._thread = threading.Thread(target=self._loop, daemon=True, name="pooled-runner")
        self._thread.start()

    # ------------------------------------------------------------------ pools
    def worker_layout(self, dop: int) -> list[tuple[list[int], int]]:
        return partition_cores(self.cores, dop, self.threads)

    def _pool(self, dop: int) -> ProcessPool:
        dop = max(1, min(int(dop), len(self.cores)))
        with self._pool_lock:
            pool = self._pools.get(dop)
            if pool is None:
                specs = [
                    WorkerSpec(name=f"measure-d{dop}-w{i}", cpu_ids=cpus, threads=t, limits=self.worker_limits)
                    for i, (cpus, t) in enumerate(self.worker_layout(dop))
                ]
                pool = ProcessPool(specs, initializer="tuning.engine.measure:warmup", max_uses=self.max_uses)
                self._pools[dop] = pool
            return pool

    def is_serial_config(self, dop: int) -> bool:
        return self.worker_layout(dop) == self.worker_layout(1)

    # ------------------------------------------------------------------ API
    def run(self, runner_inputs: list[RunnerInput]) -> list[_EngineFuture]:
        jobs, futures = [], []
        for inp in runner_inputs:
            fut: concurrent.futures.Future = concurrent.futures.Future()
            jobs.append(
                MeasureJob(
                    path=str(inp.artifact_path),
                    device_type=str(inp.device_type),
                    args_info=[_jsonable(a.as_json()) for a in inp.args_info],
                    future=fut,
                )
            )
            futures.append(_EngineFuture(fut, None))
        with self._pending_lock:
            self._pending += 1
        self._batches.put(jobs)
        return futures

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every submitted batch is measured."""
        with self._pending_lock:
            return self._pending_lock.wait_for(lambda: self._pending == 0, timeout=timeout)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._batches.put(None)
        for pool in list(self._pools.values()):
            pool.shutdown()

    # ------------------------------------------------------------------ rounds
    def _loop(self) -> None:
        while True:
            jobs = self._batches.get()
            if jobs is None:
                return
            try:
                self._measure_round(jobs)
            except BaseException as exc:  # noqa: BLE001 - never leave futures hanging
                for job in jobs:
                    if not job.future.done():
                        job.future.set_result((None, f"Runner: round failed: {exc!r}"))
            finally:
                with self._pending_lock:
                    self._pending -= 1
                    self._pending_lock.notify_all()

    def _submit(self, pool: ProcessPool, job: MeasureJob) -> concurrent.futures.Future:
        return pool.submit(
            "tuning.engine.measure:measure_path",
            job.path,
            device_type=job.device_type,
            args_info_json=job.args_info,
            evaluator=self.evaluator.to_dict(),
            threads=None,  # the worker's environment already fixes threads and cores
            cpu_ids=None,
            device_index=self.device_index,
            timeout=self.timeout_sec,
        )

    @staticmethod
    def _collect(fut: concurrent.futures.Future) -> tuple[MeasureOutcome, float | None]:
        try:
            out = MeasureOutcome.from_any(fut.result())
        except WorkerTimeout as exc:
            out = MeasureOutcome([], f"Runner: timeout: {exc}", getattr(fut, "worker_name", "?"))
        except WorkerError as exc:
            out = MeasureOutcome([], f"Runner: worker error: {str(exc)[-2000:]}", getattr(fut, "worker_name", "?"))
        return out, getattr(fut, "wall_secs", None)

    def _measure(self, jobs: Sequence[MeasureJob], dop: int) -> list[tuple[MeasureOutcome, float | None]]:
        """``rounds.Measure``: the jobs on the DOP-``dop`` pool (1: the serial worker), all at once."""
        pool = self._pool(dop)
        futs = [self._submit(pool, j) for j in jobs]
        return [self._collect(f) for f in futs]

    def measure_serial(self, jobs: Sequence[MeasureJob]) -> list[MeasureOutcome]:
        return [out for out, _ in self._measure(jobs, 1)]

    def _measure_round(self, jobs: list[MeasureJob]) -> None:
        t0 = time.perf_counter()
        rnd = self.round_index
        self.round_index += 1
        result = measure_round(jobs, self._measure, self.controller, is_serial_config=self.is_serial_config,
                               validated=self._validated, probe_first=self.probe_first,
                               remeasure_on_large_error=self.remeasure_on_large_error)
        self._validated = result.validated
        if result.warm_dop is not None:
            self._pool(result.warm_dop)  # start the next configuration's workers now
        for job, c in zip(jobs, result.candidates):
            self.ledger.put(job.path, CandidateMeta(
                round_index=rnd, dop=c.dop, worker=c.outcome.worker if c.outcome is not None else None,
                run_wall_secs=c.wall_secs, parallel_secs=c.latency_s if c.dop > 1 else None,
                remeasured_serially=c.remeasured, serial_secs=c.serial_latency_s))
        report = RoundReport(
            round_index=rnd,
            dop=result.dop,
            dop_after=result.decision.dop_after,
            mean_error=result.decision.mean_error,
            n_candidates=len(jobs),
            n_remeasured=result.n_remeasured,
            n_failures=result.n_failures,
            wall_secs=time.perf_counter() - t0,
            correction_applied=result.correction_applied,
        )
        self.ledger.add_round(report)
        for job, c in zip(jobs, result.candidates):
            job.future.set_result((c.final_secs, c.final_error if not c.final_secs else None))
        if self.on_round is not None:
            try:
                self.on_round(report)
            except Exception:  # noqa: BLE001 - a report hook never fails the round
                pass


@derived_object
class DistributedRunner(PyRunner):
    """Sends every built candidate to a measurement queue and returns at once.

    ``submit(payload: dict) -> concurrent.futures.Future`` is injected (the
    platform plugs Celery in: ``apply_async(queue=payload["queue"])`` wrapped
    in a Future); its result is a :class:`MeasureOutcome` or its dict.
    ``device_queue``: one queue name or a list (one per device, e.g.
    ``measure.<host>.gpu0``, ``measure.<host>.gpu1``); candidates are dealt
    round-robin, so DOP = number of devices, each measuring serially.
    The payload carries the ``.so`` bytes (base64), device type and index,
    args info JSON, evaluator settings and thread count.
    """

    def __init__(
        self,
        submit: Callable[[dict], concurrent.futures.Future],
        device_queue: str | Sequence[str],
        *,
        evaluator: EvaluatorConfig | dict | None = None,
        threads: int | None = None,
        cpu_ids: Sequence[int] | None = None,
        timeout_sec: float = 300.0,
        ledger: MeasureLedger | None = None,
    ) -> None:
        super().__init__()
        self.submit = submit
        self.queues = [device_queue] if isinstance(device_queue, str) else list(device_queue)
        if not self.queues:
            raise ValueError("DistributedRunner needs at least one device queue")
        self.evaluator = EvaluatorConfig.from_any(evaluator)
        self.threads = threads
        self.cpu_ids = list(cpu_ids) if cpu_ids else None
        self.timeout_sec = timeout_sec
        self.ledger = ledger or MeasureLedger()
        self._next = 0
        self.round_index = 0
        self.n_sent = 0
        self.bytes_sent = 0

    def measure_serial(self, jobs: Sequence[MeasureJob]) -> list[MeasureOutcome]:
        """Measure ``jobs`` one at a time through the first queue (the final serial re-measure)."""
        out = []
        q = self.queues[0]
        for job in jobs:
            with open(job.path, "rb") as fh:
                data = fh.read()
            payload = make_payload(data, device_type=job.device_type, args_info_json=job.args_info,
                                   evaluator=self.evaluator, threads=self.threads,
                                   device_index=device_index_from_queue(q), queue=q)
            try:
                # no timeout here: the submit future has one, from when a worker starts measuring
                out.append(MeasureOutcome.from_any(self.submit(payload).result()))
            except Exception as exc:  # noqa: BLE001
                out.append(MeasureOutcome([], f"final re-measure failed: {exc!r}", q))
        return out

    def build_payload(self, inp: RunnerInput, queue_name: str) -> dict[str, Any]:
        with open(str(inp.artifact_path), "rb") as fh:  # read now: the default callbacks delete it later
            data = fh.read()
        self.bytes_sent += len(data)
        return make_payload(
            data,
            device_type=str(inp.device_type),
            args_info_json=[_jsonable(a.as_json()) for a in inp.args_info],
            evaluator=self.evaluator,
            threads=self.threads,
            cpu_ids=self.cpu_ids,
            device_index=device_index_from_queue(queue_name),
            queue=queue_name,
            candidate=os.path.basename(os.path.dirname(str(inp.artifact_path))),
        )

    def run(self, runner_inputs: list[RunnerInput]) -> list[_EngineFuture]:
        rnd = self.round_index
        self.round_index += 1
        futures = []
        dop = min(len(self.queues), max(1, len(runner_inputs)))
        for inp in runner_inputs:
            q = self.queues[self._next % len(self.queues)]
            self._next += 1
            path = str(inp.artifact_path)
            out: concurrent.futures.Future = concurrent.futures.Future()
            try:
                remote = self.submit(self.build_payload(inp, q))
                self.n_sent += 1
            except Exception as exc:  # noqa: BLE001
                out.set_result((None, f"{INFRASTRUCTURE_ERROR}submit to {q} failed: {exc!r}"))
                futures.append(_EngineFuture(out, None))
                continue
            t_sent = time.perf_counter()

            def _done(rf, out=out, path=path, t_sent=t_sent, q=q):
                try:
                    o = MeasureOutcome.from_any(rf.result())
                except Exception as exc:  # noqa: BLE001
                    o = MeasureOutcome([], f"{INFRASTRUCTURE_ERROR}{exc}", q)
                self.ledger.put(
                    path,
                    CandidateMeta(
                        round_index=rnd,
                        dop=dop,
                        worker=o.worker,
                        run_wall_secs=time.perf_counter() - t_sent,
                        parallel_secs=None if o.error else latency_of(o.run_secs),
                    ),
                )
                out.set_result((o.run_secs or None, o.error))

            remote.add_done_callback(_done)
            # no deadline from submission: `submit`'s future enforces one from when measuring starts
            futures.append(_EngineFuture(out, None))
        return futures
