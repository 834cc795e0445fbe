"""Remote measurement builds for the measuring node's CPU: nodes register their CPU as LLVM names it, a
run measured on their queues resolves its target to that CPU (not "generic"), and a measuring worker
refuses a candidate built for another CPU."""
from __future__ import annotations

import pytest

from scheduling import services as scheduling_services
from scheduling.telemetry import NvmlReading
from tests.factories import NodeFactory
from tuning import services
from tuning.engine.measuring.measure import measure_payload
from tuning.engine.compile.targets import host_cpu_facts, host_triple
from tuning.models import TuningRun

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

QUEUE = "measure.hosta.cpu"


def _other_cpu() -> str:
    return "skylake" if host_cpu_facts()["mcpu"] != "skylake" else "znver3"


def _run_on_remote_queue(model, actor, monkeypatch, queues=(QUEUE,)) -> TuningRun:
    seen = {}

    def engine_stops_at_once(sink, model_proto, config):
        seen["submit"] = config.distributed_submit
        seen["evaluator"] = config.evaluator
        raise RuntimeError("stop here")

    run = services.start_run(actor=actor, model=model, max_trials=8, threads=1, target={"kind": "llvm"},
                             options={"measure_queues": list(queues)}, enqueue=False)
    monkeypatch.setattr("tuning.adapters.run_engine", engine_stops_at_once)
    services.execute_run(run_id=run.pk, worker="t")
    run.refresh_from_db()
    run.seen_submit, run.seen_evaluator = seen.get("submit"), seen.get("evaluator")
    return run


def test_a_remote_run_builds_for_the_nodes_registered_cpu(model_a, user_owner, monkeypatch):
    NodeFactory(name="hosta", cpu_mcpu=_other_cpu(), cpu_triple=host_triple())
    run = _run_on_remote_queue(model_a, user_owner, monkeypatch)
    assert run.resolved_target["mcpu"] == _other_cpu() and run.resolved_target["mtriple"] == host_triple()
    # the candidates carry the target, so the measuring worker can check it
    assert run.seen_submit.keywords["target"] == run.resolved_target


def test_a_node_that_named_no_cpu_gets_portable_code(model_a, user_owner, monkeypatch):
    NodeFactory(name="hosta")
    assert _run_on_remote_queue(model_a, user_owner, monkeypatch).resolved_target["mcpu"] == "generic"


def test_a_remote_run_is_timed_cold_whatever_cache_its_nodes_registered(model_a, user_owner, monkeypatch):
    """Every CPU run's candidates are timed cold, measured here or on remote queues: nodes with a small, a
    large, an unknown and differing caches all get the cold evaluator, which the engine measures with."""
    from tuning.engine.measuring.timer import COLD_CPU_EVALUATOR, EvaluatorConfig

    NodeFactory(name="hosta")  # registered no cache size
    NodeFactory(name="hostb", cpu_llc_bytes=1 << 20)
    NodeFactory(name="hostc", cpu_llc_bytes=1 << 30)
    for queues in (["measure.hosta.cpu"], ["measure.hostb.cpu"], ["measure.hostc.cpu"],
                   ["measure.hostb.cpu", "measure.hostc.cpu"]):
        run = _run_on_remote_queue(model_a, user_owner, monkeypatch, queues=queues)
        assert run.evaluator["regime"] == "cold" and run.evaluator["why"], (queues, run.evaluator)
        assert run.seen_evaluator == COLD_CPU_EVALUATOR == EvaluatorConfig.from_any(run.evaluator), queues


def test_a_measuring_worker_refuses_a_candidate_built_for_another_cpu():
    payload = {"artifact_b64": "", "device_type": "cpu", "args_info": [], "queue": QUEUE,
               "target": {"kind": "llvm", "mcpu": _other_cpu(), "num-cores": 1}}
    outcome = measure_payload(payload)
    assert outcome["run_secs"] == []
    assert outcome["error"].startswith("TargetMismatch: the target was built for the CPU"), outcome


def test_registration_stores_the_nodes_cpu():
    reading = NvmlReading(available=False, error="no driver", driver_version="", gpus=[])
    node = scheduling_services.register_node(name="hostc", reading=reading, cpu_mcpu="znver3",
                                             cpu_triple="x86_64-unknown-linux-gnu")
    assert (node.cpu_mcpu, node.cpu_triple) == ("znver3", "x86_64-unknown-linux-gnu")
    # a later registration that names no CPU keeps the one known
    node = scheduling_services.register_node(name="hostc", reading=reading)
    assert node.cpu_mcpu == "znver3"
    node = scheduling_services.register_node(name="hostc", reading=reading, cpu_llc_bytes=32 << 20)
    assert node.cpu_llc_bytes == 32 << 20
    assert scheduling_services.register_node(name="hostc", reading=reading).cpu_llc_bytes == 32 << 20


def test_a_heartbeat_registers_this_hosts_cpu():
    scheduling_services.record_heartbeat(node_name="hostd", nvml=None)
    from scheduling.models import Node
    from tuning.engine.measuring.timer import host_llc_bytes

    node = Node.objects.get(name="hostd")
    assert node.cpu_mcpu == host_cpu_facts()["mcpu"] and node.cpu_triple == host_triple()
    assert node.cpu_llc_bytes == host_llc_bytes()


def test_a_heartbeat_from_a_host_whose_cache_reads_oddly_still_registers(monkeypatch):
    monkeypatch.setattr("scheduling.services.nodes.host_llc_bytes", lambda: 512)  # a sysfs gone wrong
    scheduling_services.record_heartbeat(node_name="hoste", nvml=None)
    from scheduling.models import Node

    assert Node.objects.get(name="hoste").cpu_llc_bytes is None  # registered, size unknown
