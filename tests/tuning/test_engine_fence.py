"""The engine lives and dies with its executor's lease, and the executor rides out a database blip.

- a heartbeat that finds the lease taken over stops the engine (its child and the child's workers);
- a heartbeat and the engine's sink reconnect after the database dropped their connections, and nothing
  is counted as a lost executor;
- a sink that keeps failing stops the engine after a bounded time instead of being ignored for the rest
  of the run;
- a resumed run's engine gets only what is left of the budget after what the platform already stored.
"""
from __future__ import annotations

import json
import os
import threading
import time

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from tests.factories import MeasurementFactory, TuningTaskFactory
from tests.workers import wait_for
from tuning import adapters, services
from tuning.adapters import Abort, DatabaseSink, LeaseLost
from tuning.adapters.reconnect import FencedSink
from tuning.models import TuningRun
from tuning.services import executor

# dialect-sensitive (re-run on SQLite by scripts/test.sh): leases (select_for_update) and reconnecting after a blip
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("no_broker"), pytest.mark.dialect]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def pg_only():
    if connection.vendor != "postgresql":
        pytest.skip("dropping connections needs the PostgreSQL server")


def _drop_other_connections() -> int:
    """What a database restart or a proxy failover does to every connection but this test's own."""
    with connection.cursor() as c:
        c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                  "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return c.fetchone()[0]


def _claimed(model_a, user_owner, settings, max_trials=8):
    settings.TUNING_STALE_AFTER_S = 8.0  # a beat every 2 s
    run = services.start_run(actor=user_owner, model=model_a, max_trials=max_trials, enqueue=False)
    return run, services.claim_run(run.pk, worker="w")


def test_heartbeat_that_finds_the_lease_taken_over_stops_the_engine(model_a, user_owner, settings):
    run, lease = _claimed(model_a, user_owner, settings)
    abort = Abort()
    with executor.heartbeat_while_executing(run.pk, lease, abort):
        TuningRun.objects.filter(pk=run.pk).update(lease="another-executor")
        wait_for(abort.is_set, 30, "the heartbeat to notice the lost lease")
    assert "no longer this executor's" in abort.reason


def test_heartbeat_of_a_live_lease_never_stops_the_engine(model_a, user_owner, settings):
    run, lease = _claimed(model_a, user_owner, settings)
    abort = Abort()
    before = TuningRun.objects.get(pk=run.pk).heartbeat_at
    with executor.heartbeat_while_executing(run.pk, lease, abort):
        wait_for(lambda: TuningRun.objects.get(pk=run.pk).heartbeat_at > before, 30, "a beat")
    assert not abort.is_set()


def test_heartbeat_reconnects_after_the_database_dropped_its_connection(pg_only, model_a, user_owner, settings):
    run, lease = _claimed(model_a, user_owner, settings)
    abort = Abort()
    claimed_at = TuningRun.objects.get(pk=run.pk).heartbeat_at
    with executor.heartbeat_while_executing(run.pk, lease, abort):
        wait_for(lambda: TuningRun.objects.get(pk=run.pk).heartbeat_at > claimed_at, 30, "the thread's first beat")
        assert _drop_other_connections() >= 1  # the heartbeat thread's connection among them
        dropped_at = timezone.now()
        wait_for(lambda: TuningRun.objects.get(pk=run.pk).heartbeat_at > dropped_at, 30,
                 "a beat over a new connection")
    assert not abort.is_set()
    assert services.recover_stale_runs() == []  # nothing counted as a lost executor
    run.refresh_from_db()
    assert run.status == "running" and run.executor_losses == 0


def test_sink_reconnects_after_the_database_dropped_its_connection(pg_only, model_a, user_owner, settings):
    run, lease = _claimed(model_a, user_owner, settings)
    abort = Abort()
    sink = FencedSink(DatabaseSink(run.pk, lease), abort, give_up_after_s=30)
    assert sink.control() is None
    TuningRun.objects.filter(pk=run.pk).update(requested_action="pause")
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as side:  # the server drops this thread's connection
        side.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    assert sink.control() == "pause"  # over a new connection
    assert not abort.is_set()


