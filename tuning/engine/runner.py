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
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerInput, RunnerResult

from .doppler import DOPController, robust_z_scores
from .measure import MeasureOutcome, _jsonable, make_payload
from .procpool import ProcessPool, WorkerError, WorkerSpec, WorkerTimeout, available_cpus
from .timer import EvaluatorConfig

__all__ = [
    "PooledAsyncRunner",
    "DistributedRunner",
    "CandidateMeta",
    "RoundReport",
    "MeasureLedger",
    "partition_cores",
    "device_index_from_queue",
]

_FAILED = 1e10
# Prefix of a runner error that says nothing about the candidate (a lost message, a dead measuring worker,
# no answer in time): such results never reach the cost model (see session._skip_infrastructure_failures).
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


def _latency(run_secs: Sequence[float] | None) -> float | None:
    if not run_secs:
        return None
    v = sum(run_secs) / len(run_secs)
    return v if (v < _FAILED / 10 and not math.isnan(v)) else None


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
class _Job:
    path: str
    device_type: str
    args_info: list
    future: concurrent.futures.Future


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
                _Job(
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

    def _submit(self, pool: ProcessPool, job: _Job) -> concurrent.futures.Future:
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

    def measure_serial(self, paths_and_jobs: Sequence[_Job]) -> list[MeasureOutcome]:
        pool = self._pool(1)
        futs = [self._submit(pool, j) for j in paths_and_jobs]
        return [self._collect(f)[0] for f in futs]

    def _measure_round(self, jobs: list[_Job]) -> None:
        t0 = time.perf_counter()
        ctrl = self.controller
        rnd = self.round_index
        self.round_index += 1
        n = len(jobs)
        dop = max(1, min(ctrl.dop, ctrl.max_dop, n))
        outcomes: list[MeasureOutcome | None] = [None] * n
        walls: list[float | None] = [None] * n
        remeasured = [False] * n
        serial_lat: list[float | None] = [None] * n
        final_secs: list[list[float] | None] = [None] * n
        final_err: list[str | None] = [None] * n
        correction_applied = False
        meas_dop = [1] * n

        def parallel(idx: list[int], d: int) -> None:
            pool = self._pool(d)
            futs = [(i, self._submit(pool, jobs[i])) for i in idx]
            for i, f in futs:
                meas_dop[i] = d
                outcomes[i], walls[i] = self._collect(f)
                o = outcomes[i]
                final_secs[i] = o.run_secs if not o.error else None
                final_err[i] = o.error

        def serial(idx: list[int], *, count_as_remeasure: bool) -> None:
            for i, so in zip(idx, self.measure_serial([jobs[i] for i in idx])):
                if outcomes[i] is None:  # first and only measurement of this candidate
                    outcomes[i] = so
                else:
                    remeasured[i] = count_as_remeasure
                    serial_lat[i] = None if so.error else _latency(so.run_secs)
                final_secs[i] = so.run_secs if not so.error else None
                final_err[i] = so.error

        def lat_of(i: int) -> float | None:
            o = outcomes[i]
            return None if (o is None or o.error) else _latency(o.run_secs)

        if self.is_serial_config(dop):
            parallel(list(range(n)), dop)
            decision = ctrl.update_serial_round(n)
        else:
            probe: list[int] = []
            n_probe = max(2 * dop, math.ceil(ctrl.sample_share * n))
            if self.probe_first and dop not in self._validated and n > n_probe:
                # A DOP not validated yet: measure an evenly spread probe in parallel,
                # re-measure it serially, and decide before spending the whole round.
                step = n / n_probe
                probe = sorted({int(k * step) for k in range(n_probe)})
                parallel(probe, dop)
                plat = [lat_of(i) for i in probe]
                failed = [i for i in probe if outcomes[i].error]
                serial(probe, count_as_remeasure=True)
                failures_due = sum(1 for i in failed if final_err[i] is None)
                decision = ctrl.update(plat, [serial_lat[i] for i in probe], failures_due)
                rest = [i for i in range(n) if i not in set(probe)]
                if decision.backed_off or not ctrl.can_correct(decision.mean_signed_error):
                    d2 = max(1, min(decision.dop_after, n))
                    if self.is_serial_config(d2):
                        serial(rest, count_as_remeasure=False)
                    else:  # backed off to a smaller, still parallel DOP: re-validate next round
                        parallel(rest, d2)
                else:
                    self._validated.add(dop)
                    parallel(rest, dop)
                    valid = [i for i in rest if lat_of(i) is not None]
                    z = robust_z_scores([lat_of(i) for i in valid])
                    outl = [i for i, zi in zip(valid, z) if abs(zi) > ctrl.z_threshold]
                    rfail = [i for i in rest if outcomes[i].error]
                    serial(sorted(set(outl) | set(rfail)), count_as_remeasure=True)
                    err = decision.mean_signed_error
                    for i in rest:
                        if not remeasured[i] and final_secs[i]:
                            final_secs[i] = ctrl.correct(final_secs[i], err)
                            correction_applied = True
            else:
                parallel(list(range(n)), dop)
                lat = [lat_of(i) for i in range(n)]
                sample = ctrl.select_for_serial_remeasure(lat)
                failed = [i for i in range(n) if outcomes[i].error]
                serial(sorted(set(sample) | set(failed)), count_as_remeasure=True)
                failures_due = sum(1 for i in failed if final_err[i] is None)
                decision = ctrl.update([lat[i] for i in sample], [serial_lat[i] for i in sample], failures_due)
                if not decision.backed_off:
                    self._validated.add(dop)
                rest = [i for i in range(n) if not remeasured[i] and final_secs[i]]
                err = decision.mean_signed_error
                if rest and ctrl.can_correct(err):
                    correction_applied = True
                    for i in rest:
                        final_secs[i] = ctrl.correct(final_secs[i], err)
                elif rest and err is not None and self.remeasure_on_large_error:
                    serial(rest, count_as_remeasure=True)
            if decision.backed_off:
                self._validated.discard(dop)
            if decision.dop_after != dop:
                self._pool(decision.dop_after)  # warm the next configuration now

        for i, job in enumerate(jobs):
            o = outcomes[i]
            self.ledger.put(
                job.path,
                CandidateMeta(
                    round_index=rnd,
                    dop=meas_dop[i],
                    worker=o.worker if o is not None else None,
                    run_wall_secs=walls[i],
                    parallel_secs=lat_of(i) if meas_dop[i] > 1 else None,
                    remeasured_serially=remeasured[i],
                    serial_secs=serial_lat[i],
                ),
            )
        report = RoundReport(
            round_index=rnd,
            dop=dop,
            dop_after=decision.dop_after,
            mean_error=decision.mean_error,
            n_candidates=n,
            n_remeasured=sum(remeasured),
            n_failures=sum(1 for i in range(n) if not final_secs[i]),
            wall_secs=time.perf_counter() - t0,
            correction_applied=correction_applied,
        )
        self.ledger.add_round(report)
        for i, job in enumerate(jobs):
            job.future.set_result((final_secs[i], final_err[i] if not final_secs[i] else None))
        if self.on_round is not None:
            try:
                self.on_round(report)
            except Exception:  # noqa: BLE001
                pass

    def pool_pids(self) -> dict[int, list[int | None]]:
        return {d: p.pids() for d, p in self._pools.items()}


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
                        parallel_secs=None if o.error else _latency(o.run_secs),
                    ),
                )
                out.set_result((o.run_secs or None, o.error))

            remote.add_done_callback(_done)
            # no deadline from submission: `submit`'s future enforces one from when measuring starts
            futures.append(_EngineFuture(out, None))
        return futures
