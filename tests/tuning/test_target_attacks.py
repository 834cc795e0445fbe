"""Issue 39, item 1: a run's target was free JSON, and TVM's llvm kind hands attributes such as ``cl-opt``
and ``mattr`` to LLVM as process-wide options (LLVM has options that load a library or run a program).
The platform now builds the target from a closed set of fields; every other key is a 400 naming it with
nothing stored, on every entry point (API, dashboard, ``manage.py tune``, the record-cache import), and
the worker checks a stored row again before anything reaches TVM."""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from scheduling import services as scheduling_services
from scheduling.telemetry import NvmlReading
from tests.factories import NodeFactory
from tuning import services
from tuning.engine.compile.targets import USER_FIELDS, host_triple
from tuning.models import TuningRun

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

EVIL_OPT = "-load=/tmp/evil.so"


def _tvm_foreign_attributes() -> list[tuple[str, str, str]]:
    """(kind, attribute, TVM's type) for every attribute TVM's llvm and cuda kinds accept that a user may
    not set: TVM's own list, so an attribute a future TVM adds is refused without a change here."""
    from tvm.target import TargetKind

    return [(kind, key, type_name) for kind in USER_FIELDS
            for key, type_name in sorted(TargetKind.options_from_name(kind).items())
            if key not in USER_FIELDS[kind]]


FOREIGN = _tvm_foreign_attributes()
SAMPLES = {"str": "x", "int": 1, "bool": True, "Array<str>": [EVIL_OPT], "target.Target": {"kind": "llvm"}}


def _start(client, model, target):
    return client.post("/api/runs/", {"model": model.pk, "max_trials": 16, "target": target}, format="json")


def _assert_refused(resp, key: str) -> None:
    assert resp.status_code == 400, resp.content[:400]
    body = resp.json()
    assert "target" in body["errors"], body
    assert f"'{key}'" in json.dumps(body["errors"]["target"]), body
    assert TuningRun.objects.count() == 0


@pytest.mark.parametrize("kind,key,type_name", FOREIGN, ids=[f"{k}-{key}" for k, key, _ in FOREIGN])
def test_every_tvm_attribute_outside_the_schema_is_a_400_naming_it(api_owner, model_a, kind, key, type_name):
    _assert_refused(_start(api_owner, model_a, {"kind": kind, key: SAMPLES.get(type_name, "x")}), key)


@pytest.mark.parametrize("target,key", [
    ({"kind": "llvm", "cl-opt": [EVIL_OPT]}, "cl-opt"),
    ({"kind": "llvm", "mattr": ["+avx2", EVIL_OPT]}, "mattr"),
    ({"kind": "llvm", "libs": ["/tmp/evil.so"]}, "libs"),
    ({"kind": "llvm", "tag": "nvidia/nvidia-h100"}, "tag"),
    ({"kind": "llvm", "keys": ["cpu"]}, "keys"),
    ({"kind": "llvm", "mtriple": "x86_64-pc-linux-gnu"}, "mtriple"),
    ({"kind": "llvm", "mcpu": "skylake"}, "mcpu"),  # no registered node reports it
    ({"kind": "llvm", "mcpu": "-load=/tmp/evil.so"}, "mcpu"),
    ({"kind": "llvm", "mcpu": ["znver3"]}, "mcpu"),
    ({"kind": "llvm", "host": {"kind": "llvm", "cl-opt": [EVIL_OPT]}}, "host"),
    ({"kind": "cuda", "host": {"kind": "llvm"}}, "host"),
    ({"kind": "cuda", "host": "llvm -cl-opt=-load=/tmp/evil.so"}, "host"),
    ({"kind": "llvm", "device": "mali"}, "device"),
    ({"kind": "cuda", "model": "h100"}, "model"),
    ({"kind": "cuda", "arch": "sm_90 -cl-opt"}, "arch"),
    ({"kind": "cuda", "arch": "x" * 10_000}, "arch"),
    ({"kind": "c"}, "kind"),
    ({"kind": "hexagon"}, "kind"),
    ({"kind": "ext_dev"}, "kind"),
    ({"kind": "llvm", "num-cores": 10**12}, "num-cores"),
    ({"kind": "llvm", "num-cores": "2"}, "num-cores"),
    ({"kind": "llvm", "max-threads-per-block": 64}, "max-threads-per-block"),
])
def test_attack_targets_are_400_naming_the_key_and_store_nothing(api_owner, model_a, target, key):
    _assert_refused(_start(api_owner, model_a, target), key)


