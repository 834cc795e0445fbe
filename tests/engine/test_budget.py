"""The run's trial budget (``tuning.engine.budget``): the ledger Trimmer and the record cache share. No TVM."""

from tuning.engine.budget import TrialBudget, allocate_trials, fair_shares
from tuning.engine.events import TaskInfo
from tuning.engine.trimmer.rules import TaskPlateauTracker, TrimmerConfig


def _tasks(*weights):
    return [TaskInfo(i, f"t{i}", 1e6, w) for i, w in enumerate(weights)]


def test_a_settled_task_gets_no_round_and_is_never_resumed():
    budget = TrialBudget(_tasks(1, 1), max_trials=40, max_resumes=5)
    budget.settle(0, 2)
    assert budget.take_pending() == [0] and budget.take_pending() == []
    assert budget.parked == {0: 2} and budget.finished == {0}
    assert budget.choose([0, 1], remaining=38) == 1
    assert budget.to_resume([0, 1]) is None  # settled: never a probe, whatever max_resumes allows


def test_a_parked_task_is_resumed_at_most_max_resumes_times_largest_share_first():
    budget = TrialBudget(_tasks(1, 1, 1), max_trials=60, max_resumes=1)
    for task, best in ((0, 1e-3), (1, 4e-3), (2, 2e-3)):
        budget.add_trials(task, 8)
        budget.observe_best(task, [best])
        budget.park(task)
    assert budget.choose([0, 1, 2], remaining=36) is None  # every task parked
    assert budget.to_resume([0, 1, 2]) == 1  # 4 ms: the largest share of end-to-end latency
    budget.resume(1)
    assert not budget.is_parked(1) and budget.choose([0, 1, 2], remaining=36) == 1
    budget.park(1)
    assert budget.to_resume([0, 1, 2]) == 2  # task 1 had its one probe


def test_seed_times_move_the_shares_and_count_as_trials():
    budget = TrialBudget(_tasks(1, 1), max_trials=40)
    budget.learn_seed(0, 1e-6, 2)
    budget.learn_seed(1, 1e-3, 2)
    budget.learn_seed(1, 5e-3, 1)  # a slower seed does not raise the best
    budget.learn_seed(7, 1e-3, 4)  # not a task of the run
    assert budget.best == {0: 1e-6, 1: 1e-3} and budget.trials == {0: 2, 1: 3}
    assert budget.seed_best == {0: 1e-6, 1: 1e-3} and budget.remaining() == 35
    assert [budget.choose([0, 1], remaining=35) for _ in range(3)] == [1, 1, 1]


def test_a_searched_seed_is_judged_after_its_floor_but_a_settled_one_is_not():
    budget = TrialBudget(_tasks(1, 1), max_trials=40)
    budget.settle(0, 2)
    budget.judge_after(0, 16)
    budget.judge_after(1, 0)
    assert budget.judged_after == {1: 1}  # at least one trial before a plateau may park it


def test_the_plateau_tracker_counts_into_the_budget():
    budget = TrialBudget(_tasks(1, 1), max_trials=40)
    tracker = TaskPlateauTracker(TrimmerConfig(plateau_rounds=1), budget=budget)
    tracker.observe(0, [1.0, 2.0])
    assert tracker.observe(0, [1.5])  # no gain: parked
    assert budget.trials == {0: 3} and budget.parked == {0: 3} and budget.take_pending() == [0]
    budget.learn_seed(1, 1e-3, 2)
    assert tracker.baseline(1) == 1e-3  # a seeded task's search is judged against the seed


def test_allocation_sums_to_the_budget_and_follows_the_shares():
    shares = {0: (1.0, 3e-3), 1: (1.0, 1e-3), 2: (2.0, None)}
    alloc = allocate_trials(100, shares, [0, 1, 2])
    assert sum(alloc.values()) == 100 and alloc[0] > alloc[1]
    fair = fair_shares(_tasks(1, 1), {0: 3e-3, 1: 1e-3}, 40)
    assert fair == {0: 30, 1: 10}
