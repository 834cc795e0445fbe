"""Trimmer inside a tuning run: the glue between its pure rules (``trimmer.rules``), the run's trial
budget (``tuning.engine.budget``) and TVM MetaSchedule.

:class:`TrimmerRuntime` (TVM-free): fed by the streaming measure callback after every measured batch,
it keeps the per-task plateau tracker, the whole-model stopper and the filter counts, and tells the
task scheduler which tasks to pre-empt, whether to stop the run, and which task gets the next round
(the remaining budget split among the tasks still improving by their share of end-to-end latency:
:meth:`TrialBudget.choose <tuning.engine.budget.TrialBudget.choose>`). The callback only *decides*:
terminating a task from inside a measure callback crashes with an asynchronous runner, so the
scheduler's ``next_task_id`` applies the decisions between rounds. Plateaus count only after the
warm-up (``TrimmerConfig.judge_after_trials``; by default once the cost model has its warm-up
samples: before that the search is random).

Pre-emption parks a task in the budget (it is not terminated in TVM): when every task is parked or
exhausted and budget is left, :meth:`TrimmerRuntime.choose` resumes the parked task with the largest
share of end-to-end latency (at most ``max_resumes`` times each). Tasks whose search space ran out are
never counted as pre-empted nor as savings. A run without Trimmer whose record-cache seeds need the
budget gets a :meth:`TrimmerRuntime.passive` one (every rule off). The candidate filter, a search
strategy that asks this runtime for each task's best, is in :mod:`tuning.engine.trimmer.filter`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from tuning.engine.budget import TrialBudget
from tuning.engine.events import TaskInfo
from tuning.engine.latency import is_timing
from tuning.engine.trimmer.rules import (
    ModelStopper,
    TaskPlateauTracker,
    TrimmerConfig,
    TrimmerState,
)

__all__ = ["TrimmerRuntime", "ALL_PREEMPTED"]

ALL_PREEMPTED = "every task reached its plateau (all pre-empted)"


class TrimmerRuntime:
    """Trimmer's decisions during one ``run_tuning`` call (thread-safe: under the budget's lock)."""

    def __init__(
        self,
        config: TrimmerConfig,
        tasks: Sequence[TaskInfo],
        *,
        max_trials: int,
        initial_best: Mapping[int, float] | None = None,
        initial_trials: Mapping[int, int] | None = None,
        preempted: Mapping[int, int] | None = None,
        seed: int | None = None,
    ) -> None:
        self.config = config
        self.budget = TrialBudget(tasks, max_trials=max_trials, seed=seed, max_resumes=config.max_resumes)
        self.lock = self.budget.lock
        self.weights = self.budget.weights
        self.names = self.budget.names
        self.max_trials = self.budget.max_trials
        # no task is pre-empted (nor the run stopped) before this many measured trials
        self.min_trials = max(
            int(config.min_trials_per_task),
            math.ceil(config.min_trial_share * self.max_trials / max(1, len(self.weights))),
        )
        self.tracker = TaskPlateauTracker(config, self.min_trials, budget=self.budget)
        # the windowed rule runs on the part of the model tuning can still change
        # (see _tunable_estimate); the target latency is checked on the full estimate
        self.stopper = ModelStopper(dataclasses.replace(config, target_latency_s=None))
        # parked by the plateau rule of a cache-seeded task while Trimmer itself is off (task -> trials):
        # the cache's doing, so neither a Trimmer pre-emption nor a Trimmer saving
        self.cache_parked: dict[int, int] = {}
        self.state = TrimmerState()
        for i, b in (initial_best or {}).items():
            if b is not None and math.isfinite(b):
                self.budget.best[i] = float(b)
                self.tracker.best[i] = float(b)
        self.budget.trials.update({int(k): int(v) for k, v in (initial_trials or {}).items()})
        # per task, the filter's batches not measured yet: [generated, filtered, not sent]
        self._generated: dict[int, deque[list[int]]] = {i: deque() for i in self.weights}
        # per task, batches the filter produced of which nothing was sent: joined to the next batch
        self._unsent_carry: dict[int, list[int]] = {}
        self.filter_ranked = 0  # filter rounds judged by the task's trained predictor
        self.filter_unranked = 0  # ... kept in the search's own order (predictor not trained yet)
        self.vetoed = 0  # candidates the search would have measured, vetoed by the predictor
        self.audit: list[dict] = []  # a sample of them (config.audit_sample), for a bench to measure
        self._audit_seen = 0
        self._audit_rng = random.Random(seed)  # its own: the audit must not change the task choice
        self.judging_from_trial: int | None = None  # when plateaus started to count (warm-up over)
        self.reallocations: list[dict] = []
        self.stop_reason: str | None = None
        self.cost_model = None  # the tuner's Python cost model (set by the search step) for the filter
        for i, n in (preempted or {}).items():  # a resumed run keeps its pre-emptions (parked, resumable)
            i = int(i)
            if i in self.weights:
                self.budget.parked[i] = int(n)
                self.state.preempted_tasks[i] = int(n)

    @classmethod
    def passive(
        cls, tasks: Sequence[TaskInfo], *, max_trials: int, per_round: int, seed: int | None = None
    ) -> TrimmerRuntime:
        """A runtime with every Trimmer rule off, for a run without Trimmer whose record-cache seeds need
        the budget: it feeds the budget from the measured batches, applies its allocation, and judges
        only the cache-seeded tasks the budget names (``TrialBudget.judge_after``)."""
        runtime = cls(TrimmerConfig(enabled=False, filter_enabled=False), tasks, max_trials=max_trials, seed=seed)
        runtime.budget.per_round = max(1, per_round)
        return runtime

    # the budget's ledger, under the names the scheduler, the search step and the reports use
    @property
    def best(self) -> dict[int, float]:
        return self.budget.best

    @property
    def per_round(self) -> int:
        return self.budget.per_round

    @per_round.setter
    def per_round(self, value: int) -> None:
        self.budget.per_round = int(value)

    @property
    def exhausted(self) -> set[int]:
        return self.budget.exhausted

    @property
    def settled(self) -> set[int]:
        return self.budget.settled

    @property
    def finished(self) -> set[int]:
        """Tasks no tuning changes any more: search space exhausted, or settled before the search."""
        return self.budget.finished

    @property
    def resumptions(self) -> list[dict]:
        return self.budget.resumptions

    # ------------------------------------------------------------------ filter side
    def note_generated(self, task: int, generated: int, filtered: int, ranked: bool | None = None) -> None:
        """The candidate filter produced a batch for ``task`` (called before it is measured)."""
        with self.lock:
            if ranked is not None and filtered:
                if ranked:
                    self.filter_ranked += 1
                else:
                    self.filter_unranked += 1
            batch = [int(generated), int(filtered), 0]
            carry = self._unsent_carry.pop(task, None)
            if carry:
                batch = [a + b for a, b in zip(batch, carry)]
            self._generated.setdefault(task, deque()).append(batch)
            out = self.budget.outstanding
            out[task] = out.get(task, 0) + int(generated) - int(filtered)

    def note_not_sent(self, task: int, n: int) -> None:
        """``n`` of the candidates the filter just kept for ``task`` (its last noted batch) are not sent
        to be measured: the run measured them already, or its trial budget ran out. A batch left with
        nothing to send is joined to the task's next one, so a measured batch always satisfies
        generated = filtered + not sent + measured."""
        n = int(n)
        with self.lock:
            gen = self._generated.get(task)
            if n <= 0 or not gen:
                return
            batch = gen[-1]
            n = min(n, batch[0] - batch[1] - batch[2])
            batch[2] += n
            out = self.budget.outstanding
            out[task] = max(0, out.get(task, 0) - n)
            if batch[0] - batch[1] - batch[2] <= 0:
                gen.pop()
                carry = self._unsent_carry.setdefault(task, [0, 0, 0])
                for k in range(3):
                    carry[k] += batch[k]

    def note_vetoed(self, task: int, vetoed: Sequence[dict]) -> None:
        """Candidates the search would have measured that the predictor vetoed (``task``'s batch);
        a uniform sample of ``config.audit_sample`` of them is kept (reservoir)."""
        with self.lock:
            self.vetoed += len(vetoed)
            for item in vetoed:
                self._audit_seen += 1
                if len(self.audit) < self.config.audit_sample:
                    self.audit.append({"task": task, **item})
                else:
                    j = self._audit_rng.randrange(self._audit_seen)
                    if j < len(self.audit):
                        self.audit[j] = {"task": task, **item}

    def task_best(self, task: int) -> float:
        with self.lock:
            return self.best.get(task, math.inf)

    # ------------------------------------------------------------------ callback side
    def estimate(self) -> float | None:
        """End-to-end estimate: sum of weight x best latency (None until every task has one)."""
        vals = [self.weights[i] * b for i, b in self.best.items()]
        if not vals or not all(math.isfinite(v) for v in vals):
            return None
        return sum(vals)

    def _tunable_estimate(self) -> float | None:
        """The estimate without the tasks whose search space is exhausted: their share is a
        constant no tuning changes (a one-schedule reshape, say), and one noisy measurement
        of it would otherwise dwarf the gains the windowed stop rule looks for."""
        if self.estimate() is None:
            return None
        vals = [self.weights[i] * b for i, b in self.best.items() if i not in self.finished]
        return sum(vals) if vals else None

    def _check_target(self) -> None:
        if self.config.target_latency_s is None or self.stop_reason is not None:
            return
        probe = ModelStopper(self.config)
        if probe.observe(self.estimate()):
            self.stop_reason = probe.reason
            self.state.model_stop_reason = probe.reason

    def _preempt(self, task: int, round_index: int, reason: str) -> None:
        if self.config.enabled:
            self.state.preempted_tasks[task] = self.tracker.preempted[task]
        else:  # only a cache-seeded task is judged when Trimmer is off (TaskPlateauTracker.judged)
            self.cache_parked[task] = self.tracker.preempted[task]
            reason = "plateau after a record-cache seed"
        self._record_reallocation(task, round_index, reason)

    def observe_batch(
        self, task: int, latencies: Sequence[float | None], *, round_index: int, exhausted: bool = False
    ) -> tuple[int | None, int | None, int | None]:
        """One measured batch of ``task`` (None = failed candidate; ``exhausted``: the search had
        no candidate left). Returns the batch's (generated, filtered, not sent) counts when the
        filter produced it."""
        with self.lock:
            gen = self._generated.get(task)
            counts: tuple[int | None, int | None, int | None] = (None, None, None)
            if gen and latencies:
                g, f, d = gen.popleft()
                counts = (g, f, d)
                out = self.budget.outstanding
                out[task] = max(0, out.get(task, 0) - (g - f - d))
            if counts[0]:
                self.state.record_filter_round(
                    round_index=round_index, task=task, generated=g, filtered=f, not_sent=d, measured=len(latencies)
                )
            else:
                self.state.measured += len(latencies)
            valid = [x for x in latencies if is_timing(x) and x > 0]
            self.budget.observe_best(task, valid)
            short = exhausted or (
                len(latencies) < self.per_round and self.budget.spent() + len(latencies) < self.max_trials
            )
            if short and task not in self.exhausted:
                # fewer new candidates than a round: the search space is (nearly) exhausted. Not a
                # pre-emption: no trial is saved on a task that had nothing left to measure
                self._observe_warmup(task, latencies, valid)
                self.budget.exhaust(task)
                self.state.preempted_tasks.pop(task, None)
                self._record_reallocation(task, round_index, "search space exhausted")
                return counts
            if not self._judging():
                self._observe_warmup(task, latencies, valid)
                return counts
            if self.judging_from_trial is None:
                self.judging_from_trial = self.budget.spent()
            was = self.tracker.is_preempted(task)
            if self.tracker.observe(task, list(latencies)) and not was:
                self._preempt(task, round_index, "plateau")
            self._check_target()
            if self._min_share_met() and self.stopper.observe(self._tunable_estimate()) and self.stop_reason is None:
                self.stop_reason = self.stopper.reason
                self.state.model_stop_reason = self.stop_reason
            return counts

    def _min_share_met(self) -> bool:
        """Every task that can still be tuned has had its minimum share of trials."""
        return all(self.budget.trials.get(i, 0) >= self.min_trials for i in self.weights if i not in self.finished)

    def _judging(self) -> bool:
        """Whether plateaus count yet (see ``TrimmerConfig.judge_after_trials``)."""
        after = self.config.judge_after_trials
        if after is not None:
            return self.budget.spent() >= after
        cm = self.cost_model
        n_data, n_warm = getattr(cm, "data_size", None), getattr(cm, "num_warmup_samples", None)
        if not isinstance(n_data, int) or not isinstance(n_warm, int):
            return True  # no warm-up to wait for
        return n_data >= n_warm

    def _observe_warmup(self, task: int, latencies, valid) -> None:
        """Warm-up: keep the task's trials and best, judge nothing; only the target latency stops."""
        tr = self.tracker
        self.budget.add_trials(task, len(latencies))
        if valid and (task not in tr.best or min(valid) < tr.best[task]):
            tr.best[task] = min(valid)
        tr.stale_rounds[task] = 0
        self._check_target()

    def _record_reallocation(self, task: int, round_index: int, reason: str) -> None:
        self.reallocations.append(
            {
                "task": task,
                "task_name": self.names.get(task),
                "round": round_index,
                "reason": reason,
                "at_trial": self.budget.parked[task],
                **self.budget.reallocation(task),
            }
        )

    # ------------------------------------------------------------------ scheduler side
    def take_pending(self) -> list[int]:
        return self.budget.take_pending()

    def is_preempted(self, task: int) -> bool:
        return self.budget.is_parked(task)

    def choose(self, alive: Sequence[int], remaining: int, in_flight: Iterable[int] = ()) -> int | None:
        """The next task among ``alive`` (not terminated): the budget's share allocation among the
        tasks not parked (:meth:`TrialBudget.choose`), or, when every one is, a parked one resumed."""
        with self.lock:
            task = self.budget.choose(alive, remaining, in_flight)
            return task if task is not None else self._resume_one(alive, remaining)

    def _resume_one(self, alive: Sequence[int], remaining: int) -> int | None:
        """No task left to tune: with budget left and no stop decided, resume the parked task with
        the largest share of end-to-end latency (None when there is none to resume)."""
        if remaining <= 0 or self.stop_reason is not None:
            return None
        task = self.budget.to_resume(alive)
        if task is None:
            return None
        self.tracker.resume(task)
        self.state.preempted_tasks.pop(task, None)
        self.cache_parked.pop(task, None)
        self.resumptions.append(
            {
                "task": task,
                "task_name": self.names.get(task),
                "at_trial": self.budget.spent(),
                "remaining_budget": remaining,
            }
        )
        return task

    def trials_saved(self) -> int:
        """Trials the run did not spend because Trimmer stopped it: the budget left, unless no task
        could still be tuned (their search spaces ran out: an untrimmed run would not spend it)."""
        with self.lock:
            if self.stop_reason is None:
                return 0
            if all(i in self.finished for i in self.weights):
                return 0
            return self.budget.remaining()

    def finish_all_preempted(self) -> None:
        """No task left to tune: the stop is Trimmer's when it pre-empted any of them (else every
        search space simply ran out, which TVM ends by itself)."""
        with self.lock:
            if self.stop_reason is None and self.state.preempted_tasks:
                self.stop_reason = ALL_PREEMPTED
                self.state.model_stop_reason = ALL_PREEMPTED

    # ------------------------------------------------------------------ report
    def to_dict(self) -> dict:
        with self.lock:
            d = self.state.to_dict()
            d["preempted_task_names"] = {i: self.names.get(i) for i in d["preempted_tasks"]}
            d["reallocations"] = list(self.reallocations)
            d["trials_by_task"] = dict(self.budget.trials)
            d["filter_rounds_ranked"] = self.filter_ranked
            d["filter_rounds_unranked"] = self.filter_unranked
            d["filter_predictor"] = "ridge on MetaSchedule per-store features, trained on this run's measurements"
            d["vetoed"] = self.vetoed
            d["audit"] = list(self.audit)
            d["resumptions"] = list(self.resumptions)
            d["min_trials_before_preemption"] = self.min_trials
            d["judging_from_trial"] = self.judging_from_trial
            d["exhausted_tasks"] = sorted(self.exhausted)
            d["settled_tasks"] = sorted(self.settled)
            d["cache_parked_tasks"] = dict(self.cache_parked)
            d["cache_judged_tasks"] = dict(self.budget.judged_after)
            d["config"] = self.config.to_dict()
        d["trials_saved"] = self.trials_saved()
        return d
