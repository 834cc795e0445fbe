"""Real tuning on real Celery workers over real Redis: end to end, and SIGKILL mid-run then resume."""
from __future__ import annotations

import time

import pytest

from core import services as core_services
from tests.helpers import require_env
from tests.workers import running_worker, start_worker, wait_for
from tuning import services
from tuning.models import Measurement, TuningRun

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAST = {"search_population": 64, "genetic_num_iters": 1, "seed": 1}


@pytest.fixture
def redis_url(settings):
    url = require_env("TEST_REDIS_URL")
    from config.celery import app

    with app.connection_for_write() as conn:
        for queue in ("tuning", "default", "measure.testhost.cpu"):
            conn.default_channel.queue_purge(queue)
    return url


@pytest.fixture
def cnn(team_a, user_owner, small_cnn_bytes):
    return core_services.register_model(team=team_a, name="small_cnn", data=small_cnn_bytes,
                                        filename="small_cnn.onnx", actor=user_owner)


def test_zoo_model_tuned_end_to_end_on_a_worker(redis_url, cnn, user_owner, tmp_path, django_capture_on_commit_callbacks):
    with running_worker(broker_url=redis_url, queues="tuning", log_dir=tmp_path, pool="prefork") as worker:
        with django_capture_on_commit_callbacks(execute=True):
            run = services.start_run(actor=user_owner, model=cnn, max_trials=40, trials_per_round=8,
                                     target={"kind": "llvm", "num-cores": 2}, options=FAST)
        seen_progress = set()

        def finished():
            r = TuningRun.objects.get(pk=run.pk)
            seen_progress.add(r.trials_done)
            return r if r.status in TuningRun.TERMINAL else None

        run = wait_for(finished, 420, "the run to finish", worker.log, interval=0.5)
    assert run.status == "succeeded", run.error
    assert run.outputs_match is True and run.max_abs_diff < 1e-3
    assert run.tuned_latency_s > 0 and run.untuned_latency_s > 0
    assert 0 < run.trials_done <= 40 + 8
    assert Measurement.objects.filter(run=run).count() == run.trials_done
    assert len(seen_progress) >= 2  # progress was visible while it ran, not only at the end
    assert run.records_file and run.module_file
    # the NHWC pipeline: input transpose, conv, conv, pool, transpose+reshape, dense after fusion
    assert run.tasks.count() == 6
    assert run.tasks.filter(best_latency_s__isnull=False).count() >= 4
    assert run.energy_joules > 0 and run.energy_source in ("modeled", "rapl")
    assert run.dop_rounds.exists() and run.final_dop >= 1


def test_worker_killed_mid_run_resumes_without_losing_or_duplicating(redis_url, cnn, user_owner, tmp_path,
                                                                     settings, django_capture_on_commit_callbacks):
    settings.TUNING_STALE_AFTER_S = 4
    env = {"TUNING_STALE_AFTER_S": 4}
    worker = start_worker(broker_url=redis_url, queues="tuning", log_dir=tmp_path, name="victim", pool="prefork",
                          env_extra=env)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            run = services.start_run(actor=user_owner, model=cnn, max_trials=40, trials_per_round=8,
                                     target={"kind": "llvm", "num-cores": 2}, options=FAST)
        wait_for(lambda: Measurement.objects.filter(run=run).count() >= 8, 300, "the first measurements",
                 worker.log, interval=0.5)
    finally:
        worker.kill()  # SIGKILL the whole worker: main process, pool child and the engine's builders/runners
    before = set(Measurement.objects.filter(run=run).values_list("task__index", "candidate_key"))
    assert TuningRun.objects.get(pk=run.pk).status == "running"  # nobody told the database

    with running_worker(broker_url=redis_url, queues="tuning", log_dir=tmp_path, name="rescuer", pool="prefork",
                        env_extra=env) as rescuer:
        time.sleep(settings.TUNING_STALE_AFTER_S + 1)
        with django_capture_on_commit_callbacks(execute=True):
            recovered = services.recover_stale_runs()  # what celery beat does every minute
        # Either beat's sweep re-queued it, or the rescuer did first: a worker that starts while a dead
        # executor's lease is live checks again when it expires (issue 11, section 4).
        assert run.pk in recovered or TuningRun.objects.get(pk=run.pk).status != "running" or \
            TuningRun.objects.get(pk=run.pk).attempts >= 2
        run = wait_for(lambda: (r := TuningRun.objects.get(pk=run.pk)).status in TuningRun.TERMINAL and r,
                       420, "the resumed run to finish", rescuer.log, interval=0.5)
    assert run.status == "succeeded", run.error
    assert run.attempts == 2
    after = list(Measurement.objects.filter(run=run).values_list("task__index", "candidate_key"))
    assert len(after) == len(set(after))           # stored once each (also a DB constraint)
    assert before <= set(after)                    # nothing measured before the kill was lost
    assert len(after) == run.trials_done and len(after) > len(before)  # the rescuer measured the rest
    # Budget 40, 8 a round: at most the batch in flight at the kill is measured again. Results reach the
    # platform before TVM's join commits them; the engine's journal hands those to the resumed TVM.
    assert run.trials_done <= 40 + 8
    # Every candidate in TVM's tuning database has its stored measurement (TVM may hold a
    # candidate twice, e.g. a task with a single schedule measured again after the resume).
    import onnx

    from tuning.engine.session import database_records

    model = onnx.load_model_from_string(cnn.file.open("rb").read())
    in_tvm = {(r.task_index, r.candidate_key)
              for r in database_records(str(services.run_work_dir(run.pk)), model, run.target)}
    assert in_tvm and in_tvm <= set(after)
    assert run.outputs_match is True


