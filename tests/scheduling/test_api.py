"""Scheduling API: team scoping (another team's object is a 404), staff-only actions, telemetry
filters, profiles with their source, simulations, and trace uploads validated row by row."""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from unittest import mock

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from scheduling import services, tasks
from scheduling.models import GpuJob, GpuTelemetry, Placement, SimulationRun, TraceUpload

from ..helpers import client_for
from .fakes import make_job

GOOD_PHILLY = (
    "timestamp,duration,num_gpus,gpu_time,cluster\n"
    "2017-10-09 06:00:00,600,1,600,c1\n"
    "2017-10-09 06:01:00,1200,2,2400,c1\n"
    "2017-10-09 06:03:00,300,1,300,c1\n"
    "2017-10-09 06:04:00,900,4,3600,c1\n"
)


@pytest.fixture(autouse=True)
def _no_celery():
    with mock.patch.object(tasks.place_pending, "delay"), mock.patch.object(tasks.run_job, "apply_async"), \
            mock.patch.object(tasks.run_simulation, "delay") as sim:
        yield sim


@pytest.fixture
def api_staff(user_staff):
    return client_for(user_staff)


def test_cluster_is_readable_by_any_user_and_drain_is_staff_only(gpu_node, api_owner, api_staff):
    nodes = api_owner.get("/api/nodes/").json()
    assert nodes["count"] == 1 and nodes["results"][0]["gpu_count"] == 2
    assert nodes["results"][0]["gpu_note"] is None
    gpus = api_owner.get("/api/gpus/", {"node_name": "gpunode"}).json()["results"]
    assert [g["queue"] for g in gpus] == ["measure.gpunode.gpu0", "measure.gpunode.gpu1"]
    assert all(g["served"] for g in gpus)

    resp = api_owner.post(f"/api/gpus/{gpus[0]['id']}/drain/")
    assert resp.status_code == 403 and resp.json()["code"] == "permission_denied"
    resp = api_staff.post(f"/api/gpus/{gpus[0]['id']}/drain/")
    assert resp.status_code == 200 and resp.json()["drained"] is True
    resp = api_staff.post(f"/api/nodes/{gpu_node.pk}/drain/")
    assert resp.status_code == 200 and resp.json()["drained"] is True
    assert api_staff.post(f"/api/nodes/{gpu_node.pk}/undrain/").json()["drained"] is False
    assert api_owner.post(f"/api/nodes/{gpu_node.pk}/drain/").status_code == 403


def test_gpuless_node_says_why(db, api_owner, settings, use_nvml, no_nvml):
    settings.NODE_NAME = "cpu-only"
    use_nvml(no_nvml)
    services.record_heartbeat()
    node = api_owner.get("/api/nodes/").json()["results"][0]
    assert node["gpu_count"] == 0 and node["nvml_available"] is False
    assert node["gpu_note"] == "no NVIDIA GPU found (pynvml: NVML Shared Library Not Found)"
    from tuning.engine.measuring.timer import host_llc_bytes

    assert node["cpu_llc_bytes"] == host_llc_bytes()  # the node's last-level cache, as sysfs gives it


def test_telemetry_filters_by_gpu_and_time_and_paginates(gpu_node, api_owner):
    g0, g1 = gpu_node.gpus.order_by("index")
    t0 = timezone.now() - dt.timedelta(hours=1)
    GpuTelemetry.objects.bulk_create(
        [GpuTelemetry(gpu=g, ts=t0 + dt.timedelta(minutes=i), util_pct=i, mem_used_mb=100)
         for i in range(30) for g in (g0, g1)])
    body = api_owner.get("/api/gpu-telemetry/", {"gpu": g0.pk, "page_size": 10}).json()
    assert body["count"] == 30 and len(body["results"]) == 10 and body["next"]
    assert body["results"][0]["util_pct"] == 29  # newest first
    since = (t0 + dt.timedelta(minutes=10)).isoformat()
    until = (t0 + dt.timedelta(minutes=19)).isoformat()
    body = api_owner.get("/api/gpu-telemetry/", {"gpu": g1.pk, "since": since, "until": until}).json()
    assert body["count"] == 10 and {r["gpu_index"] for r in body["results"]} == {1}
    assert api_owner.get("/api/gpu-telemetry/", {"node": "gpunode"}).json()["count"] == 60


