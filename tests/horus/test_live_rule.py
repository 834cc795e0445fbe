"""The live re-placement rule (``horus.live_rule``): a restart costs the moved job's team its work and time,
so the job moved off an over-subscribed GPU is the one measured furthest over its prediction (the cause),
never a partner whose prediction held; a cause that cannot move leaves everyone where they are."""

from __future__ import annotations

from scheduling.horus.cluster import ClusterState
from scheduling.horus.live_rule import interference_moves, over_prediction_cause
from scheduling.horus.policies import HorusMigrate

from .helpers import view

NOW = 1000.0


def _running(state: ClusterState, job_id: str, gpu: int, *, pred: float, meas: float, migrations: int = 0,
             num_gpus: int = 1, start: float = 0.0) -> None:
    state.add(view(job_id, util=pred, mem=1000.0, num_gpus=num_gpus), [gpu + k for k in range(num_gpus)],
              true_util=pred, true_mem=900.0, now=start, meas_util=meas, migrations=migrations)


def _hot_gpu_with_a_hidden_loop(small_spec, **cause) -> ClusterState:
    """GPU 0: predicted 30 + 30 + 30 = 90 % (within 105 %), measured 70 + 30 + 20 = 120 %. ``b-loop`` was
    predicted 30 % and measures 70 % (its work hidden where graph features do not look); ``a-small`` (20 %)
    is the smallest job whose departure ends the over-subscription, the one HorusMigrate moves."""
    s = ClusterState(small_spec)
    _running(s, "b-loop", 0, pred=30.0, meas=70.0, **cause)
    _running(s, "a-steady", 0, pred=30.0, meas=30.0)
    _running(s, "a-small", 0, pred=30.0, meas=20.0)
    return s


def test_the_job_measured_furthest_over_its_prediction_is_moved_not_the_smallest(small_spec):
    s = _hot_gpu_with_a_hidden_loop(small_spec)
    assert HorusMigrate(min_runtime_s=60).rebalance(s.view(), NOW)[0][0] == "a-small"  # the simulator's choice
    (move,) = interference_moves(s.view(), NOW)
    assert move.job_id == "b-loop" and move.from_gpu == 0 and move.to_gpu != 0
    assert (move.job_measured_util_pct, move.job_predicted_util_pct) == (70.0, 30.0)
    assert move.why()["chosen_as"].startswith("cause")


def test_a_cause_that_cannot_move_restarts_nobody_else(small_spec):
    for cannot_move in ({"migrations": 2}, {"start": NOW - 10.0}):  # moved twice already; just started
        s = _hot_gpu_with_a_hidden_loop(small_spec, **cannot_move)
        assert interference_moves(s.view(), NOW) == [], cannot_move


def test_a_gang_cause_is_not_moved_and_its_partner_stays(small_spec):
    s = ClusterState(small_spec)
    _running(s, "gang", 0, pred=40.0, meas=80.0, num_gpus=2)  # GPUs 0 and 1
    _running(s, "partner", 0, pred=40.0, meas=40.0)
    assert interference_moves(s.view(), NOW) == []


def test_no_cause_without_a_job_over_its_prediction(small_spec):
    s = ClusterState(small_spec)
    _running(s, "x", 0, pred=60.0, meas=50.0)
    _running(s, "y", 0, pred=40.0, meas=40.0)
    assert over_prediction_cause(s.view().jobs_on(0)) is None
    _running(s, "z", 0, pred=10.0, meas=25.0)
    _running(s, "w", 0, pred=10.0, meas=25.0)  # same excess: the lowest id
    assert over_prediction_cause(s.view().jobs_on(0)).view.job_id == "w"


def test_a_gpu_filled_past_the_bound_by_its_predictions_is_left_alone(small_spec):
    s = ClusterState(small_spec)
    for job_id, meas in (("p", 70.0), ("q", 30.0), ("r", 20.0)):
        _running(s, job_id, 0, pred=40.0, meas=meas + 10.0)  # predicted 120 %: the policy's choice
    assert interference_moves(s.view(), NOW) == []
