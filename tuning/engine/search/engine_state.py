"""What the task scheduler, the measure callback, the streamer and the session share during one run
(:class:`EngineState`), and one launched candidate's record (:class:`LaunchedCandidate`).

TVM-free: the scheduler and ``remeasure`` import it without the callbacks (:mod:`.callbacks`)."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from typing import Any

from tuning.engine.events import (
    MeasurementRecord,
    NullSink,
    ProgressInfo,
    RoundInfo,
    TaskInfo,
    TuningSink,
    candidate_key,
)
from tuning.engine.latency import is_failed_latency

__all__ = ["EngineState", "LaunchedCandidate"]

log = logging.getLogger(__name__)


class EngineState:
    """What the scheduler, the callback and the session share during one run."""

    def __init__(
        self,
        sink: TuningSink | None,
        tasks: list[TaskInfo],
        *,
        known_keys: set[str] | None = None,
        ledger: Any = None,
        build_secs: dict[str, float] | None = None,
        initial_best: dict[int, float] | None = None,
        round_offset: int = 0,
        trimmer: Any = None,
        journal: Any = None,
    ) -> None:
        self.sink = sink or NullSink()
        self.journal = journal  # database.StreamJournal: what is reported before TVM's join commits it
        self.tasks = tasks
        self.known_keys: set[str] = set(known_keys or ())
        self.ledger = ledger
        self.build_secs = build_secs
        self.best: dict[int, float] = {t.index: math.inf for t in tasks}
        if initial_best:
            self.best.update(initial_best)
        self.best_history: dict[int, list[float]] = {t.index: [] for t in tasks}
        self.in_flight: set[int] = set()
        self.stop_reason: str | None = None
        self.n_reported = 0
        self.n_duplicates = 0
        self.trials_done = 0
        self.round_offset = round_offset
        self.own_rounds = 0  # rounds numbered here (runners without a ledger of their own)
        self.rounds: list[RoundInfo] = []
        self.sink_errors: list[str] = []
        self.lock = threading.Lock()
        self.trimmer = trimmer  # TrimmerRuntime when Trimmer is on (decides; the scheduler acts)
        self.exhausted: set[int] = set()  # tasks whose search had nothing new (Trimmer or not)
        # streaming before the join (ProgressStreamer): the batch each task has in flight, one
        # entry per candidate in TVM's order; the task TVM is launching; its scheduler object
        self.batches: dict[int, list[LaunchedCandidate]] = {}
        self.launching: int | None = None
        self.scheduler = None
        self.emit_lock = threading.Lock()  # one report of a candidate at a time (streamer vs. join)
        self.builds_in_flight = 0
        self.measurements_in_flight = 0
        self.n_streamed = 0  # records reported before their task's join
        # waits until no batch is measuring; the scheduler calls it before TVM searches a task's next
        # batch or runs join callbacks while batches may be in flight (set by session._pace
        # when measurements must not share their cores with that work); None: they overlap
        self.wait_measured: Any = None
        # called once by the scheduler when its first round robin has ended and been joined (every task
        # reached; the session's compiled checkpoint); None: nothing to do
        self.after_first_round: Any = None
        # first_round.FirstRoundPacer: sizes the first batch of tasks without a record (set by the search)
        self.pacer: Any = None

    def poll_control(self) -> str | None:
        try:
            cmd = self.sink.control()
        except Exception as exc:  # noqa: BLE001
            self.sink_errors.append(f"control(): {exc!r}")
            return None
        if cmd in ("cancel", "pause", "finish"):
            return cmd
        return None

    def notify_sink(self, name: str, *args) -> bool:
        """Call ``sink.<name>(*args)``; a failing sink is logged and listed, never fatal (False)."""
        try:
            getattr(self.sink, name)(*args)
            return True
        except Exception as exc:  # noqa: BLE001
            log.exception("sink.%s failed", name)
            self.sink_errors.append(f"{name}(): {exc!r}")
            return False

    def notify_progress(self) -> None:
        """Builds and measurements in flight, to a sink that takes them (``on_progress``)."""
        if not hasattr(self.sink, "on_progress"):
            return
        with self.lock:
            info = ProgressInfo(
                builds_in_flight=self.builds_in_flight,
                measurements_in_flight=self.measurements_in_flight,
                trials_reported=self.n_reported,
            )
        self.notify_sink("on_progress", info)

    def settle(self, entry: LaunchedCandidate, rr) -> None:
        """Turn one candidate's build and runner results into its record (None: reported before,
        a duplicate) and the runner's facts about it (call with ``self.lock`` held)."""
        task = self.tasks[entry.task_index]
        br = entry.br
        key = candidate_key(task.name, entry.cand.sch.trace)
        path = str(br.artifact_path) if br.artifact_path is not None else None
        entry.meta = self.ledger.pop(path) if self.ledger is not None else None
        build_secs = self.build_secs.pop(path, None) if (self.build_secs is not None and path) else None
        secs, error = _outcome(br, rr)
        entry.latency = None if error else sum(secs) / len(secs)
        entry.settled = True
        if key in self.known_keys:
            self.n_duplicates += 1
            return
        self.known_keys.add(key)
        meta = entry.meta
        entry.record = MeasurementRecord(
            task_index=entry.task_index,
            task_name=task.name,
            round_index=(
                self.round_offset + meta.round_index
                if meta is not None
                else -1
                if entry.own_round is None
                else entry.own_round
            ),
            candidate_key=key,
            run_secs=secs,
            build_secs=build_secs,
            run_wall_secs=meta.run_wall_secs if meta else None,
            error=error,
            worker=meta.worker if meta else None,
            dop=meta.dop if meta else 1,
            remeasured_serially=bool(meta.remeasured_serially) if meta else False,
            serial_secs=meta.serial_secs if meta else None,
        )

    def next_own_round(self) -> int:
        """A round number for a batch the runner numbered none for: from the runner's ledger when
        it keeps one (so the two never collide), else counted here."""
        if self.ledger is not None:
            return self.ledger.next_round()
        r = self.own_rounds
        self.own_rounds += 1
        return r


def _run_secs(rr) -> list[float]:
    if rr is None or rr.run_secs is None:
        return []
    return [float(x) for x in rr.run_secs]


def _outcome(br, rr) -> tuple[list[float], str | None]:
    """(run seconds, error) of one candidate; a failure has no seconds and always an error."""
    secs = _run_secs(rr)
    error = None
    if br.error_msg:
        error = "build: " + str(br.error_msg)
    elif rr is not None and rr.error_msg:
        error = "run: " + str(rr.error_msg)
    if error or not secs or is_failed_latency(min(secs)):
        return ([] if not secs or is_failed_latency(min(secs)) else secs), (error or "run: no result")
    return secs, None


@dataclasses.dataclass
class LaunchedCandidate:
    """One candidate of a launched batch: what TVM gave it and, once settled, its record."""

    task_index: int
    cand: Any  # MeasureCandidate
    br: Any  # BuilderResult
    future: Any = None  # RunnerFuture; None when the build failed (nothing sent to the runner)
    settled: bool = False
    record: MeasurementRecord | None = None  # None once settled: a duplicate
    meta: Any = None  # the runner ledger's CandidateMeta
    latency: float | None = None
    reported: bool = False
    own_round: int | None = None  # round numbered here at launch (a runner without a ledger)
