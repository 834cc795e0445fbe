"""A simulation's estimated cost is checked against the team's limit (when requested and when it starts),
it can be cancelled (queued: revoked; running: stops at its next check), and one team cannot fill the
simulation worker's queue ahead of another."""
from __future__ import annotations

import datetime as dt

import pytest

from core.models import Quota
from scheduling import services
from scheduling.horus.cost import SECONDS_PER_UNIT
from scheduling.models import SimulationRun
from scheduling.services.simulation_queue import WaitingSimulation, cancel_check, fair_dispatch_order

from ..helpers import client_for

pytestmark = pytest.mark.django_db

SMALL = {"jobs": 20, "gpus": 4, "predictions": "oracle"}
RUN_SIMULATION = "scheduling.run_simulation"


def _body(team, policies=("horus",), **parameters):
    return {"team": team.pk, "trace": "philly", "policies": list(policies), "parameters": {**SMALL, **parameters}}


def _start(api, team, policies=("horus",), **parameters):
    return api.post("/api/simulations/", _body(team, policies, **parameters), format="json")


def _sent(outbox) -> list[int]:
    return [args[0] for args in outbox.args_of(RUN_SIMULATION)]


# --- cost ------------------------------------------------------------------------------------------------

def test_a_request_over_the_cost_budget_is_refused_naming_estimate_and_limit(api_owner, team_a, celery_outbox,
                                                                             django_capture_on_commit_callbacks):
    # 20,000 jobs x 1,000 GPUs is inside the size limit (20M job-GPUs); every policy with a 1,000-deep
    # backfill window is not inside the default cost limit
    with django_capture_on_commit_callbacks(execute=True):
        resp = _start(api_owner, team_a, ["all"], jobs=20_000, gpus=1000, backfill=1000)
    assert resp.status_code == 429, resp.json()
    body = resp.json()
    assert body["code"] == "quota_exceeded" and body["quota"] == "max_simulation_units"
    estimate = api_owner.post("/api/simulations/estimate/", _body(team_a, ["all"], jobs=20_000, gpus=1000,
                                                                  backfill=1000), format="json").json()
    assert estimate["within_limit"] is False and estimate["limit_units"] == 15_000_000
    assert f"estimated at {estimate['units']:,} simulation units" in body["detail"]
    assert "the limit is 15,000,000 units per simulation" in body["detail"]
    assert not SimulationRun.objects.exists() and not celery_outbox


def test_each_multiplier_can_tip_a_request_over_the_limit(api_owner, team_a, celery_outbox):
    base = api_owner.post("/api/simulations/estimate/", _body(team_a), format="json").json()
    Quota.objects.filter(team=team_a).update(max_simulation_units=base["units"], max_concurrent_simulations=50)
    assert _start(api_owner, team_a).status_code == 201  # at the limit
    for bigger in ({"policies": ["horus", "fgd"]}, {"backfill": 10}, {"horus_lookahead": 10}, {"gpus": 400},
                   {"jobs": 21}):
        policies = bigger.pop("policies", ["horus"])
        resp = _start(api_owner, team_a, policies, **bigger)
        assert resp.status_code == 429 and resp.json()["quota"] == "max_simulation_units", (bigger, resp.json())
    assert SimulationRun.objects.count() == 1


def test_the_estimate_is_in_the_response_and_stored(api_owner, team_a, celery_outbox):
    estimate = api_owner.post("/api/simulations/estimate/", _body(team_a, ["horus", "fgd"]), format="json")
    assert estimate.status_code == 200 and set(estimate.json()["per_policy"]) == {"horus", "fgd"}
    assert not SimulationRun.objects.exists()  # estimating stores nothing
    run = _start(api_owner, team_a, ["horus", "fgd"]).json()
    assert run["cost_units"] == estimate.json()["units"] > 0
    assert run["estimated_worker_s"] == round(run["cost_units"] * SECONDS_PER_UNIT, 1)
    assert SimulationRun.objects.get(pk=run["id"]).cost_units == run["cost_units"]


def test_the_estimate_endpoint_is_for_the_teams_writers(api_other, user_viewer, team_a):
    # like starting one: the team field accepts only teams the caller can start simulations in
    for api in (api_other, client_for(user_viewer)):
        resp = api.post("/api/simulations/estimate/", _body(team_a), format="json")
        assert resp.status_code == 400 and "team" in resp.json()["errors"], resp.json()


def test_the_cost_is_checked_again_where_it_is_incurred(user_owner, team_a, celery_outbox):
    run = services.start_simulation(actor=user_owner, team=team_a, trace="philly", policies=["horus"],
                                    parameters=SMALL)
    Quota.objects.filter(team=team_a).update(max_simulation_units=run.cost_units - 1)  # lowered while it waited
    run = services.execute_simulation(run_id=run.pk)
    assert run.status == "failed" and run.results == {}
    assert f"estimated at {run.cost_units:,} simulation units" in run.error and "limit is now" in run.error


# --- cancel ----------------------------------------------------------------------------------------------

