"""The GPU-job and simulation forms: feature tests next to their attack tests (other team, viewer,
anonymous, hostile input -> a readable refusal and nothing half-written)."""
from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from core.models import Quota
from scheduling.models import GpuJob, SimulationRun, TraceUpload
from tests.factories import PredictorVersionFactory
from tests.helpers import PHILLY_CSV

pytestmark = pytest.mark.django_db


@pytest.fixture
def predictor(db):
    from scheduling import services

    services.load_seed_profiles()
    return PredictorVersionFactory(active=True)


@pytest.fixture
def viewer_client(user_viewer):
    from django.test import Client

    viewer = Client()  # not the `client` fixture: owner_client is that one
    viewer.force_login(user_viewer)
    return viewer


# --- GPU jobs --------------------------------------------------------------------------------------


def test_preview_predicts_and_names_the_policy(owner_client, model_a, predictor, settings):
    settings.SCHEDULING_POLICY = "horus"
    body = owner_client.get(f"/cluster/jobs/preview/?model={model_a.pk}&batch_size=16").json()
    assert body["policy"] == "horus" and body["predictor_version"] == predictor.version
    assert 0 < body["util_pct"] <= 100 and body["mem_mb"] > 0 and body["batch_size"] == 16
    bigger = owner_client.get(f"/cluster/jobs/preview/?model={model_a.pk}&batch_size=256").json()
    assert bigger["mem_mb"] >= body["mem_mb"]  # the prediction follows the batch size


@pytest.mark.parametrize("query, field", [
    ("model={m}&batch_size=0", "batch_size"), ("model={m}&batch_size=99999", "batch_size"),
    ("model={m}&batch_size=-1", "batch_size"), ("model={m}&batch_size=1e3", "batch_size"),
    ("model={m}&batch_size=", "batch_size"), ("model=abc&batch_size=8", "model"),
    ("model=' OR 1=1 --&batch_size=8", "model"), ("batch_size=8", "model"),
])
def test_preview_refuses_hostile_input_with_a_message(owner_client, model_a, predictor, query, field):
    resp = owner_client.get("/cluster/jobs/preview/?" + query.format(m=model_a.pk))
    assert resp.status_code == 400 and field in resp.json()["errors"] and resp.json()["detail"]
    assert not GpuJob.objects.exists()


def test_preview_of_another_teams_or_a_viewers_model_is_404(client, owner_client, viewer_client, model_a, model_b,
                                                            predictor):
    assert owner_client.get(f"/cluster/jobs/preview/?model={model_b.pk}&batch_size=8").status_code == 404
    assert viewer_client.get(f"/cluster/jobs/preview/?model={model_a.pk}&batch_size=8").status_code == 404
    client.logout()
    assert client.get(f"/cluster/jobs/preview/?model={model_a.pk}&batch_size=8").status_code == 302


def test_submit_a_job_through_the_form(owner_client, api_owner, model_a, predictor, no_broker):
    html = owner_client.get("/cluster/jobs/new/").content.decode()
    assert 'id="job-form"' in html and "cnn-a" in html and 'data-preview="policy"' in html
    resp = owner_client.post("/cluster/jobs/new/", {"model": model_a.pk, "batch_size": 8, "iterations": 50,
                                                    "duration_estimate_s": 120, "runtime": "auto"})
    job = GpuJob.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/cluster/jobs/{job.pk}/"
    api = api_owner.get(f"/api/gpu-jobs/{job.pk}/").json()  # what the API says the form made
    assert api["batch_size"] == 8 and api["iterations"] == 50 and api["duration_estimate_s"] == 120
    assert api["predicted_util_pct"] is not None and api["state"] == "pending"
    detail = owner_client.get(f"/cluster/jobs/{job.pk}/").content.decode()
    assert "Not placed yet" in detail and 'id="job-cancel"' in detail and "fig-telemetry" in detail