def test_jobs_are_team_scoped(api_owner, api_other, model_a, model_b, predictor, gpu_node):
    resp = api_owner.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8, "duration_estimate_s": 60},
                          format="json")
    assert resp.status_code == 201, resp.json()
    mine = resp.json()
    assert mine["state"] == "pending" and mine["predicted_util_pct"] > 0 and mine["predictor"] == predictor.version
    (p,) = services.place_pending_jobs(policy="horus")
    detail = api_owner.get(f"/api/gpu-jobs/{mine['id']}/").json()
    assert detail["state"] == "placed" and detail["placement"]["queue"] == p.queue

    # Another team's job, placement: 404 and absent from lists.
    assert api_other.get(f"/api/gpu-jobs/{mine['id']}/").status_code == 404
    resp = api_other.post(f"/api/gpu-jobs/{mine['id']}/cancel/")
    assert resp.status_code == 404 and resp.json()["code"] == "not_found"
    assert api_other.get("/api/gpu-jobs/").json()["count"] == 0
    assert api_other.get(f"/api/placements/{p.pk}/").status_code == 404
    assert api_other.get("/api/placements/").json()["count"] == 0
    assert api_owner.get("/api/placements/", {"active": "true"}).json()["count"] == 1

    # ...and one cannot submit on another team's model.
    resp = api_other.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8}, format="json")
    assert resp.status_code == 400 and "model" in resp.json()["errors"]

    resp = api_owner.post(f"/api/gpu-jobs/{mine['id']}/cancel/")
    assert resp.status_code == 200 and resp.json()["state"] == "cancelled" and resp.json()["placement"] is None
    assert api_owner.post(f"/api/gpu-jobs/{mine['id']}/cancel/").status_code == 409


