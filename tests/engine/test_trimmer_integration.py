"""Trimmer wired into real tuning runs: the ML candidate filter, per-task
pre-emption with budget re-allocation, the whole-model stop; plus the runtime's
decisions on synthetic batches (no TVM)."""

import math

import pytest

from tuning.engine.events import ListSink, TaskInfo
from tuning.engine.trimmer.rules import TrimmerConfig
from tuning.engine.trimmer.hooks import ALL_PREEMPTED, TrimmerRuntime

FAST_SEARCH = dict(trials_per_round=8, search_population=48, genetic_num_iters=1, seed=1)


def _tasks(*weights):
    return [TaskInfo(i, f"t{i}", 1e6, w) for i, w in enumerate(weights)]


# --- the runtime's decisions (no TVM) ------------------------------------------------------

def test_filter_counts_add_up_when_kept_candidates_are_not_sent():
    """What the filter kept but the run did not send (measured already, or past the trial budget) is
    counted apart, and a batch of which nothing was sent joins the task's next one."""
    rt = TrimmerRuntime(TrimmerConfig(model_patience=100, min_trial_share=0), _tasks(1, 1), max_trials=100)
    rt.note_generated(0, 8, 6)  # kept 2 ...
    rt.note_not_sent(0, 2)  # ... both measured earlier: nothing sent, the next batch carries it
    rt.note_generated(0, 8, 5)  # kept 3 ...
    rt.note_not_sent(0, 1)  # ... 2 sent
    assert rt.budget.outstanding[0] == 2
    assert rt.observe_batch(0, [1e-3, 2e-3], round_index=0) == (16, 11, 3)
    rt.note_generated(1, 4, 0)
    rt.note_not_sent(1, 9)  # never more than the batch kept
    rt.note_not_sent(0, 1)  # no batch of task 0 is out: nothing to amend
    d = rt.to_dict()
    assert (d["generated"], d["filtered"], d["not_sent"], d["measured"]) == (16, 11, 3, 2)
    assert rt.budget.outstanding.get(1, 0) == 0
    rt.note_generated(1, 4, 1)  # the carried batch (4 generated, none sent) joins this one
    assert rt.observe_batch(1, [1e-3] * 3, round_index=1) == (8, 1, 4)


def test_runtime_preempts_moves_budget_and_stops():
    rt = TrimmerRuntime(TrimmerConfig(plateau_rounds=1, model_patience=100, min_trial_share=0, max_resumes=0),
                        _tasks(1, 1, 1), max_trials=48)
    for i, lat in enumerate([4e-3, 2e-3, 1e-3]):
        assert rt.observe_batch(i, [lat, None], round_index=i) == (None, None, None)
    assert rt.estimate() == pytest.approx(7e-3)
    # budget by share of end-to-end latency: task 0 (4 ms of 7) is furthest below its share
    assert rt.choose([0, 1, 2], remaining=42) == 0
    rt.note_generated(0, 8, 6)  # the filter kept 2 of 8
    assert rt.choose([0, 1, 2], remaining=42, in_flight=[0]) == 0  # still below its share
    assert rt.observe_batch(0, [5e-3, 6e-3], round_index=3) == (8, 6, 0)  # no gain: pre-empted
    assert rt.take_pending() == [0] and rt.take_pending() == []
    assert rt.state.preempted_tasks == {0: 4}
    move = rt.reallocations[0]
    assert move["task"] == 0 and move["freed_trials"] > 0
    assert sum(move["moved_to"].values()) == move["freed_trials"] and set(move["moved_to"]) <= {1, 2}
    assert rt.choose([0, 1, 2], remaining=40) == 1  # the rest goes to the tasks still improving
    d = rt.to_dict()
    assert (d["generated"], d["filtered"], d["measured"]) == (8, 6, 8)
    assert d["preempted_task_names"] == {0: "t0"}
    rt.observe_batch(1, [2.5e-3], round_index=4)
    rt.observe_batch(2, [1.5e-3], round_index=5)
    assert rt.choose([1, 2], remaining=38) is None  # all plateaued
    rt.finish_all_preempted()
    assert rt.stop_reason == ALL_PREEMPTED == rt.to_dict()["model_stop_reason"]


