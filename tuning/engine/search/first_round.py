"""A wall-time budget that reaches every task.

MetaSchedule gives every task one round before any task a second, and a round is ``trials_per_round``
candidates. ``workloads.round_size`` lowers the round so a *trial* budget reaches every task; a *time*
budget (the caller's sink answers "finish" once it is spent) had no such rule, and a task without a record
is compiled with TVM's default schedule: vgg11's layout pipelines (16 tasks, slower builds) at 4 minutes
ended with 2 to 6 tasks never measured, and one of its convs alone ran 46.5 ms on the default schedule in a
model onnxruntime runs in 3.6 ms.

:class:`FirstRoundPacer` does two things, both for tasks that have no record yet:

- with a known deadline, it sizes each such task's first batch so that the first round robin fits in
  ``FIRST_ROUND_SHARE`` of the time the search starts with, from the seconds a trial has cost so far in the
  search (its search, build and measurement together, once ``MIN_RATE_SAMPLE`` candidates were measured),
  never below ``MIN_FIRST_BATCH`` nor above the round. A budget that affords full rounds is left alone;
- once the caller asks to finish, the scheduler (``ControlledScheduler``) still gives each task still to come
  in the round robin without a record one batch of ``LATE_FIRST_BATCH`` candidates, then stops: a bounded
  overrun (one short batch a task) instead of a task compiled untuned.

TVM-free: the scheduler and the search wrapper call it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["FIRST_ROUND_SHARE", "LATE_FIRST_BATCH", "MIN_FIRST_BATCH", "MIN_RATE_SAMPLE", "FirstRoundPacer"]

# the first round robin may take up to this share of the search's time; the rest goes to the tasks whose
# gradient says more trials pay
FIRST_ROUND_SHARE = 0.5
# the smallest first batch the pacing gives a task (the platform refuses budgets under 8 trials a task)
MIN_FIRST_BATCH = 8
# the pacing waits for this many measured candidates before it trusts the rate: a first task with a one-schedule
# space (resnet18 opens with a reshape) costs a whole search for one candidate, and a rate taken from it cut the
# next tasks' first rounds to the floor
MIN_RATE_SAMPLE = 16
# a task reached only after the caller asked to finish gets this many candidates: the best of a few sampled
# schedules is far from TVM's default one (loop nests without tiling or vectorisation), and the overrun stays short
LATE_FIRST_BATCH = 4


class FirstRoundPacer:
    """Sizes the first batch of each task that has no record. ``unreached``: those tasks' indices;
    ``deadline``: when the caller's time budget ends (``clock``'s time; None: no time budget);
    ``measured``: a callable returning the candidates measured so far in this call."""

    def __init__(
        self,
        unreached: Iterable[int],
        *,
        deadline: float | None,
        measured: Callable[[], int],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.unreached = set(unreached)
        self.measured = measured
        self.clock = clock
        self.started = clock()
        self.measured_at_start = measured()
        self.first_round_s = None if deadline is None else FIRST_ROUND_SHARE * max(0.0, deadline - self.started)
        self.finishing = False  # the caller asked to finish; owed first batches are being given
        self.late: list[int] = []  # tasks given their first batch after the caller asked to finish
        self._lock = threading.Lock()

    def owes(self, task_index: int) -> bool:
        """``task_index`` has no record and has not had its first batch yet."""
        return task_index in self.unreached

    def first_batch(self, task_index: int, wanted: int) -> int:
        """How many of the ``wanted`` candidates ``task_index`` may send now (``wanted`` after its first batch)."""
        with self._lock:
            if task_index not in self.unreached or wanted <= 0:
                return wanted
            left = len(self.unreached)  # this task included
            self.unreached.discard(task_index)
            if self.finishing:
                self.late.append(task_index)
                return min(wanted, LATE_FIRST_BATCH)
            return min(wanted, self._paced(left))

    def _paced(self, tasks_left: int) -> int:
        if self.first_round_s is None:
            return 1 << 30
        n = self.measured() - self.measured_at_start
        if n < MIN_RATE_SAMPLE:
            return 1 << 30  # no trustworthy rate yet: the first tasks get the full round
        elapsed = self.clock() - self.started
        per_trial_s = elapsed / n
        share_s = (self.first_round_s - elapsed) / tasks_left
        if share_s <= 0:
            return MIN_FIRST_BATCH
        return max(MIN_FIRST_BATCH, int(share_s / per_trial_s))