def test_viewer_reads_but_cannot_cancel(model_a, user_viewer):
    job = make_job(model_a)
    api = client_for(user_viewer)
    assert api.get(f"/api/gpu-jobs/{job.pk}/").status_code == 200
    assert api.post(f"/api/gpu-jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.state == "pending"


def test_place_action_is_staff_only(gpu_node, model_a, api_owner, api_staff):
    make_job(model_a)
    assert api_owner.post("/api/gpu-jobs/place/", {"policy": "horus"}, format="json").status_code == 403
    resp = api_staff.post("/api/gpu-jobs/place/", {"policy": "gandiva"}, format="json")
    assert resp.status_code == 200 and len(resp.json()) == 1 and resp.json()[0]["policy"] == "gandiva"
    assert GpuJob.objects.get().state == "placed"


def test_profiles_show_source_and_synthetic_note(db, api_owner):
    services.load_seed_profiles()
    body = api_owner.get("/api/gpu-profiles/", {"model_name": "resnet18", "gpu_model": "V100"}).json()
    assert body["count"] > 0
    row = body["results"][0]
    assert row["source"] == "synthetic-roofline-v1" and row["synthetic"] is True and "no GPU" in row["note"]
    assert api_owner.get("/api/gpu-profiles/", {"synthetic": "false"}).json()["count"] == 0


def test_predictor_training_is_staff_only(db, api_owner, api_staff, celery_outbox, django_capture_on_commit_callbacks):
    assert api_owner.post("/api/predictors/train/", {}, format="json").status_code == 403
    with django_capture_on_commit_callbacks(execute=True):
        resp = api_staff.post("/api/predictors/train/", {"k_folds": 2}, format="json")
    assert resp.status_code == 202, resp.json()
    assert resp.json()["state"] == "queued" and celery_outbox[0].task == "scheduling.train_predictor"
    with mock.patch("scheduling.horus.predictor.DEFAULT_XGB_PARAMS", {"n_estimators": 10, "max_depth": 3}):
        tasks.train_predictor.run(**celery_outbox[0].kwargs)  # what the worker runs
    v = api_owner.get("/api/predictors/").json()["results"][0]
    assert v["active"] and v["version"] == 1 and v["util_rmsle"] > 0 and v["mem_rmsle"] > 0
    assert v["metrics"]["k_folds"] == 2 and v["sources"] == ["synthetic-roofline-v1"] and v["n_records"] > 100


def test_simulations_are_team_scoped_and_run_by_a_task(api_owner, api_other, team_a, _no_celery,
                                                        django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        resp = api_owner.post("/api/simulations/", {
            "team": team_a.pk, "trace": "philly", "policies": ["horus", "fifo_exclusive"], "seed": 3,
            "parameters": {"jobs": 60, "start": 2000, "gpus": 8, "predictions": "oracle",
                           "telemetry_delay_s": 0, "horus_lookahead": 1}}, format="json")
    assert resp.status_code == 201, resp.json()
    sim = resp.json()
    assert sim["status"] == "queued" and sim["parameters"]["gpus"] == 8 and sim["parameters"]["method"] == "replay"
    # parameters the documented shape does not list reach the run too (they were once dropped unseen)
    assert sim["parameters"]["telemetry_delay_s"] == 0 and sim["parameters"]["horus_lookahead"] == 1
    _no_celery.assert_called_once_with(sim["id"])

    run = services.execute_simulation(run_id=sim["id"])  # what the task does
    assert run.status == "succeeded", run.error
    detail = api_owner.get(f"/api/simulations/{sim['id']}/").json()
    assert [r["policy"] for r in detail["table"]] == ["horus", "fifo_exclusive"]
    assert detail["results"]["cluster"]["gpus"] == 8 and detail["results"]["trace"]["jobs_used"] == 60
    assert "results" not in api_owner.get("/api/simulations/").json()["results"][0]

    assert api_other.get(f"/api/simulations/{sim['id']}/").status_code == 404
    assert api_other.get("/api/simulations/").json()["count"] == 0
    resp = api_other.post("/api/simulations/", {"team": team_a.pk, "trace": "philly"}, format="json")
    assert resp.status_code == 400 and "team" in resp.json()["errors"]


def test_simulation_parameters_are_validated(api_owner, team_a):
    bad = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": "philly",
                                               "parameters": {"scale": 3}}, format="json")
    assert bad.status_code == 400 and "scale" in bad.json()["detail"]
    bad = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": "philly", "policies": ["nope"]},
                         format="json")
    assert bad.status_code == 400 and "nope" in bad.json()["detail"]
    bad = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": "nowhere"}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"] == {"trace": [bad.json()["detail"]]}
    for delay in (-1, 1e9, "soon", "nan"):  # the telemetry lag: a number of seconds within a day
        bad = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": "philly",
                                                   "parameters": {"telemetry_delay_s": delay}}, format="json")
        assert bad.status_code == 400 and "telemetry_delay_s" in bad.json()["detail"], delay
    for flag in ("maybe", 2, [True]):  # a flag is true/false (bool("maybe") would have been True)
        bad = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": "philly",
                                                   "parameters": {"usage_fgd_gang_moves": flag}}, format="json")
        assert bad.status_code == 400 and "usage_fgd_gang_moves" in bad.json()["detail"], flag
    for jobs in (2.9, "2.5", True):  # a count is a whole number
        bad = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": "philly",
                                                   "parameters": {"jobs": jobs}}, format="json")
        assert bad.status_code == 400 and "jobs" in bad.json()["detail"], jobs
    assert not SimulationRun.objects.exists()


def test_the_gang_move_ablation_reaches_usage_fgd():
    from scheduling.horus.experiments import ExperimentError, ExperimentParams, policy_options

    for given, want in ((False, False), ("false", False), ("0", False), (True, True), ("on", True)):
        p = ExperimentParams.from_dict({"usage_fgd_gang_moves": given})
        assert policy_options("usage_fgd", p) == {"move_gangs": want}
    assert ExperimentParams().usage_fgd_gang_moves and "move_gangs" not in policy_options("horus", ExperimentParams())
    assert ExperimentParams.from_dict({"jobs": "300", "gpus": 16.0, "start": "5.0"}).jobs == 300  # whole numbers pass
    for jobs in (2.9, "2.5", True):  # the engine's own parse (CLI, stored experiments): int(2.9) ran 2 jobs
        with pytest.raises(ExperimentError, match="jobs must be a whole number"):
            ExperimentParams.from_dict({"jobs": jobs})


def _upload(api, team, text, name="mytrace", filename="jobs.csv"):
    return api.post("/api/traces/", {"team": team.pk, "name": name,
                                     "file": SimpleUploadedFile(filename, text.encode())}, format="multipart")