def test_runtime_target_latency_stop_and_resume_state():
    rt = TrimmerRuntime(TrimmerConfig(target_latency_s=1e-3), _tasks(2, 1), max_trials=32,
                        initial_best={0: 1e-3}, initial_trials={0: 8}, preempted={1: 8})
    assert rt.is_preempted(1) and rt.take_pending() == []  # a resumed run keeps its pre-emptions (parked)
    assert rt.stop_reason is None
    rt.observe_batch(1, [3e-4], round_index=0)  # still measured while in flight: counted, stays pre-empted
    rt.observe_batch(0, [3e-4], round_index=1)  # 2 x 0.3 + 0.3 ms <= 1 ms
    assert rt.stop_reason and "target latency" in rt.stop_reason
    assert math.isclose(rt.estimate(), 9e-4)


def test_exhausted_search_space_is_parked_not_preempted_and_left_out_of_the_stop_rule():
    rt = TrimmerRuntime(TrimmerConfig(), _tasks(1, 1), max_trials=100)
    rt.per_round = 8
    rt.observe_batch(0, [3e-3], round_index=0)  # 1 new candidate of 8 asked: nothing left to search
    assert rt.is_preempted(0) and rt.take_pending() == [0]
    assert rt.reallocations[0]["reason"] == "search space exhausted" and rt.to_dict()["exhausted_tasks"] == [0]
    assert rt.state.preempted_tasks == {}  # not a Trimmer pre-emption: nothing saved on it
    rt.observe_batch(1, [1e-4] * 8, round_index=1)
    # a noisy one-schedule task must not dwarf the gains the windowed rule looks for
    assert rt.estimate() == pytest.approx(3.1e-3) and rt._tunable_estimate() == pytest.approx(1e-4)


def test_plateaus_are_judged_only_after_the_cost_model_warm_up():
    class FakeModel:
        data_size, num_warmup_samples = 0, 100

    cfg = TrimmerConfig(plateau_rounds=1, model_window=1, model_patience=1, min_trial_share=0)
    rt = TrimmerRuntime(cfg, _tasks(1, 1), max_trials=400)
    rt.cost_model = FakeModel()
    for r in range(4):  # random-search phase: no gain, but nothing is judged
        rt.observe_batch(0, [1e-3], round_index=2 * r)
        rt.observe_batch(1, [1e-3], round_index=2 * r + 1)
    assert not rt.state.preempted_tasks and rt.stop_reason is None and rt.to_dict()["judging_from_trial"] is None
    FakeModel.data_size = 100
    rt.observe_batch(0, [1e-3], round_index=9)
    assert rt.state.preempted_tasks == {0: 5} and rt.to_dict()["judging_from_trial"] == 8
    # an explicit threshold instead of the cost model's warm-up; the target latency always applies
    rt = TrimmerRuntime(TrimmerConfig(plateau_rounds=1, judge_after_trials=3, target_latency_s=5e-4,
                                      min_trial_share=0), _tasks(1), max_trials=40)
    rt.observe_batch(0, [1e-3, 1e-3], round_index=0)
    rt.observe_batch(0, [1e-3], round_index=1)   # 2 trials before: not judged yet
    assert not rt.state.preempted_tasks
    rt.observe_batch(0, [4e-4], round_index=2)   # judged now, and below the target
    assert rt.stop_reason and "target latency" in rt.stop_reason
    with pytest.raises(ValueError):
        TrimmerConfig.from_dict({"judge_after_trials": -1})


# --- real tuning runs (small ONNX CNN, 5 tasks) ---------------------------------------------

@pytest.fixture(scope="module")
def cnn():
    from tuning.engine.testing import tiny_cnn_onnx

    return tiny_cnn_onnx()


