"""Trimmer inside a tuning run: the glue between its pure rules (``trimmer.py``)
and TVM MetaSchedule.

- :class:`TrimmerRuntime` (TVM-free): fed by the streaming measure callback
  after every measured batch, it keeps the per-task plateau tracker, the
  whole-model stopper and the filter counts, and tells the task scheduler
  which tasks to pre-empt, whether to stop the run, and which task gets the
  next round (the remaining budget split among the tasks still improving by
  their share of end-to-end latency, :func:`~.trimmer.allocate_trials`).
  The callback only *decides*: terminating a task from inside a measure
  callback crashes with an asynchronous runner, so the scheduler's
  ``next_task_id`` applies the decisions between rounds. Plateaus count only
  after the warm-up (``TrimmerConfig.judge_after_trials``; by default once the
  cost model has its warm-up samples: before that the search is random).
- :class:`FilteredSearch`: a ``PySearchStrategy`` around TVM's
  ``EvolutionarySearch`` that asks it for ``filter_oversample`` x the batch
  and measures the batch the search itself would have measured (its own
  order), except the candidates an *independent* predictor
  (:mod:`.trimmer_predictor`: ridge on MetaSchedule features, trained on this
  run's measurements of the task, not the search's XGBoost model) says are
  worse than the task's best by more than its own error: those are replaced
  by the search's next picks. The first ``filter_keep_explore`` share of the
  slots is never vetoed. The inner search is given an inflated budget, so this
  wrapper enforces the real per-task trial budget itself.
- Pre-emption parks a task (it is not terminated in TVM): when every task is
  parked or exhausted and budget is left, :meth:`TrimmerRuntime.choose`
  resumes the parked task with the largest share of end-to-end latency (at most
  ``max_resumes`` times each). Tasks whose search space ran out are never
  counted as pre-empted nor as savings.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from tuning.engine.events import TaskInfo, trace_json
from tuning.engine.latency import is_failed_latency
from tuning.engine.trimmer.predictor import RidgeLatencyPredictor, pool_store_features
from tuning.engine.trimmer.rules import (
    ModelStopper,
    TaskPlateauTracker,
    TrimmerConfig,
    TrimmerState,
    allocate_trials,
)

__all__ = ["TrimmerRuntime", "FilteredSearch", "make_filtered_search", "ALL_PREEMPTED"]

ALL_PREEMPTED = "every task reached its plateau (all pre-empted)"


class TrimmerRuntime:
    """Trimmer's decisions during one ``run_tuning`` call (thread-safe)."""

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
        self.weights = {t.index: float(t.weight or 1.0) for t in tasks}
        self.names = {t.index: t.name for t in tasks}
        self.max_trials = int(max_trials)
        # no task is pre-empted (nor the run stopped) before this many measured trials
        self.min_trials = max(int(config.min_trials_per_task),
                              math.ceil(config.min_trial_share * self.max_trials / max(1, len(self.weights))))
        self.tracker = TaskPlateauTracker(config, self.min_trials)
        # the windowed rule runs on the part of the model tuning can still change
        # (see _tunable_estimate); the target latency is checked on the full estimate
        self.stopper = ModelStopper(dataclasses.replace(config, target_latency_s=None))
        self.exhausted: set[int] = set()  # the search had fewer new candidates than a round
        # settled before the search (a verified record-cache hit): done like an exhausted task (terminated,
        # never resumed, a constant share of the estimate), reported apart
        self.settled: set[int] = set()
        # parked by the plateau rule of a cache-seeded task while Trimmer itself is off (task -> trials):
        # the cache's doing, so neither a Trimmer pre-emption nor a Trimmer saving
        self.cache_parked: dict[int, int] = {}
        self.state = TrimmerState()
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.best: dict[int, float] = {i: math.inf for i in self.weights}
        for i, b in (initial_best or {}).items():
            if b is not None and math.isfinite(b):
                self.best[i] = float(b)
                self.tracker.best[i] = float(b)
        self.tracker.trials.update({int(k): int(v) for k, v in (initial_trials or {}).items()})
        self._generated: dict[int, deque[tuple[int, int]]] = {i: deque() for i in self.weights}
        self.outstanding: dict[int, int] = {}  # kept by the filter, not measured yet
        self.per_round = 1  # batch size assumed for an in-flight batch the filter did not count
        self.filter_ranked = 0  # filter rounds judged by the task's trained predictor
        self.filter_unranked = 0  # ... kept in the search's own order (predictor not trained yet)
        self.vetoed = 0  # candidates the search would have measured, vetoed by the predictor
        self.audit: list[dict] = []  # a sample of them (config.audit_sample), for a bench to measure
        self._audit_seen = 0
        self._audit_rng = random.Random(seed)  # its own: the audit must not change the task choice
        self.resumptions: list[dict] = []
        self.judging_from_trial: int | None = None  # when plateaus started to count (warm-up over)
        self.pending: set[int] = set()  # pre-empted by the callback, to terminate in the scheduler
        self.reallocations: list[dict] = []
        self.stop_reason: str | None = None
        self.cost_model = None  # the tuner's Python cost model (set by the search step) for the filter
        for i, n in (preempted or {}).items():  # a resumed run keeps its pre-emptions (parked, resumable)
            i = int(i)
            if i in self.weights:
                self.tracker.preempted[i] = int(n)
                self.state.preempted_tasks[i] = int(n)

    # ------------------------------------------------------------------ filter side
    def note_generated(self, task: int, generated: int, filtered: int, ranked: bool | None = None) -> None:
        """The candidate filter produced a batch for ``task`` (called before it is measured)."""
        with self.lock:
            if ranked is not None and filtered:
                if ranked:
                    self.filter_ranked += 1
                else:
                    self.filter_unranked += 1
            self._generated.setdefault(task, deque()).append((int(generated), int(filtered)))
            self.outstanding[task] = self.outstanding.get(task, 0) + int(generated) - int(filtered)

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
        self.pending.add(task)
        self._record_reallocation(task, round_index, reason)

    def observe_batch(self, task: int, latencies: Sequence[float | None], *, round_index: int,
                      exhausted: bool = False) -> tuple[int | None, int | None]:
        """One measured batch of ``task`` (None = failed candidate; ``exhausted``: the search had
        no candidate left). Returns the batch's (generated, filtered) counts when the filter
        produced it."""
        with self.lock:
            gen = self._generated.get(task)
            counts: tuple[int | None, int | None] = (None, None)
            if gen:
                g, f = gen.popleft()
                counts = (g, f)
                self.outstanding[task] = max(0, self.outstanding.get(task, 0) - (g - f))
            if gen is not None and counts[0]:
                self.state.record_filter_round(round_index=round_index, task=task, generated=g, filtered=f,
                                               measured=len(latencies))
            else:
                self.state.measured += len(latencies)
            valid = [x for x in latencies if not is_failed_latency(x) and x > 0]
            if valid:
                self.best[task] = min(self.best.get(task, math.inf), min(valid))
            short = exhausted or (len(latencies) < self.per_round
                                  and self._spent() + len(latencies) < self.max_trials)
            if short and task not in self.exhausted:
                # fewer new candidates than a round: the search space is (nearly) exhausted. Not a
                # pre-emption: no trial is saved on a task that had nothing left to measure
                self._observe_warmup(task, latencies, valid)
                self.exhausted.add(task)
                self.tracker.preempted[task] = self.tracker.trials[task]
                self.state.preempted_tasks.pop(task, None)
                self.pending.add(task)
                self._record_reallocation(task, round_index, "search space exhausted")
                return counts
            if not self._judging():
                self._observe_warmup(task, latencies, valid)
                return counts
            if self.judging_from_trial is None:
                self.judging_from_trial = self._spent()
            was = self.tracker.is_preempted(task)
            if self.tracker.observe(task, list(latencies)) and not was:
                self._preempt(task, round_index, "plateau")
            self._check_target()
            if (self._min_share_met() and self.stopper.observe(self._tunable_estimate())
                    and self.stop_reason is None):
                self.stop_reason = self.stopper.reason
                self.state.model_stop_reason = self.stop_reason
            return counts

    def _min_share_met(self) -> bool:
        """Every task that can still be tuned has had its minimum share of trials."""
        return all(self.tracker.trials.get(i, 0) >= self.min_trials for i in self.weights if i not in self.finished)

    def _spent(self) -> int:
        return sum(self.tracker.trials.values())

    @property
    def finished(self) -> set[int]:
        """Tasks no tuning changes any more: search space exhausted, or settled before the search."""
        return self.exhausted | self.settled

    def _judging(self) -> bool:
        """Whether plateaus count yet (see ``TrimmerConfig.judge_after_trials``)."""
        after = self.config.judge_after_trials
        if after is not None:
            return self._spent() >= after
        cm = self.cost_model
        n_data, n_warm = getattr(cm, "data_size", None), getattr(cm, "num_warmup_samples", None)
        if not isinstance(n_data, int) or not isinstance(n_warm, int):
            return True  # no warm-up to wait for
        return n_data >= n_warm

    def _observe_warmup(self, task: int, latencies, valid) -> None:
        """Warm-up: keep the task's trials and best, judge nothing; only the target latency stops."""
        tr = self.tracker
        tr.trials[task] = tr.trials.get(task, 0) + len(latencies)
        if valid and (task not in tr.best or min(valid) < tr.best[task]):
            tr.best[task] = min(valid)
        tr.stale_rounds[task] = 0
        self._check_target()

    def _shares(self, active: Iterable[int]) -> dict[int, tuple[float, float | None]]:
        return {i: (self.weights[i], self.best[i] if math.isfinite(self.best[i]) else None) for i in active}

    def _active(self, exclude: Iterable[int] = ()) -> list[int]:
        ex = set(exclude)
        return [i for i in self.weights if not self.tracker.is_preempted(i) and i not in ex]

    def _record_reallocation(self, task: int, round_index: int, reason: str) -> None:
        remaining = max(0, self.max_trials - self._spent())
        others = self._active(exclude=[task])
        before = allocate_trials(remaining, self._shares(others + [task]), others + [task])
        after = allocate_trials(remaining, self._shares(others), others)
        self.reallocations.append({
            "task": task,
            "task_name": self.names.get(task),
            "round": round_index,
            "reason": reason,
            "at_trial": self.tracker.preempted[task],
            "remaining_budget": remaining,
            "freed_trials": before.get(task, 0),
            "moved_to": {j: after[j] - before.get(j, 0) for j in others if after[j] - before.get(j, 0)},
        })

    # ------------------------------------------------------------------ scheduler side
    def take_pending(self) -> list[int]:
        with self.lock:
            out = sorted(self.pending)
            self.pending.clear()
            return out

    def is_preempted(self, task: int) -> bool:
        return self.tracker.is_preempted(task)

    def choose(self, alive: Sequence[int], remaining: int, in_flight: Iterable[int] = ()) -> int | None:
        """The next task among ``alive`` (not terminated): the remaining budget plus
        what the still-improving tasks already spent is split by their share of
        end-to-end latency; the task furthest below its allotment goes next
        (trials in flight count as spent; ties: the larger share)."""
        with self.lock:
            active = [i for i in alive if not self.tracker.is_preempted(i)]
            if not active:
                return self._resume_one(alive, remaining)
            flying = set(in_flight)
            pending = {i: self.outstanding.get(i, 0) or (self.per_round if i in flying else 0) for i in active}
            spent = {i: self.tracker.trials.get(i, 0) + pending[i] for i in active}
            remaining = max(0, remaining - sum(pending.values()))
            shares = self._shares(active)
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

    def _resume_one(self, alive: Sequence[int], remaining: int) -> int | None:
        """No task left to tune: with budget left and no stop decided, resume the parked task with
        the largest share of end-to-end latency (None when there is none to resume)."""
        if remaining <= 0 or self.stop_reason is not None:
            return None
        parked = [i for i in alive if i not in self.finished and self.tracker.can_resume(i)]
        if not parked:
            return None
        shares = self._shares(parked)
        task = max(parked, key=lambda i: (shares[i][0] * shares[i][1]) if shares[i][1] else 0.0)
        self.tracker.resume(task)
        self.state.preempted_tasks.pop(task, None)
        self.cache_parked.pop(task, None)
        self.resumptions.append({"task": task, "task_name": self.names.get(task), "at_trial": self._spent(),
                                 "remaining_budget": remaining})
        return task

    def trials_saved(self) -> int:
        """Trials the run did not spend because Trimmer stopped it: the budget left, unless no task
        could still be tuned (their search spaces ran out: an untrimmed run would not spend it)."""
        with self.lock:
            if self.stop_reason is None:
                return 0
            if all(i in self.finished for i in self.weights):
                return 0
            return max(0, self.max_trials - self._spent())

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
            d["trials_by_task"] = dict(self.tracker.trials)
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
            d["cache_judged_tasks"] = dict(self.tracker.judged)
            d["config"] = self.config.to_dict()
        d["trials_saved"] = self.trials_saved()
        return d


