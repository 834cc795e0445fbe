"""A model that crashes TVM fails its own run with a clear error; the worker keeps serving other runs.
Runs whose executor died are re-queued at most TUNING_MAX_EXECUTOR_LOSSES - 1 times, and a requested
cancel or pause is honoured instead of re-queueing."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core import services as core_services
from tests.helpers import require_env
from tests.tuning.onnx_builders import hostile_gather, tiny_dense
from tests.workers import running_worker, wait_for
from tuning import adapters, services
from tuning.models import TuningRun

TINY = {"search_population": 16, "genetic_num_iters": 1, "seed": 1,
        "evaluator": {"number": 2, "repeat": 1, "min_repeat_ms": 1}}


def _register(team, actor, name, data):
    return core_services.register_model(team=team, name=name, data=data, filename=f"{name}.onnx", actor=actor)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_model_that_segfaults_tvm_fails_its_run_and_the_worker_serves_the_next(
        team_a, user_owner, tmp_path, django_capture_on_commit_callbacks):
    url = require_env("TEST_REDIS_URL")
    from config.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("tuning")
    hostile = _register(team_a, user_owner, "hostile", hostile_gather())  # passes validation
    good = _register(team_a, user_owner, "tiny", tiny_dense())
    # solo pool: the run executes in the worker's only process, so a crash there would end the worker
    with running_worker(broker_url=url, queues="tuning", log_dir=tmp_path, pool="solo") as worker:
        with django_capture_on_commit_callbacks(execute=True):
            bad = services.start_run(actor=user_owner, model=hostile, max_trials=4, trials_per_round=4,
                                     target={"kind": "llvm", "num-cores": 1}, options=TINY)
        bad = wait_for(lambda: (r := TuningRun.objects.get(pk=bad.pk)).status in TuningRun.TERMINAL and r,
                       300, "the hostile run to end", worker.log, interval=0.5)
        assert bad.status == "failed"
        assert "the TVM compiler crashed (signal 11, SIGSEGV) while" in bad.error, bad.error
        assert worker.proc.poll() is None  # the worker lives
        with django_capture_on_commit_callbacks(execute=True):
            ok = services.start_run(actor=user_owner, model=good, max_trials=4, trials_per_round=4,
                                    target={"kind": "llvm", "num-cores": 1}, options=TINY)
        ok = wait_for(lambda: (r := TuningRun.objects.get(pk=ok.pk)).status in TuningRun.TERMINAL and r,
                      300, "the good run to end", worker.log, interval=0.5)
        assert ok.status == "succeeded", ok.error
        assert ok.outputs_match is True and ok.trials_done > 0
        assert worker.proc.poll() is None
    assert bad.attempts == 1 and bad.executor_losses == 0  # failed at once: never re-queued


def _running(run, *, age_s: float, **fields):
    TuningRun.objects.filter(pk=run.pk).update(status=TuningRun.Status.RUNNING, lease="dead", worker="w@dead",
                                               heartbeat_at=timezone.now() - timedelta(seconds=age_s), **fields)


@pytest.mark.django_db
def test_a_run_that_killed_its_executor_three_times_is_failed_not_requeued(model_a, user_owner, no_broker,
                                                                           settings):
    settings.TUNING_STALE_AFTER_S = 10
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    for loss in (1, 2):
        _running(run, age_s=60)
        assert services.recover_stale_runs() == [run.pk]
        run.refresh_from_db()
        assert run.status == "queued" and run.executor_losses == loss
    _running(run, age_s=60)
    assert services.recover_stale_runs() == []
    run.refresh_from_db()
    assert run.status == "failed" and run.executor_losses == 3 and run.finished_at
    assert "died 3 times" in run.error and "not retried" in run.error
    assert no_broker == [run.pk, run.pk]
    # a re-delivered task of the dead worker (acks_late) does not run it again either
    assert services.claim_run(run.pk, worker="w2") is None


@pytest.mark.django_db
def test_redelivered_task_of_a_dead_executor_counts_a_loss(model_a, user_owner, no_broker, settings):
    settings.TUNING_STALE_AFTER_S = 10
    settings.TUNING_MAX_EXECUTOR_LOSSES = 1
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    _running(run, age_s=60)
    assert services.claim_run(run.pk, worker="w2") is None
    run.refresh_from_db()
    assert run.status == "failed" and run.executor_losses == 1


@pytest.mark.django_db
@pytest.mark.parametrize("action,status", [("cancel", "cancelled"), ("pause", "paused")])
def test_recovery_honours_a_requested_cancel_or_pause(model_a, user_owner, no_broker, settings, action, status):
    settings.TUNING_STALE_AFTER_S = 10
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    _running(run, age_s=60, requested_action=action)
    assert services.recover_stale_runs() == []
    run.refresh_from_db()
    assert run.status == status and run.requested_action == "" and run.lease == ""
    assert no_broker == []


@pytest.mark.django_db
def test_next_stale_check_is_when_a_live_lease_expires(model_a, user_owner, settings):
    settings.TUNING_STALE_AFTER_S = 120
    assert services.seconds_until_next_stale() is None
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    _running(run, age_s=100)
    assert 15 < services.seconds_until_next_stale() <= 20


def test_engine_child_gets_no_secrets_unless_it_needs_django(monkeypatch):
    """The engine child compiles and loads code derived from the user's model: without Django (every run
    that is not distributed) it sees only the sandbox's allow-listed environment."""
    monkeypatch.setenv("DATABASE_URL", "postgres://secret@db/x")
    monkeypatch.setenv("DJANGO_SECRET_KEY", "s3cret")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://secret@broker/0")
    probe = "tuning.engine.process.sandbox:describe_process"
    seen = adapters.call_engine(probe, what="probing the child's environment")["env"]
    assert not {"DATABASE_URL", "DJANGO_SECRET_KEY", "CELERY_BROKER_URL"} & set(seen), seen
    assert "PATH" in seen
    # a distributed run's child sets up Django and talks to the broker: it keeps the worker's environment
    seen = adapters.call_engine(probe, what="probing", needs_django=True)["env"]
    assert {"DATABASE_URL", "DJANGO_SECRET_KEY"} <= set(seen)


def test_engine_child_passes_large_messages_both_ways():
    """A model proto and a run summary are megabytes: a pipe hands them over in pieces, and neither side
    may take a short read or write for the end of the message."""
    from tuning.engine.process.isolate import call_isolated

    assert call_isolated("builtins:len", b"x" * 10_000_000, what="receiving a large argument") == 10_000_000
    assert len(call_isolated("builtins:bytes", 20_000_000, what="sending a large answer")) == 20_000_000