def test_job_form_refusals_store_nothing(owner_client, viewer_client, team_a, model_a, model_b, predictor):
    bad = owner_client.post("/cluster/jobs/new/", {"model": model_a.pk, "batch_size": 0, "iterations": 1,
                                                   "runtime": "auto"})
    assert bad.status_code == 200 and "batch_size" in bad.context["form"].errors
    foreign = owner_client.post("/cluster/jobs/new/", {"model": model_b.pk, "batch_size": 8, "iterations": 1,
                                                       "runtime": "auto"})
    assert "model" in foreign.context["form"].errors
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=0.001)
    over = owner_client.post("/cluster/jobs/new/", {"model": model_a.pk, "batch_size": 8, "iterations": 1,
                                                    "duration_estimate_s": 3600, "runtime": "auto"})
    assert over.status_code == 200 and "GPU hours per month" in over.content.decode()
    viewer = viewer_client.post("/cluster/jobs/new/", {"model": model_a.pk, "batch_size": 8, "iterations": 1,
                                                       "runtime": "auto"})
    assert viewer.status_code == 200 and 'id="no-models"' in viewer.content.decode()
    assert not GpuJob.objects.exists()


def test_job_detail_shows_placement_history_and_telemetry(owner_client, client, user_other, team_b, model_a):
    from django.utils import timezone

    from tests.factories import GpuJobFactory, GpuTelemetryFactory, NodeFactory, PlacementFactory

    gpu = NodeFactory(name="node-9", gpus=1).gpus.get()
    job = GpuJobFactory(model=model_a, state=GpuJob.State.RUNNING, policy="horus")
    placed = timezone.now() - timezone.timedelta(minutes=5)
    PlacementFactory(job=job, gpu=gpu, placed_at=placed, policy="horus", score=0.42)
    for k in range(3):
        GpuTelemetryFactory(gpu=gpu, ts=placed + timezone.timedelta(minutes=k + 1), util_pct=30 + k)
    resp = owner_client.get(f"/cluster/jobs/{job.pk}/")
    html = resp.content.decode()
    assert "node-9/gpu0" in html and "0.420" in html and "active" in html
    telemetry = resp.context["figures"]["telemetry"]
    assert [t["y"] for t in telemetry["data"]] == [[30, 31, 32]]
    client.force_login(user_other)
    assert client.get(f"/cluster/jobs/{job.pk}/").status_code == 404


# --- simulations ---------------------------------------------------------------------------------------


def _sim_form(team, **extra):
    return {"team": team.pk, "trace": "philly", "policies": ["horus", "fifo_exclusive"], "seeds": "0", "jobs": 40,
            "gpus": 8, **extra}


def test_start_simulations_through_the_form_like_the_api(owner_client, api_owner, team_a, no_broker):
    Quota.objects.filter(team=team_a).update(max_concurrent_simulations=5)
    resp = owner_client.post("/simulations/new/", _sim_form(team_a, seeds="3, 4", predictor_error=0.5,
                                                            method="replay"))
    sims = list(SimulationRun.objects.order_by("pk"))
    assert resp.status_code == 302 and resp["Location"] == f"/simulations/{sims[0].pk}/"
    assert [s.seed for s in sims] == [3, 4] and all(s.policies == ["horus", "fifo_exclusive"] for s in sims)
    api = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": "philly", "seed": 3,
                                               "policies": ["horus", "fifo_exclusive"],
                                               "parameters": {"jobs": 40, "gpus": 8, "predictor_error": 0.5,
                                                              "method": "replay"}}, format="json").json()
    assert api["parameters"] == sims[0].parameters  # one service, one validation, same stored parameters
    progress = owner_client.get(f"/simulations/{sims[0].pk}/progress/")
    assert progress.json()["status"] == "queued" and not progress.json()["terminal"]
    assert owner_client.get(f"/simulations/{sims[0].pk}/progress/",
                            HTTP_IF_NONE_MATCH=progress["ETag"]).status_code == 304
    page = owner_client.get(f"/simulations/{sims[0].pk}/").content.decode()
    assert 'id="sim-progress"' in page


@pytest.mark.parametrize("extra, field", [
    ({"seeds": "1,x"}, "seeds"), ({"seeds": "1,2,3,4,5,6"}, "seeds"), ({"policies": ["nope"]}, "policies"),
    ({"trace": "../../etc/passwd"}, "trace"), ({"gpus": 0}, "gpus"), ({"predictor_error": -1}, "predictor_error"),
])
def test_simulation_form_refuses_bad_input_and_stores_nothing(owner_client, team_a, extra, field):
    resp = owner_client.post("/simulations/new/", _sim_form(team_a, **extra))
    assert resp.status_code == 200 and field in resp.context["form"].errors
    assert not SimulationRun.objects.exists()


