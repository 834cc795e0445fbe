"""The local measuring runner: a pool of measurement slots with DOPpler's adaptive parallelism (one
per GPU too, see ``multi_device``; hosts' queues: ``distributed``).

``PooledAsyncRunner.run`` returns at once; a background thread measures the
batch as one DOPpler *round* (:func:`~.rounds.measure_round`):

1. the batch is measured DOP candidates at a time by DOP persistent worker processes, one per
   measurement slot (slots.py: T = deployment threads cores each, SMT/NUMA-aware, inside the
   affinity mask; affinity set, ``TVM_BIND_THREADS=0``, ``TVM_NUM_THREADS`` = T);
2. at DOP > 1 a sample chosen by the DOP rule (``doppler/rule.py``: outliers + a share of good candidates)
   and every failed candidate are re-measured by the serial worker (slot 0, T threads, the other
   slots idle): the same program measured the same way, alone;
3. the rule decides the DOP of the next round from the mean error; the
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
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerInput

from tuning.engine.doppler.platform_rule import make_rule
from tuning.engine.doppler.rounds import measure_round
from tuning.engine.doppler.rule import DopRule
from tuning.engine.measuring import measure
from tuning.engine.measuring.cuda_binaries import CACHE_DIR_VAR, new_cache_dir
from tuning.engine.measuring.measure import MeasureOutcome, _jsonable
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
from tuning.engine.process.sandbox import RUNTIME_ONLY_ENV, remove_dir
from tuning.engine.runners.measure_jobs import (
    answer_search,
    record_candidates,
    INFRASTRUCTURE_ERROR,
    EngineFuture,
    MeasureJob,
    MeasureLedger,
    RoundReport,
)

__all__ = ["PooledAsyncRunner"]


@derived_object
class PooledAsyncRunner(PyRunner):
    """Asynchronous local runner with a persistent, core-partitioned pool and
    DOPpler's DOP control (see module doc).

    ``threads``: deployment thread count = the serial reference (default: all
    measuring cores). ``cpu_ids``: cores to measure on (default: this
    process's affinity set). ``dop``: ``"auto"`` (DOPpler) or a fixed int; ``dop_rule``: the auto rule,
    a :class:`DopRule` class or factory called with the slot count (default: the platform's).
    """

    def __init__(
        self,
        *,
        evaluator: EvaluatorConfig | dict | None = None,
        threads: int | None = None,
        cpu_ids: Sequence[int] | None = None,
        dop: str | int = "auto",
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
        dop_rule: Callable[[int], DopRule] | None = None,
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
        self.slots: list[Slot] = (
            list(slots) if slots else plan_slots(read_topology(affinity=self.cores), int(threads or len(self.cores)))
        )
        self.threads = self.slots[0].threads
        self.rule = make_rule(dop, len(self.slots), dop_rule)
        self.rule.limit_max_dop(len(self.slots))
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
        if self.rule.dop > 1:
            self._pool(self.rule.dop)  # and the first round's parallel workers
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
                    WorkerSpec(
                        name=f"measure-d{dop}-w{i}",
                        cpu_ids=cpus,
                        threads=t,
                        limits=self.worker_limits,
                        env=dict(self.worker_env),
                    )
                    for i, (cpus, t) in enumerate(self.worker_layout(dop))
                    if i >= len(shared)
                ]
                pool = ProcessPool(specs, initializer=measure.warmup, max_uses=self.max_uses, shared=shared)
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
    def run(self, runner_inputs: list[RunnerInput]) -> list[EngineFuture]:
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
            futures.append(EngineFuture(fut, None, alive=self._thread.is_alive))
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
            done = self._pending_lock.wait_for(
                lambda: self._pending == 0 or not self._thread.is_alive(), timeout=timeout
            )
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
            out = MeasureOutcome(
                [], f"{INFRASTRUCTURE_ERROR}{type(exc).__name__}: {exc}", getattr(fut, "worker_name", "?")
            )
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
        result = measure_round(
            jobs,
            self._measure,
            self.rule,
            is_serial_config=self.is_serial_config,
            validated=self._validated,
            probe_first=self.probe_first,
            remeasure_on_large_error=self.remeasure_on_large_error,
        )
        self._validated = result.validated
        next_dop = result.warm_dop or result.decision.dop_after
        self.retire_pools({next_dop})  # DOPs left behind give their cores and memory back
        if next_dop > 1:
            self._pool(next_dop)  # start the next round's workers now (they load TVM while TVM searches)
        record_candidates(self.ledger, jobs, result, rnd, default_worker=None)
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
        answer_search(jobs, result)
        if self.on_round is not None:
            try:
                self.on_round(report)
            except Exception:  # noqa: BLE001 - a report hook never fails the round
                pass
