"""The run bounds table every entry point shares, the sink's serial re-measure, and a deleted run's files."""
from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from core import services as core_services
from core.exceptions import ServiceError
from tuning import adapters, services
from tuning.models import RUN_LIMITS, Measurement, TuningRun, parse_dop

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

OVER_MAX_TRIALS = RUN_LIMITS["max_trials"][1] + 1


def test_service_refuses_max_trials_over_the_table(model_a, user_owner):
    """The cap the API and the dashboard apply holds for every caller of start_run (the command too)."""
    with pytest.raises(ServiceError) as err:
        services.start_run(actor=user_owner, model=model_a, max_trials=OVER_MAX_TRIALS, enqueue=False)
    assert err.value.field == "max_trials"
    for name, value in (("trials_per_round", 0), ("threads", 0), ("search_population", 4)):
        kwargs = {"options": {name: value}} if name == "search_population" else {name: value}
        with pytest.raises(ServiceError) as err:
            services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False, **kwargs)
        assert err.value.field == name
    assert TuningRun.objects.count() == 0


def test_tune_command_refuses_max_trials_over_the_table(model_a):
    with pytest.raises(CommandError, match="max_trials"):
        call_command("tune", str(model_a.pk), "--trials", str(OVER_MAX_TRIALS), "--no-progress",
                     stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="--dop"):
        call_command("tune", str(model_a.pk), "--dop", "many", "--no-progress", stdout=io.StringIO(),
                     stderr=io.StringIO())
    assert TuningRun.objects.count() == 0


def test_api_and_service_read_dop_alike(api_owner, model_a, user_owner):
    assert parse_dop("auto") is None and parse_dop("") is None and parse_dop(None) is None
    assert parse_dop(4) == 4 and parse_dop("4") == 4
    for bad in ("many", 0, "0", -1, True, RUN_LIMITS["dop"][1] + 1, "2.5"):
        with pytest.raises(ValueError):
            parse_dop(bad)
    resp = api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 8, "dop": "3"}, format="json")
    assert resp.status_code == 201 and resp.json()["dop"] == "3"  # in and out: "auto" or N
    resp = api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 8, "dop": "0"}, format="json")
    assert resp.status_code == 400 and "dop" in resp.json()["errors"]
    with pytest.raises(ServiceError):
        services.start_run(actor=user_owner, model=model_a, max_trials=8, dop=0, enqueue=False)


def _record(task_index, key, latency):
    return SimpleNamespace(task_index=task_index, task_name=f"task{task_index}", round_index=0, candidate_key=key,
                           run_secs=[latency] * 3, latency_s=latency, build_secs=0.1, run_wall_secs=0.01,
                           error="", worker="w", dop=2, remeasured_serially=False, serial_secs=None)


def test_serial_remeasure_reaches_the_measurements(model_a, user_owner):
    """The engine's final serial re-measures (task_index, candidate_key, serial_secs | None) land on their
    Measurement rows, and every re-measure, timed or not, is charged to the run."""
    run = services.start_run(actor=user_owner, model=model_a, max_trials=16, enqueue=False)
    lease = services.claim_run(run.pk, worker="t")
    sink = adapters.DatabaseSink(run.pk, lease)
    sink.on_tasks([SimpleNamespace(index=i, name=f"task{i}", flops=1e6, weight=1.0) for i in range(2)])
    sink.on_measurements([_record(0, "a", 2e-3), _record(0, "b", 3e-3), _record(1, "c", 1e-3)])
    sink.on_serial_remeasure([(0, "a", 2.5e-3), (1, "c", None)])
    rows = {m.candidate_key: (m.remeasured_serially, m.serial_secs) for m in Measurement.objects.filter(run=run)}
    assert rows == {"a": (True, 2.5e-3), "b": (False, None), "c": (False, None)}
    run.refresh_from_db()
    assert run.serial_remeasures == 2


def _run_with_files(user_owner, model_a):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    work = adapters.run_work_dir(run.pk)
    (work / "database_tuning_record.json").write_text("[]")
    return run, work


def test_deleting_a_run_deletes_its_files_on_commit(model_a, user_owner, user_staff,
                                                    django_capture_on_commit_callbacks):
    run, work = _run_with_files(user_owner, model_a)
    with django_capture_on_commit_callbacks(execute=True):
        run.delete()
    assert not adapters.run_files_dir(run.pk).exists()
    # and through a cascade: deleting the model (staff only) deletes its runs' files
    run, work = _run_with_files(user_owner, model_a)
    with django_capture_on_commit_callbacks(execute=True):
        core_services.delete_model(actor=user_staff, model=model_a)
    assert not TuningRun.objects.filter(pk=run.pk).exists() and not work.exists()


def test_a_rolled_back_delete_keeps_the_files(model_a, user_owner, django_capture_on_commit_callbacks):
    run, work = _run_with_files(user_owner, model_a)
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError):
            with transaction.atomic():
                TuningRun.objects.get(pk=run.pk).delete()
                raise RuntimeError("roll back")
    assert TuningRun.objects.filter(pk=run.pk).exists() and (work / "database_tuning_record.json").exists()


def test_every_tuning_task_has_a_time_limit_under_the_visibility_timeout():
    """A soft limit the task sees, a hard one after it; a run's stays under Redis' 12 h visibility
    timeout (test_visibility_timeout_is_longer_than_the_longest_task), so a live run is never re-delivered."""
    from tuning import tasks

    for task in (tasks.execute_run, tasks.recover_stale_runs, tasks.measure_candidate):
        assert task.soft_time_limit and task.time_limit > task.soft_time_limit, task.name
    assert tasks.execute_run.time_limit < 12 * 3600
