"""Trimmer, honestly (no TVM): the filter's own predictor, the veto that keeps the search's batch,
the minimum share before a pre-emption, resuming a parked task, and savings that leave out tasks
whose search space ran out."""

import math

import numpy as np
import pytest

from tuning.engine.events import TaskInfo
from tuning.engine.trimmer.rules import TrimmerConfig
from tuning.engine.trimmer.filter import choose_kept
from tuning.engine.trimmer.hooks import ALL_PREEMPTED, TrimmerRuntime
from tuning.engine.trimmer.predictor import RidgeLatencyPredictor, pool_store_features


def _tasks(*weights):
    return [TaskInfo(i, f"t{i}", 1e6, w) for i, w in enumerate(weights)]


def test_predictor_learns_from_measurements_only_and_reports_its_error():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 6))
    lat = np.exp(0.8 * x[:, 0] - 0.3 * x[:, 1]) * 1e-3
    p = RidgeLatencyPredictor(min_samples=16, alpha=1.0)
    assert p.predict_log(list(x)) is None and p.veto_threshold(1e-3, 0.25) is None  # untrained: no opinion
    p.add(list(x[:30]), list(lat[:30]) )
    p.add([x[30]], [None])  # a failed candidate says nothing about speed
    assert p.n_samples == 30 and p.ready
    pred = p.predict_log(list(x[30:]))
    assert np.corrcoef(pred, np.log(lat[30:]))[0, 1] > 0.9
    assert p.loo_rmse is not None and p.loo_rmse > 0
    assert p.veto_threshold(1e-3, 0.25) == pytest.approx(math.log(1e-3) + max(math.log1p(0.25), p.loo_rmse))
    assert p.veto_threshold(math.inf, 0.25) is None
    assert pool_store_features(np.array([[1.0, 4.0], [3.0, 0.0]])).tolist() == [2.0, 2.0, 3.0, 4.0]


def test_veto_keeps_the_search_batch_except_predicted_losers():
    # 8 candidates in the search's order, 4 slots, the first 25 % never vetoed
    predicted = [5.0, 5.0, 0.0, 5.0, 0.0, 0.0, 0.0, 5.0]
    kept, vetoed = choose_kept(8, 4, 0.25, predicted, threshold=1.0)
    assert kept == [0, 2, 4, 5] and vetoed == [1, 3]  # 1 and 3 would have been measured
    assert choose_kept(8, 4, 0.25, None, None) == ([0, 1, 2, 3], [])  # no predictor: the search's own batch
    # too few pass: the least bad vetoed ones fill the batch
    kept, vetoed = choose_kept(4, 3, 0.0, [9.0, 2.0, 3.0, 8.0], threshold=1.0)
    assert kept == [1, 2, 3] and vetoed == [0]


def test_runtime_keeps_a_uniform_audit_sample_of_vetoed_candidates():
    rt = TrimmerRuntime(TrimmerConfig(audit_sample=3), _tasks(1), max_trials=64, seed=1)
    rt.note_vetoed(0, [{"trace": str(i), "predicted_s": 1.0, "best_s": 0.5} for i in range(10)])
    d = rt.to_dict()
    assert d["vetoed"] == 10 and len(d["audit"]) == 3 and all(a["task"] == 0 for a in d["audit"])
    assert "ridge" in d["filter_predictor"]


def test_no_preemption_before_the_minimum_share_of_trials():
    cfg = TrimmerConfig(plateau_rounds=1, judge_after_trials=0, min_trial_share=0.5)
    rt = TrimmerRuntime(cfg, _tasks(1, 1), max_trials=64)  # min 0.5 x 64 / 2 = 16 trials per task
    assert rt.min_trials == 16
    rt.observe_batch(0, [1e-3] * 8, round_index=0)
    rt.observe_batch(0, [1e-3] * 4, round_index=1)  # no gain, 12 trials: kept
    assert not rt.is_preempted(0)
    rt.observe_batch(0, [1e-3] * 4, round_index=2)  # no gain at 16 trials: now pre-empted
    assert rt.is_preempted(0) and rt.state.preempted_tasks == {0: 16}


def test_a_parked_task_is_resumed_when_budget_is_left_and_parked_again_without_gain():
    cfg = TrimmerConfig(plateau_rounds=1, judge_after_trials=0, min_trial_share=0, model_patience=100,
                        max_resumes=1)
    rt = TrimmerRuntime(cfg, _tasks(1, 3), max_trials=100)
    for t in (0, 1):
        rt.observe_batch(t, [1e-3], round_index=t)
        rt.observe_batch(t, [1e-3], round_index=2 + t)  # no gain: both parked
    assert rt.is_preempted(0) and rt.is_preempted(1)
    assert rt.choose([0, 1], remaining=96) == 1  # the larger share of end-to-end latency
    assert not rt.is_preempted(1) and rt.to_dict()["resumptions"][0]["task"] == 1
    rt.observe_batch(1, [5e-4], round_index=4)  # a gain: it keeps going
    assert not rt.is_preempted(1)
    rt.observe_batch(1, [5e-4], round_index=5)  # no gain: parked again, no resume left
    assert rt.choose([0, 1], remaining=94) == 0  # the other parked task gets its probe
    rt.observe_batch(0, [1e-3], round_index=6)  # no gain: parked again
    assert rt.choose([0, 1], remaining=93) is None  # every resume spent
    rt.finish_all_preempted()
    assert rt.stop_reason == ALL_PREEMPTED and rt.trials_saved() == 100 - 7


def test_exhausted_search_spaces_are_no_saving():
    rt = TrimmerRuntime(TrimmerConfig(min_trial_share=0), _tasks(1, 1), max_trials=100)
    rt.per_round = 8
    rt.observe_batch(0, [1e-3], round_index=0)  # one new candidate of 8: space ran out
    rt.observe_batch(1, [], round_index=-1, exhausted=True)
    assert rt.choose([0, 1], remaining=99) is None  # nothing left to tune, nothing to resume
    rt.finish_all_preempted()
    assert rt.stop_reason is None and rt.state.preempted_tasks == {}  # not Trimmer's stop
    rt.stop_reason = "forced"  # even a stop saves nothing when no task could still be tuned
    assert rt.trials_saved() == 0 and rt.to_dict()["trials_saved"] == 0


def test_config_checks_the_new_options():
    for bad in ({"min_trial_share": 1.5}, {"max_resumes": -1}, {"filter_min_samples": 2.5},
                {"audit_sample": True}, {"filter_veto_margin": -0.1}):
        with pytest.raises(ValueError):
            TrimmerConfig.from_dict(bad)
