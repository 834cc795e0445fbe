"""Trimmer's cost cutting, as pure decision logic (the TVM hooks call into it).

- Per-task pre-emption: a task whose best latency has not improved by more
  than ``min_improvement`` (relative) for ``plateau_rounds`` consecutive rounds
  stops receiving trials (authors' default: 2 rounds), but never before it has
  measured ``min_trial_share`` of an equal split of the budget (a plateau of a
  few rounds early on says little, and cost latency at small budgets). A
  pre-empted task is parked, not terminated: when no task is left to tune and
  budget remains, a parked task is resumed for another probe (at most
  ``max_resumes`` times each; one batch without a gain parks it again).
- Budget re-allocation: the trials a pre-empted task no longer uses go to the
  tasks still improving, weighted by their share of end-to-end latency
  (weight x best latency): :func:`tuning.engine.budget.allocate_trials`, on the
  run's :class:`~tuning.engine.budget.TrialBudget`, which the record cache
  shares.
- Whole-model stop: the estimated end-to-end latency (sum of weight x best)
  over a window of rounds fails to improve by more than ``model_min_improvement``
  ``model_patience`` times in a row, or reaches ``target_latency_s``.
- Warm-up: plateaus are judged (pre-emption, the windowed stop) only after
  ``judge_after_trials`` measured trials; None = once the tuner's cost model
  has its warm-up samples (MetaSchedule's XGBoost model ranks candidates at
  random until it has seen 100, so a plateau before that says nothing about
  convergence). The target latency applies from the start.

Django-free and TVM-free, so every rule is unit-tested on synthetic histories.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from tuning.engine.budget import TrialBudget

__all__ = ["TrimmerConfig", "TaskPlateauTracker", "ModelStopper", "TrimmerState"]


@dataclasses.dataclass(frozen=True)
class TrimmerConfig:
    enabled: bool = True
    plateau_rounds: int = 2  # rounds without improvement before a task is pre-empted
    min_improvement: float = 0.01  # relative improvement that counts as progress
    model_window: int = 2  # rounds summed for the whole-model cost (authors' window)
    model_patience: int = 3  # non-improving windows in a row before the run stops
    model_min_improvement: float = 0.005
    target_latency_s: float | None = None
    min_trials_per_task: int = 0  # a task is never pre-empted before this many trials
    min_trial_share: float = 0.5  # ... nor before this share of max_trials / number of tasks
    max_resumes: int = 1  # probes a pre-empted task gets when budget is left
    filter_enabled: bool = True  # candidate filter (an independent predictor vetoes likely losers)
    filter_oversample: int = 4  # candidates the search generates per slot measured
    filter_keep_explore: float = 0.1  # share of slots never vetoed (the search's own picks)
    filter_min_samples: int = 16  # measured candidates of a task before its predictor vetoes
    filter_veto_margin: float = 0.25  # veto when predicted > best x (1 + margin) (and the CV error)
    audit_sample: int = 0  # keep up to this many vetoed candidates (trace JSON) for a bench audit
    judge_after_trials: int | None = None  # None: once the cost model is warm; 0: from the start

    @classmethod
    def from_dict(cls, data: Mapping | None) -> TrimmerConfig:
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown Trimmer option(s): {', '.join(sorted(unknown))}")
        cfg = cls(**data)
        if cfg.plateau_rounds < 1 or cfg.model_window < 1 or cfg.model_patience < 1:
            raise ValueError("plateau_rounds, model_window and model_patience must be >= 1")
        if not 0 <= cfg.min_improvement < 1 or not 0 <= cfg.model_min_improvement < 1:
            raise ValueError("improvement thresholds are relative and must be in [0, 1)")
        if cfg.filter_oversample < 1 or not 0 <= cfg.filter_keep_explore <= 1:
            raise ValueError("filter_oversample must be >= 1 and filter_keep_explore in [0, 1]")
        if not 0 <= cfg.min_trial_share <= 1 or cfg.filter_veto_margin < 0:
            raise ValueError("min_trial_share must be in [0, 1] and filter_veto_margin >= 0")
        for name in ("max_resumes", "filter_min_samples", "audit_sample", "min_trials_per_task"):
            value = getattr(cfg, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer")
        if cfg.target_latency_s is not None and cfg.target_latency_s <= 0:
            raise ValueError("target_latency_s must be positive")
        if cfg.judge_after_trials is not None and (
            not isinstance(cfg.judge_after_trials, int) or cfg.judge_after_trials < 0
        ):
            raise ValueError("judge_after_trials must be a non-negative integer or null")
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class TaskPlateauTracker:
    """Counts, per task, the consecutive rounds whose batch did not improve its best.

    The trials, parked tasks and resumes it counts are the run's :class:`TrialBudget`'s (the record
    cache reads and writes the same ledger); without one it keeps a budget of its own."""

    def __init__(self, config: TrimmerConfig, min_trials: int | None = None, budget: TrialBudget | None = None):
        self.config = config
        self.min_trials = config.min_trials_per_task if min_trials is None else int(min_trials)
        self.budget = budget if budget is not None else TrialBudget((), max_trials=0, max_resumes=config.max_resumes)
        self.best: dict[int, float] = {}  # the best each task's own batches reached (plateau baseline)
        self.stale_rounds: dict[int, int] = {}

    @property
    def trials(self) -> dict[int, int]:
        return self.budget.trials

    @property
    def preempted(self) -> dict[int, int]:
        """task -> trials it had when pre-empted (parked in the budget)."""
        return self.budget.parked

    @property
    def judged(self) -> dict[int, int]:
        """Tasks judged by the plateau rule even when Trimmer is off, each never before its own number of
        trials (a record-cache seed whose source was not converged: searched on from the seed, stopped
        once the search no longer beats it)."""
        return self.budget.judged_after

    def baseline(self, task: int) -> float | None:
        """What a batch of ``task`` must beat: its best so far, or a record-cache seed's time here."""
        best = min(self.best.get(task, math.inf), self.budget.seed_best.get(task, math.inf))
        return best if math.isfinite(best) else None

    def observe(self, task: int, batch_latencies: Sequence[float | None]) -> bool:
        """Record one measured batch of a task; returns True when the task is (now) pre-empted."""
        if task in self.preempted:
            return True
        valid = [x for x in batch_latencies if x is not None and math.isfinite(x) and x > 0]
        self.budget.add_trials(task, len(batch_latencies))
        previous = self.baseline(task)
        batch_best = min(valid) if valid else None
        if batch_best is not None and (previous is None or batch_best < previous * (1 - self.config.min_improvement)):
            self.stale_rounds[task] = 0
        else:
            self.stale_rounds[task] = self.stale_rounds.get(task, 0) + 1
        if batch_best is not None and (previous is None or batch_best < previous):
            self.best[task] = batch_best
        floor = self.judged.get(task)
        need = self.min_trials if floor is None else max(self.min_trials, floor)
        if (
            (self.config.enabled or floor is not None)
            and self.stale_rounds[task] >= self.config.plateau_rounds
            and self.trials[task] >= need
        ):
            self.budget.park(task)
            return True
        return False

    def is_preempted(self, task: int) -> bool:
        return self.budget.is_parked(task)

    def can_resume(self, task: int) -> bool:
        return self.budget.can_resume(task)

    def resume(self, task: int) -> None:
        """Give a pre-empted task another probe: one more batch without a gain parks it again."""
        self.budget.resume(task)
        self.stale_rounds[task] = max(0, self.config.plateau_rounds - 1)


