"""measure_queues accepts only the CPU queues of registered, live nodes (GPU queues are placed as GPU
jobs, under the GPU-hour quota); errors and summaries shown to users carry no absolute server paths."""
from __future__ import annotations

import sys
import sysconfig
from datetime import timedelta

import pytest
from django.conf import settings as dj_settings
from django.utils import timezone

from scheduling.models import Node
from tests.factories import NodeFactory
from tuning import services
from tuning.models import TuningRun

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]


def _start(client, model, queues):
    return client.post("/api/runs/", {"model": model.pk, "max_trials": 8, "measure_queues": queues,
                                      "target": {"kind": "llvm", "num-cores": 2}}, format="json")


def test_live_node_cpu_queue_is_accepted(api_owner, model_a):
    NodeFactory(name="hosta")
    resp = _start(api_owner, model_a, ["measure.hosta.cpu"])
    assert resp.status_code == 201, resp.content
    assert TuningRun.objects.get(pk=resp.json()["id"]).options["measure_queues"] == ["measure.hosta.cpu"]


@pytest.mark.parametrize("queue,why", [
    ("measure.nobody.cpu", "not the CPU queue of a registered, live node"),  # no such node: nobody serves it
    ("measure.stale.cpu", "not the CPU queue of a registered, live node"),   # its node stopped heartbeating
    ("measure.drained.cpu", "not the CPU queue of a registered, live node"),
    ("measure.gpuhost.gpu0", "is a GPU queue"),                               # outside placement and quota
])
def test_unusable_queues_are_refused_naming_the_queue(api_owner, model_a, queue, why):
    NodeFactory(name="gpuhost", gpus=2)
    NodeFactory(name="stale")
    Node.objects.filter(name="stale").update(last_seen=timezone.now() - timedelta(days=1))
    NodeFactory(name="drained")
    Node.objects.filter(name="drained").update(drained=True)
    before = TuningRun.objects.count()
    resp = _start(api_owner, model_a, ["measure.gpuhost.cpu", queue])
    assert resp.status_code == 400, resp.content
    assert queue in resp.content.decode() and why in resp.content.decode()
    assert TuningRun.objects.count() == before  # nothing written


def test_user_visible_errors_and_summaries_have_no_absolute_paths(model_a, user_owner, monkeypatch):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    work = services.run_work_dir(run.pk)
    site = sysconfig.get_paths()["purelib"]
    traceback = (f'Traceback (most recent call last):\n  File "{site}/tvm/relax/frontend/onnx.py", line 9\n'
                 f'  File "{dj_settings.BASE_DIR}/tuning/engine/session.py", line 3\n'
                 f'  File "{sys.prefix}/lib/python3.11/json/decoder.py", line 1\n'
                 f"ValueError: cannot open {work}/database_tuning_record.json (see /opt/secret/build/x.log)")

    def failing_engine(sink, model_proto, config):
        raise ValueError(traceback)

    monkeypatch.setattr("tuning.adapters.run_engine", failing_engine)
    assert services.execute_run(run_id=run.pk, worker="t") == TuningRun.Status.FAILED
    run.refresh_from_db()
    for prefix in (str(work), site, str(dj_settings.BASE_DIR), sys.prefix, "/opt/secret", str(dj_settings.MEDIA_ROOT)):
        assert prefix not in run.error, run.error
    assert "./database_tuning_record.json" in run.error
    assert "<python>/tvm/relax/frontend/onnx.py" in run.error and "<app>/tuning/engine/session.py" in run.error
    assert "<path>/x.log" in run.error
    summary = services.public_json({"database_path": f"{work}/database_tuning_record.json",
                                    "sink_errors": [f"on_round(): OSError('{work}')"], "n": 3}, work)
    assert summary == {"database_path": "./database_tuning_record.json", "sink_errors": ["on_round(): OSError('.')"],
                       "n": 3}
    assert services.public_text("redis://127.0.0.1:6379/0 and http://x.org/a/b") == \
        "redis://127.0.0.1:6379/0 and http://x.org/a/b"
