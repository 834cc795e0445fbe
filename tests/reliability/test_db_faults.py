"""A database error in the middle of a write leaves nothing half-written.

For each service that writes several rows, count its write statements, then run it again N times,
making the 1st, 2nd, ... Nth write fail with a real `django.db.OperationalError` (via
`connection.execute_wrapper`, as a dropped connection or a full disk would). After every failure the
database (and, for models and traces, the media directory) must look exactly as before; a clean
attempt afterwards must still succeed.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from core import services as core_services
from core.models import DLModel, Membership, Quota, Team
from scheduling.models import GpuJob, Placement, TraceUpload
from tuning import services as tuning_services
from tuning.models import DopRound, Measurement, TuningRun, TuningTask

from tests.helpers import PHILLY_CSV

from .faults import count_statements, fail_nth

# dialect-sensitive (re-run on SQLite by scripts/test.sh): transactions rolled back on a database error
pytestmark = [pytest.mark.django_db, pytest.mark.dialect]

WRITES = r"^\s*(INSERT|UPDATE|DELETE)\b"


def media_files(settings) -> set[str]:
    root = Path(settings.MEDIA_ROOT)
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def all_or_nothing(action, snapshot, *, settings=None, pattern=WRITES, min_writes=1):
    """Fail each write statement of `action` in turn; the snapshot must not move. Returns the count."""
    files_before = media_files(settings) if settings else set()
    n = count_statements(action, pattern)
    if settings is not None:  # the counting run's files were rolled back in the DB, not on disk
        for name in media_files(settings) - files_before:
            (Path(settings.MEDIA_ROOT) / name).unlink()
    assert n >= min_writes, f"expected at least {min_writes} writes, saw {n}"
    before = snapshot(), (media_files(settings) if settings else None)
    for i in range(1, n + 1):
        with fail_nth(i, pattern) as injected:
            with pytest.raises(Exception, match="injected failure"):
                action()
        assert injected.failed_sql, f"write #{i} of {n} was not reached"
        after = snapshot(), (media_files(settings) if settings else None)
        assert after == before, (f"write #{i} of {n} failed ({injected.failed_sql[:70]}...) and left a partial "
                                 f"state:\n before {before}\n after  {after}")
    return n


# --- core --------------------------------------------------------------------------------------------

def test_register_model_leaves_no_row_and_no_orphan_file(user_owner, team_a, small_cnn_bytes, settings):
    def action():
        return core_services.register_model(team=team_a, name="atomic", data=small_cnn_bytes, filename="m.onnx",
                                            actor=user_owner)

    def snapshot():
        return list(DLModel.objects.values_list("name", "file"))

    all_or_nothing(action, snapshot, settings=settings)
    model = action()  # the platform still works afterwards
    assert Path(model.file.path).read_bytes() == small_cnn_bytes
    assert media_files(settings) == {model.file.name}


def test_create_team_is_all_or_nothing(user_owner):
    def snapshot():
        return (Team.objects.count(), Quota.objects.count(), Membership.objects.count())

    n = all_or_nothing(lambda: core_services.create_team(name="Atomic Team", owner=user_owner), snapshot,
                       min_writes=3)
    assert n >= 3  # team, quota, owner membership
    team = core_services.create_team(name="Atomic Team", owner=user_owner)
    assert team.quota and team.memberships.get().role == "owner"


def test_delete_model_keeps_the_file_until_the_row_is_gone(user_staff, model_a, settings,
                                                          django_capture_on_commit_callbacks):
    path = Path(model_a.file.path)
    with fail_nth(1, r"^\s*DELETE\b"):
        with pytest.raises(Exception, match="injected failure"):
            with django_capture_on_commit_callbacks(execute=True):
                core_services.delete_model(actor=user_staff, model=model_a)
    assert DLModel.objects.filter(pk=model_a.pk).exists() and path.exists()
    with django_capture_on_commit_callbacks(execute=True):
        core_services.delete_model(actor=user_staff, model=model_a)
    assert not DLModel.objects.filter(pk=model_a.pk).exists() and not path.exists()


# --- tuning ------------------------------------------------------------------------------------------

def test_start_run_is_all_or_nothing(user_owner, model_a, team_a):
    def snapshot():
        return (list(TuningRun.objects.values_list("pk", flat=True)),
                list(Quota.objects.filter(team=team_a).values_list("max_concurrent_runs", "tuning_trials_per_month")))

    all_or_nothing(lambda: tuning_services.start_run(actor=user_owner, model=model_a, max_trials=64, enqueue=False),
                   snapshot)
    run = tuning_services.start_run(actor=user_owner, model=model_a, max_trials=64, enqueue=False)
    assert run.status == "queued"


def _record(task_index, key, latency, round_index=0):
    return SimpleNamespace(task_index=task_index, task_name=f"task{task_index}", round_index=round_index,
                           candidate_key=key, run_secs=[latency] * 3, latency_s=latency, build_secs=0.1,
                           run_wall_secs=0.01, error="", worker="w", dop=2, remeasured_serially=False,
                           serial_secs=None)


@pytest.fixture
def sink(user_owner, model_a):
    run = tuning_services.start_run(actor=user_owner, model=model_a, max_trials=64, enqueue=False)
    lease = tuning_services.claim_run(run.pk, worker="fault-test")
    s = tuning_services.DatabaseSink(run.pk, lease)
    s.on_tasks([SimpleNamespace(index=i, name=f"task{i}", flops=1e6, weight=1.0) for i in range(2)])
    s.on_measurements([_record(0, "a0", 2e-3), _record(1, "b0", 3e-3)])
    return s


def _run_state(run_id):
    """Everything the sink writes, and whether it agrees with itself."""
    run = TuningRun.objects.get(pk=run_id)
    measurements = sorted(Measurement.objects.filter(run_id=run_id).values_list("task__index", "candidate_key"))
    tasks = sorted(TuningTask.objects.filter(run_id=run_id).values_list("index", "trials", "best_latency_s"))
    rounds = sorted(DopRound.objects.filter(run_id=run_id).values_list("round_index", "dop"))
    return measurements, tasks, rounds, run.trials_done


def test_sink_measurement_batch_is_all_or_nothing(sink):
    # one batch: new candidates of two known tasks and of a task the sink has not seen yet
    batch = [_record(0, "a1", 1e-3, 1), _record(1, "b1", 4e-3, 1), _record(2, "c0", 5e-3, 1)]

    def action():  # a fresh sink each time, as a resumed executor would have
        tuning_services.DatabaseSink(sink.run_id, sink.lease).on_measurements(batch)

    n = all_or_nothing(action, lambda: _run_state(sink.run_id), min_writes=3)
    action()
    measurements, tasks, _, trials_done = _run_state(sink.run_id)
    assert len(measurements) == trials_done == 5
    assert [t[1] for t in tasks] == [2, 2, 1]  # each task's trial count matches its stored measurements
    assert n >= 3


def test_sink_survives_a_failed_batch_and_retries_cleanly(sink):
    """The same sink object goes on after a failed write: no stale task id (that row was rolled back),
    no energy attributed to measurements that were not stored."""
    batch = [_record(3, "d0", 5e-3, 1), _record(0, "a2", 1e-3, 1)]
    cpu = (sink._build_cpu_s, sink._measure_cpu_s)
    for n in (1, 2, 3):  # the new task row, the measurements, the task stats
        with fail_nth(n, WRITES):
            with pytest.raises(Exception, match="injected failure"):
                sink.on_measurements(batch)
        assert 3 not in sink._task_ids and (sink._build_cpu_s, sink._measure_cpu_s) == cpu
        assert not TuningTask.objects.filter(run_id=sink.run_id, index=3).exists()
    sink.on_measurements(batch)  # the engine's next attempt with the same sink
    measurements, tasks, _, trials_done = _run_state(sink.run_id)
    assert ("d0" in {k for _, k in measurements}) and len(measurements) == trials_done == 4
    assert dict((i, n) for i, n, _ in tasks) == {0: 2, 1: 1, 3: 1}
    assert sink._build_cpu_s > cpu[0]


def test_sink_tasks_and_rounds_are_all_or_nothing(sink):
    more = [SimpleNamespace(index=i, name=f"task{i}", flops=1e6, weight=1.0) for i in range(2, 5)]
    all_or_nothing(lambda: sink.on_tasks(more), lambda: _run_state(sink.run_id), min_writes=3)
    info = SimpleNamespace(round_index=7, task_index=0, dop=4, mean_error=0.01, n_candidates=8, n_remeasured=1,
                           n_failures=0)
    all_or_nothing(lambda: sink.on_round(info), lambda: _run_state(sink.run_id))


def test_finish_is_all_or_nothing(sink, settings, monkeypatch):
    """The real last write of a successful run (`tuning.services.finish_succeeded`: results, records zip,
    task states, status) fails at each of its writes in turn: the run, its tasks and the media directory
    stay as they were. Only the TVM compile-and-compare (a sandboxed child) is replaced, at its adapter."""
    from tuning import adapters

    work = adapters.run_work_dir(sink.run_id)
    (work / "database_tuning_record.json").write_text("[]")
    (work / "database_workload.json").write_text("[]")
    comparison = {"tuned_latency_s": 1e-3, "untuned_latency_s": 2e-3, "outputs_match": True, "max_abs_diff": 0.0}
    monkeypatch.setattr("tuning.adapters.compile_and_compare", lambda model_proto, work_dir, run: comparison)
    summary = SimpleNamespace(status="succeeded", tasks=[{"index": 0}, {"index": 1}], final_dop=2,
                              mean_parallel_error=0.01, trimmer=None)

    def finish():
        tuning_services.finish_succeeded(sink.run_id, sink.lease, None, summary, work)

    def snapshot():
        run = TuningRun.objects.filter(pk=sink.run_id).values_list(
            "status", "records_file", "lease", "tuned_latency_s", "final_dop", "summary").get()
        return run, sorted(TuningTask.objects.filter(run_id=sink.run_id).values_list("index", "status"))

    n = all_or_nothing(finish, snapshot, settings=settings, min_writes=2)
    assert n >= 2  # task states and the run row
    finish()  # a clean attempt afterwards lands completely
    run = TuningRun.objects.get(pk=sink.run_id)
    assert run.status == "succeeded" and run.lease == "" and run.records_file and run.tuned_latency_s == 1e-3
    assert set(TuningTask.objects.filter(run_id=sink.run_id).values_list("status", flat=True)) == {"done"}


# --- scheduling --------------------------------------------------------------------------------------

def test_upload_trace_leaves_no_row_and_no_file(user_owner, team_a, settings):
    from scheduling import services

    def action():
        return services.upload_trace(actor=user_owner, team=team_a, name="atomic", data=PHILLY_CSV.encode(),
                                     filename="philly.csv")

    all_or_nothing(action, lambda: list(TraceUpload.objects.values_list("name", flat=True)), settings=settings)
    assert action().n_jobs == 4


def test_placement_pass_is_all_or_nothing(model_a, user_owner, settings):
    from scheduling import services
    from tests.factories import GpuJobFactory, NodeFactory

    NodeFactory(name="faultnode", gpus=2)
    jobs = [GpuJobFactory(model=model_a, predicted_util_pct=20.0, predicted_mem_mb=1000.0) for _ in range(3)]

    def snapshot():
        return (sorted(GpuJob.objects.values_list("pk", "state", "policy")),
                sorted(Placement.objects.values_list("job_id", "gpu_id", "released_at")))

    n = all_or_nothing(lambda: services.place_pending_jobs(policy="horus"), snapshot, min_writes=2)
    placed = services.place_pending_jobs(policy="horus")
    assert len(placed) == 3 and n >= 6  # a placement and a job update per job
    assert set(GpuJob.objects.values_list("state", flat=True)) == {"placed"}
    assert {p.job_id for p in placed} == {j.pk for j in jobs}


def test_submit_job_is_all_or_nothing(model_a, user_owner, team_a, settings):
    from scheduling import services
    from tests.factories import NodeFactory

    NodeFactory(name="faultnode2", gpus=2)
    services.train_predictor(actor=None, k_folds=2, xgb_params={"n_estimators": 10})

    def snapshot():
        return (GpuJob.objects.count(), Quota.objects.filter(team=team_a).values_list("gpu_hours_per_month").get())

    all_or_nothing(lambda: services.submit_job(actor=user_owner, model=model_a, batch_size=8,
                                               duration_estimate_s=60.0, place=False), snapshot)
    assert services.submit_job(actor=user_owner, model=model_a, batch_size=8, duration_estimate_s=60.0,
                               place=False).state == "pending"
