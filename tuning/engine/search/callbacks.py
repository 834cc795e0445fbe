"""How measured candidates reach the sink, plus the small shared state the engine's scheduler,
runner and callback agree on (:mod:`.engine_state`).

TVM hands results to Python only when the task scheduler *joins* a task, and our scheduler
launches a whole round robin of tasks before its first join (measuring overlaps the next task's
search): a 19-task network showed no progress for 17 minutes. So results travel two ways, and each
candidate is reported exactly once, whichever comes first:

- :class:`ProgressStreamer`: a thread that watches the runner futures of every launched batch
  (:class:`StreamingRunner` hands them over as TVM submits them) and sends each candidate to the
  sink as soon as its future is done, whatever the join order;
- :class:`StreamingMeasureCallback`: at the join, reports what the streamer has not (yet), and
  does the per-batch work that needs the joined batch (trial count, best history, Trimmer, DOP
  rounds).

:class:`ObservedBuilder` counts the candidates being built; the streamer counts those sent to the
runner and not measured yet; both reach the sink as ``on_progress`` (builds / measurements in
flight) when the sink has that method."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Sequence

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import PyBuilder
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback
from tvm.s_tir.meta_schedule.runner import PyRunner

from tuning.engine.events import MeasurementRecord, RoundInfo
from tuning.engine.search.engine_state import EngineState, LaunchedCandidate

__all__ = ["StreamingMeasureCallback", "ProgressStreamer", "StreamingRunner", "ObservedBuilder"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _Batch:
    """One measured batch of a task, as the callback reports it."""

    records: list[MeasurementRecord] = dataclasses.field(default_factory=list)  # not reported before
    latencies: list[float | None] = dataclasses.field(default_factory=list)  # every candidate; None = failed
    rounds_seen: dict[int, int] = dataclasses.field(default_factory=dict)  # runner round -> candidates
    n_failures: int = 0
    best: float = math.inf
    n_new: int = 0  # records of this batch, reported now or streamed before
    own_round: int | None = None  # the round numbered at launch (runner without a ledger)


@derived_object
class StreamingMeasureCallback(PyMeasureCallback):
    """At TVM's join of a batch: reports the candidates the streamer has not and does the per-batch
    bookkeeping (use after TVM's default callbacks)."""

    def __init__(self, state: EngineState) -> None:
        super().__init__()
        self.state = state

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        st = self.state
        task_id = int(task_id)
        if len(measure_candidates) == 0:
            self._empty_batch(task_id)
            return
        with st.emit_lock:
            batch = self._read_batch(task_id, measure_candidates, builder_results, runner_results)
            if batch.records:
                st.n_reported += len(batch.records)
                st.notify_sink("on_measurements", batch.records)
        with st.lock:
            st.trials_done += len(measure_candidates)
            st.best[task_id] = min(st.best.get(task_id, math.inf), batch.best)
            st.best_history[task_id].append(st.best[task_id])
            st.in_flight.discard(task_id)
        infos = self._round_infos(task_id, batch, len(measure_candidates))
        if st.journal is not None and infos:  # a killed call's successor numbers on from here
            st.journal.note_round(max(i.round_index for i in infos))
        self._observe_trimmer(task_id, batch.latencies, infos)
        for info in infos:
            st.rounds.append(info)
            st.notify_sink("on_round", info)
        st.notify_progress()

    def _empty_batch(self, task_id: int) -> None:
        """The search had nothing new (space exhausted): no round to report; for
        Trimmer it is a round without improvement."""
        st = self.state
        with st.lock:
            st.best_history[task_id].append(st.best.get(task_id, math.inf))
            st.in_flight.discard(task_id)
            st.batches.pop(task_id, None)
            st.exhausted.add(task_id)
        if st.trimmer is not None:
            try:
                st.trimmer.observe_batch(task_id, [], round_index=-1, exhausted=True)
            except Exception as exc:  # noqa: BLE001
                st.sink_errors.append(f"trimmer: {exc!r}")

    def _entries(self, task_id: int, measure_candidates, builder_results) -> list[LaunchedCandidate]:
        """The streamer's entries of this batch when they are the joined candidates, else new ones."""
        st = self.state
        with st.lock:
            entries = st.batches.pop(task_id, None)
        if (
            entries is None
            or len(entries) != len(measure_candidates)
            or not all(e.cand.same_as(c) for e, c in zip(entries, measure_candidates))
        ):
            return [LaunchedCandidate(task_id, c, b) for c, b in zip(measure_candidates, builder_results)]
        return entries

    def _read_batch(self, task_id: int, measure_candidates, builder_results, runner_results) -> _Batch:
        """The batch's latencies, and the records of its candidates not reported before."""
        st = self.state
        batch = _Batch()
        entries = self._entries(task_id, measure_candidates, builder_results)
        batch.own_round = entries[0].own_round if entries else None
        with st.lock:
            for entry, rr in zip(entries, runner_results):
                if not entry.settled:
                    st.settle(entry, rr)
                    if entry.future is not None:
                        st.measurements_in_flight = max(0, st.measurements_in_flight - 1)
                batch.latencies.append(entry.latency)
                if entry.latency is None:
                    batch.n_failures += 1
                else:
                    batch.best = min(batch.best, entry.latency)
                if entry.meta is not None:
                    r = entry.meta.round_index
                    batch.rounds_seen[r] = batch.rounds_seen.get(r, 0) + 1
                if entry.record is not None:
                    batch.n_new += 1
                    if not entry.reported:
                        entry.reported = True
                        batch.records.append(entry.record)
        return batch

    def _round_infos(self, task_id: int, batch: _Batch, n_candidates: int) -> list[RoundInfo]:
        """The runner's rounds this batch was measured in (from its ledger), or one round
        numbered here for a runner without a ledger (its records get that number)."""
        st = self.state
        if batch.rounds_seen and st.ledger is not None:
            infos = self._ledger_rounds(task_id, batch)
            # failed builds never reached the runner: they belong to the batch's (first) round
            unsent = n_candidates - sum(batch.rounds_seen.values())
            infos[0].n_candidates += unsent
            infos[0].n_failures += unsent
            for rec in batch.records:
                if rec.round_index < 0:
                    rec.round_index = infos[0].round_index
            return infos
        r = batch.own_round if batch.own_round is not None else st.round_offset + st.next_own_round()
        for rec in batch.records:
            rec.round_index = r
        return [
            RoundInfo(
                round_index=r,
                task_index=task_id,
                dop=1,
                mean_error=None,
                n_candidates=n_candidates,
                n_remeasured=0,
                n_failures=batch.n_failures,
                dop_after=1,
            )
        ]

    def _ledger_rounds(self, task_id: int, batch: _Batch) -> list[RoundInfo]:
        """The runner's reports of the rounds this batch's measured candidates were in."""
        st = self.state
        infos = []
        for r in sorted(batch.rounds_seen):
            rep = st.ledger.rounds.get(r)
            infos.append(
                RoundInfo(
                    round_index=st.round_offset + r,
                    task_index=task_id,
                    dop=rep.dop if rep else 1,
                    mean_error=rep.mean_error if rep else None,
                    n_candidates=rep.n_candidates if rep else batch.rounds_seen[r],
                    n_remeasured=rep.n_remeasured if rep else 0,
                    n_failures=rep.n_failures if rep else 0,
                    dop_after=rep.dop_after if rep else None,
                    wall_secs=rep.wall_secs if rep else None,
                    parallel_wall_secs=rep.parallel_wall_secs if rep else None,
                    serial_wall_secs=rep.serial_wall_secs if rep else None,
                )
            )
        return infos

    def _observe_trimmer(self, task_id: int, latencies: list[float | None], infos: list[RoundInfo]) -> None:
        st = self.state
        if st.trimmer is None or not infos:
            return
        try:
            gen, filt, unsent = st.trimmer.observe_batch(task_id, latencies, round_index=infos[0].round_index)
            infos[0].n_generated, infos[0].n_filtered, infos[0].n_not_sent = gen, filt, unsent
        except Exception as exc:  # noqa: BLE001 - Trimmer must never lose measurements
            log.exception("Trimmer failed to observe a batch")
            st.sink_errors.append(f"trimmer: {exc!r}")


# --------------------------------------------------------------------------- before the join
class ProgressStreamer:
    """Reports each candidate to the sink as soon as its runner future is done (a daemon thread
    polling the futures of the batches in flight), so results, the best-so-far curve and the
    energy move while the scheduler has joined nothing. A report the sink refuses is left to
    the join (the callback reports what is not reported)."""

    POLL_S = 0.1

    def __init__(self, state: EngineState, *, poll_s: float | None = None) -> None:
        self.state = state
        self.poll_s = self.POLL_S if poll_s is None else poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tuning-progress", daemon=True)
        self._thread.start()

    def register(self, task_id: int, candidates: Sequence, builder_results: Sequence, futures: Sequence) -> None:
        """A batch TVM just sent to the runner: ``futures`` in the order of the built candidates."""
        st = self.state
        pending = iter(futures)
        entries = []
        for cand, br in zip(candidates, builder_results):
            entries.append(LaunchedCandidate(task_id, cand, br, None if br.error_msg else next(pending, None)))
        with st.lock:
            if st.ledger is None:  # the runner numbers no rounds: one per batch, numbered now
                own = st.round_offset + st.next_own_round()
                for e in entries:
                    e.own_round = own
            st.batches[task_id] = entries
            st.measurements_in_flight += sum(1 for e in entries if e.future is not None)
        # failed builds have nothing to wait for; under a runner's ledger their round is known
        # only at the join (the round the runner gives the rest of the batch)
        self._report(lambda e: e.future is None and e.own_round is not None)
        self.state.notify_progress()

    def _done(self, entry: LaunchedCandidate) -> bool:
        try:
            return bool(entry.future.done())
        except Exception:  # noqa: BLE001 - a broken future is the join's to report
            return False

    def _report(self, ready) -> int:
        """Settle and report every unsettled candidate for which ``ready(entry)`` holds."""
        st = self.state
        with st.emit_lock:
            with st.lock:
                todo = [e for batch in st.batches.values() for e in batch if not e.settled]
            todo = [e for e in todo if ready(e)]
            if not todo:
                return 0
            results = {id(e): (e.future.result() if e.future is not None else None) for e in todo}
            records, entries = [], []
            with st.lock:
                for e in todo:
                    if e.settled:  # the join got there first
                        continue
                    st.settle(e, results[id(e)])
                    if e.future is not None:
                        st.measurements_in_flight = max(0, st.measurements_in_flight - 1)
                    if e.record is not None:
                        e.reported = True
                        records.append(e.record)
                        entries.append(e)
            if records and not self._journal(entries):
                records = []  # not durable: the join reports them, once TVM's database has them
            if records and st.notify_sink("on_measurements", records):
                with st.lock:
                    st.n_reported += len(records)
                    st.n_streamed += len(records)
            else:
                for e in entries:  # refused: the join reports them
                    e.reported = False
        st.notify_progress()
        return len(records)

    def _journal(self, entries: list[LaunchedCandidate]) -> bool:
        """Write the entries to the run's journal before the sink hears of them (False: it failed)."""
        st = self.state
        if st.journal is None:
            return True
        try:
            st.journal.record(
                [
                    (e.task_index, e.record.round_index, e.cand, e.record.run_secs)
                    for e in entries
                    if e.record is not None
                ]
            )
            return True
        except Exception as exc:  # noqa: BLE001 - a full disk must not stop the run
            log.exception("could not journal streamed results")
            st.sink_errors.append(f"journal: {exc!r}")
            for e in entries:
                e.reported = False
            return False

    def poll(self) -> int:
        """Report the candidates measured since the last poll (also called by the thread)."""
        return self._report(lambda e: e.future is not None and self._done(e))

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - never kill the run; the join reports instead
                log.exception("progress streamer failed")
                self.state.sink_errors.append(f"progress: {exc!r}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@derived_object
class StreamingRunner(PyRunner):
    """Delegates to the run's runner and hands each batch's futures to the :class:`ProgressStreamer`
    (with the candidates and builds TVM just recorded for the task being launched)."""

    def __init__(self, inner, streamer: ProgressStreamer) -> None:
        super().__init__()
        self.inner = inner
        self.streamer = streamer

    def run(self, runner_inputs):
        futures = list(self.inner.run(runner_inputs))
        st = self.streamer.state
        task_id, outer = st.launching, st.scheduler
        if task_id is not None and outer is not None:
            try:
                rec = outer.tasks_[task_id]
                self.streamer.register(task_id, list(rec.measure_candidates), list(rec.builder_results), futures)
            except Exception as exc:  # noqa: BLE001 - the join still reports this batch
                log.exception("could not watch a batch")
                st.sink_errors.append(f"progress: {exc!r}")
        return futures


@derived_object
class ObservedBuilder(PyBuilder):
    """Delegates to the run's builder and counts the candidates being built (``on_progress``)."""

    def __init__(self, inner, state: EngineState) -> None:
        super().__init__()
        self.inner = inner
        self.state = state

    def build(self, build_inputs):
        st = self.state
        n = len(build_inputs)
        with st.lock:
            st.builds_in_flight += n
        st.notify_progress()
        try:
            return self.inner.build(build_inputs)
        finally:
            with st.lock:
                st.builds_in_flight = max(0, st.builds_in_flight - n)
            st.notify_progress()
