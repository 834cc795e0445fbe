"""An attempt whose engine was stopped (its lease lost) or crashed leaves the run's TVM database holding
every result the platform stored, also when the run ends there (issue 40's SIGSTOP row: the run was
cancelled while its engine was stopped, 9 results stored, TVM's database empty). Results never stored
(under no valid lease) stay out of it."""
from __future__ import annotations

import onnx
import pytest

from tests.engine.test_journal_commit import write_journal
from tests.factories import MeasurementFactory, TuningTaskFactory
from tuning import adapters, services
from tuning.adapters import LeaseLost
from tuning.engine.session import database_records
from tuning.models import TuningRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]


def test_a_run_cancelled_while_its_engine_was_stopped_keeps_its_stored_results_in_tvm(
        model_a, user_owner, settings, monkeypatch):
    settings.TUNING_STALE_AFTER_S = 8.0
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    model = onnx.load_model_from_string(model_a.file.open("rb").read())
    work_dir = adapters.run_work_dir(run.pk)
    work_dir.mkdir(parents=True, exist_ok=True)
    stored: list = []

    def engine_stopped_then_cancelled(sink, model_proto, config):
        """The engine streamed 3 results (journal, then the sink: 2 stored before it was stopped), never
        reached TVM's join; while it was stopped the run was cancelled, and the fence killed it."""
        keys = write_journal(work_dir, model, config.target, task_index=0, n=3)
        task = TuningTaskFactory(run=run, index=0)
        stored.extend(keys[:2])
        for _, key in keys[:2]:
            MeasurementFactory(task=task, candidate_key=key)
        TuningRun.objects.filter(pk=run.pk).update(status=TuningRun.Status.CANCELLED, lease="")
        raise LeaseLost("the engine was stopped: the run is no longer this executor's")

    monkeypatch.setattr("tuning.adapters.run_engine", engine_stopped_then_cancelled)
    assert services.execute_run(run_id=run.pk, worker="stopped") is None
    run.refresh_from_db()
    assert run.status == "cancelled"
    in_tvm = [(r.task_index, r.candidate_key)
              for r in database_records(str(work_dir), model, run.engine_target)]
    assert sorted(in_tvm) == sorted(stored)  # every stored result, once; the unstored one stays out