def test_cancel_a_queued_simulation_revokes_it(api_owner, team_a, celery_outbox, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run = _start(api_owner, team_a).json()
    assert _sent(celery_outbox) == [run["id"]]  # the message is already with the broker
    resp = api_owner.post(f"/api/simulations/{run['id']}/cancel/")
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert services.execute_simulation(run_id=run["id"]) is None  # the worker drops the revoked message
    assert SimulationRun.objects.get(pk=run["id"]).status == "cancelled"
    again = api_owner.post(f"/api/simulations/{run['id']}/cancel/")
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]


def test_cancel_by_another_team_is_404_and_by_a_viewer_403(api_owner, api_other, user_viewer, team_a):
    run = _start(api_owner, team_a).json()
    assert api_other.post(f"/api/simulations/{run['id']}/cancel/").status_code == 404
    assert client_for(user_viewer).post(f"/api/simulations/{run['id']}/cancel/").status_code == 403
    assert client_for(None).post(f"/api/simulations/{run['id']}/cancel/").status_code in (401, 403)
    assert SimulationRun.objects.get(pk=run["id"]).status == "queued"


def test_a_cancelled_running_simulation_stops_and_discards_its_partial_results(api_owner, user_owner, team_a):
    run = services.start_simulation(actor=user_owner, team=team_a, trace="philly",
                                    policies=["best_fit", "horus", "fgd"], parameters=SMALL)
    seen = {}
    flag = cancel_check(run.pk, every_s=0)

    def should_stop() -> bool:
        # while the first policy runs, the owner presses Cancel (the API call a second process would make)
        if "cancel" not in seen:
            seen["status"] = SimulationRun.objects.get(pk=run.pk).status
            seen["cancel"] = api_owner.post(f"/api/simulations/{run.pk}/cancel/").json()
        return flag()

    finished = services.execute_simulation(run_id=run.pk, should_stop=should_stop)
    assert seen["status"] == "running"
    assert seen["cancel"]["status"] == "running" and seen["cancel"]["cancel_requested"] is True
    assert finished.status == "cancelled" and finished.results == {}
    assert "partial" not in finished.results and "discarded" in finished.error and "after 0 of 3" in finished.error


def test_the_cancel_flag_is_read_from_the_database_at_most_once_per_interval(user_owner, team_a):
    run = services.start_simulation(actor=user_owner, team=team_a, trace="philly", parameters=SMALL)
    now = [0.0]
    check = cancel_check(run.pk, every_s=1.0, clock=lambda: now[0])
    SimulationRun.objects.filter(pk=run.pk).update(cancel_requested_at=dt.datetime.now(dt.UTC))
    assert check() is False  # not looked at yet: the engine asks far more often than once a second
    now[0] = 1.0
    assert check() is True and check() is True


# --- fair queue ------------------------------------------------------------------------------------------

def test_one_teams_five_simulations_do_not_delay_anothers_first_beyond_one_slot(
        api_owner, api_other, team_a, team_b, celery_outbox, django_capture_on_commit_callbacks):
    Quota.objects.filter(team=team_a).update(max_concurrent_simulations=10)
    with django_capture_on_commit_callbacks(execute=True):
        a = [_start(api_owner, team_a).json() for _ in range(5)]
        b = _start(api_other, team_b).json()
    assert _sent(celery_outbox) == [a[0]["id"], b["id"]]  # B's first is right behind A's one slot
    assert [r["waiting_in_fair_queue"] for r in a] == [False, True, True, True, True]
    assert b["waiting_in_fair_queue"] is False
    with django_capture_on_commit_callbacks(execute=True):
        assert services.execute_simulation(run_id=a[0]["id"]).status == "succeeded"
    assert _sent(celery_outbox) == [a[0]["id"], b["id"], a[1]["id"]]  # A's slot freed: its next one goes
    with django_capture_on_commit_callbacks(execute=True):  # cancelling a waiting one frees no slot
        api_owner.post(f"/api/simulations/{a[2]['id']}/cancel/")
        services.dispatch_simulations()
    assert len(_sent(celery_outbox)) == 3
    with django_capture_on_commit_callbacks(execute=True):  # cancelling the sent one does: a[3] goes
        api_owner.post(f"/api/simulations/{a[1]['id']}/cancel/")
    assert _sent(celery_outbox)[-1] == a[3]["id"] and len(_sent(celery_outbox)) == 4


def _at(minute: int) -> dt.datetime:
    return dt.datetime(2026, 1, 1, 12, minute, tzinfo=dt.UTC)


def test_dispatch_order_is_round_robin_by_team():
    waiting = [WaitingSimulation(i, 1, _at(i)) for i in range(1, 6)] + [WaitingSimulation(10, 2, _at(9)),
                                                                      WaitingSimulation(11, 3, _at(8))]
    # team 1 has one in the worker's queue: its other four wait; teams 2 and 3 go, oldest run first
    assert fair_dispatch_order(waiting, busy_teams={1}, last_served={1: _at(0)}) == [11, 10]
    # nobody busy: one each, the team served longest ago (or never) first, whatever its runs' age
    assert fair_dispatch_order(waiting, busy_teams=set(), last_served={1: _at(30), 2: _at(20)}) == [11, 10, 1]
    assert fair_dispatch_order(waiting, busy_teams={1, 2, 3}, last_served={}) == []
