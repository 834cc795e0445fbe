"""Run control: every (status, pending request) x control transition, the concurrent-run queue, and the
task rows of a stopped run. The table is walked through the API, so the answers users get are tested too."""
from __future__ import annotations

import pytest
from django.utils import timezone

from core.models import Quota
from tests.factories import TuningRunFactory, TuningTaskFactory
from tuning import services
from tuning.models import TuningRun, TuningTask
from tuning.services.runs import TRANSITIONS, Control, Outcome, transition

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

S, A = TuningRun.Status, TuningRun.Action

# (status, pending request, control) -> (HTTP status, status after, pending request after)
EXPECTED = [
    (S.QUEUED, A.NONE, "cancel", 200, S.CANCELLED, A.NONE),
    (S.QUEUED, A.NONE, "pause", 200, S.PAUSED, A.NONE),
    (S.QUEUED, A.NONE, "resume", 200, S.QUEUED, A.NONE),
    (S.RUNNING, A.NONE, "cancel", 200, S.RUNNING, A.CANCEL),
    (S.RUNNING, A.NONE, "pause", 200, S.RUNNING, A.PAUSE),
    (S.RUNNING, A.NONE, "resume", 200, S.RUNNING, A.NONE),
    (S.RUNNING, A.PAUSE, "cancel", 200, S.RUNNING, A.CANCEL),  # cancel wins over a pending pause
    (S.RUNNING, A.PAUSE, "pause", 200, S.RUNNING, A.PAUSE),
    (S.RUNNING, A.PAUSE, "resume", 200, S.RUNNING, A.NONE),  # a pending pause is withdrawn
    (S.RUNNING, A.CANCEL, "cancel", 200, S.RUNNING, A.CANCEL),
    (S.RUNNING, A.CANCEL, "pause", 409, S.RUNNING, A.CANCEL),  # a later pause does not undo a cancel
    (S.RUNNING, A.CANCEL, "resume", 409, S.RUNNING, A.CANCEL),
    (S.PAUSED, A.NONE, "cancel", 200, S.CANCELLED, A.NONE),
    (S.PAUSED, A.NONE, "pause", 200, S.PAUSED, A.NONE),
    (S.PAUSED, A.NONE, "resume", 200, S.QUEUED, A.NONE),
    *[(done, A.NONE, control, 409, done, A.NONE)
      for done in TuningRun.TERMINAL for control in ("cancel", "pause", "resume")],
]


def test_the_table_covers_every_live_state_and_control():
    live = [(s, a) for s, a, *_ in EXPECTED if s not in TuningRun.TERMINAL]
    assert {(s, a, c) for s, a in live for c in ("cancel", "pause", "resume")} == set(TRANSITIONS)
    assert transition(S.SUCCEEDED, A.NONE, Control.RESUME)[0] == Outcome.REFUSED


@pytest.mark.parametrize("status,pending,control,http,after,pending_after", EXPECTED,
                         ids=[f"{s}+{a or 'none'}-{c}" for s, a, c, *_ in EXPECTED])
def test_each_transition_through_the_api(api_owner, model_a, user_owner, status, pending, control, http, after,
                                         pending_after, no_broker):
    run = TuningRunFactory(model=model_a, team=model_a.team, created_by=user_owner, status=status,
                           requested_action=pending)
    resp = api_owner.post(f"/api/runs/{run.pk}/{control}/")
    assert resp.status_code == http, resp.content
    run.refresh_from_db()
    assert (run.status, run.requested_action) == (after, pending_after)
    if http == 409:
        assert resp.json()["code"] == "conflict" and str(run.pk) in resp.json()["detail"]
    else:
        assert (resp.json()["status"], resp.json()["requested_action"]) == (after, pending_after)
    if status not in TuningRun.TERMINAL:
        assert (run.finished_at is not None) == (after == S.CANCELLED)
    assert no_broker == ([run.pk] if (status, control) == (S.PAUSED, "resume") else [])


def test_a_viewer_cannot_drive_any_control(user_viewer, model_a, user_owner):
    from tests.helpers import client_for

    run = TuningRunFactory(model=model_a, team=model_a.team, created_by=user_owner, running=True)
    viewer = client_for(user_viewer)
    for control in ("cancel", "pause", "resume"):
        assert viewer.post(f"/api/runs/{run.pk}/{control}/").status_code == 403
    run.refresh_from_db()
    assert (run.status, run.requested_action) == (S.RUNNING, A.NONE)


