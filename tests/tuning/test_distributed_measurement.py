"""Distributed measurement end to end: a tuning worker sends candidates to two measuring workers, each
serving its own node's `measure.<node>.cpu` queue; and a run whose measurements all get lost fails."""
from __future__ import annotations

import pytest

from core import services as core_services
from tests.factories import NodeFactory
from tests.helpers import require_env
from tests.tuning.onnx_builders import tiny_dense
from tests.workers import running_worker, wait_for
from tuning import services
from tuning.models import Measurement, TuningRun

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TINY = {"search_population": 16, "genetic_num_iters": 1, "seed": 1,
        "evaluator": {"number": 2, "repeat": 1, "min_repeat_ms": 1}}
QUEUES = ["measure.hosta.cpu", "measure.hostb.cpu"]


@pytest.fixture
def redis_url():
    url = require_env("TEST_REDIS_URL")
    from config.celery import app

    with app.connection_for_write() as conn:
        for queue in ("tuning", *QUEUES):
            conn.default_channel.queue_purge(queue)
    return url


def _run(team, actor, options):
    model = core_services.register_model(team=team, name="tiny", data=tiny_dense(), filename="tiny.onnx",
                                         actor=actor)
    return services.start_run(actor=actor, model=model, max_trials=8, trials_per_round=4,
                              target={"kind": "llvm", "num-cores": 1}, options=options)


def _ended(run):
    return lambda: (r := TuningRun.objects.get(pk=run.pk)).status in TuningRun.TERMINAL and r


def test_candidates_are_measured_on_two_remote_workers(redis_url, team_a, user_owner, tmp_path,
                                                       django_capture_on_commit_callbacks):
    for node in ("hosta", "hostb"):
        NodeFactory(name=node)
    with running_worker(broker_url=redis_url, queues=QUEUES[0], log_dir=tmp_path, name="ma") as ma, \
            running_worker(broker_url=redis_url, queues=QUEUES[1], log_dir=tmp_path, name="mb") as mb, \
            running_worker(broker_url=redis_url, queues="tuning", log_dir=tmp_path, name="tuner") as tuner:
        with django_capture_on_commit_callbacks(execute=True):
            run = _run(team_a, user_owner, {**TINY, "measure_queues": QUEUES})
        run = wait_for(_ended(run), 300, "the run to end", tuner.log, interval=0.5)
        assert run.status == "succeeded", run.error
        for worker in (ma, mb):  # each remote worker measured candidates
            assert "tuning.measure_candidate[" in worker.log() and " succeeded in " in worker.log()
        assert "Never call result.get()" not in tuner.log()
    measured = Measurement.objects.filter(run=run)
    assert measured.count() == run.trials_done > 0
    assert measured.filter(error="", latency_s__gt=0).exists()
    assert not measured.filter(error__contains="infrastructure").exists(), list(measured.values_list("error"))


def test_run_whose_measurements_are_all_lost_fails_clearly(redis_url, team_a, user_owner, tmp_path,
                                                         django_capture_on_commit_callbacks):
    # Both nodes are registered and live, but no worker serves their queues (their workers are gone).
    for node in ("hosta", "hostb"):
        NodeFactory(name=node)
    env = {"TUNING_MEASURE_QUEUE_TIMEOUT_S": 3}
    with running_worker(broker_url=redis_url, queues="tuning", log_dir=tmp_path, name="tuner",
                        env_extra=env) as tuner:
        with django_capture_on_commit_callbacks(execute=True):
            run = _run(team_a, user_owner, {**TINY, "measure_queues": QUEUES})
        run = wait_for(_ended(run), 300, "the run to end", tuner.log, interval=0.5)
    assert run.status == "failed"
    assert "No measurement succeeded" in run.error and "no worker took the measurement in 3 s" in run.error, \
        run.error
    assert set(Measurement.objects.filter(run=run).values_list("error", flat=True)) <= {
        f"run: infrastructure: {q}: no worker took the measurement in 3 s" for q in QUEUES}