def test_malformed_trace_row_is_refused_with_line_and_column_and_nothing_stored(api_owner, team_a, settings):
    text = GOOD_PHILLY.replace("2017-10-09 06:03:00,300,1", "2017-10-09 06:03:00,abc,1")
    resp = _upload(api_owner, team_a, text)
    assert resp.status_code == 400
    body = resp.json()
    assert body["code"] == "trace_malformed" and body["line"] == 4 and body["column"] == "duration"
    assert "line 4" in body["detail"] and "'duration'" in body["detail"] and "abc" in body["detail"]
    assert body["errors"]["file"] == [body["detail"]]
    assert not TraceUpload.objects.exists()
    assert not list((Path(settings.MEDIA_ROOT) / "traces").rglob("*"))

    resp = _upload(api_owner, team_a, "timestamp,duration\n2017-10-09 06:00:00,5\n")
    assert resp.status_code == 400 and "unknown trace format" in resp.json()["detail"]
    resp = _upload(api_owner, team_a, "sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,2,P100\n")
    assert resp.status_code == 400 and "describes a cluster, not jobs" in resp.json()["detail"]
    assert not TraceUpload.objects.exists()


def test_uploaded_trace_is_team_scoped_and_simulated(api_owner, api_other, team_a, team_b):
    resp = _upload(api_owner, team_a, GOOD_PHILLY)
    assert resp.status_code == 201, resp.json()
    trace = resp.json()
    assert trace["kind"] == "philly" and trace["n_jobs"] == 4 and trace["summary"]["num_gpus"] == {"1": 2, "2": 1,
                                                                                                   "4": 1}
    assert api_other.get(f"/api/traces/{trace['id']}/").status_code == 404
    assert api_other.delete(f"/api/traces/{trace['id']}/").status_code == 404
    # Another team cannot simulate on it either.
    resp = api_other.post("/api/simulations/", {"team": team_b.pk, "trace": str(trace["id"])}, format="json")
    assert resp.status_code == 400 and resp.json()["errors"] == {"trace": [resp.json()["detail"]]}

    resp = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": str(trace["id"]), "policies": ["all"],
                                                "parameters": {"gpus": 4, "predictions": "oracle"}}, format="json")
    assert resp.status_code == 201, resp.json()
    run = services.execute_simulation(run_id=resp.json()["id"])
    assert run.status == "succeeded", run.error
    assert run.trace == "upload" and run.results["trace"]["jobs_used"] == 4
    assert len(run.results["table"]) == len(run.policies) >= 7
    assert _upload(api_owner, team_a, GOOD_PHILLY).status_code == 409  # same name


def test_schema_lists_scheduling_endpoints(client, django_user_model):
    # the schema needs a login (issue 11: API_DOCS_PUBLIC=0 by default)
    client.force_login(django_user_model.objects.create_user(username="schema-reader", password="pw"))
    import yaml

    paths = set(yaml.safe_load(client.get("/api/schema/").content)["paths"])
    for p in ["/api/nodes/", "/api/gpus/{id}/drain/", "/api/gpu-telemetry/", "/api/gpu-jobs/",
              "/api/gpu-jobs/{id}/cancel/", "/api/placements/", "/api/gpu-profiles/", "/api/predictors/train/",
              "/api/simulations/", "/api/traces/"]:
        assert p in paths, p


def test_admin_pages_render(client, django_user_model, gpu_node, model_a):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    make_job(model_a)
    services.load_seed_profiles()
    for url in ["/admin/scheduling/node/", f"/admin/scheduling/node/{gpu_node.pk}/change/", "/admin/scheduling/gpu/",
                "/admin/scheduling/gpujob/", "/admin/scheduling/placement/", "/admin/scheduling/gpuprofile/",
                "/admin/scheduling/predictorversion/", "/admin/scheduling/simulationrun/",
                "/admin/scheduling/traceupload/", "/admin/scheduling/gputelemetry/"]:
        assert client.get(url).status_code == 200, url
    html = client.get("/admin/scheduling/gpuprofile/").content.decode()
    assert "synthetic-roofline-v1" in html
    resp = client.post("/admin/scheduling/gpu/", {"action": "drain_gpus",
                                                  "_selected_action": [g.pk for g in gpu_node.gpus.all()]})
    assert resp.status_code == 302 and set(gpu_node.gpus.values_list("drained", flat=True)) == {True}
    assert Placement.objects.count() == 0