def test_a_refused_seed_queues_none_of_them(owner_client, team_a, no_broker):
    Quota.objects.filter(team=team_a).update(max_concurrent_simulations=1)
    resp = owner_client.post("/simulations/new/", _sim_form(team_a, seeds="0,1"))
    assert resp.status_code == 200 and "concurrent simulations" in resp.content.decode()
    assert not SimulationRun.objects.exists() and not no_broker


def test_viewer_and_other_team_cannot_start_one(viewer_client, client, user_other, team_b, team_a):
    assert 'id="no-teams"' in viewer_client.post("/simulations/new/", _sim_form(team_a)).content.decode()
    client.force_login(user_other)
    resp = client.post("/simulations/new/", _sim_form(team_a))
    assert "team" in resp.context["form"].errors
    assert not SimulationRun.objects.exists()


def _upload(client, team, name, content, filename="t.csv"):
    return client.post("/simulations/new/?upload=1", {"team": team.pk, "name": name,
                                                      "file": SimpleUploadedFile(filename, content)})


def test_upload_a_trace_then_simulate_it(owner_client, team_a, no_broker):
    resp = _upload(owner_client, team_a, "mine", PHILLY_CSV.encode())
    trace = TraceUpload.objects.get()
    assert resp.status_code == 302 and trace.n_jobs == 4 and trace.kind == "philly"
    assert "mine (uploaded" in owner_client.get("/simulations/new/").content.decode()
    owner_client.post("/simulations/new/", _sim_form(team_a, trace=str(trace.pk), jobs=4))
    assert SimulationRun.objects.get().trace_upload == trace


@pytest.mark.parametrize("content, filename, says", [
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "x.png", ""),
    (b"timestamp,duration,num_gpus\n2017-10-09 06:00:00,abc,1\n", "bad.csv", "duration"),
    (b"=cmd|' /C calc'!A0,duration,num_gpus\n1,2,3\n", "formula.csv", ""),
    (b"timestamp,duration,num_gpus\n2017-10-09 06:00:00,600,-4\n", "neg.csv", "num_gpus"),
    (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03broken", "cut.csv.gz", "gzip"),
])
def test_hostile_trace_uploads_get_a_readable_error_and_store_nothing(owner_client, team_a, content, filename,
                                                                      says):
    resp = _upload(owner_client, team_a, "hostile", content, filename)
    errors = resp.context["upload_form"].errors
    assert resp.status_code == 200 and "file" in errors and says in " ".join(errors["file"])
    assert not TraceUpload.objects.exists()


def test_oversize_trace_is_refused_before_parsing(owner_client, team_a, settings):
    settings.SCHEDULING_MAX_TRACE_BYTES = 200
    resp = _upload(owner_client, team_a, "big", PHILLY_CSV.encode() * 10)
    assert resp.status_code == 200 and "limit" in " ".join(resp.context["upload_form"].errors["file"])
    assert not TraceUpload.objects.exists()


def test_upload_by_a_viewer_or_into_another_team_stores_nothing(viewer_client, client, user_other, team_b, team_a):
    _upload(viewer_client, team_a, "v", PHILLY_CSV.encode())
    client.force_login(user_other)
    resp = _upload(client, team_a, "o", PHILLY_CSV.encode())
    assert "team" in resp.context["upload_form"].errors
    assert not TraceUpload.objects.exists()


def test_progress_of_another_teams_simulation_is_404(client, user_other, team_b, team_a):
    sim = SimulationRun.objects.create(team=team_a, trace="philly", policies=["horus"])
    client.force_login(user_other)
    assert client.get(f"/simulations/{sim.pk}/progress/").status_code == 404


def test_preview_never_trains_a_predictor(owner_client, model_a, celery_outbox):
    from django_celery_results.models import TaskResult

    from scheduling.models import PredictorVersion

    body = owner_client.get(f"/cluster/jobs/preview/?model={model_a.pk}&batch_size=8").json()
    assert body["util_pct"] > 0 and body["mem_mb"] > 0 and body["predictor_version"] is None  # the analytic estimate
    assert "analytic estimate" in body["note"] and body["policy"]
    assert not PredictorVersion.objects.exists() and not TaskResult.objects.exists() and not celery_outbox


BIG = "9" * 30  # past every integer column


