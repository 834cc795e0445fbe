"""GPU-hours per month: submissions that would exceed it are refused; usage comes from placements."""
from __future__ import annotations

import datetime as dt
from unittest import mock

import pytest
from django.utils import timezone

from core.exceptions import QuotaExceeded
from core.models import Quota
from core.selectors import month_start, quota_usage
from scheduling import services, tasks
from scheduling.models import GpuJob, Placement

from .fakes import make_job

# dialect-sensitive (re-run on SQLite by scripts/test.sh): GPU-hours summed over date ranges
pytestmark = pytest.mark.dialect


@pytest.fixture(autouse=True)
def _no_celery():
    with mock.patch.object(tasks.place_pending, "delay"), mock.patch.object(tasks.run_job, "apply_async"):
        yield


def test_submission_over_the_gpu_hour_quota_is_refused(model_a, user_owner, team_a, predictor):
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=1.0)
    services.submit_job(actor=user_owner, model=model_a, batch_size=8, duration_estimate_s=2400)  # 0.67 h reserved
    with pytest.raises(QuotaExceeded) as exc:
        services.submit_job(actor=user_owner, model=model_a, batch_size=8, duration_estimate_s=1800)  # 0.5 h more
    assert exc.value.quota == "gpu_hours_per_month"
    assert "GPU hours per month" in exc.value.message and "0.333 h left of 1 h" in exc.value.message
    assert GpuJob.objects.count() == 1
    services.submit_job(actor=user_owner, model=model_a, batch_size=8, duration_estimate_s=1200)  # exactly fits


def test_api_refusal_names_the_quota(api_owner, model_a, team_a, predictor):
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=0.01)
    resp = api_owner.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 4, "duration_estimate_s": 600},
                          format="json")
    assert resp.status_code == 429, resp.json()
    body = resp.json()
    assert body["code"] == "quota_exceeded" and body["quota"] == "gpu_hours_per_month"
    assert not GpuJob.objects.exists()


def test_usage_provider_counts_gpu_hours_from_placements(model_a, team_a, gpu_node):
    start, now = month_start(), timezone.now()
    g0 = gpu_node.gpus.get(index=0)
    last_month = make_job(model_a, state="finished")  # half of it last month: that half is not counted
    Placement.objects.create(job=last_month, gpu=g0, policy="horus", queue=g0.queue,
                             placed_at=start - dt.timedelta(minutes=30), released_at=start + dt.timedelta(minutes=30))
    done = make_job(model_a, state="finished")
    Placement.objects.create(job=done, gpu=g0, policy="horus", queue=g0.queue,
                             placed_at=start + dt.timedelta(minutes=1), released_at=start + dt.timedelta(minutes=16))
    running = make_job(model_a, state="running")
    placed = max(start, now - dt.timedelta(minutes=15))
    Placement.objects.create(job=running, gpu=g0, policy="horus", queue=g0.queue, placed_at=placed)
    expected = 0.5 + 0.25 + (now - placed).total_seconds() / 3600
    usage = quota_usage(team_a.pk)
    assert usage.gpu_hours_this_month == pytest.approx(expected, abs=0.01)
    assert usage.as_dict()["gpu_hours_this_month"] == pytest.approx(expected, abs=0.01)


def test_finished_work_counts_against_the_quota(model_a, user_owner, team_a, gpu_node, predictor):
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=2.0)
    start = month_start()
    g0 = gpu_node.gpus.get(index=0)
    old = make_job(model_a, state="finished")
    Placement.objects.create(job=old, gpu=g0, policy="horus", queue=g0.queue,
                             placed_at=start, released_at=start + dt.timedelta(hours=1, minutes=45))
    with pytest.raises(QuotaExceeded):
        services.submit_job(actor=user_owner, model=model_a, batch_size=8, duration_estimate_s=1800)


def test_declared_duration_is_bounded_by_a_setting(api_owner, model_a, team_a, predictor, settings):
    """duration_estimate_s is what the quota reserves and when the job is stopped: it has a ceiling."""
    too_long = {"model": model_a.pk, "batch_size": 4, "duration_estimate_s": 2 * 24 * 3600}  # default cap 24 h
    resp = api_owner.post("/api/gpu-jobs/", too_long, format="json")
    assert resp.status_code == 400, resp.json()
    assert "duration_estimate_s" in resp.json()["errors"] and "86400 s" in resp.json()["detail"]
    settings.SCHEDULING_MAX_JOB_DURATION_S = 600
    resp = api_owner.post("/api/gpu-jobs/", {**too_long, "duration_estimate_s": 601}, format="json")
    assert resp.status_code == 400 and "from 1 s to 600 s" in resp.json()["detail"]
    assert not GpuJob.objects.exists()
    resp = api_owner.post("/api/gpu-jobs/", {**too_long, "duration_estimate_s": 600}, format="json")
    assert resp.status_code == 201, resp.json()


def _finished_placement(model, gpu, *, hours: float):
    job = make_job(model, state="finished")
    start = max(month_start(), timezone.now() - dt.timedelta(hours=hours))
    Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue, placed_at=start,
                             released_at=start + dt.timedelta(hours=hours))
    return job


def test_quota_is_checked_again_at_placement_with_the_gpu_time_used(model_a, team_a, gpu_node):
    """A job admitted when the team had room is not placed once the GPU time already used leaves none:
    it fails naming the quota, with no placement (it would otherwise run past the quota)."""
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=1.0)
    job = make_job(model_a, estimate=1800)  # admitted: 0.5 h of 1 h
    _finished_placement(model_a, gpu_node.gpus.get(index=0), hours=0.75)  # used since: 0.75 h
    assert services.place_pending_jobs(policy="horus") == []
    job.refresh_from_db()
    assert job.state == "failed" and job.finished_at is not None
    assert "Quota 'GPU hours per month'" in job.error and "0.750 h of 1 h already used" in job.error
    assert not Placement.objects.filter(job=job).exists()


def test_a_job_waits_at_placement_while_running_jobs_hold_the_rest_of_the_quota(model_a, team_a, gpu_node):
    """Running jobs count as the GPU time they used so far plus what they declared and have not used yet;
    a job that fits only once they end stays pending and is placed when they do."""
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=1.0)
    g0 = gpu_node.gpus.get(index=0)
    started = timezone.now() - dt.timedelta(minutes=6)
    running = make_job(model_a, state="running", estimate=2400, started_at=started, placed_at=started)  # 0.1 h used
    Placement.objects.create(job=running, gpu=g0, policy="horus", queue=g0.queue, placed_at=started)
    waiting = make_job(model_a, estimate=1800)  # 0.1 used + 0.567 reserved + 0.5 > 1 h; 0.1 + 0.5 fits
    assert services.place_pending_jobs(policy="horus") == []
    waiting.refresh_from_db()
    assert waiting.state == "pending" and not waiting.error
    services.finish_job(job_id=running.pk, result={})
    (placement,) = services.place_pending_jobs(policy="horus")
    assert placement.job == waiting