# --------------------------------------------------------------------------- candidate filter
def choose_kept(n: int, want: int, keep_explore: float, predicted_log: Sequence[float] | None,
                threshold: float | None) -> tuple[list[int], list[int]]:
    """Which of ``n`` candidates (in the search's own order, best first) are measured: the first
    ``want`` of them, except those past the first ``keep_explore`` share of the slots whose
    predicted log latency is above ``threshold`` (vetoed), replaced by the search's next picks.
    Returns (kept indices in order, vetoed indices among the first ``want``: what the search
    would have measured). Without a prediction or threshold: the first ``want``."""
    want = min(want, n)
    if predicted_log is None or threshold is None or len(predicted_log) != n:
        return list(range(want)), []
    n_free = min(want, int(math.ceil(want * keep_explore)))
    kept = list(range(n_free))
    passed_over = []
    for i in range(n_free, n):
        if len(kept) == want:
            break
        if predicted_log[i] > threshold:
            passed_over.append(i)
        else:
            kept.append(i)
    if len(kept) < want:  # too few candidates passed: the least bad vetoed ones fill the batch
        fill = sorted(passed_over, key=lambda i: predicted_log[i])[:want - len(kept)]
        kept = sorted(kept + fill)
    kept_set = set(kept)
    return kept, [i for i in range(want) if i not in kept_set]