def test_hostile_ids_and_numbers_never_5xx(owner_client, team_a, model_a, predictor, no_broker):
    for url in (f"/cluster/jobs/preview/?model={BIG}&batch_size=8", f"/cluster/jobs/{BIG}/",
                f"/simulations/{BIG}/progress/", f"/cluster/jobs/preview/?model={model_a.pk}&batch_size={BIG}"):
        assert owner_client.get(url).status_code in (400, 404), url
    assert owner_client.post(f"/cluster/jobs/{BIG}/cancel/").status_code == 404
    resp = owner_client.post("/cluster/jobs/new/", {"model": BIG, "batch_size": BIG, "iterations": BIG,
                                                    "duration_estimate_s": "1e400", "runtime": "auto"})
    assert resp.status_code == 200 and not GpuJob.objects.exists()
    resp = owner_client.post("/simulations/new/", {**_sim_form(team_a, gpus=BIG, jobs=BIG, scale="1e400"),
                                                   "team": BIG})
    assert resp.status_code == 200 and not SimulationRun.objects.exists()
    resp = owner_client.post("/simulations/new/", _sim_form(team_a, gpus=10**6, jobs=10**7))
    assert resp.status_code == 200 and resp.context["form"].errors and not SimulationRun.objects.exists()


def test_the_dashboard_form_submits_a_two_gpu_training_job(owner_client, model_a, predictor):
    html = owner_client.get("/cluster/jobs/new/").content.decode()
    assert 'name="kind"' in html and 'name="optimizer"' in html and 'name="num_gpus"' in html
    resp = owner_client.post("/cluster/jobs/new/", {"model": model_a.pk, "batch_size": 4, "iterations": 20,
                                                    "runtime": "auto", "kind": "train", "optimizer": "sgd",
                                                    "learning_rate": "0.001", "num_gpus": 2})
    job = GpuJob.objects.get()
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert (job.kind, job.optimizer, job.learning_rate, job.num_gpus) == ("train", "sgd", 0.001, 2)
    detail = owner_client.get(f"/cluster/jobs/{job.pk}/").content.decode()
    assert "training steps (sgd)" in detail and "2 GPUs" in detail


def test_the_preview_of_a_training_job_shows_its_training_memory(owner_client, model_a, predictor):
    from scheduling.services.jobs import TRAIN_MEMORY_FACTOR

    base = owner_client.get(f"/cluster/jobs/preview/?model={model_a.pk}&batch_size=8").json()
    train = owner_client.get(f"/cluster/jobs/preview/?model={model_a.pk}&batch_size=8&kind=train").json()
    assert train["kind"] == "train" and train["util_pct"] == base["util_pct"]
    assert train["mem_mb"] == round(base["mem_mb"] * TRAIN_MEMORY_FACTOR, 1)
    bad = owner_client.get(f"/cluster/jobs/preview/?model={model_a.pk}&batch_size=8&kind=finetune")
    assert bad.status_code == 400 and "kind" in bad.json()["errors"]


def test_the_job_page_shows_its_replacements_and_training_loss(owner_client, model_a):
    job = GpuJob.objects.create(
        team_id=model_a.team_id, model=model_a, batch_size=4, kind="train", iterations=10, duration_estimate_s=60,
        state="finished", result={"losses": [1.5, 0.5], "loss_first": 1.5, "loss_last": 0.5, "steps": 2,
                                  "optimizer": "adam", "learning_rate": 0.0001},
        replacements=[{"status": "done", "at": "2026-01-01T00:00:00+00:00", "reason": "oom", "measured_mem_mb": 4100.0,
                       "mem_share_mb": 2512.0, "predicted_util_pct_before": 30.0, "predicted_mem_mb_before": 2000.0,
                       "predicted_util_pct_after": 30.0, "predicted_mem_mb_after": 4100.0},
                      {"status": "done", "at": "2026-01-01T00:05:00+00:00", "reason": "interference",
                       "rule": "horus_migrate", "gpu_measured_util_pct": 120.0, "gpu_predicted_util_pct": 90.0,
                       "bound_pct": 105.0, "job_measured_util_pct": 20.0, "job_predicted_util_pct": 30.0,
                       "predicted_util_pct_before": 30.0, "predicted_mem_mb_before": 4100.0,
                       "predicted_util_pct_after": 20.0, "predicted_mem_mb_after": 900.0}])
    html = owner_client.get(f"/cluster/jobs/{job.pk}/").content.decode()
    assert 'id="replacements-table"' in html and "over its memory share" in html and "4100 MB" in html
    assert "interference (horus_migrate)" in html and "GPU at 120.0 % measured (90.0 % predicted)" in html
    assert 'id="training-loss"' in html and "1.5000 at the first step" in html and "0.5000 at step 2" in html
