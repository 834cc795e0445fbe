"""Trimmer's candidate filter: a ``PySearchStrategy`` around TVM's ``EvolutionarySearch``.

:class:`FilteredSearch` asks the inner search for ``filter_oversample`` x the batch and measures the
batch the search itself would have measured (its own order), except the candidates an *independent*
predictor (:mod:`tuning.engine.trimmer.predictor`: ridge on MetaSchedule features, trained on this
run's measurements of the task, not the search's XGBoost model) says are worse than the task's best by
more than its own error: those are replaced by the search's next picks (:func:`choose_kept`). The
first ``filter_keep_explore`` share of the slots is never vetoed. The inner search is given an inflated
budget, so this wrapper enforces the real per-task trial budget itself. What it generated, kept and
vetoed is reported to the run's :class:`~tuning.engine.trimmer.hooks.TrimmerRuntime`.

TVM is imported when the class is first needed (:func:`make_filtered_search`), not with this module.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from tuning.engine.events import trace_json
from tuning.engine.trimmer.predictor import RidgeLatencyPredictor, pool_store_features
from tuning.engine.trimmer.rules import TrimmerConfig

if TYPE_CHECKING:
    from tuning.engine.trimmer.hooks import TrimmerRuntime

__all__ = ["make_filtered_search", "choose_kept"]  # and FilteredSearch, through __getattr__


def choose_kept(
    n: int, want: int, keep_explore: float, predicted_log: Sequence[float] | np.ndarray | None, threshold: float | None
) -> tuple[list[int], list[int]]:
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
        fill = sorted(passed_over, key=lambda i: predicted_log[i])[: want - len(kept)]
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
                min_samples=runtime.config.filter_min_samples if runtime is not None else 16
            )
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
                if vetoed and predicted is not None:  # a veto needs a prediction (choose_kept)
                    self.runtime.note_vetoed(
                        self.task_index,
                        [
                            {
                                "trace": trace_json(cands[i].sch.trace),
                                "predicted_s": math.exp(float(predicted[i])),
                                "best_s": self.runtime.task_best(self.task_index),
                            }
                            for i in vetoed
                        ],
                    )
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
            return FilteredSearch(
                task_index=self.task_index,
                runtime=self.runtime,
                oversample=self.oversample,
                keep_explore=self.keep_explore,
                inner_kwargs=self.inner_kwargs,
                seed=self.seed,
            )

    return FilteredSearch


def make_filtered_search(
    *,
    task_index: int,
    runtime: TrimmerRuntime | None,
    config: TrimmerConfig,
    inner_kwargs: dict | None = None,
    seed: int | None = None,
):
    """A :class:`FilteredSearch` for one task (``inner_kwargs``: EvolutionarySearch's)."""
    cls = _filtered_search_class()
    return cls(
        task_index=task_index,
        runtime=runtime,
        oversample=config.filter_oversample,
        keep_explore=config.filter_keep_explore,
        inner_kwargs=inner_kwargs,
        seed=seed,
    )


def __getattr__(name: str):  # FilteredSearch without importing TVM at module import
    if name == "FilteredSearch":
        return _filtered_search_class()
    raise AttributeError(name)