def _start(api, model):
    resp = api.post("/api/runs/", {"model": model.pk, "max_trials": 16}, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


@pytest.mark.dialect
def test_waiting_runs_get_slots_in_order_as_runs_end(api_owner, model_a, team_a, no_broker,
                                                     django_capture_on_commit_callbacks):
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=1)
    first, second, third = (_start(api_owner, model_a) for _ in range(3))
    assert no_broker == [first["id"]]
    assert [api_owner.get(f"/api/runs/{r['id']}/").json()["queue_position"] for r in (first, second, third)] \
        == [None, 1, 2]
    with django_capture_on_commit_callbacks(execute=True):
        assert api_owner.post(f"/api/runs/{first['id']}/cancel/").json()["status"] == "cancelled"
    assert no_broker == [first["id"], second["id"]]
    body = api_owner.get(f"/api/runs/{third['id']}/").json()
    assert body["queue_position"] == 1 and body["status"] == "queued"
    assert api_owner.get(f"/api/runs/{second['id']}/").json()["queue_position"] is None


def test_a_cancelled_waiting_run_leaves_the_queue_without_freeing_a_slot(api_owner, model_a, team_a, no_broker,
                                                                        django_capture_on_commit_callbacks):
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=1)
    first, second, third = (_start(api_owner, model_a) for _ in range(3))
    with django_capture_on_commit_callbacks(execute=True):
        assert api_owner.post(f"/api/runs/{second['id']}/cancel/").status_code == 200
    assert no_broker == [first["id"]]  # the first still holds the only slot
    assert api_owner.get(f"/api/runs/{third['id']}/").json()["queue_position"] == 1


@pytest.mark.dialect
def test_a_resumed_run_over_the_quota_waits_at_the_back(api_owner, model_a, team_a, no_broker, user_owner):
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=1)
    paused = TuningRunFactory(model=model_a, team=team_a, created_by=user_owner, paused=True)
    first, second = _start(api_owner, model_a), _start(api_owner, model_a)
    body = api_owner.post(f"/api/runs/{paused.pk}/resume/").json()
    assert body["status"] == "queued" and body["queue_position"] == 2
    assert no_broker == [first["id"]] and second["queue_position"] == 1


def test_a_run_that_ends_on_a_worker_frees_its_slot(model_a, team_a, user_owner, no_broker,
                                                    django_capture_on_commit_callbacks):
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=1)
    running = TuningRunFactory(model=model_a, team=team_a, created_by=user_owner, running=True,
                               requested_action=A.PAUSE)
    waiting = services.start_run(actor=user_owner, model=model_a, max_trials=16)
    assert waiting.waiting_since is not None and no_broker == []
    with django_capture_on_commit_callbacks(execute=True):
        services.finish_interrupted(running.pk, running.lease, "paused")
    assert no_broker == [waiting.pk]
    waiting.refresh_from_db()
    assert waiting.waiting_since is None and waiting.queue_position is None


def test_the_periodic_sweep_sends_waiting_runs_a_missed_dispatch_left(model_a, team_a, user_owner, no_broker):
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=2)
    waiting = TuningRunFactory(model=model_a, team=team_a, created_by=user_owner, waiting_since=timezone.now())
    assert services.dispatch_all_waiting_runs() == [waiting.pk] and no_broker == [waiting.pk]
    assert services.dispatch_all_waiting_runs() == []  # sent once


@pytest.mark.parametrize("stop,task_after", [("cancelled", [TuningTask.Status.DONE, TuningTask.Status.UNTUNED]),
                                             ("paused", [TuningTask.Status.PENDING, TuningTask.Status.PENDING])])
def test_a_stopped_run_leaves_no_task_tuning(model_a, team_a, user_owner, stop, task_after):
    run = TuningRunFactory(model=model_a, team=team_a, created_by=user_owner, running=True)
    TuningTaskFactory(run=run, index=0, status=TuningTask.Status.TUNING, best_latency_s=1e-3, trials=8)
    TuningTaskFactory(run=run, index=1, status=TuningTask.Status.TUNING, best_latency_s=None, trials=0)
    services.finish_interrupted(run.pk, run.lease, stop)
    assert list(run.tasks.order_by("index").values_list("status", flat=True)) == task_after


def test_a_waiting_run_is_never_claimed_by_an_executor(model_a, team_a, user_owner):
    """A stray delivery (or a direct execute) of a waiting run does not jump the team's queue."""
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=1)
    services.start_run(actor=user_owner, model=model_a, max_trials=16, enqueue=False)
    waiting = services.start_run(actor=user_owner, model=model_a, max_trials=16, enqueue=False)
    assert waiting.waiting_since is not None
    assert services.claim_run(waiting.pk, worker="w") is None
    waiting.refresh_from_db()
    assert waiting.status == S.QUEUED and waiting.waiting_since is not None


def test_a_caller_that_runs_the_run_itself_is_refused_instead_of_queued(model_a, team_a, user_owner):
    from core.exceptions import QuotaExceeded

    Quota.objects.filter(team=team_a).update(max_concurrent_runs=1)
    services.start_run(actor=user_owner, model=model_a, max_trials=16, enqueue=False)
    with pytest.raises(QuotaExceeded) as refused:
        services.start_run(actor=user_owner, model=model_a, max_trials=16, enqueue=False, queue_when_busy=False)
    assert refused.value.quota == "max_concurrent_runs"
    assert TuningRun.objects.filter(team=team_a).count() == 1