def _store_features(context, candidates) -> list[np.ndarray] | None:
    """MetaSchedule's per-store features of each candidate, pooled (None when extraction fails)."""
    from tvm.s_tir import meta_schedule as ms

    try:
        extractor = ms.feature_extractor.PerStoreFeature(extract_workload=False)
        return [pool_store_features(f.numpy()) for f in extractor.extract_from(context, candidates)]
    except Exception:  # noqa: BLE001 - never lose a round to the filter
        return None


@functools.cache
def _filtered_search_class():
    """Defined lazily so importing this module does not import TVM."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy

    @derived_object
    class FilteredSearch(PySearchStrategy):
        def __init__(
            self,
            *,
            task_index: int,
            runtime: TrimmerRuntime | None = None,
            oversample: int = 4,
            keep_explore: float = 0.1,
            inner_kwargs: dict | None = None,
            seed: int | None = None,
        ) -> None:
            super().__init__()
            self.task_index = int(task_index)
            self.runtime = runtime
            self.oversample = max(1, int(oversample))
            self.keep_explore = float(keep_explore)
            self.inner_kwargs = dict(inner_kwargs or {})
            self.seed = seed
            self.inner = ms.search_strategy.EvolutionarySearch(**self.inner_kwargs)
            self.context = self.cost_model = None
            self.max_trials = self.per_iter = self.sent = self.generated = self.filtered = 0
            margin = runtime.config.filter_veto_margin if runtime is not None else 0.25
            self.veto_margin = float(margin)
            self.predictor = RidgeLatencyPredictor(
                min_samples=runtime.config.filter_min_samples if runtime is not None else 16)
            self._sent_features: list[np.ndarray] | None = None  # of the batch out for measurement

        def _initialize_with_tune_context(self, context) -> None:
            self.context = context
            self.inner._initialize_with_tune_context(context)

        def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None) -> None:
            self.max_trials, self.per_iter = int(max_trials), int(num_trials_per_iter)
            self.sent = 0
            self.cost_model = cost_model
            k = self.oversample
            # the inner search counts only what is measured (NotifyRunnerResults), so its
            # budget never binds: the real one is enforced in generate_measure_candidates
            self.inner.pre_tuning(
                self.max_trials * k + k * self.per_iter, self.per_iter * k, design_spaces, database, cost_model
            )

        def post_tuning(self) -> None:
            self.inner.post_tuning()
            self.cost_model = None

        def generate_measure_candidates(self):
            want = min(self.per_iter, self.max_trials - self.sent)
            if want <= 0:
                return None
            cands = self.inner.generate_measure_candidates()
            if cands is None:
                return None
            cands = list(cands)
            feats = _store_features(self.context, cands)
            predicted, threshold = None, None
            if feats is not None and self.runtime is not None:
                predicted = self.predictor.predict_log(feats)
                threshold = self.predictor.veto_threshold(self.runtime.task_best(self.task_index), self.veto_margin)
            keep, vetoed = choose_kept(len(cands), want, self.keep_explore, predicted, threshold)
            kept = [cands[i] for i in keep]
            self._sent_features = [feats[i] for i in keep] if feats is not None else None
            self.sent += len(kept)
            self.generated += len(cands)
            self.filtered += len(cands) - len(kept)
            if self.runtime is not None:
                ranked = None if len(cands) <= want else (predicted is not None and threshold is not None)
                self.runtime.note_generated(self.task_index, len(cands), len(cands) - len(kept), ranked)
                if vetoed:
                    self.runtime.note_vetoed(self.task_index, [
                        {"trace": trace_json(cands[i].sch.trace), "predicted_s": math.exp(float(predicted[i])),
                         "best_s": self.runtime.task_best(self.task_index)} for i in vetoed])
            return kept

        def notify_runner_results(self, measure_candidates, results) -> None:
            self.inner.notify_runner_results(measure_candidates, results)
            feats, self._sent_features = self._sent_features, None
            if feats is None or len(feats) != len(results):
                return
            lats = []
            for r in results:
                secs = [float(x) for x in (r.run_secs or [])] if r.error_msg is None else []
                lats.append(sum(secs) / len(secs) if secs else None)
            self.predictor.add(feats, lats)

        def clone(self):
            return FilteredSearch(task_index=self.task_index, runtime=self.runtime, oversample=self.oversample,
                                  keep_explore=self.keep_explore, inner_kwargs=self.inner_kwargs, seed=self.seed)

    return FilteredSearch


def make_filtered_search(*, task_index: int, runtime: TrimmerRuntime | None, config: TrimmerConfig,
                         inner_kwargs: dict | None = None, seed: int | None = None):
    """A :class:`FilteredSearch` for one task (``inner_kwargs``: EvolutionarySearch's)."""
    cls = _filtered_search_class()
    return cls(task_index=task_index, runtime=runtime, oversample=config.filter_oversample,
               keep_explore=config.filter_keep_explore, inner_kwargs=inner_kwargs, seed=seed)


def __getattr__(name: str):  # FilteredSearch without importing TVM at module import
    if name == "FilteredSearch":
        return _filtered_search_class()
    raise AttributeError(name)
