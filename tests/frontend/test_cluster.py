"""Cluster and simulation pages over the scheduling app's models."""
from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from scheduling.models import GpuJob, SimulationRun
from tests.factories import GpuJobFactory, GpuTelemetryFactory, NodeFactory, PlacementFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="session")
def experiment_results():
    """Real results of the scheduling experiments (small, oracle predictions: ~1 s)."""
    from scheduling.horus.experiments import run_experiment
    from scheduling.horus.profiles import load_profiles

    profiles = load_profiles()
    replay = run_experiment(trace="philly", policies=["fifo_exclusive", "horus"], seed=0,
                            params={"jobs": 120, "gpus": 16, "predictions": "oracle"}, profiles=profiles)
    fill = run_experiment(trace="alibaba", policies=["best_fit", "fgd"], seed=0,
                          params={"scale": 0.01, "predictions": "oracle"}, profiles=profiles)
    return {"replay": replay, "fill": fill}


@pytest.fixture
def cluster(team_a, team_b, model_a, model_b):
    """A live node with two H200s (30 samples each, one running job of team A), a stale CPU-only node,
    and a pending job of team B."""
    now = timezone.now()
    node = NodeFactory(name="node-1", memory_mb=128_000, driver_version="550.1", gpus=2,
                       gpus__name="NVIDIA H200", gpus__gpu_model="H200", gpus__memory_total_mb=143_000)
    NodeFactory(name="cpu-only", cpu_cores=2, memory_mb=4000, nvml_available=False, driver_version="",
                nvml_error="NVML Shared Library Not Found", last_seen=now - dt.timedelta(hours=2))
    gpus = list(node.gpus.order_by("index"))
    for k in range(30):
        for g in gpus:
            GpuTelemetryFactory(gpu=g, ts=now - dt.timedelta(minutes=30 - k), util_pct=20 + k + 10 * g.index,
                                mem_used_mb=1000 * (k + 1))
    job_a = GpuJobFactory(model=model_a, predicted_util_pct=40, predicted_mem_mb=900, state=GpuJob.State.RUNNING,
                          policy="horus")
    PlacementFactory(job=job_a, gpu=gpus[1])
    GpuJobFactory(model=model_b, batch_size=4, predicted_util_pct=None, predicted_mem_mb=None)
    return {"node": node, "gpus": gpus, "job_a": job_a}


def test_cluster_page_without_data_says_so(owner_client):
    html = owner_client.get("/cluster/").content.decode()
    assert 'id="no-data"' in html and "No data yet" in html


def test_cluster_page(owner_client, cluster):
    html = owner_client.get("/cluster/").content.decode()
    assert 'id="no-data"' not in html
    assert "node-1" in html and "cpu-only" in html and "stale" in html and "no GPU found" in html
    assert "node-1/gpu1" in html and "NVIDIA H200" in html and "59%" in html  # latest util of gpu1
    assert "cnn-a" in html and "cnn-b" not in html  # team B's job stays hidden
    for fig in ("fig-utilization", "fig-memory", "fig-telemetry", "fig-jobs"):
        assert f'<script id="{fig}" type="application/json">' in html


def test_cluster_chart_endpoint(api_owner, cluster, team_b):
    body = api_owner.get("/api/charts/cluster/").json()
    assert body["available"] is True
    tele = body["figures"]["telemetry"]
    assert len(tele["data"]) == 2 and len(tele["data"][0]["x"]) == 30
    jobs = body["figures"]["jobs"]["data"][0]
    assert dict(zip(jobs["x"], jobs["y"]))["Running"] == 1 and dict(zip(jobs["x"], jobs["y"]))["Pending"] == 0
    assert api_owner.get(f"/api/charts/cluster/?team={team_b.pk}").status_code == 404


def test_simulations_pages(owner_client, api_owner, team_a, team_b, experiment_results):
    assert "No data yet" in owner_client.get("/simulations/").content.decode()
    replay = SimulationRun.objects.create(team=team_a, trace="philly", policies=["fifo_exclusive", "horus"],
                                          status="succeeded", results=experiment_results["replay"])
    fill = SimulationRun.objects.create(team=team_a, trace="alibaba", policies=["best_fit", "fgd"],
                                        status="succeeded", results=experiment_results["fill"])
    queued = SimulationRun.objects.create(team=team_a, trace="philly", policies=["horus"])
    other = SimulationRun.objects.create(team=team_b, trace="philly", policies=["horus"], status="succeeded",
                                         results=experiment_results["replay"])
    html = owner_client.get("/simulations/").content.decode()
    for sim in (replay, fill, queued):
        assert f'href="/simulations/{sim.pk}/"' in html
    assert f'href="/simulations/{other.pk}/"' not in html

    html = owner_client.get(f"/simulations/{replay.pk}/").content.decode()
    assert "makespan_h" in html and "horus" in html and "fig-curve" in html and "fig-makespan_h" in html
    html = owner_client.get(f"/simulations/{fill.pk}/").content.decode()
    assert "allocated_share" in html and "fgd" in html and "fig-frag_rate" in html
    assert "No results yet" in owner_client.get(f"/simulations/{queued.pk}/").content.decode()
    assert owner_client.get(f"/simulations/{other.pk}/").status_code == 404

    body = api_owner.get(f"/api/charts/simulations/{fill.pk}/").json()
    curve = body["figures"]["curve"]
    assert [t["name"] for t in curve["data"]] == ["best_fit", "fgd"]
    assert api_owner.get(f"/api/charts/simulations/{other.pk}/").status_code == 404


def test_simulation_figures_are_conditional(api_owner, api_other, team_a, experiment_results):
    sim = SimulationRun.objects.create(team=team_a, trace="philly", policies=["fifo_exclusive", "horus"])
    url = f"/api/charts/simulations/{sim.pk}/"
    queued = api_owner.get(url)
    assert queued.json()["available"] is False
    assert api_owner.get(url, HTTP_IF_NONE_MATCH=queued["ETag"]).status_code == 304
    assert api_other.get(url, HTTP_IF_NONE_MATCH=queued["ETag"]).status_code == 404
    SimulationRun.objects.filter(pk=sim.pk).update(status="succeeded", results=experiment_results["replay"],
                                                   finished_at=timezone.now())
    done = api_owner.get(url, HTTP_IF_NONE_MATCH=queued["ETag"])
    assert done.status_code == 200 and done.json()["available"] is True and done["ETag"] != queued["ETag"]


def test_jobs_chart_without_jobs_says_no_data_yet(api_owner, team_a):
    NodeFactory(name="node-x", gpus=1)
    jobs = api_owner.get(f"/api/charts/cluster/?team={team_a.pk}").json()["figures"]["jobs"]
    assert jobs["data"] == [] and "No data yet" in jobs["layout"]["annotations"][0]["text"]
