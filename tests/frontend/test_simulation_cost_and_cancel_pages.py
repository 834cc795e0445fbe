"""The simulation form shows a request's estimated cost against the team's limit, and the detail page
shows it and cancels; attack tests beside them (viewer, other team)."""
from __future__ import annotations

import pytest
from django.test import Client

from core.models import Quota
from scheduling import services
from scheduling.models import SimulationRun

pytestmark = pytest.mark.django_db

SMALL = {"jobs": 20, "gpus": 4, "predictions": "oracle"}


def _form(team, **extra):
    return {"team": team.pk, "trace": "philly", "policies": ["horus", "fgd"], "seeds": "0, 1", "jobs": 40, "gpus": 8,
            **extra}


def test_the_form_estimates_the_cost_of_every_seed_without_starting(owner_client, user_owner, team_a, no_broker):
    resp = owner_client.post("/simulations/new/", _form(team_a, backfill=4, estimate="1"))
    assert resp.status_code == 200 and not SimulationRun.objects.exists() and not no_broker
    estimate = services.estimate_simulation(actor=user_owner, team=team_a, trace="philly", policies=["horus", "fgd"],
                                            parameters={"jobs": 40, "gpus": 8, "backfill": 4}, seeds=2)
    html = resp.content.decode()
    box = html.split('id="simulation-estimate"', 1)[1].split("</div>", 1)[0]
    assert f"Estimated cost: {estimate['units']} simulation units" in box and "2 simulations of" in box
    assert "limit is 15000000 units per simulation" in box and "within it" in box
    assert "<th>horus</th>" in box and "<th>fgd</th>" in box


def test_the_form_says_when_the_estimate_is_over_the_limit_and_starting_it_is_refused(owner_client, team_a,
                                                                                      no_broker):
    Quota.objects.filter(team=team_a).update(max_simulation_units=100)
    box = owner_client.post("/simulations/new/", _form(team_a, estimate="1")).content.decode()
    assert "<strong>over it</strong>" in box
    refused = owner_client.post("/simulations/new/", _form(team_a)).content.decode()
    assert "Quota &#x27;simulation cost&#x27; would be exceeded" in refused and "the limit is 100 units" in refused
    assert not SimulationRun.objects.exists() and not no_broker


def test_the_detail_page_shows_the_cost_and_cancels(owner_client, user_owner, team_a):
    run = services.start_simulation(actor=user_owner, team=team_a, trace="philly", parameters=SMALL)
    page = owner_client.get(f"/simulations/{run.pk}/").content.decode()
    assert f"Estimated cost: <strong>{run.cost_units}</strong> simulation units" in page and 'id="sim-cancel"' in page
    resp = owner_client.post(f"/simulations/{run.pk}/cancel/")
    assert resp.status_code == 302 and SimulationRun.objects.get(pk=run.pk).status == "cancelled"
    page = owner_client.get(f"/simulations/{run.pk}/").content.decode()
    assert 'id="sim-cancel"' not in page and "Cancelled before it started." in page
    progress = owner_client.get(f"/simulations/{run.pk}/progress/").json()
    assert progress["status"] == "cancelled" and progress["terminal"] is True


def test_a_running_simulation_shows_its_cancel_request(owner_client, user_owner, team_a):
    run = services.start_simulation(actor=user_owner, team=team_a, trace="philly", parameters=SMALL)
    SimulationRun.objects.filter(pk=run.pk).update(status="running")
    owner_client.post(f"/simulations/{run.pk}/cancel/")
    assert SimulationRun.objects.get(pk=run.pk).status == "running"  # the worker ends it at its next check
    assert 'id="sim-stopping"' in owner_client.get(f"/simulations/{run.pk}/").content.decode()
    assert owner_client.get(f"/simulations/{run.pk}/progress/").json()["cancel_requested"] is True


def test_a_viewer_or_another_team_cannot_cancel(user_owner, user_viewer, user_other, team_a, team_b):
    run = services.start_simulation(actor=user_owner, team=team_a, trace="philly", parameters=SMALL)
    viewer = Client()
    viewer.force_login(user_viewer)
    assert 'id="sim-cancel"' not in viewer.get(f"/simulations/{run.pk}/").content.decode()
    viewer.post(f"/simulations/{run.pk}/cancel/")
    other = Client()
    other.force_login(user_other)
    assert other.post(f"/simulations/{run.pk}/cancel/").status_code == 404
    assert other.get(f"/simulations/{run.pk}/cancel/").status_code == 405
    assert SimulationRun.objects.get(pk=run.pk).status == "queued"
