"""A run's trial budget per task: what each task has spent, which tasks still get rounds, and who is next.

Two mechanisms decide about tasks and both need the same ledger: Trimmer parks a task whose search
plateaued and resumes it when budget is left (``trimmer/``), and the record cache settles a task whose
cached record verified on this host and seeds the others' times (``records/``). Neither owns the
budget; :class:`TrialBudget` does, and both call it:

- **trials** per task (measured here, seeds included) and each task's **best** latency: the
  allocation's shares (weight x best latency) come from them;
- **park** / **resume**: a parked task gets no rounds but may be resumed (at most ``max_resumes``
  times) when no task is left to tune and budget remains;
- **settle**: a task done before the search (a verified record-cache hit): never resumed;
  **exhaust**: a task whose search space ran out. Both are :attr:`TrialBudget.finished`;
- **pending**: the tasks parked, settled or exhausted since the task scheduler last looked (it joins
  them between rounds: a task must not be terminated from inside a measure callback);
- the **allocation** (:func:`allocate_trials`, :meth:`TrialBudget.choose`): the budget split among
  the tasks still tuned by their share of end-to-end latency, the task furthest below its allotment
  next.

Pure Python (no TVM, no Django); the caller holds :attr:`TrialBudget.lock` around a sequence of
calls that must see one state (the measure callback and the task scheduler run on different threads).
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

__all__ = ["TrialBudget", "allocate_trials", "fair_shares"]


class _Task(Protocol):  # events.TaskInfo
    index: int
    name: str
    weight: float


def allocate_trials(
    remaining: int, tasks: Mapping[int, tuple[float, float | None]], active: Sequence[int]
) -> dict[int, int]:
    """Split ``remaining`` trials among ``active`` tasks by share of end-to-end latency.

    ``tasks`` maps task -> (weight, best latency or None). A task with no
    measurement yet gets the mean share, so new tasks are not starved.
    Largest-remainder rounding: the result sums to ``remaining`` exactly.
    """
    active = list(active)
    if remaining <= 0 or not active:
        return {t: 0 for t in active}
    weighted = {t: tasks[t][0] * best for t in active if (best := tasks[t][1])}
    fallback = (sum(weighted.values()) / len(weighted)) if weighted else 1.0
    shares = {t: weighted.get(t, fallback) for t in active}
    total = sum(shares.values()) or 1.0
    exact = {t: remaining * s / total for t, s in shares.items()}
    alloc = {t: int(math.floor(x)) for t, x in exact.items()}
    left = remaining - sum(alloc.values())
    for t in sorted(active, key=lambda t: exact[t] - alloc[t], reverse=True)[:left]:
        alloc[t] += 1
    return alloc


def fair_shares(tasks: Iterable[_Task], best: Mapping[int, float | None], max_trials: int) -> dict[int, int]:
    """The trials a run would give each task out of its whole budget by the share allocation
    (weight x latency; ``best`` where a task has a time, the mean share for the others)."""
    shares = {t.index: (float(t.weight or 1.0), best.get(t.index)) for t in tasks}
    return allocate_trials(int(max_trials), shares, list(shares))


class TrialBudget:
    """One run's trials per task and the share allocation of what is left (see the module doc)."""

    def __init__(
        self,
        tasks: Sequence[_Task],
        *,
        max_trials: int,
        per_round: int = 1,
        seed: int | None = None,
        max_resumes: int = 0,
    ) -> None:
        self.weights = {t.index: float(t.weight or 1.0) for t in tasks}
        self.names = {t.index: t.name for t in tasks}
        self.max_trials = int(max_trials)
        self.per_round = int(per_round)  # batch size assumed for an in-flight batch nobody counted
        self.max_resumes = int(max_resumes)
        self.lock = threading.RLock()
        self.rng = random.Random(seed)
        self.trials: dict[int, int] = {}
        self.best: dict[int, float] = {i: math.inf for i in self.weights}
        self.parked: dict[int, int] = {}  # task -> trials it had when parked
        self.resumes: dict[int, int] = {}  # task -> times it was resumed after being parked
        self.settled: set[int] = set()
        self.exhausted: set[int] = set()
        self.pending: set[int] = set()
        self.outstanding: dict[int, int] = {}  # candidates a search kept for a task, not measured yet
        # task -> trials it gets before a plateau may park it even when Trimmer is off (a record-cache
        # seed whose source was not converged: searched on from the seed, stopped once no longer beaten)
        self.judged_after: dict[int, int] = {}
        self.seed_best: dict[int, float] = {}  # the record cache's seeds: their best time on this host
        self.resumptions: list[dict] = []

    # ------------------------------------------------------------------ ledger
    def spent(self) -> int:
        return sum(self.trials.values())

    def remaining(self) -> int:
        return max(0, self.max_trials - self.spent())

    def add_trials(self, task: int, n: int) -> None:
        self.trials[task] = self.trials.get(task, 0) + int(n)

    def observe_best(self, task: int, latencies: Iterable[float]) -> None:
        """Lower ``task``'s best latency to the best of ``latencies`` (valid times only)."""
        lats = list(latencies)
        if lats:
            self.best[task] = min(self.best.get(task, math.inf), min(lats))

    @property
    def finished(self) -> set[int]:
        """Tasks no tuning changes any more: search space exhausted, or settled before the search."""
        return self.exhausted | self.settled

    # ------------------------------------------------------------------ park, resume, settle
    def is_parked(self, task: int) -> bool:
        return task in self.parked

    def park(self, task: int, at_trials: int | None = None) -> None:
        """No more rounds for ``task`` (the scheduler joins it); it may be resumed later."""
        self.parked[task] = self.trials.get(task, 0) if at_trials is None else int(at_trials)
        self.pending.add(task)

    def can_resume(self, task: int) -> bool:
        return task in self.parked and task not in self.finished and self.resumes.get(task, 0) < self.max_resumes

    def resume(self, task: int) -> None:
        self.parked.pop(task, None)
        self.resumes[task] = self.resumes.get(task, 0) + 1

    def exhaust(self, task: int) -> None:
        """``task``'s search space ran out: done, never resumed."""
        self.exhausted.add(task)
        self.park(task)

    def settle(self, task: int, trials: int) -> None:
        """``task`` is done before the search (``trials``: the seeds measured for it): never resumed."""
        with self.lock:
            self.settled.add(int(task))
            self.park(int(task), trials)

    def learn_seed(self, task: int, best: float | None, trials: int) -> None:
        """A seed measured for ``task`` before the search: its best time here and the trials it took,
        learned as a batch is (so shares follow the seed's real time from the first round)."""
        task = int(task)
        if task not in self.weights:
            return
        with self.lock:
            if best is not None and best < self.best.get(task, math.inf):
                self.best[task] = float(best)
                self.seed_best[task] = min(float(best), self.seed_best.get(task, math.inf))
            self.add_trials(task, trials)

    def judge_after(self, task: int, trials: int) -> None:
        """Let the plateau rule park ``task`` (even with Trimmer off), never before ``trials``."""
        task = int(task)
        with self.lock:
            if task in self.weights and task not in self.settled:
                self.judged_after[task] = max(1, int(trials))

    def take_pending(self) -> list[int]:
        with self.lock:
            out = sorted(self.pending)
            self.pending.clear()
            return out

    # ------------------------------------------------------------------ allocation
    def shares(self, active: Iterable[int]) -> dict[int, tuple[float, float | None]]:
        return {i: (self.weights[i], self.best[i] if math.isfinite(self.best[i]) else None) for i in active}

    def active(self, exclude: Iterable[int] = ()) -> list[int]:
        ex = set(exclude)
        return [i for i in self.weights if not self.is_parked(i) and i not in ex]

    def reallocation(self, task: int) -> dict:
        """What parking ``task`` moves: the budget left, the trials it would have had, and where they go."""
        remaining = self.remaining()
        others = self.active(exclude=[task])
        before = allocate_trials(remaining, self.shares(others + [task]), others + [task])
        after = allocate_trials(remaining, self.shares(others), others)
        return {
            "remaining_budget": remaining,
            "freed_trials": before.get(task, 0),
            "moved_to": {j: after[j] - before.get(j, 0) for j in others if after[j] - before.get(j, 0)},
        }

    def choose(self, alive: Sequence[int], remaining: int, in_flight: Iterable[int] = ()) -> int | None:
        """The next task among ``alive`` that is not parked (None: every one is): the remaining budget
        plus what those tasks already spent is split by their share of end-to-end latency; the task
        furthest below its allotment goes next (trials in flight count as spent; ties: the larger share)."""
        with self.lock:
            active = [i for i in alive if not self.is_parked(i)]
            if not active:
                return None
            flying = set(in_flight)
            pending = {i: self.outstanding.get(i, 0) or (self.per_round if i in flying else 0) for i in active}
            spent = {i: self.trials.get(i, 0) + pending[i] for i in active}
            remaining = max(0, remaining - sum(pending.values()))
            shares = self.shares(active)
            alloc = allocate_trials(sum(spent.values()) + remaining, shares, active)
            known = [w * b for w, b in shares.values() if b]
            fallback = (sum(known) / len(known)) if known else 1.0

            def share(i: int) -> float:
                w, b = shares[i]
                return w * b if b else fallback

            best = max(alloc[i] - spent[i] for i in active)
            tied = [i for i in active if alloc[i] - spent[i] == best]
            top = max(share(i) for i in tied)
            tied = [i for i in tied if share(i) == top]
            return tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]

    def to_resume(self, alive: Sequence[int]) -> int | None:
        """The parked task among ``alive`` to resume when no task is left to tune: the one with the
        largest share of end-to-end latency that may still be resumed (None: none may)."""
        with self.lock:
            parked = [i for i in alive if self.can_resume(i)]
            if not parked:
                return None
            shares = self.shares(parked)
            return max(parked, key=lambda i: shares[i][0] * (shares[i][1] or 0.0))
