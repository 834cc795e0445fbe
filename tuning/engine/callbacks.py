"""Measure callback that streams every measured candidate to a sink, plus the
small shared state the engine's scheduler, runner and callback agree on."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

from .events import MeasurementRecord, NullSink, RoundInfo, TaskInfo, TuningSink, candidate_key

__all__ = ["EngineState", "StreamingMeasureCallback"]

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
    ) -> None:
        self.sink = sink or NullSink()
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

    def poll_control(self) -> str | None:
        try:
            cmd = self.sink.control()
        except Exception as exc:  # noqa: BLE001
            self.sink_errors.append(f"control(): {exc!r}")
            return None
        if cmd in ("cancel", "pause"):
            return cmd
        return None

    def notify_sink(self, name: str, *args) -> None:
        """Call ``sink.<name>(*args)``; a failing sink is logged and listed, never fatal."""
        try:
            getattr(self.sink, name)(*args)
        except Exception as exc:  # noqa: BLE001
            log.exception("sink.%s failed", name)
            self.sink_errors.append(f"{name}(): {exc!r}")

    def next_own_round(self) -> int:
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
    if error or not secs or min(secs) >= 1e9:
        return ([] if not secs or min(secs) >= 1e9 else secs), (error or "run: no result")
    return secs, None


@dataclasses.dataclass
class _Batch:
    """One measured batch of a task, as the callback reports it."""

    records: list[MeasurementRecord] = dataclasses.field(default_factory=list)  # new candidates only
    latencies: list[float | None] = dataclasses.field(default_factory=list)  # every candidate; None = failed
    rounds_seen: dict[int, int] = dataclasses.field(default_factory=dict)  # runner round -> candidates
    n_failures: int = 0
    best: float = math.inf


@derived_object
class StreamingMeasureCallback(PyMeasureCallback):
    """Turns each measured batch into :class:`MeasurementRecord` s and hands
    them to the sink at once (use after TVM's default callbacks)."""

    def __init__(self, state: EngineState) -> None:
        super().__init__()
        self.state = state

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        st = self.state
        task_id = int(task_id)
        if len(measure_candidates) == 0:
            self._empty_batch(task_id)
            return
        batch = self._read_batch(task_id, measure_candidates, builder_results, runner_results)
        with st.lock:
            st.trials_done += len(measure_candidates)
            st.best[task_id] = min(st.best.get(task_id, math.inf), batch.best)
            st.best_history[task_id].append(st.best[task_id])
            st.in_flight.discard(task_id)
        infos = self._round_infos(task_id, batch, len(measure_candidates))
        self._observe_trimmer(task_id, batch.latencies, infos)
        st.n_reported += len(batch.records)
        if batch.records:
            st.notify_sink("on_measurements", batch.records)
        for info in infos:
            st.rounds.append(info)
            st.notify_sink("on_round", info)

    def _empty_batch(self, task_id: int) -> None:
        """The search had nothing new (space exhausted): no round to report; for
        Trimmer it is a round without improvement."""
        st = self.state
        with st.lock:
            st.best_history[task_id].append(st.best.get(task_id, math.inf))
            st.in_flight.discard(task_id)
        if st.trimmer is not None:
            try:
                st.trimmer.observe_batch(task_id, [], round_index=-1)
            except Exception as exc:  # noqa: BLE001
                st.sink_errors.append(f"trimmer: {exc!r}")

    def _read_batch(self, task_id: int, measure_candidates, builder_results, runner_results) -> _Batch:
        """Records of the candidates not reported before, with what the runner's ledger knows."""
        st = self.state
        task = st.tasks[task_id]
        batch = _Batch()
        for cand, br, rr in zip(measure_candidates, builder_results, runner_results):
            key = candidate_key(task.name, cand.sch.trace)
            path = str(br.artifact_path) if br.artifact_path is not None else None
            meta = st.ledger.pop(path) if st.ledger is not None else None
            build_secs = st.build_secs.pop(path, None) if (st.build_secs is not None and path) else None
            secs, error = _outcome(br, rr)
            if error:
                batch.n_failures += 1
                batch.latencies.append(None)
            else:
                batch.best = min(batch.best, sum(secs) / len(secs))
                batch.latencies.append(sum(secs) / len(secs))
            if meta is not None:
                batch.rounds_seen[meta.round_index] = batch.rounds_seen.get(meta.round_index, 0) + 1
            if key in st.known_keys:
                st.n_duplicates += 1
                continue
            st.known_keys.add(key)
            batch.records.append(MeasurementRecord(
                task_index=task_id,
                task_name=task.name,
                round_index=-1 if meta is None else st.round_offset + meta.round_index,
                candidate_key=key,
                run_secs=secs,
                build_secs=build_secs,
                run_wall_secs=meta.run_wall_secs if meta else None,
                error=error,
                worker=meta.worker if meta else None,
                dop=meta.dop if meta else 1,
                remeasured_serially=bool(meta.remeasured_serially) if meta else False,
                serial_secs=meta.serial_secs if meta else None,
                parallel_secs=meta.parallel_secs if meta else None,
            ))
        return batch

    def _round_infos(self, task_id: int, batch: _Batch, n_candidates: int) -> list[RoundInfo]:
        """The runner's rounds this batch was measured in (from its ledger), or one round
        numbered here for a runner without a ledger (its records get that number)."""
        st = self.state
        if batch.rounds_seen and st.ledger is not None:
            infos = []
            for r in sorted(batch.rounds_seen):
                rep = st.ledger.rounds.get(r)
                infos.append(RoundInfo(
                    round_index=st.round_offset + r,
                    task_index=task_id,
                    dop=rep.dop if rep else 1,
                    mean_error=rep.mean_error if rep else None,
                    n_candidates=rep.n_candidates if rep else batch.rounds_seen[r],
                    n_remeasured=rep.n_remeasured if rep else 0,
                    n_failures=rep.n_failures if rep else 0,
                    dop_after=rep.dop_after if rep else None,
                    wall_secs=rep.wall_secs if rep else None,
                ))
            return infos
        r = st.round_offset + st.next_own_round()
        for rec in batch.records:
            rec.round_index = r
        return [RoundInfo(round_index=r, task_index=task_id, dop=1, mean_error=None, n_candidates=n_candidates,
                          n_remeasured=0, n_failures=batch.n_failures, dop_after=1)]

    def _observe_trimmer(self, task_id: int, latencies: list[float | None], infos: list[RoundInfo]) -> None:
        st = self.state
        if st.trimmer is None or not infos:
            return
        try:
            gen, filt = st.trimmer.observe_batch(task_id, latencies, round_index=infos[0].round_index)
            infos[0].n_generated, infos[0].n_filtered = gen, filt
        except Exception as exc:  # noqa: BLE001 - Trimmer must never lose measurements
            log.exception("Trimmer failed to observe a batch")
            st.sink_errors.append(f"trimmer: {exc!r}")
