"""TVM's gradient-based task scheduler, in Python, with a stop switch.

Same rule as ``ms.task_scheduler.GradientBased`` (round robin over the tasks
first, then the task with the largest weighted gradient
alpha * (best[n-1-w] - best[n-1]) / w + (1 - alpha) * best[n-1] / n, ties
broken at random), but ``next_task_id`` first asks the sink whether the run
must stop ("cancel" / "pause", or "finish": the search ends as if its budget
were spent); if so it joins the tasks still measuring (their records are
streamed) and returns -1, which ends TVM's tuning loop cleanly between rounds. A "finish" that
comes during the first round robin waits until each task still to come without a record has had one
short batch (``first_round``: no task compiled on TVM's default schedule for want of a turn).

The per-task best-latency history comes from :class:`EngineState` (filled by
the streaming callback), because TVM does not expose it to Python. Which task
has measurements in flight is tracked here too: TVM's ``JoinRunningTask``
must only be called on such a task.

With Trimmer (``state.trimmer``, a :class:`~tuning.engine.trimmer.hooks.TrimmerRuntime`),
``next_task_id`` also applies what the callback decided: it joins the tasks
that plateaued and gives them no more rounds (parked, not terminated: Trimmer
may resume one when budget is left; only a task whose search space ran out is
terminated, never from inside the callback: that crashes with an
asynchronous runner), ends the run on Trimmer's whole-model stop, and after
the first round robin gives the next round to the still-improving task
furthest below its share of the budget (split by share of end-to-end
latency) instead of using the gradient.
"""

from __future__ import annotations

import logging
import random

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.task_scheduler import PyTaskScheduler

from tuning.engine.latency import is_failed_latency
from tuning.engine.search.engine_state import EngineState

__all__ = ["ControlledScheduler"]

log = logging.getLogger(__name__)


