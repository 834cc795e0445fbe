"""A wall-time budget reaches every task: the first round robin is paced by the budget, and a caller's
"finish" that comes before every task had a turn first gives each task without a record one short batch."""

import pytest

from tuning.engine.events import ListSink
from tuning.engine.search.first_round import FIRST_ROUND_SHARE, LATE_FIRST_BATCH, MIN_FIRST_BATCH, FirstRoundPacer


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _pacer(n_tasks, *, budget_s, reached=()):
    clock = Clock()
    counter = {"n": 0}
    pacer = FirstRoundPacer(
        (i for i in range(n_tasks) if i not in reached),
        deadline=None if budget_s is None else clock.now + budget_s,
        measured=lambda: counter["n"],
        clock=clock,
    )
    return pacer, clock, counter


def test_a_budget_that_affords_full_rounds_is_left_alone():
    pacer, clock, counter = _pacer(12, budget_s=1800)
    assert pacer.first_batch(0, 32) == 32  # no rate measured yet: the full round
    clock.now += 20.0
    counter["n"] = 32  # 0.625 s a trial: 11 more rounds of 32 take 220 s, well within half of 1,800 s
    assert [pacer.first_batch(i, 32) for i in range(1, 12)] == [32] * 11


def test_a_short_budget_shrinks_the_first_batches_so_every_task_gets_one():
    """vgg11's shape: 16 tasks at ~0.8 s a trial, 8 minutes. Full rounds would need ~410 s for the first round
    robin alone; paced, the other 15 share what is left of half the budget."""
    pacer, clock, counter = _pacer(16, budget_s=480)
    assert pacer.first_batch(0, 32) == 32
    clock.now += 25.6
    counter["n"] = 32  # 0.8 s a trial
    left_s = FIRST_ROUND_SHARE * 480 - 25.6
    expected = int(left_s / 15 / 0.8)  # 15 tasks to go, this one included
    assert MIN_FIRST_BATCH < pacer.first_batch(1, 32) == expected < 32
    # spent: what the pacing can give is the floor
    clock.now += 300.0
    counter["n"] = 49
    assert pacer.first_batch(2, 32) == MIN_FIRST_BATCH


def test_a_rate_from_a_one_candidate_task_is_not_trusted():
    """resnet18 opens with a reshape (one schedule): a whole search for one candidate is no rate."""
    pacer, clock, counter = _pacer(20, budget_s=1800)
    assert pacer.first_batch(0, 1) == 1
    clock.now += 20.0
    counter["n"] = 1  # 20 s for one candidate: taken as a rate, the next round would be cut to the floor
    assert pacer.first_batch(1, 32) == 32


def test_the_pacing_never_asks_more_than_the_search_offers_nor_touches_later_batches():
    pacer, clock, counter = _pacer(3, budget_s=60, reached={2})
    clock.now += 50.0
    counter["n"] = 20  # past half the budget: the pacing gives the floor
    assert pacer.first_batch(0, 5) == 5  # fewer offered than the floor: all of them
    assert pacer.first_batch(0, 32) == 32  # its second batch: not the pacer's business
    assert pacer.first_batch(2, 32) == 32  # had records before this call
    assert not pacer.owes(0) and not pacer.owes(2) and pacer.owes(1)


def test_after_the_caller_finished_each_owed_task_gets_a_short_batch_and_is_listed():
    pacer, _, _ = _pacer(4, budget_s=None, reached={1})
    assert pacer.first_batch(0, 32) == 32  # before finishing, no deadline: full round
    pacer.finishing = True
    assert pacer.first_batch(2, 32) == LATE_FIRST_BATCH
    assert pacer.first_batch(3, 2) == 2
    assert pacer.late == [2, 3] and not any(pacer.owes(i) for i in range(4))


def test_a_time_budget_must_be_positive():
    from tuning.engine.config import TuningConfig

    with pytest.raises(ValueError, match="time_budget_s"):
        TuningConfig(target="llvm", max_trials=8, time_budget_s=0)


@pytest.mark.slow
def test_a_finish_before_any_round_still_measures_every_task_once(tmp_path, cpu_target):
    """The caller's budget is spent before the search starts (a resumed run out of time, a budget shorter
    than the task extraction): without the deferral the search stops at once and all six tasks of the
    model would be compiled on TVM's default schedule; with it each gets one short batch, and no more."""
    from tuning.engine.config import TuningConfig
    from tuning.engine.measuring.timer import EvaluatorConfig
    from tuning.engine.session import run_tuning
    from tuning.engine.testing import tiny_cnn_onnx

    sink = ListSink(stop_after_records=0, command="finish")
    cfg = TuningConfig(target=cpu_target, max_trials=96, trials_per_round=16, work_dir=str(tmp_path), seed=1,
                       search_population=32, genetic_num_iters=1, time_budget_s=1.0,
                       evaluator=EvaluatorConfig(number=2, repeat=1, min_repeat_ms=5))
    s = run_tuning(tiny_cnn_onnx(), cfg, sink)
    assert s.status == "succeeded" and len(s.tasks) == 6
    assert all(t.n_records > 0 for t in s.tasks), [(t.name, t.n_records) for t in s.tasks]
    assert all(t.n_records <= LATE_FIRST_BATCH for t in s.tasks)  # one short batch each, then the finish holds
    assert sorted(s.late_first_rounds) == sorted(t.name for t in s.tasks)
