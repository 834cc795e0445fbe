"""Predictor training is a Celery task, never a request (issue 40): the train action answers 202 with a
state to poll, and the first GPU job is placed by the analytic estimate while a training is queued."""
from __future__ import annotations

from unittest import mock

import pytest
from django_celery_results.models import TaskResult
from kombu.exceptions import OperationalError as BrokerError

from scheduling import services, tasks
from scheduling.models import PredictorVersion

from ..helpers import client_for

FAST_XGB = {"n_estimators": 10, "max_depth": 3}


@pytest.fixture
def api_staff(user_staff):
    return client_for(user_staff)


def _run_like_a_worker(message, monkeypatch):
    """Run the queued message as a worker does, its result stored in the result backend under its id."""
    monkeypatch.setattr(tasks.train_predictor, "store_eager_result", True)
    with mock.patch("scheduling.horus.predictor.DEFAULT_XGB_PARAMS", FAST_XGB):
        return tasks.train_predictor.apply(kwargs=message.kwargs, task_id=message.options["task_id"])


def test_the_train_action_answers_202_and_the_task_trains(api_staff, user_staff, celery_outbox, monkeypatch,
                                                          django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        resp = api_staff.post("/api/predictors/train/", {"k_folds": 2, "seed": 3}, format="json")
    assert resp.status_code == 202, resp.json()
    body = resp.json()
    assert body["state"] == "queued" and body["version"] is None and body["error"] == ""
    assert resp["Location"] == body["url"] == f"/api/predictors/training/{body['task_id']}/"
    assert not PredictorVersion.objects.exists()  # nothing was trained in the request
    [message] = celery_outbox
    assert message.task == "scheduling.train_predictor" and message.options["task_id"] == body["task_id"]
    assert message.kwargs == {"k_folds": 2, "seed": 3, "activate": True, "requested_by": user_staff.pk}
    assert api_staff.get(body["url"]).json()["state"] == "queued"

    _run_like_a_worker(message, monkeypatch)
    polled = api_staff.get(body["url"]).json()
    pv = PredictorVersion.objects.get()
    assert polled["state"] == "succeeded" and polled["version"] == pv.version and polled["finished_at"]
    assert pv.active and pv.trained_by == user_staff and pv.metrics["k_folds"] == 2


def test_a_failed_training_says_why(api_staff, user_staff, celery_outbox, monkeypatch,
                                    django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        url = api_staff.post("/api/predictors/train/", {"k_folds": 2}, format="json").json()["url"]
    user_staff.is_staff = False  # demoted while it waited in the queue: the worker checks again
    user_staff.save()
    _run_like_a_worker(celery_outbox[0], monkeypatch)
    user_staff.is_staff = True
    user_staff.save()
    polled = api_staff.get(url).json()
    assert polled["state"] == "failed" and "Only staff can train predictors" in polled["error"]
    assert not PredictorVersion.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_down_the_train_action_is_a_503_and_the_training_is_failed(user_staff, monkeypatch):
    from celery.app.task import Task

    def broker_down(*args, **kwargs):
        raise BrokerError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(Task, "apply_async", broker_down)
    api = client_for(user_staff)
    resp = api.post("/api/predictors/train/", {"k_folds": 2}, format="json")
    assert resp.status_code == 503 and int(resp["Retry-After"]) > 0
    assert resp.json()["code"] == "broker_unavailable" and "broker is unreachable" in resp.json()["detail"]
    row = TaskResult.objects.get(task_name="scheduling.train_predictor")
    polled = api.get(f"/api/predictors/training/{row.task_id}/").json()
    assert polled["state"] == "failed" and "broker" in polled["error"]


def test_only_staff_see_trainings_and_only_trainings(api_owner, api_staff, celery_outbox,
                                                     django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        url = api_staff.post("/api/predictors/train/", {}, format="json").json()["url"]
    assert api_owner.get(url).status_code == 403
    assert api_owner.post("/api/predictors/train/", {}, format="json").status_code == 403
    assert api_staff.get("/api/predictors/training/00000000-0000-4000-8000-000000000000/").status_code == 404
    assert api_staff.get("/api/predictors/training/../../etc/").status_code == 404
    # another task's result row (a tuning run's, say) is not a training, whatever its id
    other = TaskResult.objects.create(task_id="11111111-2222-4333-8444-555555555555", task_name="tuning.execute_run",
                                      status="SUCCESS", result='"done"')
    assert api_staff.get(f"/api/predictors/training/{other.task_id}/").status_code == 404


@pytest.mark.parametrize("body", [{"k_folds": 1}, {"k_folds": 21}, {"k_folds": "many"}, {"seed": -1}])
def test_bad_training_parameters_are_a_400_and_queue_nothing(api_staff, celery_outbox, body):
    resp = api_staff.post("/api/predictors/train/", body, format="json")
    assert resp.status_code == 400 and resp.json()["errors"]
    assert not TaskResult.objects.exists() and not celery_outbox


def test_the_first_gpu_job_is_placed_by_the_analytic_estimate_and_queues_one_training(
        gpu_node, model_a, user_owner, celery_outbox, monkeypatch, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        first = services.submit_job(actor=user_owner, model=model_a, batch_size=8, duration_estimate_s=60)
        second = services.submit_job(actor=user_owner, model=model_a, batch_size=16, duration_estimate_s=60)
    assert not PredictorVersion.objects.exists()  # no training inside the request
    for job in (first, second):
        assert job.predictor_version is None and 0 < job.predicted_util_pct <= 100 and job.predicted_mem_mb > 0
    assert second.predicted_mem_mb > first.predicted_mem_mb  # a larger batch needs more memory
    trainings = [m for m in celery_outbox if m.task == "scheduling.train_predictor"]
    assert len(trainings) == 1  # one training while it is in flight, not one per job
    assert trainings[0].kwargs["requested_by"] is None  # the platform asked

    _run_like_a_worker(trainings[0], monkeypatch)
    pv = PredictorVersion.objects.get(active=True)
    third = services.submit_job(actor=user_owner, model=model_a, batch_size=8, duration_estimate_s=60)
    assert third.predictor_version == pv


def test_with_no_active_predictor_the_last_trained_one_predicts(gpu_node, model_a, predictor, celery_outbox):
    PredictorVersion.objects.update(active=False)
    prediction = services.predict_job(model=model_a, batch_size=8)
    assert prediction["predictor_version"] == predictor and prediction["method"] == "predictor"
    assert not celery_outbox
