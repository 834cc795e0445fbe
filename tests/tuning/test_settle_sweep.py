"""A run that ends with no executor left to commit its journal (cancelled after its executor was killed,
or its executor killed just as its attempt ended) keeps a TVM database that lags its store (issue 40):
the cancel sends a settle task, and the periodic sweep commits the stored results (never the unstored
ones), marks the journal settled, and opens TVM no more for it."""
from __future__ import annotations

from datetime import timedelta

import onnx
import pytest
from django.utils import timezone

from tests.engine.test_journal_commit import write_journal
from tests.factories import MeasurementFactory, TuningTaskFactory
from tuning import adapters, services
from tuning.engine.process.lifeline import lock_work_dir
from tuning.engine.session import database_records
from tuning.engine.workdir import JOURNAL_SETTLED
from tuning.models import TuningRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]


@pytest.fixture
def commits(monkeypatch) -> list[int]:
    """The runs whose journal was committed through the adapter (each call opens TVM), in order."""
    calls: list[int] = []
    real = adapters.commit_stored_journal

    def spy(model_proto, work_dir, run, **kwargs):
        calls.append(run.pk)
        return real(model_proto, work_dir, run, **kwargs)

    monkeypatch.setattr(adapters, "commit_stored_journal", spy)
    return calls


def _run_with_lagging_journal(model, user):
    """A run whose killed engine streamed 3 results (its journal) of which the platform stored 2, and
    that no TVM join committed: its TVM database holds none of them."""
    run = services.start_run(actor=user, model=model, max_trials=8, enqueue=False)
    proto = onnx.load_model_from_string(model.file.open("rb").read())
    work_dir = adapters.run_work_dir(run.pk)
    keys = write_journal(work_dir, proto, adapters.engine_target(run), task_index=0, n=3)
    task = TuningTaskFactory(run=run, index=0)
    for _, key in keys[:2]:
        MeasurementFactory(task=task, candidate_key=key)
    return run, proto, work_dir, keys[:2]


def _in_tvm(run, proto, work_dir) -> list[tuple[int, str]]:
    return sorted((r.task_index, r.candidate_key) for r in database_records(str(work_dir), proto, run.engine_target))


def test_a_run_cancelled_with_no_executor_is_settled_by_the_sweep_once(
        model_a, user_owner, celery_outbox, commits):
    run, proto, work_dir, stored = _run_with_lagging_journal(model_a, user_owner)
    services.cancel_run(actor=user_owner, run=run)  # queued again after its executor died: ends now
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert celery_outbox.args_of("tuning.settle_run_database") == [(run.pk,)]  # settled off the request

    assert services.sweep_unsettled_runs() == [run.pk]
    assert _in_tvm(run, proto, work_dir) == sorted(stored)  # the stored ones, once; the unstored stays out
    assert (work_dir / JOURNAL_SETTLED).exists()
    assert commits == [run.pk]

    assert services.sweep_unsettled_runs() == []  # settled: the marker says so, TVM is not opened
    assert services.settle_ended_run(run_id=run.pk) is None  # the cancel's task, arriving late, too
    assert commits == [run.pk]
    assert _in_tvm(run, proto, work_dir) == sorted(stored)


def test_recovery_that_cancels_a_run_whose_executor_died_sends_its_settle(
        model_a, user_owner, celery_outbox, settings):
    run, _, _, _ = _run_with_lagging_journal(model_a, user_owner)
    TuningRun.objects.filter(pk=run.pk).update(
        status=TuningRun.Status.RUNNING, requested_action=TuningRun.Action.CANCEL, lease="dead",
        heartbeat_at=timezone.now() - timedelta(seconds=settings.TUNING_STALE_AFTER_S + 60))
    services.recover_stale_runs()
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert celery_outbox.args_of("tuning.settle_run_database") == [(run.pk,)]


def test_the_sweep_skips_a_run_whose_engine_still_holds_its_work_dir_and_settles_it_next_time(
        model_a, user_owner, commits, monkeypatch):
    run, proto, work_dir, stored = _run_with_lagging_journal(model_a, user_owner)
    TuningRun.objects.filter(pk=run.pk).update(status=TuningRun.Status.CANCELLED, finished_at=timezone.now())
    monkeypatch.setattr("tuning.services.settle.SETTLE_BUSY_WAIT_S", 0.2)
    with lock_work_dir(str(work_dir)):  # a stopped engine of the run still holds it
        assert services.sweep_unsettled_runs() == [run.pk]
    assert not (work_dir / JOURNAL_SETTLED).exists() and _in_tvm(run, proto, work_dir) == []
    assert services.sweep_unsettled_runs() == [run.pk]  # the next sweep
    assert _in_tvm(run, proto, work_dir) == sorted(stored)
    assert services.sweep_unsettled_runs() == []


def test_the_sweep_leaves_live_and_long_ended_runs_alone(model_a, user_owner, commits):
    live, _, _, _ = _run_with_lagging_journal(model_a, user_owner)
    TuningRun.objects.filter(pk=live.pk).update(status=TuningRun.Status.RUNNING)  # its engine commits them
    old, _, _, _ = _run_with_lagging_journal(model_a, user_owner)
    TuningRun.objects.filter(pk=old.pk).update(status=TuningRun.Status.FAILED,
                                               finished_at=timezone.now() - timedelta(days=2))
    assert services.sweep_unsettled_runs(window_s=3600) == []
    assert commits == []
