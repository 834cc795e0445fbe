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

from .conftest import make_job


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
