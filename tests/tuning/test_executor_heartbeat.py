"""A busy executor stays alive to recovery: while the engine is silent (a long TVM compile, the final
compile and compare), the executor's heartbeat thread keeps the run's heartbeat fresh, so the beat's
stale-run sweep leaves the run to it instead of starting a second executor."""
from __future__ import annotations

import threading
import time

import pytest

from tuning import services
from tuning.models import TuningRun
from tuning.services import executor

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker")]


def test_run_whose_engine_is_silent_longer_than_the_stale_threshold_is_not_recovered(
        model_a, user_owner, settings, monkeypatch):
    settings.TUNING_STALE_AFTER_S = 8.0  # the thread beats every 2 s
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    seen = {}

    def silent_engine(sink, model_proto, config):
        time.sleep(settings.TUNING_STALE_AFTER_S * 1.5)  # no event, no control() call: only the thread beats
        seen["recovered"] = services.recover_stale_runs()
        seen["attempts"] = TuningRun.objects.get(pk=run.pk).attempts
        raise RuntimeError("engine stops here")

    monkeypatch.setattr("tuning.adapters.run_engine", silent_engine)
    assert services.execute_run(run_id=run.pk, worker="busy") == TuningRun.Status.FAILED
    assert run.pk not in seen["recovered"] and seen["attempts"] == 1


def test_the_heartbeat_thread_stops_with_the_executor(model_a, user_owner, settings):
    settings.TUNING_STALE_AFTER_S = 8.0
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    lease = services.claim_run(run.pk, worker="w")
    with executor.heartbeat_while_executing(run.pk, lease):
        pass
    assert not [t for t in threading.enumerate() if t.name == f"run-{run.pk}-heartbeat"]
