"""Simulations have per-team limits (at once, and jobs x GPUs of one) and run on their own queue.

Five 100,000-job x 20,000-GPU simulations used to be accepted, each holding the shared worker 25 s.
"""
from __future__ import annotations

from unittest import mock

import pytest

from core.models import Quota
from scheduling import services, tasks
from scheduling.models import SimulationRun

from ..helpers import client_for, require_env

SMALL = {"jobs": 20, "gpus": 4, "predictions": "oracle"}


@pytest.fixture
def no_sends():
    with mock.patch.object(tasks.run_simulation, "delay") as sim:
        yield sim


def _start(api, team, **parameters):
    return api.post("/api/simulations/", {"team": team.pk, "trace": "philly", "policies": ["horus"],
                                          "parameters": {**SMALL, **parameters}}, format="json")


@pytest.mark.django_db
def test_an_oversized_simulation_is_refused_naming_the_limit(api_owner, team_a, no_sends):
    resp = _start(api_owner, team_a, jobs=100_000, gpus=20_000)
    assert resp.status_code == 429, resp.json()
    body = resp.json()
    assert body["code"] == "quota_exceeded" and body["quota"] == "max_simulation_job_gpus"
    assert "100000 jobs x 20000 GPUs" in body["detail"] and "20000000 per simulation" in body["detail"]
    assert not SimulationRun.objects.exists() and not no_sends.called

    Quota.objects.filter(team=team_a).update(max_simulation_job_gpus=1000)
    assert _start(api_owner, team_a, jobs=250, gpus=4).status_code == 201  # 1000: at the limit
    assert _start(api_owner, team_a, jobs=251, gpus=4).status_code == 429
    assert SimulationRun.objects.count() == 1


@pytest.mark.django_db
def test_simulation_size_counts_the_jobs_the_trace_has(api_owner, user_owner, team_a, no_sends):
    """An uploaded 4-job trace simulates 4 jobs, whatever `jobs` asks; the Alibaba fill method simulates
    the trace's pods on its scaled cluster."""
    from ..helpers import PHILLY_CSV

    trace = services.upload_trace(actor=user_owner, team=team_a, name="tiny", data=PHILLY_CSV.encode(),
                                  filename="tiny.csv")
    Quota.objects.filter(team=team_a).update(max_simulation_job_gpus=400, max_concurrent_simulations=10)
    resp = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": str(trace.pk), "policies": ["horus"],
                                                "parameters": {"jobs": 100_000, "gpus": 100}}, format="json")
    assert resp.status_code == 201, resp.json()  # 4 jobs x 100 GPUs
    resp = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": "alibaba", "policies": ["horus"]},
                          format="json")
    assert resp.status_code == 429 and resp.json()["quota"] == "max_simulation_job_gpus"
    assert "jobs x" in resp.json()["detail"]


@pytest.mark.django_db
def test_simulations_at_once_are_limited_per_team(api_owner, api_other, team_a, team_b, no_sends):
    Quota.objects.filter(team=team_a).update(max_concurrent_simulations=2)
    first, second = _start(api_owner, team_a), _start(api_owner, team_a)
    assert first.status_code == second.status_code == 201
    resp = _start(api_owner, team_a)
    assert resp.status_code == 429 and resp.json()["quota"] == "max_concurrent_simulations"
    assert "2 of 2 simulations are queued or running" in resp.json()["detail"]
    assert SimulationRun.objects.filter(team=team_a).count() == 2
    assert _start(api_other, team_b).status_code == 201  # another team's limit is its own

    usage = api_owner.get(f"/api/quotas/{team_a.quota.pk}/").json()
    assert usage["max_concurrent_simulations"] == 2 and usage["usage"]["concurrent_simulations"] == 2
    assert services.execute_simulation(run_id=first.json()["id"]).status == "succeeded"
    assert _start(api_owner, team_a).status_code == 201  # a finished one frees its slot


@pytest.mark.django_db
def test_simulation_limits_are_staff_edited_quota_fields(api_owner, user_staff, team_a):
    quota = api_owner.get("/api/quotas/").json()["results"][0]
    assert quota["max_concurrent_simulations"] == 2 and quota["max_simulation_job_gpus"] == 20_000_000
    assert quota["usage"]["concurrent_simulations"] == 0
    url = f"/api/quotas/{quota['id']}/"
    assert api_owner.patch(url, {"max_concurrent_simulations": 50}, format="json").status_code == 403
    resp = client_for(user_staff).patch(url, {"max_concurrent_simulations": 5, "max_simulation_job_gpus": 10**6},
                                        format="json")
    assert resp.status_code == 200, resp.json()
    assert (resp.json()["max_concurrent_simulations"], resp.json()["max_simulation_job_gpus"]) == (5, 10**6)


@pytest.mark.django_db
def test_energy_page_shows_the_simulation_limits(client, user_owner, team_a, no_sends):
    services.start_simulation(actor=user_owner, team=team_a, trace="philly", parameters=SMALL)
    client.force_login(user_owner)
    html = client.get("/energy/").content.decode()
    table = html.split('id="quota-table"', 1)[1].split("</table>", 1)[0]
    assert "Simulations" in table and "1 / 2" in table and "at most 20000000" in table


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_simulations_run_on_their_own_queue(tmp_path, user_owner, team_a, django_capture_on_commit_callbacks):
    """A worker that serves only `simulations` runs them; nothing lands on the tuning or default queues."""
    from config.celery import app
    from tests.workers import running_worker, wait_for

    redis_url = require_env("TEST_REDIS_URL")
    with app.connection_for_write() as conn:
        for queue in ("simulations", "default", "tuning"):
            conn.default_channel.queue_purge(queue)
    with running_worker(broker_url=redis_url, queues="simulations", log_dir=tmp_path, name="sim") as worker:
        with django_capture_on_commit_callbacks(execute=True):
            run = services.start_simulation(actor=user_owner, team=team_a, trace="philly", parameters=SMALL)
        wait_for(lambda: SimulationRun.objects.get(pk=run.pk).status in ("succeeded", "failed"), 120,
                 "the simulation to run on the simulations worker", log=worker.log)
    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    with app.connection_for_write() as conn:
        for queue in ("default", "tuning"):
            assert conn.default_channel.client.llen(queue) == 0, queue