def test_sink_that_lost_its_lease_stops_the_engine_at_once(model_a, user_owner, settings):
    run, lease = _claimed(model_a, user_owner, settings)
    abort = Abort()
    sink = FencedSink(DatabaseSink(run.pk, lease), abort, give_up_after_s=300)
    TuningRun.objects.filter(pk=run.pk).update(lease="another-executor")
    with pytest.raises(LeaseLost):
        sink.control()
    assert abort.is_set() and "taken over" in abort.reason


def test_sink_that_keeps_failing_stops_the_engine_after_its_bound(model_a, user_owner, settings):
    run, lease = _claimed(model_a, user_owner, settings)
    abort = Abort()
    sink = FencedSink(DatabaseSink(run.pk, lease), abort, give_up_after_s=0.5)
    TuningRun.objects.filter(pk=run.pk).delete()  # every call fails now, and not for a lost connection
    with pytest.raises(TuningRun.DoesNotExist):
        sink.control()
    assert not abort.is_set()  # one failure is borne ...
    time.sleep(0.6)
    with pytest.raises(TuningRun.DoesNotExist):
        sink.control()
    assert abort.is_set() and "could not store the run's results" in abort.reason  # ... not forever


def test_executor_whose_lease_is_taken_over_kills_its_engine_and_the_engines_workers(
        model_a, user_owner, settings, monkeypatch, tmp_path):
    settings.TUNING_STALE_AFTER_S = 8.0
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    pid_file = tmp_path / "pids.json"

    def engine_that_hangs(sink, model_proto, config):  # a real engine child, tuning "forever"
        return adapters.call_engine("tests.engine.lifeline_helpers:engine_tree_then_hang", str(pid_file),
                                    what="tuning")

    monkeypatch.setattr("tuning.adapters.run_engine", engine_that_hangs)
    pids: dict = {}

    def take_over() -> None:
        pids.update(wait_for(lambda: pid_file.exists() and json.loads(pid_file.read_text()), 120,
                             "the engine to start its workers"))
        TuningRun.objects.filter(pk=run.pk).update(lease="another-executor")  # recovery gave it away

    thief = threading.Thread(target=take_over)
    thief.start()
    try:
        assert services.execute_run(run_id=run.pk, worker="old") is None  # stops quietly
    finally:
        thief.join(timeout=130)
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, 9)
    assert pids
    wait_for(lambda: not any(_alive(p) for p in pids.values()), 30, "the engine's processes to end")
    run.refresh_from_db()
    assert run.status == "running" and run.lease == "another-executor" and run.error == ""


def test_resumed_run_gets_only_the_budget_left_after_what_is_stored(model_a, user_owner, no_broker):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=16, enqueue=False)
    task = TuningTaskFactory(run=run, index=0)
    for i in range(5):
        MeasurementFactory(task=task, candidate_key=f"k{i}")
    config = adapters.build_engine_config(run, adapters.run_work_dir(run.pk))
    assert config.trials_spent == 5


def test_executor_steps_back_while_an_old_engine_still_holds_the_work_dir(model_a, user_owner, settings, no_broker,
                                                                          tmp_path):
    """The previous executor's engine still works in the run's directory (its process tree was stopped,
    say): the new attempt's engine refuses to start next to it, and the run is queued again as after an
    executor loss, with nothing written by a second engine."""
    import subprocess
    import sys

    from tests.workers import ROOT

    settings.TUNING_STALE_AFTER_S = 4.0  # the engine waits stale/2 + 10 s for the work dir
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    work_dir, ready = adapters.run_work_dir(run.pk), tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-m", "tests.engine.lifeline_helpers", "hold_work_dir", str(work_dir),
                               str(ready)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        wait_for(ready.exists, 120, "the old engine to hold the work dir")
        assert services.execute_run(run_id=run.pk, worker="new") is None
    finally:
        holder.kill()
        holder.wait(timeout=30)
    run.refresh_from_db()
    assert run.status == "queued" and run.executor_losses == 1 and run.lease == ""
    assert no_broker == [run.pk]  # sent again
    assert not (work_dir / "database_tuning_record.json").exists()