@pytest.mark.parametrize("target", ["llvm -mcpu=znver3 -cl-opt=-load=/tmp/evil.so", "llvm -mattr=+avx2",
                                    "nvidia/nvidia-h100", ["llvm"], 7])
def test_a_string_of_options_is_refused(api_owner, model_a, target):
    resp = _start(api_owner, model_a, target)
    assert resp.status_code == 400 and "target" in resp.json()["errors"], resp.content[:400]
    assert TuningRun.objects.count() == 0


def test_num_cores_is_bounded_by_the_machines_here(api_owner, model_a):
    limit = services.target_core_limit()
    _assert_refused(_start(api_owner, model_a, {"kind": "llvm", "num-cores": limit + 1}), "num-cores")
    NodeFactory(name="big", cpu_cores=limit + 8)  # a registered node with more cores raises the bound
    assert _start(api_owner, model_a, {"kind": "llvm", "num-cores": limit + 1}).status_code == 201


def test_the_schema_accepts_what_a_user_may_set(api_owner, model_a, team_a):
    from core.models import Quota

    Quota.objects.filter(team=team_a).update(max_concurrent_runs=20)
    NodeFactory(name="zen", cpu_mcpu="znver3", cpu_triple="x86_64-pc-linux-gnu")
    body = _start(api_owner, model_a, {"kind": "llvm", "num-cores": 2, "mcpu": "znver3"}).json()
    # the triple is the node's registration, never the user's
    assert body["target"] == {"kind": "llvm", "num-cores": 2, "mcpu": "znver3", "mtriple": "x86_64-pc-linux-gnu"}
    assert _start(api_owner, model_a, {"kind": "cuda", "arch": "sm_90"}).json()["target"] == {
        "kind": "cuda", "arch": "sm_90"}
    assert _start(api_owner, model_a, "llvm").json()["target"]["kind"] == "llvm"


def _spy_on_engine_children(monkeypatch) -> list:
    """Record every sandboxed child the worker starts (the only way TVM is reached from it); calls pass
    through unchanged."""
    from tuning.adapters import engine as adapter_engine
    from tuning.engine.process import procpool

    calls: list = []
    real_isolated, real_pool = adapter_engine.call_isolated, procpool.run_isolated

    def isolated(func, *args, **kwargs):
        calls.append(func)
        return real_isolated(func, *args, **kwargs)

    def pooled(func, *args, **kwargs):
        calls.append(func)
        return real_pool(func, *args, **kwargs)

    monkeypatch.setattr(adapter_engine, "call_isolated", isolated)
    monkeypatch.setattr(procpool, "run_isolated", pooled)
    return calls


@pytest.mark.parametrize("stored,field,key", [
    ({"kind": "llvm", "num-cores": 1, "cl-opt": [EVIL_OPT]}, "target", "cl-opt"),
    ({"kind": "llvm", "num-cores": 1, "mcpu": "znver3 -mattr=+x"}, "target", "mcpu"),
    ({"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm", "mattr": ["+x"]}}, "target", "host.mattr"),
    ({"kind": "llvm", "num-cores": 1, "mtriple": "x86_64-pc-linux-gnu", "libs": ["/tmp/evil.so"]},
     "resolved_target", "libs"),
])
def test_a_stored_row_with_a_foreign_key_fails_before_tvm(model_a, user_owner, monkeypatch, stored, field, key):
    """A row written before the schema was closed (or around the API): the executing worker refuses it
    with the key named, and no engine child (TVM) is started for it."""
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, threads=1,
                             target={"kind": "llvm", "num-cores": 1}, enqueue=False)
    TuningRun.objects.filter(pk=run.pk).update(**{field: stored})
    calls = _spy_on_engine_children(monkeypatch)
    assert services.execute_run(run_id=run.pk, worker="t") == TuningRun.Status.FAILED
    run.refresh_from_db()
    assert f"target['{key}']" in run.error and "refused before it reached TVM" in run.error, run.error
    assert calls == []
    if field == "target":
        assert run.resolved_target is None


def test_the_tune_command_refuses_a_foreign_key(model_a):
    target = json.dumps({"kind": "llvm", "num-cores": 1, "cl-opt": [EVIL_OPT]})
    with pytest.raises(CommandError, match="cl-opt"):
        call_command("tune", str(model_a.pk), "--trials", "8", "--target", target, "--no-progress",
                     stdout=io.StringIO(), stderr=io.StringIO())
    assert TuningRun.objects.count() == 0


