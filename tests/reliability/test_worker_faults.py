"""A Celery worker SIGKILLed in the middle of GPU-job placement and of a GPU job: restart it; no job
is placed (or run) twice.

(A worker SIGKILLed in the middle of a *tuning run*, then resumed without losing or duplicating a
measurement, is tests/tuning/test_tuning_worker.py::test_worker_killed_mid_run_resumes_without_losing_or_duplicating.)

How the kill lands "in the middle": a PostgreSQL trigger parks one statement of the task's transaction
on an advisory lock this test holds, after the task has already written part of its work in that
transaction; the test waits until the worker's backend is parked there, then SIGKILLs the worker's
whole process group. What makes it safe is what the product relies on: acks_late (the message is only
acked after the task returns), idempotent tasks (placement takes only PENDING jobs, a run takes only a
PLACED job through a row-locked claim), and the database (one transaction per pass; a partial unique
index allows one active placement per job).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import time

import psycopg
import pytest
from django.db import connection

from scheduling.models import GpuJob, Placement
from tests.factories import GpuJobFactory, NodeFactory
from tests.workers import ROOT, database_url_for_workers, start_worker, wait_for


LOCK_KEY = 424242
VISIBILITY_S = 5  # the test workers' Redis visibility timeout (deployment: 12 h, see below)


# --- visibility timeout ------------------------------------------------------------------------------

def _settings_under(env: dict) -> dict:
    code = ("import os, json, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); "
            "django.setup(); from django.conf import settings as s; from config.celery import app; "
            "print(json.dumps({'opts': app.conf.broker_transport_options, 'acks_late': app.conf.task_acks_late, "
            "'reject': app.conf.task_reject_on_worker_lost, 'prefetch': app.conf.worker_prefetch_multiplier, "
            "'time_limit': app.conf.task_time_limit, 'soft': app.conf.task_soft_time_limit, "
            "'stale': s.TUNING_STALE_AFTER_S, 'node_stale': s.SCHEDULING_NODE_STALE_S, "
            "'retries': app.conf.broker_connection_max_retries}))")
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("CELERY_VISIBILITY_TIMEOUT",
                                                                          "CELERY_BROKER_URL")} | env
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_visibility_timeout_is_longer_than_the_longest_task():
    """With Redis, a message a worker took but has not acked comes back after `visibility_timeout`.
    It must be longer than the longest task, or a live task is delivered twice. The longest tasks are
    tuning runs and GPU jobs: no task time limit is configured, so the timeout (12 h) must exceed the
    time limits if anyone sets them, and every liveness window the recovery sweeps use. A tuning run
    that outlives even 12 h is still safe: the re-delivered message finds the run `running` with a fresh
    heartbeat and the lease refuses it (test_redelivered_tasks_for_live_work_are_no_ops)."""
    conf = _settings_under({"REDIS_URL": "redis://127.0.0.1:6379/0", "DATABASE_URL": "sqlite:////tmp/unused.db"})
    vt = conf["opts"]["visibility_timeout"]
    assert vt >= 12 * 3600
    assert conf["acks_late"] and conf["reject"] and conf["prefetch"] == 1
    assert conf["retries"] is None  # reconnect to the broker forever (see test_broker_faults)
    for limit in (conf["time_limit"], conf["soft"]):
        assert limit is None or vt > limit
    assert vt > 10 * max(conf["stale"], conf["node_stale"])
    # the embedded SQLite broker rejects the option, so it is only set for Redis
    assert _settings_under({"REDIS_URL": "", "DATABASE_URL": "sqlite:////tmp/unused.db"})["opts"] == {}


@pytest.mark.django_db
def test_redelivered_tasks_for_live_work_are_no_ops(model_a, user_owner):
    """What a premature re-delivery (a task longer than the visibility timeout) would do: nothing."""
    from scheduling import services as sched
    from tuning import services as tuning
    from tuning.models import TuningRun

    run = tuning.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    assert tuning.claim_run(run.pk, worker="first")  # live executor, fresh heartbeat
    assert tuning.claim_run(run.pk, worker="second") is None
    assert TuningRun.objects.get(pk=run.pk).worker == "first"
    assert tuning.execute_run(run_id=run.pk, worker="second") is None  # the task body: returns at once

    NodeFactory(name="livenode", gpus=2)
    job = GpuJobFactory(model=model_a)
    [placement] = sched.place_pending_jobs(policy="horus")
    assert sched.place_pending_jobs(policy="horus") == []  # a second pass places nothing
    assert sched.claim_job(job_id=job.pk, placement_id=placement.pk, worker="first")
    assert sched.claim_job(job_id=job.pk, placement_id=placement.pk, worker="second") is None
    assert GpuJob.objects.get(pk=job.pk).worker == "first"


# --- killing workers mid-task ------------------------------------------------------------------------------

def _pg() -> psycopg.Connection:
    return psycopg.connect(database_url_for_workers().replace("postgres://", "postgresql://", 1), autocommit=True)


def _my_backend() -> int:
    connection.ensure_connection()
    return connection.connection.info.backend_pid


def _parked(pg) -> bool:
    return pg.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()[0] > 0


def _install_trigger(table: str, when: str, condition: str) -> None:
    with connection.cursor() as c:
        c.execute(f"""
            CREATE OR REPLACE FUNCTION rel_park() RETURNS trigger AS $$
            BEGIN
              IF {condition} THEN PERFORM pg_advisory_xact_lock({LOCK_KEY}); END IF;
              RETURN NEW;
            END $$ LANGUAGE plpgsql""")
        c.execute(f"CREATE TRIGGER rel_park {when} ON {table} FOR EACH ROW EXECUTE FUNCTION rel_park()")


def _drop_trigger(table: str) -> None:
    with connection.cursor() as c:
        c.execute(f"DROP TRIGGER IF EXISTS rel_park ON {table}")
        c.execute("DROP FUNCTION IF EXISTS rel_park()")


def _wait_for_dead_backends(pg, keep: set[int]) -> None:
    """After the kill the worker's backend finishes its parked statement, finds its client gone and rolls
    back; make sure it is gone (terminate it if the server has not noticed yet)."""
    deadline = time.monotonic() + 15
    query = ("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> ALL(%s) "
             "AND state IN ('active', 'idle in transaction')")
    while time.monotonic() < deadline:
        if not pg.execute(query, [list(keep)]).fetchall():
            return
        time.sleep(0.2)
    for (pid,) in pg.execute(query, [list(keep)]).fetchall():
        pg.execute("SELECT pg_terminate_backend(%s)", [pid])


def _send(broker_url: str, name: str, args: list, queue: str) -> None:
    from config.celery import app

    with app.connection_for_write(broker_url) as conn:
        app.send_task(name, args=args, queue=queue, connection=conn)


def _queued_run_jobs(broker_url: str, node: str) -> list[tuple[int, int]]:
    import redis

    r = redis.Redis.from_url(broker_url)
    out = []
    for key in r.scan_iter(f"measure.{node}.gpu*"):
        for raw in r.lrange(key, 0, -1):
            msg = json.loads(raw)
            assert msg["headers"]["task"] == "scheduling.run_job"
            out.append(tuple(ast.literal_eval(msg["headers"]["argsrepr"])))
    return out


@pytest.fixture
def pg_only():
    if connection.vendor != "postgresql":
        pytest.skip("worker processes share the PostgreSQL test database (pass 1 of make test)")


@pytest.fixture
def pg(pg_only):
    conn = _pg()
    try:
        yield conn
    finally:
        conn.close()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_killed_mid_placement_then_restarted_places_each_job_once(pg, private_redis, model_a, tmp_path):
    NodeFactory(name="killnode", gpus=2)  # 2 GPUs whose queues measure.killnode.gpu0/1 are served
    jobs = [GpuJobFactory(model=model_a, predicted_util_pct=20.0, predicted_mem_mb=1000.0) for _ in range(3)]
    env = {"CELERY_VISIBILITY_TIMEOUT": VISIBILITY_S}
    keep = {pg.info.backend_pid, _my_backend()}
    # Park the 2nd job's placement INSERT: by then the pass has inserted the 1st job's placement and
    # marked it placed, in the same (uncommitted) transaction.
    _install_trigger("scheduling_placement", "BEFORE INSERT", f"NEW.job_id = {jobs[1].pk}")
    try:
        pg.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
        victim = start_worker(broker_url=private_redis.url, queues="default", log_dir=tmp_path, name="placer",
                              env_extra=env)
        try:
            _send(private_redis.url, "scheduling.place_pending", ["horus"], "default")
            delivered = time.monotonic()
            wait_for(lambda: _parked(pg), 60, "the placement pass to reach the 2nd job", victim.log)
        finally:
            victim.kill()  # SIGKILL, main process and children
        pg.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
        _wait_for_dead_backends(pg, keep)
    finally:
        _drop_trigger("scheduling_placement")
    # Nothing of the killed pass survived: the 1st job's placement was in the rolled-back transaction.
    assert not Placement.objects.exists()
    assert set(GpuJob.objects.values_list("state", flat=True)) == {"pending"}
    assert _queued_run_jobs(private_redis.url, "killnode") == []

    # Restart. The unacked message comes back once the visibility timeout has passed (acks_late); the
    # rescuer runs the pass again, and every job is placed exactly once.
    time.sleep(max(0.0, VISIBILITY_S + 0.5 - (time.monotonic() - delivered)))
    rescuer = start_worker(broker_url=private_redis.url, queues="default", log_dir=tmp_path, name="rescuer",
                           env_extra=env)
    try:
        wait_for(lambda: Placement.objects.count() >= 3, 60, "the re-delivered pass to place the jobs",
                 rescuer.log)
        _send(private_redis.url, "scheduling.place_pending", ["horus"], "default")  # and a duplicate pass
        passes = lambda: sum(1 for line in rescuer.log().splitlines()  # noqa: E731
                             if "scheduling.place_pending[" in line and " succeeded in " in line)
        wait_for(lambda: passes() >= 2, 30, "the re-delivered pass and the duplicate one", rescuer.log)
    finally:
        rescuer.stop()
    placements = list(Placement.objects.values_list("job_id", "released_at"))
    assert sorted(j for j, _ in placements) == sorted(j.pk for j in jobs)  # one each: never twice
    assert all(released is None for _, released in placements)
    assert set(GpuJob.objects.values_list("state", flat=True)) == {"placed"}
    sent = _queued_run_jobs(private_redis.url, "killnode")
    assert sorted(j for j, _ in sent) == sorted(j.pk for j in jobs)  # one run_job message per job


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_killed_mid_gpu_job_is_not_run_twice(pg, private_redis, model_a, tmp_path):
    from scheduling import services as sched

    NodeFactory(name="killnode", gpus=2)
    jobs = [GpuJobFactory(model=model_a, predicted_util_pct=20.0, predicted_mem_mb=1000.0) for _ in range(2)]
    placements = sched.place_pending_jobs(policy="horus")
    assert len(placements) == 2
    victim_job = placements[0].job_id
    env = {"CELERY_VISIBILITY_TIMEOUT": VISIBILITY_S, "DLOPT_NODE_NAME": "killnode"}
    queues = ",".join(sorted({p.queue for p in placements}))
    keep = {pg.info.backend_pid, _my_backend()}
    # Park the end of the first job (releasing its placement): it has been claimed (running, committed)
    # and its model has run (here: found no GPU) when the worker dies.
    _install_trigger("scheduling_placement", "BEFORE UPDATE",
                     f"NEW.job_id = {victim_job} AND NEW.released_at IS NOT NULL")
    try:
        pg.execute("SELECT pg_advisory_lock(%s)", [LOCK_KEY])
        victim = start_worker(broker_url=private_redis.url, queues=queues, log_dir=tmp_path, name="gpuvictim",
                              env_extra=env)
        try:
            for p in placements:
                _send(private_redis.url, "scheduling.run_job", [p.job_id, p.pk], p.queue)
            delivered = time.monotonic()
            wait_for(lambda: _parked(pg), 60, "the job to reach its end", victim.log)
        finally:
            victim.kill()
        pg.execute("SELECT pg_advisory_unlock(%s)", [LOCK_KEY])
        _wait_for_dead_backends(pg, keep)
    finally:
        _drop_trigger("scheduling_placement")
    job = GpuJob.objects.get(pk=victim_job)
    assert job.state == "running" and job.worker == victim.hostname  # its end was never written
    first_worker = job.worker

    time.sleep(max(0.0, VISIBILITY_S + 0.5 - (time.monotonic() - delivered)))
    rescuer = start_worker(broker_url=private_redis.url, queues=queues, log_dir=tmp_path, name="gpurescuer",
                           env_extra=env)
    try:
        wait_for(lambda: GpuJob.objects.filter(state__in=GpuJob.ACTIVE).count() == 0, 60,
                 "every job to reach a final state", rescuer.log)
    finally:
        rescuer.stop()
    job.refresh_from_db()
    # The re-delivered run_job did not run the job a second time ...
    assert job.worker == first_worker
    assert "nothing to do" in rescuer.log()
    # ... and the restarted GPU worker did not leave it "running" forever on a GPU nobody runs it on:
    assert job.state == "failed" and "restarted" in job.error
    assert not Placement.objects.filter(released_at__isnull=True).exists()
    # every other job ran once (here: on a machine with no GPU, it failed saying so)
    for other in GpuJob.objects.exclude(pk=victim_job):
        assert other.state == "failed" and "GPU" in other.error and other.worker, other.error
    assert Placement.objects.count() == len(jobs)
