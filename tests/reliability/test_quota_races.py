"""Many concurrent starts against the last unit of a quota never over-allocate (PostgreSQL row locks).

tests/tuning/test_runs_api.py::test_concurrent_starts_never_over_allocate_the_last_run races the
concurrent-run quota; here: the monthly tuning-trial quota and the monthly GPU-hour quota, 12 threads
each, through the API (each thread its own client and database connection), released together by a
barrier.
"""
from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from core import services as core_services
from core.models import Quota
from scheduling import selectors
from scheduling.models import GpuJob
from tuning.models import TuningRun

# dialect-sensitive (re-run on SQLite by scripts/test.sh): row locks under concurrent starts
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.dialect]

THREADS = 12


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the row-locking race is exercised on PostgreSQL (pass 1 of make test)")


@pytest.fixture
def no_sends(celery_outbox):
    """The committed runs and jobs send their Celery messages to the outbox, not to a broker."""
    return celery_outbox


def race(user, post) -> list[tuple[int, dict]]:
    """Run `post(client)` in THREADS threads released at once; (status, body) of each."""
    key = core_services.create_api_token(user=user, name="race").key
    barrier, results, lock = threading.Barrier(THREADS), [], threading.Lock()

    def attempt():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        try:
            barrier.wait(timeout=30)
            resp = post(client)
            with lock:
                results.append((resp.status_code, resp.json()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == THREADS, results
    return results


def _outcomes(results, quota_name):
    ok = [b for s, b in results if s == 201]
    refused = [b for s, b in results if s == 429]
    assert len(ok) + len(refused) == THREADS, [s for s, _ in results]
    assert all(b["quota"] == quota_name for b in refused), refused
    return ok, refused


def test_monthly_trials_race_for_the_last_units(model_a, user_owner, team_a, no_sends):
    from tuning import services

    Quota.objects.filter(team=team_a).update(max_concurrent_runs=100, tuning_trials_per_month=100,
                                             energy_kwh_per_month=1000)
    services.start_run(actor=user_owner, model=model_a, max_trials=92, enqueue=False)  # 8 trials left
    results = race(user_owner, lambda c: c.post("/api/runs/", {"model": model_a.pk, "max_trials": 8}, format="json"))
    ok, refused = _outcomes(results, "tuning_trials_per_month")
    assert len(ok) == 1 and len(refused) == THREADS - 1
    assert services.trials_reserved(team_a.pk) == 100  # exactly the quota, never more
    assert TuningRun.objects.filter(team=team_a).count() == 2


def test_monthly_trials_race_many_winners(model_a, user_owner, team_a, no_sends):
    """Room for 5 of 12: exactly 5 get in, whatever the interleaving."""
    from tuning import services

    Quota.objects.filter(team=team_a).update(max_concurrent_runs=100, tuning_trials_per_month=50,
                                             energy_kwh_per_month=1000)
    results = race(user_owner, lambda c: c.post("/api/runs/", {"model": model_a.pk, "max_trials": 10}, format="json"))
    ok, _ = _outcomes(results, "tuning_trials_per_month")
    assert len(ok) == 5 and services.trials_reserved(team_a.pk) == 50


def test_gpu_hours_race_for_the_last_slot(model_a, user_owner, team_a, no_sends):
    from scheduling import services

    services.train_predictor(actor=None, k_folds=2, xgb_params={"n_estimators": 10})
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=1.0)
    services.submit_job(actor=user_owner, model=model_a, batch_size=8, duration_estimate_s=3000.0,
                        place=False)  # 50 of the 60 GPU-minutes reserved
    results = race(user_owner, lambda c: c.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8,
                                                                   "duration_estimate_s": 600}, format="json"))
    ok, refused = _outcomes(results, "gpu_hours_per_month")
    assert len(ok) == 1 and len(refused) == THREADS - 1
    assert selectors.gpu_hours_committed(team_a.pk) <= 1.0 + 1e-9
    assert GpuJob.objects.filter(team=team_a).count() == 2


def test_gpu_hours_race_many_winners(model_a, user_owner, team_a, no_sends):
    from scheduling import services

    services.train_predictor(actor=None, k_folds=2, xgb_params={"n_estimators": 10})
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=1.0)
    results = race(user_owner, lambda c: c.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8,
                                                                   "duration_estimate_s": 900}, format="json"))
    ok, _ = _outcomes(results, "gpu_hours_per_month")
    assert len(ok) == 4  # 4 x 15 min fill the hour
    assert selectors.gpu_hours_committed(team_a.pk) <= 1.0 + 1e-9