def test_every_database_connection_dropped_mid_run_is_ridden_out(redis_url, team_a, user_owner, tmp_path, settings,
                                                                 django_capture_on_commit_callbacks):
    """A database restart (every connection of the worker terminated by the server) in the middle of a run:
    the executor, its heartbeat and the engine's sink reconnect; the run finishes in its first attempt, no
    executor is counted lost, nothing is measured twice or lost, and the budget holds."""
    from django.db import connection

    from tests.tuning.onnx_builders import tiny_dense

    if connection.vendor != "postgresql":
        pytest.skip("dropping connections needs the PostgreSQL server")
    settings.TUNING_STALE_AFTER_S = 20
    model = core_services.register_model(team=team_a, name="tiny", data=tiny_dense(), filename="tiny.onnx",
                                         actor=user_owner)
    tiny = {"search_population": 16, "genetic_num_iters": 1, "seed": 1,
            "evaluator": {"number": 2, "repeat": 1, "min_repeat_ms": 1}}
    with running_worker(broker_url=redis_url, queues="tuning", log_dir=tmp_path, name="dbdrop", pool="prefork",
                        env_extra={"TUNING_STALE_AFTER_S": 20}) as worker:
        with django_capture_on_commit_callbacks(execute=True):
            run = services.start_run(actor=user_owner, model=model, max_trials=16, trials_per_round=4,
                                     target={"kind": "llvm", "num-cores": 1}, options=tiny)
        wait_for(lambda: Measurement.objects.filter(run=run).count() >= 4, 300, "the first measurements",
                 worker.log, interval=0.5)
        with connection.cursor() as c:  # what a database restart does to the worker's connections
            c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                      "WHERE datname = current_database() AND pid <> pg_backend_pid()")
            assert c.fetchone()[0] >= 1
        run = wait_for(lambda: (r := TuningRun.objects.get(pk=run.pk)).status in TuningRun.TERMINAL and r,
                       420, "the run to finish", worker.log, interval=0.5)
    assert run.status == "succeeded", run.error
    assert run.attempts == 1 and run.executor_losses == 0  # a database blip is not a lost executor
    stored = list(Measurement.objects.filter(run=run).values_list("task__index", "candidate_key"))
    assert len(stored) == len(set(stored)) == run.trials_done <= 16 + 4
    import onnx

    from tuning.engine.session import database_records

    records = database_records(str(services.run_work_dir(run.pk)), onnx.load_model_from_string(tiny_dense()),
                               run.engine_target)
    in_tvm = [(r.task_index, r.candidate_key) for r in records]
    assert len(in_tvm) == len(set(in_tvm)) and set(in_tvm) == set(stored)  # store == TVM's database
