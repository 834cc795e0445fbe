"""Measuring runners: a local pool of measurement slots with DOPpler's adaptive parallelism, one
per GPU (MultiDeviceRunner), and a distributed one that ships ``.so`` files to hosts' queues.

``PooledAsyncRunner.run`` returns at once; a background thread measures the
batch as one DOPpler *round* (:func:`~.rounds.measure_round`):

1. the batch is measured DOP candidates at a time by DOP persistent worker processes, one per
   measurement slot (slots.py: T = deployment threads cores each, SMT/NUMA-aware, inside the
   affinity mask; affinity set, ``TVM_BIND_THREADS=0``, ``TVM_NUM_THREADS`` = T);
2. at DOP > 1 a sample chosen by :class:`DOPController` (outliers + a share of good candidates)
   and every failed candidate are re-measured by the serial worker (slot 0, T threads, the other
   slots idle): the same program measured the same way, alone;
3. the controller updates DOP for the next round from the mean error; the
   other latencies are corrected, or re-measured serially when the error is
   too large to correct (``remeasure_on_large_error``); pools of DOPs left behind are retired;
4. the futures resolve - the task scheduler joins them later, so measuring a
   task overlaps the search and build of the next one (unless the session
   asks builds to wait, see ``wait_idle``).

Every wait is bounded: a round's calls by :meth:`PooledAsyncRunner.round_timeout` (a pool that
misses it is killed, its calls end as infrastructure errors), ``wait_idle`` by what the pending
jobs may take, the engine's join by the measuring thread's liveness; a killed worker takes its
process group (procpool.py). GPU workers get their slot group's environment (gpu_slots.py: MPS).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import (
    PyRunner,
    PyRunnerFuture,
    RunnerInput,
    RunnerResult,
)

from tuning.engine.doppler.controller import DOPController
from tuning.engine.doppler.rounds import measure_round
from tuning.engine.measuring import measure
from tuning.engine.measuring.cuda_binaries import (
    CACHE_DIR_VAR,
    binaries_beside,
    new_cache_dir,
)
from tuning.engine.measuring.measure import MeasureOutcome, _jsonable, make_payload
from tuning.engine.measuring.slots import Slot, plan_slots, read_topology
from tuning.engine.measuring.timer import EvaluatorConfig
from tuning.engine.process.procpool import (
    TIMING_LOCK_VAR,
    ProcessPool,
    WorkerError,
    WorkerSpec,
    WorkerTimeout,
    available_cpus,
)
from tuning.engine.process.sandbox import (
    RUNTIME_ONLY_ENV,
    read_untrusted_file,
    remove_dir,
)

__all__ = [
    "PooledAsyncRunner",
    "DistributedRunner",
    "CandidateMeta",
    "RoundReport",
    "MeasureLedger",
    "MeasureJob",
    "device_index_from_queue",
    "deal_by_capacity",
    "MultiDeviceRunner",
]

# Prefix of a runner error that says nothing about the candidate (a lost message, a dead measuring worker,
# no answer in time): such results never reach the cost model (see search.skip_infrastructure_failures).
INFRASTRUCTURE_ERROR = "infrastructure: "


def is_infrastructure_failure(error_msg) -> bool:
    return bool(error_msg) and str(error_msg).startswith(INFRASTRUCTURE_ERROR)


def deal_by_capacity(n: int, capacities: Sequence[int]) -> list[int]:
    """Owner index of each of ``n`` candidates, dealt in proportion to ``capacities`` (each device's or
    host's current DOP), interleaved so every owner starts at once (largest remainder first)."""
    caps = [max(1, int(c)) for c in capacities]
    if not caps:
        raise ValueError("no devices to deal to")
    total = sum(caps)
    owners, given = [], [0] * len(caps)
    for k in range(n):
        # the owner furthest below its share of the first k + 1 candidates
        share = [(k + 1) * c / total - g for c, g in zip(caps, given)]
        i = max(range(len(caps)), key=lambda j: (share[j], -j))
        owners.append(i)
        given[i] += 1
    return owners


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
    parallel_wall_secs: float | None = None  # of wall_secs: measuring at the round's DOP
    serial_wall_secs: float | None = None  # of wall_secs: serial re-measures (DOPpler's sample)
    serial_by_reason: dict | None = None  # of serial_wall_secs: {reason: {"n", "secs"}} (rounds.SERIAL_REASONS)


class MeasureLedger:
    """Per-candidate facts the runner knows and the measure callback reports
    (keyed by artifact path; thread-safe)."""

    def __init__(self) -> None:
        self._meta: dict[str, CandidateMeta] = {}
        self.rounds: dict[int, RoundReport] = {}
        self.rounds_numbered = 0
        self._lock = threading.Lock()

    def next_round(self) -> int:
        """The next round number. Every runner sharing this ledger (one per device) and the measure
        callback (a batch the runner never saw: all its builds failed) number rounds here, so no
        two rounds of a run share a number."""
        with self._lock:
            r = self.rounds_numbered
            self.rounds_numbered += 1
            return r

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

    def __init__(self, fut: concurrent.futures.Future, timeout_sec: float | None = None,
                 alive: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.fut = fut
        self.deadline = None if timeout_sec is None else time.monotonic() + timeout_sec
        self.timeout_sec = timeout_sec
        self.alive = alive  # whoever resolves `fut` (a measuring thread): a dead one never will

    def _abandoned(self) -> bool:
        return self.alive is not None and not self.fut.done() and not self.alive()

    def done(self) -> bool:
        return (self.fut.done() or self._abandoned()
                or (self.deadline is not None and time.monotonic() > self.deadline))

    def _wait(self):
        """The future's value, waiting in slices so a dead resolver ends the wait too."""
        while True:
            remaining = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            try:
                return self.fut.result(timeout=5.0 if remaining is None else min(5.0, remaining))
            except concurrent.futures.TimeoutError:
                if self._abandoned():
                    raise RuntimeError("the measuring thread is gone") from None
                if remaining is not None and remaining <= 5.0:
                    raise

    def result(self) -> RunnerResult:
        try:
            run_secs, error = self._wait()
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
    process's affinity set). ``dop``: ``"auto"`` (DOPpler) or a fixed int; ``dop_rule``: the auto rule's
    choices (``DOPController.for_dop``'s keywords; default: the platform's).
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
        slots: Sequence[Slot] | None = None,
        start_timeout: float = 180.0,
        worker_env: dict[str, str] | None = None,
        dop_rule: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.evaluator = EvaluatorConfig.from_any(evaluator)
        self.worker_limits = worker_limits  # RLIMITs of the measuring workers (None: sandbox defaults)
        # e.g. a GPU slot group's CUDA_VISIBLE_DEVICES / MPS pipe. Measuring needs TVM's runtime only
        # (measure.py): on the runtime library alone a DOP-auto runner's workers were ready in 1.5 s against
        # 2.1 s and hold 86 MB against 194 MB each (2-core VM); a DOP change or a recycled
        # worker pays that start again, on cores the search and builds are using
        self.worker_env = {**RUNTIME_ONLY_ENV, **dict(worker_env or {})}
        # a GPU slot group (timing lock): its workers time one at a time, so a call may wait for the
        # others' windows before its own; and they share a private cache of kernels they compile
        self.exclusive_timing = TIMING_LOCK_VAR in self.worker_env
        self._own_kernel_cache = None
        if self.exclusive_timing and CACHE_DIR_VAR not in self.worker_env and CACHE_DIR_VAR not in os.environ:
            self._own_kernel_cache = self.worker_env[CACHE_DIR_VAR] = new_cache_dir()
        self.cores = list(cpu_ids) if cpu_ids else available_cpus()
        # slots of `threads` cores each (SMT- and NUMA-aware, see slots.py); slot 0 is the serial reference
        self.slots: list[Slot] = list(slots) if slots else plan_slots(read_topology(affinity=self.cores), int(threads or len(self.cores)))
        self.threads = self.slots[0].threads
        if controller is None:
            controller = DOPController.for_dop(dop, len(self.slots), **(dop_rule or {}))
        self.controller = controller
        self.controller.max_dop = min(self.controller.max_dop, len(self.slots))
        self.controller.dop = max(1, min(self.controller.dop, self.controller.max_dop))
        self.timeout_sec = float(timeout_sec)
        self.start_timeout = float(start_timeout)
        self.max_uses = max_uses
        self.remeasure_on_large_error = remeasure_on_large_error
        self.probe_first = probe_first
        self._validated: set[int] = set()
        self.device_index = device_index
        self.ledger = ledger or MeasureLedger()
        self.measure_func = measure.measure_path
        self._pools: dict[int, ProcessPool] = {}
        self._pool_lock = threading.Lock()
        self._batches: queue.Queue = queue.Queue()
        self._pending = 0
        self._pending_jobs = 0
        self._pending_lock = threading.Condition()
        self.on_round: Callable[[RoundReport], None] | None = None
        self._closed = False
        self._pool(1)  # spawn the serial worker now (it imports TVM while we search)
        if self.controller.dop > 1:
            self._pool(self.controller.dop)  # and the first round's parallel workers
        self._thread = threading.Thread(target=self._loop, daemon=True, name="pooled-runner")
        self._thread.start()

    # ------------------------------------------------------------------ pools
    def worker_layout(self, dop: int) -> list[tuple[list[int], int]]:
        """(cpus, threads) of each worker at ``dop``: the first ``dop`` slots, T threads each."""
        dop = max(1, min(int(dop), len(self.slots)))
        return [slot.as_layout() for slot in self.slots[:dop]]

    def _pool(self, dop: int) -> ProcessPool:
        dop = max(1, min(int(dop), len(self.slots)))
        with self._pool_lock:
            pool = self._pools.get(dop)
            if pool is None:
                # slot 0 of every DOP is the serial reference's slot: a parallel pool reuses the serial
                # worker there (one process less to start, to import TVM in and to keep in memory)
                serial = self._pools.get(1) if dop > 1 else None
                shared = serial.workers[:1] if serial is not None else []
                specs = [
                    WorkerSpec(name=f"measure-d{dop}-w{i}", cpu_ids=cpus, threads=t, limits=self.worker_limits,
                               env=dict(self.worker_env))
                    for i, (cpus, t) in enumerate(self.worker_layout(dop)) if i >= len(shared)
                ]
                pool = ProcessPool(specs, initializer=measure.warmup, max_uses=self.max_uses,
                                   shared=shared)
                self._pools[dop] = pool
            return pool

    def retire_pools(self, keep: set[int]) -> None:
        """End the worker pools of DOPs not in ``keep`` (the serial worker is always kept)."""
        with self._pool_lock:
            gone = [d for d in self._pools if d not in keep and d != 1]
            pools = [self._pools.pop(d) for d in gone]
        for pool in pools:
            pool.shutdown()

    def _retire_pool(self, dop: int) -> None:
        """A pool that left a call unanswered: kill it (a fresh one is made on next use)."""
        with self._pool_lock:
            pool = self._pools.pop(max(1, min(int(dop), len(self.slots))), None)
        if pool is not None:
            pool.kill()

    def is_serial_config(self, dop: int) -> bool:
        """Slot 0 alone at T threads is the serial reference; any DOP > 1 is a parallel configuration."""
        return int(dop) <= 1 or len(self.slots) == 1

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
            futures.append(_EngineFuture(fut, None, alive=self._thread.is_alive))
        with self._pending_lock:
            self._pending += 1
            self._pending_jobs += len(jobs)
        self._batches.put(jobs)
        return futures

    def round_timeout(self, n_jobs: int, dop: int) -> float:
        """The longest ``n_jobs`` measured ``dop`` at a time may take: each call's own timeout,
        a worker start, and slack; past it the round ends with errors rather than waiting on."""
        waves = -(-max(1, n_jobs) // max(1, dop))
        per_call = self.timeout_sec * (max(1, dop) if self.exclusive_timing else 1)  # _submit's
        return waves * (per_call + 5.0) + self.start_timeout

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every submitted batch is measured; False when that did not happen in
        ``timeout`` (default: what the pending jobs may take, measured serially and twice over:
        a serial pass plus re-measures) or the measuring thread is gone."""
        with self._pending_lock:
            if timeout is None:
                timeout = 2 * self.round_timeout(self._pending_jobs, 1)
            done = self._pending_lock.wait_for(lambda: self._pending == 0 or not self._thread.is_alive(),
                                               timeout=timeout)
            return bool(done) and self._pending == 0

    def wait_ready(self) -> None:
        """Block until the workers started so far (the serial one, the first round's) have imported TVM
        and said hello, each within its start timeout (WorkerError past it): a benchmark that times
        rounds starts its clock after this."""
        with self._pool_lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.wait_ready()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._batches.put(None)
        with self._pool_lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown()
        if self._own_kernel_cache:
            remove_dir(self._own_kernel_cache)

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
                    self._pending_jobs -= len(jobs)
                    self._pending_lock.notify_all()

    def _submit(self, pool: ProcessPool, job: MeasureJob) -> concurrent.futures.Future:
        return pool.submit(
            self.measure_func,
            job.path,
            device_type=job.device_type,
            args_info_json=job.args_info,
            evaluator=self.evaluator.to_dict(),
            threads=None,  # the worker's environment already fixes threads and cores
            cpu_ids=None,
            device_index=self.device_index,
            # in a timing window a call can wait for the pool's other workers' windows first: that
            # wait is not the candidate's, so it does not count against the candidate's timeout
            timeout=self.timeout_sec * (len(pool) if self.exclusive_timing else 1),
        )

    @staticmethod
    def _collect(fut: concurrent.futures.Future) -> tuple[MeasureOutcome, float | None]:
        if not fut.done():  # the round's deadline passed: no answer from the pool
            fut.cancel()
            return MeasureOutcome([], f"{INFRASTRUCTURE_ERROR}no answer from the measuring pool in time", "?"), None
        try:
            out = MeasureOutcome.from_any(fut.result(timeout=0))
        except WorkerTimeout as exc:
            out = MeasureOutcome([], f"Runner: timeout: {exc}", getattr(fut, "worker_name", "?"))
        except WorkerError as exc:
            out = MeasureOutcome([], f"Runner: worker error: {str(exc)[-2000:]}", getattr(fut, "worker_name", "?"))
        except Exception as exc:  # noqa: BLE001 - cancelled, or the pool raised
            out = MeasureOutcome([], f"{INFRASTRUCTURE_ERROR}{type(exc).__name__}: {exc}", getattr(fut, "worker_name", "?"))
        return out, getattr(fut, "wall_secs", None)

    def _measure(self, jobs: Sequence[MeasureJob], dop: int) -> list[tuple[MeasureOutcome, float | None]]:
        """``rounds.Measure``: the jobs on the DOP-``dop`` pool (1: the serial worker), all at once,
        within :meth:`round_timeout` (a pool that misses it is killed, its calls end as errors)."""
        pool = self._pool(dop)
        futs = [self._submit(pool, j) for j in jobs]
        _, late = concurrent.futures.wait(futs, timeout=self.round_timeout(len(jobs), len(pool)))
        if late:
            self._retire_pool(dop)
        return [self._collect(f) for f in futs]

    def measure_serial(self, jobs: Sequence[MeasureJob]) -> list[MeasureOutcome]:
        return [out for out, _ in self._measure(jobs, 1)]

    def _measure_round(self, jobs: list[MeasureJob]) -> None:
        t0 = time.perf_counter()
        rnd = self.ledger.next_round()
        result = measure_round(jobs, self._measure, self.controller, is_serial_config=self.is_serial_config,
                               validated=self._validated, probe_first=self.probe_first,
                               remeasure_on_large_error=self.remeasure_on_large_error)
        self._validated = result.validated
        next_dop = result.warm_dop or result.decision.dop_after
        self.retire_pools({next_dop})  # DOPs left behind give their cores and memory back
        if next_dop > 1:
            self._pool(next_dop)  # start the next round's workers now (they load TVM while TVM searches)
        for job, c in zip(jobs, result.candidates):
            self.ledger.put(job.path, CandidateMeta(
                round_index=rnd, dop=c.dop, worker=c.outcome.worker if c.outcome is not None else None,
                run_wall_secs=c.wall_secs, parallel_secs=c.latency_s if c.dop > 1 else None,
                remeasured_serially=c.remeasured, serial_secs=c.serial_reference_s))
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
            parallel_wall_secs=result.parallel_wall_s,
            serial_wall_secs=result.serial_wall_s,
            serial_by_reason=result.serial_by_reason,
        )
        self.ledger.add_round(report)
        for job, c in zip(jobs, result.candidates):
            job.future.set_result((c.final_secs, c.final_error if not c.final_secs else None))
        if self.on_round is not None:
            try:
                self.on_round(report)
            except Exception:  # noqa: BLE001 - a report hook never fails the round
                pass


def _weighted_error(parts: Sequence[RoundReport]) -> float | None:
    known = [(p.mean_error, p.n_candidates) for p in parts if p.mean_error is not None]
    total = sum(n for _, n in known)
    return sum(e * n for e, n in known) / total if total else None


MAX_ARTIFACT_BYTES = 256 * 1024 * 1024


def read_artifact(path: str) -> bytes:
    """A built candidate's bytes, as this (secret-holding) process ships them: the path came from a
    build worker, so only a regular ELF shared object is read, through no link
    (sandbox.read_untrusted_file)."""
    data = read_untrusted_file(path, max_bytes=MAX_ARTIFACT_BYTES, magic=b"\x7fELF")
    if data is None:
        raise ValueError(f"{os.path.basename(path)!r} is not a built candidate (a regular shared object)")
    return data


def _inner(runner):
    """The Python object behind a ``derived_object`` runner (its ``run`` returns our own futures)."""
    return getattr(runner, "_inst", runner)


@derived_object
class MultiDeviceRunner(PyRunner):
    """Several GPUs of one host: one :class:`PooledAsyncRunner` (slot group, DOP controller, error
    samples) per device; each batch is dealt in proportion to each device's current DOP."""

    def __init__(self, runners: Sequence[Any]) -> None:
        super().__init__()
        if not runners:
            raise ValueError("MultiDeviceRunner needs at least one device runner")
        self.runners = [_inner(r) for r in runners]
        self.controller = self.runners[0].controller  # the session reports the first device's DOP
        self.ledger = self.runners[0].ledger

    def run(self, runner_inputs: list[RunnerInput]) -> list[_EngineFuture]:
        owners = deal_by_capacity(len(runner_inputs), [r.controller.dop for r in self.runners])
        futures: list[Any] = [None] * len(runner_inputs)
        for d, runner in enumerate(self.runners):
            idx = [i for i, o in enumerate(owners) if o == d]
            if idx:
                for i, fut in zip(idx, runner.run([runner_inputs[i] for i in idx])):
                    futures[i] = fut
        return futures

    def wait_idle(self, timeout: float | None = None) -> bool:
        return all(r.wait_idle(timeout) for r in self.runners)

    def measure_serial(self, jobs: Sequence[MeasureJob]) -> list[MeasureOutcome]:
        return self.runners[0].measure_serial(jobs)

    def device_dops(self) -> dict[int, int]:
        return {r.device_index: r.controller.dop for r in self.runners}

    def shutdown(self) -> None:
        for r in self.runners:
            r.shutdown()


@derived_object
class DistributedRunner(PyRunner):
    """Measures built candidates on remote hosts' queues, DOPpler-style per queue.

    ``submit(payload: dict) -> concurrent.futures.Future`` is injected (the platform plugs Celery in:
    ``apply_async(queue=payload["queue"])`` wrapped in a Future); its result is a
    :class:`MeasureOutcome` or its dict. ``device_queue``: one queue name or a list (one per host and
    device, e.g. ``measure.<host>.cpu``, ``measure.<host>.gpu0``).

    Per queue: the host reports its measurement slots (a ``describe`` payload, answered by
    :func:`~.measure.describe_host` on that host), which bound that queue's own
    :class:`DOPController`; each batch is dealt in proportion to the queues' current DOPs, and each
    queue's share is measured as one DOPpler round (:func:`~.rounds.measure_round`) *on that host*:
    at most DOP candidates in flight (each tagged with its slot), a sample re-measured with one in
    flight (the host's serial reference), the error and DOP that host's own. Nothing is queued
    behind a busy host by us (at most DOP in flight), and the remote deadline starts when a worker
    takes a candidate (see ``tuning/distributed.py``); every local wait is bounded too.
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
        dop: str | int = "auto",
        queue_slots: dict[str, int] | None = None,
        wait_timeout_sec: float | None = None,
        target_device_type: str | None = None,
        dop_rule: Mapping[str, str] | None = None,
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
        # a candidate's whole local wait: a backstop past the platform's own queue (from submission,
        # 3600 s) and run (from a worker's start, 600 s) timeouts, which fire first in tuning/distributed.py
        self.wait_timeout_sec = float(wait_timeout_sec or timeout_sec + 4800.0)
        self.ledger = ledger or MeasureLedger()
        self.target_device_type = target_device_type
        self.slots = dict(queue_slots) if queue_slots else {q: self._describe_slots(q) for q in self.queues}
        self.controllers = {q: DOPController.for_dop(dop, self.slots[q], **(dop_rule or {})) for q in self.queues}
        self.controller = self.controllers[self.queues[0]]  # the session reports the first queue's DOP
        self._validated: dict[str, set[int]] = {q: set() for q in self.queues}
        # one thread per queue: its rounds run in order, the queues side by side
        self._rounds = {q: concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dist-{i}")
                        for i, q in enumerate(self.queues)}
        self.n_sent = 0
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._parts: dict[int, list[RoundReport]] = {}

    # ------------------------------------------------------------------ hosts
    def _describe_slots(self, q: str) -> int:
        """The measurement slots the host behind ``q`` reports (1 when it does not answer in time)."""
        try:
            answer = self.submit({"kind": "describe", "queue": q, "threads": self.threads,
                                  "device_type": "cuda" if "gpu" in q.rsplit(".", 1)[-1] else "cpu",
                                  "device_index": device_index_from_queue(q)}).result(timeout=60)
            return max(1, int(answer.get("slots") or 1)) if isinstance(answer, dict) else 1
        except Exception:  # noqa: BLE001 - an old worker, a lost message: measure serially there
            return 1

    def queue_dops(self) -> dict[str, int]:
        return {q: c.dop for q, c in self.controllers.items()}

    def queues_of_class(self, device_type: str | None) -> list[str]:
        """Queues whose devices are of the run's target class (``cpu`` or a GPU kind)."""
        if not device_type:
            return list(self.queues)
        gpu = device_type not in ("cpu", "llvm")
        picked = [q for q in self.queues if ("gpu" in q.rsplit(".", 1)[-1]) == gpu]
        return picked or list(self.queues)

    # ------------------------------------------------------------------ one candidate
    def _payload(self, job: MeasureJob, q: str, slot: int) -> dict[str, Any]:
        data = read_artifact(job.path)
        with self._lock:
            self.bytes_sent += len(data)
        payload = make_payload(data, device_type=job.device_type, args_info_json=job.args_info,
                               evaluator=self.evaluator, threads=self.threads, cpu_ids=self.cpu_ids,
                               device_index=device_index_from_queue(q), queue=q,
                               candidate=os.path.basename(os.path.dirname(job.path)),
                               kernel_binaries=binaries_beside(job.path) if job.device_type == "cuda" else None)
        payload["slot"] = int(slot)
        return payload

    def _one(self, q: str, job: MeasureJob, slot: int) -> tuple[MeasureOutcome, float | None]:
        t0 = time.perf_counter()
        try:
            payload = self._payload(job, q, slot)
        except (OSError, ValueError) as exc:  # the candidate's, not the queue's: no infrastructure error
            return MeasureOutcome([], f"candidate not shipped: {exc}", q), None
        try:
            remote = self.submit(payload)
            with self._lock:
                self.n_sent += 1
        except Exception as exc:  # noqa: BLE001
            return MeasureOutcome([], f"{INFRASTRUCTURE_ERROR}submit to {q} failed: {exc!r}", q), None
        try:
            out = MeasureOutcome.from_any(remote.result(timeout=self.wait_timeout_sec))
        except concurrent.futures.TimeoutError:
            out = MeasureOutcome([], f"{INFRASTRUCTURE_ERROR}{q}: no answer in {self.wait_timeout_sec:g} s", q)
        except Exception as exc:  # noqa: BLE001
            out = MeasureOutcome([], f"{INFRASTRUCTURE_ERROR}{exc}", q)
        return out, time.perf_counter() - t0

    def _measure_on(self, q: str, jobs: Sequence[MeasureJob], dop: int) -> list[tuple[MeasureOutcome, float | None]]:
        """``rounds.Measure`` for one host: at most ``dop`` candidates in flight, slot k of the host each."""
        dop = max(1, min(int(dop), len(jobs) or 1))
        free: queue.Queue = queue.Queue()
        for k in range(dop):
            free.put(k)

        def one(job):
            slot = free.get()
            try:
                return self._one(q, job, slot)
            finally:
                free.put(slot)

        with concurrent.futures.ThreadPoolExecutor(max_workers=dop, thread_name_prefix="dist-send") as ex:
            return list(ex.map(one, jobs))

    # ------------------------------------------------------------------ rounds
    def _queue_round(self, q: str, rnd: int, jobs: list[MeasureJob]) -> None:
        t0 = time.perf_counter()
        try:
            result = measure_round(jobs, functools.partial(self._measure_on, q), self.controllers[q],
                                   is_serial_config=lambda d: int(d) <= 1, validated=self._validated[q])
        except BaseException as exc:  # noqa: BLE001 - never leave futures hanging
            for job in jobs:
                if not job.future.done():
                    job.future.set_result((None, f"{INFRASTRUCTURE_ERROR}round on {q} failed: {exc!r}"))
            return
        self._validated[q] = result.validated
        for job, c in zip(jobs, result.candidates):
            self.ledger.put(job.path, CandidateMeta(
                round_index=rnd, dop=c.dop, worker=c.outcome.worker if c.outcome is not None else q,
                run_wall_secs=c.wall_secs, parallel_secs=c.latency_s if c.dop > 1 else None,
                remeasured_serially=c.remeasured, serial_secs=c.serial_reference_s))
        self._add_part(rnd, RoundReport(
            round_index=rnd, dop=result.dop, dop_after=result.decision.dop_after,
            mean_error=result.decision.mean_error, n_candidates=len(jobs), n_remeasured=result.n_remeasured,
            n_failures=result.n_failures, wall_secs=time.perf_counter() - t0,
            correction_applied=result.correction_applied))
        for job, c in zip(jobs, result.candidates):
            job.future.set_result((c.final_secs, c.final_error if not c.final_secs else None))

    def _add_part(self, rnd: int, part: RoundReport) -> None:
        """One queue's share of round ``rnd``; the round's report (the DOP chart's point) is the sum
        over its queues: total DOP, candidates, re-measures, failures; error weighted by candidates."""
        with self._lock:
            parts = self._parts.setdefault(rnd, [])
            parts.append(part)
            self.ledger.add_round(RoundReport(
                round_index=rnd, dop=sum(p.dop for p in parts), dop_after=sum(p.dop_after for p in parts),
                mean_error=_weighted_error(parts), n_candidates=sum(p.n_candidates for p in parts),
                n_remeasured=sum(p.n_remeasured for p in parts), n_failures=sum(p.n_failures for p in parts),
                wall_secs=max(p.wall_secs for p in parts),
                correction_applied=any(p.correction_applied for p in parts)))

    def run(self, runner_inputs: list[RunnerInput]) -> list[_EngineFuture]:
        rnd = self.ledger.next_round()
        owners = deal_by_capacity(len(runner_inputs), [self.controllers[q].dop for q in self.queues])
        jobs = [MeasureJob(path=str(inp.artifact_path), device_type=str(inp.device_type),
                           args_info=[_jsonable(a.as_json()) for a in inp.args_info],
                           future=concurrent.futures.Future()) for inp in runner_inputs]
        for d, q in enumerate(self.queues):
            mine = [j for j, o in zip(jobs, owners) if o == d]
            if mine:
                self._rounds[q].submit(self._queue_round, q, rnd, mine)
        # a bound on the engine's join: every candidate waited for twice (parallel and serially)
        return [_EngineFuture(j.future, 2 * self.wait_timeout_sec + 60) for j in jobs]

    def measure_serial(self, jobs: Sequence[MeasureJob]) -> list[MeasureOutcome]:
        """Measure ``jobs`` one at a time on one device of the run's target class (the final serial
        re-measure: every finalist on the same device, its serial reference slot 0)."""
        qs = self.queues_of_class(self.target_device_type or (jobs[0].device_type if jobs else None))
        return [self._one(qs[0], job, 0)[0] for job in jobs]

    def shutdown(self) -> None:
        for ex in self._rounds.values():
            ex.shutdown(wait=False, cancel_futures=True)
