"""A Celery task round trip through a real worker process on real Redis."""
from __future__ import annotations

import os

import pytest

from tests.helpers import require_env
from tests.workers import running_worker

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_ping_round_trip_through_real_worker(tmp_path, settings):
    redis_url = require_env("TEST_REDIS_URL")
    from config.celery import app
    from core.tasks import ping

    app.conf.broker_url = redis_url
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("default")
    with running_worker(broker_url=redis_url, queues="default", log_dir=tmp_path) as worker:
        result = ping.apply_async(args=["hello"], queue="default")
        reply = result.get(timeout=60)
    assert reply["reply"] == "hello"
    # Executed by the worker process (solo pool: the worker's main process), not by us.
    assert reply["worker_pid"] == worker.pid != os.getpid()
    from django_celery_results.models import TaskResult

    assert TaskResult.objects.get(task_id=result.id).status == "SUCCESS"
