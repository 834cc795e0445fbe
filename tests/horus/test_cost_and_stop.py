"""The simulation cost estimate (every multiplier counts) and the engine's ``should_stop`` (a cancelled
run stops between events, not after the last one)."""

from __future__ import annotations

import pytest

from scheduling.horus.cost import (
    POLICY_WEIGHTS,
    SECONDS_PER_UNIT,
    estimate_simulation_cost,
    fill_decisions,
)
from scheduling.horus.experiments import POLICY_NAMES, ExperimentParams, default_inputs, run_experiment
from scheduling.horus.policies import make_policy
from scheduling.horus.sim_inputs import STOP_CHECK_EVERY, SimulationStopped
from scheduling.horus.simulator import simulate

from .helpers import random_jobs
from .test_simulator import SPEC


def _cost(policies=("best_fit",), jobs=1000, gpus=64, seeds=1, **params):
    p = ExperimentParams.from_dict(params).validate("philly" if params.get("method") != "fill" else "alibaba_pods")
    return estimate_simulation_cost(p, policies=list(policies), jobs=jobs, gpus=gpus, seeds=seeds)


def test_the_formula_for_one_baseline_policy():
    c = _cost()
    # 1000 decisions x weight 1 x (1 + 64/1024) x (1 + 0/64), plus 1000 jobs prepared
    assert c.per_policy == {"best_fit": 1062} and c.units == 2062
    assert c.seconds == pytest.approx(2062 * SECONDS_PER_UNIT) and (c.jobs, c.gpus, c.decisions) == (1000, 64, 1000)


@pytest.mark.parametrize("bigger", [
    {"jobs": 4000}, {"gpus": 4096}, {"seeds": 3}, {"backfill": 200}, {"policies": ("best_fit", "random_fit")},
    {"policies": ("fgd",)}, {"policies": ("usage_fgd",)},
])
def test_every_multiplier_raises_the_estimate(bigger):
    assert _cost(**bigger).units > _cost().units


def test_lookahead_costs_only_the_policies_that_use_it():
    assert _cost(policies=("horus",), horus_lookahead=300).units > _cost(policies=("horus",), horus_lookahead=1).units
    assert _cost(policies=("best_fit",), horus_lookahead=300).units == _cost(policies=("best_fit",)).units
    # the window never counts past the queue: 10 jobs cannot wait 10,000 deep
    assert _cost(jobs=10, backfill=10_000).units == _cost(jobs=10, backfill=10).units


def test_seeds_multiply_the_whole_request():
    one, three = _cost(policies=POLICY_NAMES), _cost(policies=POLICY_NAMES, seeds=3)
    assert three.units == 3 * one.units and three.per_policy == one.per_policy


def test_a_fill_is_charged_the_pods_it_submits_at_most_the_fills_cap():
    p = ExperimentParams.from_dict({"until": 1.0}).validate("alibaba_pods")
    sized = estimate_simulation_cost(p, policies=["fgd"], jobs=8000, gpus=300, gpu_request_per_pod=0.75)
    assert sized.decisions == fill_decisions(300, until=1.0, gpu_request_per_pod=0.75) == 501  # 1.25 x 300 / 0.75
    assert sized.per_policy["fgd"] == round(501 * POLICY_WEIGHTS["fgd"] * (1 + 300 / 1024))
    # unknown mean request, or pods so small the fill would run to its cap: the cap, 10 x GPUs + 1000
    assert estimate_simulation_cost(p, policies=["fgd"], jobs=8000, gpus=300).decisions == 4000
    assert fill_decisions(300, gpu_request_per_pod=0.01) == 4000
    half = ExperimentParams.from_dict({"until": 0.5}).validate("alibaba_pods")
    assert estimate_simulation_cost(half, policies=["fgd"], jobs=8000, gpus=300,
                                    gpu_request_per_pod=0.75).decisions == 251


def test_an_unknown_policy_is_charged_as_the_dearest():
    assert _cost(policies=("someday",)).per_policy["someday"] == _cost(policies=("usage_fgd",)).per_policy["usage_fgd"]


# --------------------------------------------------------------------------------------------- stop
class FlipAfter:
    """``should_stop`` that says True from its ``n``-th call on."""

    def __init__(self, n: int):
        self.n, self.calls = n, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls >= self.n


def test_a_replay_stops_between_events_when_asked():
    jobs = random_jobs(400, 2)
    full = simulate(jobs, SPEC, make_policy("best_fit"), seed=1)
    assert full.events > 4 * STOP_CHECK_EVERY
    stop = FlipAfter(2)
    with pytest.raises(SimulationStopped, match="stopped after"):
        simulate(jobs, SPEC, make_policy("best_fit"), seed=1, should_stop=stop)
    assert stop.calls == 2  # asked every STOP_CHECK_EVERY batches, stopped at the first True
    never = FlipAfter(10**9)
    assert simulate(jobs, SPEC, make_policy("best_fit"), seed=1, should_stop=never).to_dict()["makespan_s"] == \
        full.makespan_s and never.calls >= 2  # asking changes nothing


def test_an_experiment_stops_mid_policy_and_names_what_had_finished():
    inputs = default_inputs()
    params = {"jobs": 300, "gpus": 8, "predictions": "oracle", "start": 10_000}
    running, asked_in = [], []

    def stop_inside_horus() -> bool:
        asked_in.append(running[-1] if running else None)
        return running[-1:] == ["horus"]

    with pytest.raises(SimulationStopped) as info:
        run_experiment(trace="philly", policies=["best_fit", "horus", "fgd"], seed=0, params=params,
                       profiles=inputs["profiles"], progress=running.append, should_stop=stop_inside_horus)
    assert info.value.completed == ["best_fit"] and "during policy horus, after 1 of 3 policies" in str(info.value)
    assert "stopped after" in str(info.value)  # inside the replay, between events
    assert asked_in.count("best_fit") > 1 and running == ["best_fit", "horus"]


def test_a_fill_stops_when_asked():
    inputs = default_inputs()
    with pytest.raises(SimulationStopped, match="pods"):
        run_experiment(trace="alibaba", policies=["best_fit"], seed=0,
                       params={"scale": 0.02, "predictions": "oracle"}, profiles=inputs["profiles"],
                       should_stop=FlipAfter(2))
