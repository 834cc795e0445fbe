"""What the measuring runners share: the jobs they measure, the futures they answer the search with,
the ledger of per-candidate facts and round reports, and how a batch is dealt over devices or hosts.

An error starting with :data:`INFRASTRUCTURE_ERROR` says nothing about the candidate (a lost message,
a dead measuring worker, no answer in time): the search never shows it to the cost model.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunnerFuture, RunnerResult

__all__ = [
    "INFRASTRUCTURE_ERROR",
    "is_infrastructure_failure",
    "deal_by_capacity",
    "CandidateMeta",
    "RoundReport",
    "MeasureLedger",
    "EngineFuture",
    "MeasureJob",
    "runner_object",
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
class EngineFuture(PyRunnerFuture):
    """RunnerFuture over a ``concurrent.futures.Future`` resolving to
    ``(run_secs | None, error | None)``."""

    def __init__(
        self, fut: concurrent.futures.Future, timeout_sec: float | None = None, alive: Callable[[], bool] | None = None
    ) -> None:
        super().__init__()
        self.fut = fut
        self.deadline = None if timeout_sec is None else time.monotonic() + timeout_sec
        self.timeout_sec = timeout_sec
        self.alive = alive  # whoever resolves `fut` (a measuring thread): a dead one never will

    def _abandoned(self) -> bool:
        return self.alive is not None and not self.fut.done() and not self.alive()

    def done(self) -> bool:
        return self.fut.done() or self._abandoned() or (self.deadline is not None and time.monotonic() > self.deadline)

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

    @property
    def search_future(self) -> concurrent.futures.Future:
        """:attr:`future`, for the runners' rounds, which only measure jobs their ``run`` gave one."""
        if self.future is None:
            raise RuntimeError(f"{self.path}: a measurement outside the search has no future to answer")
        return self.future


def runner_object(runner):
    """The Python object behind a ``derived_object`` runner (its ``run`` returns our own futures)."""
    return getattr(runner, "_inst", runner)


def record_candidates(
    ledger: MeasureLedger, jobs: Sequence[MeasureJob], result, round_index: int, default_worker: str | None
) -> None:
    """Each measured candidate's facts of a round (``rounds.measure_round``'s result) into the ledger,
    where the sink reads them; ``default_worker`` names the worker of a candidate that has no outcome."""
    for job, c in zip(jobs, result.candidates):
        ledger.put(
            job.path,
            CandidateMeta(
                round_index=round_index,
                dop=c.dop,
                worker=c.outcome.worker if c.outcome is not None else default_worker,
                run_wall_secs=c.wall_secs,
                parallel_secs=c.latency_s if c.dop > 1 else None,
                remeasured_serially=c.remeasured,
                serial_secs=c.serial_reference_s,
            ),
        )


def answer_search(jobs: Sequence[MeasureJob], result) -> None:
    """Hand each candidate's final timing (or, without one, its error) back to TVM's search."""
    for job, c in zip(jobs, result.candidates):
        job.search_future.set_result((c.final_secs, c.final_error if not c.final_secs else None))