def _cfg(cpu_target, work_dir, max_trials, trimmer, **kw):
    from tuning.engine.config import TuningConfig
    from tuning.engine.measuring.timer import EvaluatorConfig

    opts = {**FAST_SEARCH, **kw}
    return TuningConfig(target=cpu_target, max_trials=max_trials, work_dir=str(work_dir),
                        evaluator=EvaluatorConfig(number=2, repeat=1, min_repeat_ms=5), trimmer=trimmer, **opts)


@pytest.mark.slow
def test_filter_and_preemption_on_a_real_run(tmp_path, cpu_target, cnn):
    """Aggressive Trimmer: a task is pre-empted as soon as one batch brings less than a 90 %
    gain; the filter measures 1 of 3 generated candidates; its budget goes to the others."""
    from tuning.engine.session import run_tuning

    trimmer = {"plateau_rounds": 1, "min_improvement": 0.9, "model_patience": 100, "judge_after_trials": 0,
               "filter_oversample": 3, "filter_keep_explore": 0.0, "min_trial_share": 0, "max_resumes": 0,
               "filter_min_samples": 4}
    sink = ListSink()
    s = run_tuning(cnn, _cfg(cpu_target, tmp_path, 64, trimmer, final_remeasure=False), sink)
    assert s.status == "succeeded" and s.trimmer is not None
    t = s.trimmer
    # the filter: generated > filtered > 0; what it kept is measured unless the run measured it
    # already or its budget ran out (not sent): the counts add up, in total and per round
    assert t["generated"] > t["measured"] > 0 and t["filtered"] > 0
    assert t["filtered"] + t["not_sent"] + t["measured"] == t["generated"]
    filtered_rounds = [r for r in sink.rounds if r.n_generated]
    assert filtered_rounds and sum(r.n_generated for r in filtered_rounds) == t["generated"]
    assert all(r.n_generated - r.n_filtered - r.n_not_sent == r.n_candidates for r in filtered_rounds)
    assert sum(r.n_candidates for r in sink.rounds) == s.n_measurements + s.n_duplicates
    # pre-emption: tasks stopped with their trial count at that moment
    pre = {int(k): v for k, v in t["preempted_tasks"].items()}
    assert pre, t
    by_task = {x.index: x.n_records for x in s.tasks}
    for i, at in pre.items():
        assert 0 < at <= by_task[i] + 8
    # its budget moved to the tasks still improving, which were measured afterwards
    moves = [m for m in t["reallocations"] if m["remaining_budget"] > 8]
    assert moves and any(m["freed_trials"] > 0 for m in moves)
    assert all(sum(m["moved_to"].values()) == m["freed_trials"] for m in moves)
    first = moves[0]
    assert set(first["moved_to"]) and first["task"] not in first["moved_to"]
    later = [r for r in sink.rounds if r.round_index > first["round"] and r.task_index != first["task"]]
    assert later  # the others were measured after it ...
    assert not [r for r in sink.rounds if r.round_index > first["round"] and r.task_index == first["task"]]  # it never
    assert s.tasks and all(x.best_latency_s and x.best_latency_s > 0 for x in s.tasks)


@pytest.mark.slow
def test_model_stop_at_target_latency_ends_the_run_early(tmp_path, cpu_target, cnn):
    from tuning.engine.session import run_tuning

    sink = ListSink()
    s = run_tuning(cnn, _cfg(cpu_target, tmp_path, 200, {"target_latency_s": 10.0, "filter_enabled": False},
                             final_remeasure=False, trials_per_round=4, search_population=24), sink)
    assert s.status == "succeeded"
    assert s.stop_reason and "target latency" in s.stop_reason
    assert s.trimmer["model_stop_reason"] == s.stop_reason
    # stops once every task has a latency (after the first round robin): far below the budget
    assert 0 < s.n_measurements <= 5 * 4 < 200
    assert s.trimmer["generated"] == 0 and s.trimmer["measured"] == s.n_measurements + s.n_duplicates
