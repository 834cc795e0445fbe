"""Redis stopped and restarted under a running worker and a running web app.

A private redis-server (free port, temp dir, AOF on as in docker-compose.yml) so that killing it
disturbs nobody else's tests.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest
import redis as redis_lib

from tests.workers import running_worker, wait_for


pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@contextmanager
def web_broker(url: str):
    """Point this (web) process's Celery producer at `url`."""
    from config.celery import app

    old = app.conf.broker_url

    def reset(to):
        app.conf.broker_url = to
        app._pool = None
        app.amqp._producer_pool = None

    reset(url)
    try:
        yield app
    finally:
        reset(old)


def _ping(app, url: str, payload: str):
    from core.tasks import ping

    with app.connection_for_write(url) as conn:
        return ping.apply_async(args=[payload], queue="default", connection=conn)


def test_worker_reconnects_after_redis_restart_and_queued_messages_survive(aof_redis, tmp_path):
    from celery.result import AsyncResult

    url = aof_redis.url
    with web_broker(url) as app:
        # A message queued while no worker runs survives a Redis restart (AOF, as deployed).
        early = _ping(app, url, "queued-before-restart")
        time.sleep(1.2)  # appendfsync everysec
        aof_redis.kill()
        aof_redis.start()
        with running_worker(broker_url=url, queues="default", log_dir=tmp_path, name="reconnect") as worker:
            assert AsyncResult(early.id).get(timeout=60)["reply"] == "queued-before-restart"
            first = _ping(app, url, "before").get(timeout=60)
            assert first["worker_pid"] == worker.pid

            aof_redis.kill()  # the broker dies under the worker ...
            wait_for(lambda: "lost" in worker.log().lower() or "Cannot connect" in worker.log()
                     or "Error" in worker.log(), 30, "the worker to notice", worker.log)
            time.sleep(2)
            assert worker.proc.poll() is None  # ... which keeps running, retrying
            aof_redis.start()  # ... and comes back on the same port
            # no manual action: new tasks are processed by the same worker process
            after = _ping(app, url, "after")
            reply = after.get(timeout=90)
            assert reply["reply"] == "after" and reply["worker_pid"] == worker.pid
            burst = [_ping(app, url, f"n{i}") for i in range(20)]
            assert [r.get(timeout=60)["reply"] for r in burst] == [f"n{i}" for i in range(20)]
            log = worker.log()
    assert "Connected to redis" in log and log.count("Connected to redis") >= 2, log[-3000:]


def test_api_stays_up_while_the_broker_is_down(aof_redis, user_owner, team_a, small_cnn_bytes, settings):
    """Requests that enqueue work while Redis is down must not 500 (the row is committed by then); the
    work is marked so the user knows, and reads keep working."""
    from rest_framework.test import APIClient

    from core import services as core_services
    from core.models import Quota
    from scheduling.models import SimulationRun
    from tuning.models import TuningRun

    model = core_services.register_model(team=team_a, name="m", data=small_cnn_bytes, filename="m.onnx",
                                         actor=user_owner)
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=10)
    from scheduling import services as sched

    sched.train_predictor(actor=None, k_folds=2, xgb_params={"n_estimators": 10})
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {core_services.create_api_token(user=user_owner, name='t').key}")
    with web_broker(aof_redis.url):
        aof_redis.kill()
        started = time.monotonic()
        resp = api.post("/api/runs/", {"model": model.pk, "max_trials": 8}, format="json")
        assert resp.status_code == 201, resp.content[:300]
        assert time.monotonic() - started < 30  # the publish retries are bounded
        run = TuningRun.objects.get(pk=resp.json()["id"])
        # not queued (no message exists), not lost: paused with the reason, resumable
        assert run.status == "paused" and "broker" in run.error.lower()
        assert resp.json()["status"] == "paused" and resp.json()["error"] == run.error
        resp = api.post("/api/simulations/", {"team": team_a.pk, "trace": "philly", "policies": ["horus"],
                                              "parameters": {"jobs": 20, "gpus": 4}}, format="json")
        assert resp.status_code == 201, resp.content[:300]
        sim = SimulationRun.objects.get(pk=resp.json()["id"])
        assert sim.status == "failed" and "broker" in sim.error.lower() and resp.json()["status"] == "failed"
        resp = api.post("/api/gpu-jobs/", {"model": model.pk, "batch_size": 8, "duration_estimate_s": 60},
                        format="json")
        assert resp.status_code == 201 and resp.json()["state"] == "pending"  # the heartbeat's pass places it
        for url in ("/api/runs/", f"/api/runs/{run.pk}/", "/api/models/", "/api/simulations/", "/api/me/"):
            assert api.get(url).status_code == 200, url
        # once Redis is back: resume the paused run, start another; both are queued as usual
        aof_redis.start()
        resp = api.post(f"/api/runs/{run.pk}/resume/", format="json")
        assert resp.status_code == 200 and resp.json()["status"] == "queued" and resp.json()["error"] == ""
        resp = api.post("/api/runs/", {"model": model.pk, "max_trials": 8}, format="json")
        assert resp.status_code == 201 and resp.json()["status"] == "queued"
        queued = [json.loads(m)["headers"]["argsrepr"] for m in
                  redis_lib.Redis.from_url(aof_redis.url).lrange("tuning", 0, -1)]
        assert sorted(queued) == sorted([f"({run.pk},)", f"({resp.json()['id']},)"])