@derived_object
class ControlledScheduler(PyTaskScheduler):
    def __init__(
        self,
        state: EngineState,
        *,
        alpha: float = 0.2,
        window_size: int = 3,
        seed: int | None = None,
        max_trials: int | None = None,
    ) -> None:
        super().__init__()
        self.state = state
        self.alpha = alpha
        self.window_size = window_size
        self.rng = random.Random(seed)
        self.max_trials = max_trials
        self._rr = 0

    def _join(self, outer, task_id: int) -> None:
        # a terminated task never has futures (TVM terminates before sending)
        if task_id in self.state.in_flight and not outer.tasks_[task_id].is_terminated:
            outer.join_running_task(task_id)
        self.state.in_flight.discard(task_id)

    def _join_all(self, outer) -> None:
        if len(self.state.in_flight) > 1:
            self._wait_measured()  # the first joins' callbacks would run beside the last batches' measuring
        for tid in sorted(self.state.in_flight):
            self._join(outer, tid)

    def _wait_measured(self) -> None:
        if self.state.wait_measured is not None:
            self.state.wait_measured()

    def _first_batches_owed(self, tasks) -> bool:
        """The caller asked to finish: True (and the pacer switches to short late batches) while a task
        still to come in the round robin has no record, so that no task is compiled on TVM's default
        schedule for want of one batch; cancel and pause are never deferred."""
        pacer = self.state.pacer
        if pacer is None or self._rr >= len(tasks):
            return False
        if not any(pacer.owes(i) and not tasks[i].is_terminated for i in range(self._rr, len(tasks))):
            return False
        if not pacer.finishing:
            pacer.finishing = True
            log.info("the caller asked to finish: tasks without a record get one short batch first")
        return True

    def _launch(self, task_id: int) -> int:
        """``task_id`` is the task TVM searches, builds and sends to the runner next."""
        self._wait_measured()  # the search leaves the cores to the batches still measuring
        self.state.in_flight.add(task_id)
        self.state.launching = task_id  # the StreamingRunner files the batch TVM now sends under it
        return task_id

    def _after_first_round(self) -> None:
        """The first round robin is joined: its records are in TVM's database (the compiled checkpoint)."""
        hook, self.state.after_first_round = self.state.after_first_round, None
        if hook is None:
            return
        try:
            hook()
        except Exception:  # noqa: BLE001 - an informative step must not end the search
            log.exception("the first round's hook failed")

    def _trim(self, outer) -> bool:
        """Apply Trimmer's decisions; True when the run must stop (whole-model stop)."""
        tr = self.state.trimmer
        if tr is None:
            return False
        tasks = outer.tasks_
        while True:
            pending = [t for t in tr.take_pending() if 0 <= t < len(tasks) and not tasks[t].is_terminated]
            if not pending:
                break
            for tid in pending:
                self._join(outer, tid)  # its last batch is kept (and may pre-empt others)
                # a pre-empted task is only parked (Trimmer may resume it); one whose search space
                # ran out, or that a verified record-cache hit settled, is done
                if tid in tr.finished and not tasks[tid].is_terminated:
                    outer.terminate_task(tid)
        if tr.stop_reason:
            self._join_all(outer)
            return True
        return False

    def next_task_id(self) -> int:
        outer = self._outer()
        st = self.state
        st.scheduler, st.launching = outer, None
        tasks = outer.tasks_
        n = len(tasks)

        cmd = st.poll_control()
        if cmd == "finish" and self._first_batches_owed(tasks):
            cmd = None  # the round robin gives each task still without a record one short batch first
        if cmd is not None:
            st.stop_reason = cmd
            self._join_all(outer)
            return -1
        if self.max_trials is not None and st.trials_done >= self.max_trials:
            self._join_all(outer)
            return -1
        if self._trim(outer):
            return -1

        # Phase 1: round robin, no joins (measuring overlaps the next task's search)
        finishing = st.pacer is not None and st.pacer.finishing
        while self._rr < n:
            tid = self._rr
            self._rr += 1
            if finishing and not st.pacer.owes(tid):
                continue  # past the caller's finish: only the tasks without a record
            if not tasks[tid].is_terminated and not (st.trimmer is not None and st.trimmer.is_preempted(tid)):
                self._join(outer, tid)
                return self._launch(tid)
        if self._rr == n:
            self._rr += 1
            self._join_all(outer)
            if finishing:
                st.stop_reason = "finish"
                return -1
            if self._trim(outer):
                return -1
            self._after_first_round()  # not for a run that Trimmer just stopped

        # Phase 2: gradient (Trimmer: share of the end-to-end latency)
        alive = []
        for i in range(n):
            if i in st.in_flight and not tasks[i].is_terminated:
                outer.touch_task(i)
            if not tasks[i].is_terminated:
                alive.append(i)
            else:
                st.in_flight.discard(i)
        if st.trimmer is not None:
            if self._trim(outer):
                return -1
            alive = [i for i in alive if not tasks[i].is_terminated]
            if not alive:
                self._join_all(outer)
                st.trimmer.finish_all_preempted()
                return -1
            remaining = (self.max_trials - st.trials_done) if self.max_trials is not None else 0
            tid = st.trimmer.choose(alive, remaining, st.in_flight)
            if tid is None:
                self._join_all(outer)
                st.trimmer.finish_all_preempted()
                return -1
            self._join(outer, tid)
            if tasks[tid].is_terminated or st.trimmer.is_preempted(tid) or st.trimmer.stop_reason:
                return self.next_task_id()  # its joined batch pre-empted it or stopped the run
            return self._launch(tid)
        if not alive:
            return -1
        w = self.window_size
        grads = []
        for i in alive:
            hist = st.best_history.get(i) or []
            if not hist or is_failed_latency(hist[-1]):
                grads.append(1e9)
                continue
            k = len(hist)
            best = hist[-1]
            g1 = (hist[k - 1 - w] - best) / w if k >= 1 + w else 0.0
            g2 = best / k
            grads.append((self.alpha * g1 + (1 - self.alpha) * g2) * float(tasks[i].task_weight))
        gmax, gmin = max(grads), min(grads)
        if gmax == gmin:
            tid = alive[self.rng.randrange(len(alive))]
        else:
            tid = alive[grads.index(gmax)]
        self._join(outer, tid)
        if tasks[tid].is_terminated:  # pragma: no cover - joined task got terminated
            return self.next_task_id()
        return self._launch(tid)