class ModelStopper:
    """Whole-model stop on the windowed end-to-end estimate, or at a target latency."""

    def __init__(self, config: TrimmerConfig):
        self.config = config
        self.history: list[float] = []
        self.misses = 0
        self.reason: str | None = None

    def observe(self, estimate_s: float | None) -> bool:
        """Record the end-to-end estimate after a round; returns True when the run should stop."""
        if estimate_s is None or not math.isfinite(estimate_s):
            return False
        self.history.append(estimate_s)
        cfg = self.config
        if cfg.target_latency_s is not None and estimate_s <= cfg.target_latency_s:
            self.reason = f"target latency reached ({estimate_s * 1e3:.4f} ms <= {cfg.target_latency_s * 1e3:.4f} ms)"
            return True
        w = cfg.model_window
        if len(self.history) < 2 * w:
            return False
        recent = sum(self.history[-w:])
        before = sum(self.history[-2 * w : -w])
        if recent < before * (1 - cfg.model_min_improvement):
            self.misses = 0
        else:
            self.misses += 1
        if cfg.enabled and self.misses >= cfg.model_patience:
            self.reason = (
                f"end-to-end estimate did not improve by more than "
                f"{cfg.model_min_improvement:.1%} for {self.misses} windows of {w} rounds"
            )
            return True
        return False


@dataclasses.dataclass
class TrimmerState:
    """What a run reports about trimming: per-task pre-emption and the model stop."""

    preempted_tasks: dict[int, int] = dataclasses.field(default_factory=dict)
    model_stop_reason: str | None = None
    generated: int = 0
    filtered: int = 0
    # kept by the filter but never sent: measured earlier in the run, or past the run's trial budget
    not_sent: int = 0
    measured: int = 0
    rounds: list[dict] = dataclasses.field(default_factory=list)

    def record_filter_round(
        self, *, round_index: int, task: int, generated: int, filtered: int, measured: int, not_sent: int = 0
    ) -> None:
        self.generated += generated
        self.filtered += filtered
        self.not_sent += not_sent
        self.measured += measured
        self.rounds.append(
            {
                "round": round_index,
                "task": task,
                "generated": generated,
                "filtered": filtered,
                "not_sent": not_sent,
                "measured": measured,
            }
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