def test_the_dashboard_form_builds_only_the_schema(client, user_owner, model_a):
    """The start form has no field for anything but kind and cores; extra posted keys are ignored, and cores
    beyond the machines here are refused by the same builder."""
    client.force_login(user_owner)
    data = {"model": model_a.pk, "target_kind": "llvm", "num_cores": services.target_core_limit() + 1,
            "max_trials": 16, "trials_per_round": 8, "measurement_mode": "doppler", "dop_mode": "auto",
            "dop_fixed": "", "threads": "", "search_population": "", "seed": "", "cl-opt": EVIL_OPT,
            "mcpu": "skylake", "target": json.dumps({"kind": "llvm", "cl-opt": [EVIL_OPT]})}
    html = client.post("/runs/new/", data).content.decode()
    assert "num-cores" in html and TuningRun.objects.count() == 0
    client.post("/runs/new/", {**data, "num_cores": 1})
    run = TuningRun.objects.get()
    assert run.target == {"kind": "llvm", "num-cores": 1}


def test_node_registration_refuses_names_llvm_could_read_as_options():
    reading = NvmlReading(available=False, error="no driver", driver_version="", gpus=[])
    from core.exceptions import ServiceError

    for fields, field in [({"cpu_mcpu": "-load=/tmp/evil.so"}, "cpu_mcpu"), ({"cpu_mcpu": "znver3 +avx"}, "cpu_mcpu"),
                          ({"cpu_triple": "x86_64 -cl-opt"}, "cpu_triple")]:
        with pytest.raises(ServiceError) as exc:
            scheduling_services.register_node(name="hostile", reading=reading, **fields)
        assert exc.value.field == field
    node = scheduling_services.register_node(name="fine", reading=reading, cpu_mcpu="znver3",
                                             cpu_triple=host_triple())
    assert node.cpu_mcpu == "znver3"


def test_node_registration_refuses_a_cache_size_that_is_not_one():
    """The size decides how the node's runs are timed: only a whole number of bytes in a cache's range."""
    from core.exceptions import ServiceError
    from scheduling.models import Node

    reading = NvmlReading(available=False, error="no driver", driver_version="", gpus=[])
    for hostile in (-1, 0, 1 << 50, True, 3.5, "32M", [1 << 20]):
        with pytest.raises(ServiceError) as exc:
            scheduling_services.register_node(name="hostile", reading=reading, cpu_llc_bytes=hostile)
        assert exc.value.field == "cpu_llc_bytes"
    assert not Node.objects.filter(name="hostile").exists()  # nothing half-written


def test_a_node_row_written_around_registration_is_not_a_known_cpu(api_owner, model_a):
    """A row whose triple LLVM could read as options does not make its CPU one a target may name."""
    NodeFactory(name="forged", cpu_mcpu="znver3", cpu_triple="x86_64 -cl-opt=-load=/tmp/evil.so")
    _assert_refused(_start(api_owner, model_a, {"kind": "llvm", "mcpu": "znver3"}), "mcpu")


def test_a_measuring_task_refuses_a_foreign_key():
    """The Celery task a measuring worker runs receives the target in its message; it refuses it unparsed."""
    from tuning.tasks import measure_candidate

    payload = {"artifact_b64": "", "device_type": "cpu", "args_info": [], "queue": "measure.x.cpu",
               "target": {"kind": "llvm", "num-cores": 1, "cl-opt": [EVIL_OPT]}}
    outcome = measure_candidate.run(payload)
    assert outcome["run_secs"] == [] and "TargetRefused: target['cl-opt']" in outcome["error"], outcome


def test_the_record_cache_import_refuses_a_foreign_key(user_staff):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from recordcache.models import CacheEntry
    from tests.helpers import client_for

    staff = client_for(user_staff)
    for target, key in [({"kind": "llvm", "cl-opt": [EVIL_OPT]}, "cl-opt"), ({"kind": "llvm", "mcpu": "skylake"},
                                                                              "mcpu")]:
        body = {"workloads": SimpleUploadedFile("w.json", b"{}\n"), "records": SimpleUploadedFile("r.json", b"[]\n"),
                "target": json.dumps(target), "hardware": "h", "tvm_version": "v"}
        r = staff.post("/api/record-cache/import/", body, format="multipart")
        assert r.status_code == 400 and f"'{key}'" in json.dumps(r.json()["errors"]), r.content[:300]
    assert not CacheEntry.objects.exists()
