"""The closed target schema in the engine: what a user may set is an explicit list, everything else TVM's
target kinds accept is refused (the list is TVM's own, so an attribute a future TVM adds is refused by
default), and every path that turns a dict into a TVM target checks it first."""

import base64
import json

import pytest

from tuning.engine.compile import targets as tg
from tuning.engine.records.check import RecordError, precheck
from tuning.engine.compile.pipeline import make_target

KNOWN = {"znver3": "x86_64-pc-linux-gnu"}


def _tvm_attributes() -> list[tuple[str, str, str]]:
    """(kind, attribute, TVM's type name) of every attribute TVM's llvm and cuda kinds accept."""
    from tvm.target import TargetKind

    return [(kind, key, type_name) for kind in tg.TARGET_KINDS
            for key, type_name in sorted(TargetKind.options_from_name(kind).items())]


def sample_value(type_name: str):
    """A well-typed value for a TVM attribute, so it is refused for its key and not for its value."""
    return {"str": "x", "int": 1, "bool": True, "Array<str>": ["x"], "target.Target": {"kind": "llvm"}}.get(
        type_name, "x")


FOREIGN = [(kind, key, type_name) for kind, key, type_name in _tvm_attributes()
           if key not in tg.USER_FIELDS[kind]]


def test_the_foreign_list_is_tvms_own():
    """The refusal list is derived: it holds the attributes the attack used and the allow-list does not grow
    with TVM."""
    keys = {key for _, key, _ in FOREIGN}
    assert {"cl-opt", "mattr", "libs", "host", "mtriple", "tag", "keys", "device", "model", "jit"} <= keys
    assert ("cuda", "mcpu") in {(k, key) for k, key, _ in FOREIGN}
    assert not keys & {"kind", "num-cores", "arch"}


@pytest.mark.parametrize("kind,key,type_name", FOREIGN, ids=[f"{k}-{key}" for k, key, _ in FOREIGN])
def test_every_other_tvm_attribute_is_refused_naming_it(kind, key, type_name):
    fields = {"kind": kind, key: sample_value(type_name)}
    with pytest.raises(tg.TargetRefused) as exc:
        tg.build_target(fields, cpus=KNOWN)
    assert exc.value.key == key and repr(key) in str(exc.value)


def test_the_builder_writes_only_the_schema():
    assert tg.build_target({"kind": "llvm"}, default_cores=2) == {"kind": "llvm", "num-cores": 2}
    assert tg.build_target("llvm", default_cores=3) == {"kind": "llvm", "num-cores": 3}
    # a registered CPU brings its registered triple; the user never writes one
    assert tg.build_target({"kind": "llvm", "mcpu": "znver3", "num-cores": 4}, cpus=KNOWN) == {
        "kind": "llvm", "num-cores": 4, "mcpu": "znver3", "mtriple": "x86_64-pc-linux-gnu"}
    assert tg.build_target({"kind": "llvm", "mcpu": "generic"}, default_cores=1)["mcpu"] == "generic"
    assert tg.build_target({"kind": "cuda", "arch": "sm_90a"}) == {"kind": "cuda", "arch": "sm_90a"}
    assert tg.build_target({"kind": "cuda"}) == {"kind": "cuda"}


@pytest.mark.parametrize("fields,key", [
    ({"kind": "llvm", "mcpu": "skylake"}, "mcpu"),  # not a registered CPU
    ({"kind": "llvm", "mcpu": "znver3 -mattr=+x"}, "mcpu"),
    ({"kind": "llvm", "mcpu": 7}, "mcpu"),
    ({"kind": "llvm", "mcpu": "z" * 5000}, "mcpu"),
    ({"kind": "llvm", "num-cores": 10**9}, "num-cores"),
    ({"kind": "llvm", "num-cores": 0}, "num-cores"),
    ({"kind": "llvm", "num-cores": True}, "num-cores"),
    ({"kind": "llvm", "num-cores": "2"}, "num-cores"),
    ({"kind": "llvm", "num-cores": 3}, "num-cores"),  # above this call's max_cores
    ({"kind": "cuda", "arch": "sm_90 -cl-opt"}, "arch"),
    ({"kind": "cuda", "arch": "compute_90"}, "arch"),
    ({"kind": "c"}, "kind"), ({"kind": "hexagon"}, "kind"), ({"kind": "ext_dev"}, "kind"), ({"kind": ["llvm"]}, "kind"),
    ({}, "kind"),
    ({"kind": "llvm", "host": {"kind": "llvm"}}, "host"),
    ({"kind": "cuda", "host": "llvm"}, "host"),
    ({"kind": "llvm", "CL-OPT": ["x"]}, "CL-OPT"),
])
def test_bad_fields_are_refused_naming_the_key(fields, key):
    with pytest.raises(tg.TargetRefused) as exc:
        tg.build_target(fields, cpus=KNOWN, max_cores=2)
    assert exc.value.key == key, str(exc.value)


@pytest.mark.parametrize("target", ["llvm -mcpu=znver3 -cl-opt=-load=/tmp/x.so", "nvidia/nvidia-h100", "[1]", 3,
                                    ["kind", "llvm"], '{"kind": "llvm", "cl-opt": ["x"]}'])
def test_strings_of_options_and_non_objects_are_refused(target):
    with pytest.raises(tg.TargetRefused):
        tg.build_target(target)


def test_check_target_accepts_what_the_platform_writes_and_nothing_else():
    resolved = tg.resolve_cpu_target(num_cores=1)
    assert tg.check_target(resolved) == resolved
    assert tg.check_target(tg.canonical_key(resolved)) == json.loads(tg.canonical_key(resolved))
    cuda = tg.resolve_cuda_target(arch="sm_90")
    assert tg.check_target(cuda) == cuda
    assert tg.check_target(tg.canonical_key(cuda))["arch"] == "sm_90"  # TVM's filled-in GPU limits pass
    for bad, key in [(dict(resolved, **{"cl-opt": ["-x"]}), "cl-opt"), (dict(resolved, mtriple="x86_64 -x"), "mtriple"),
                     (dict(cuda, host={"kind": "llvm", "mattr": ["+x"]}), "host.mattr"),
                     (dict(cuda, host={"kind": "cuda"}), "host.kind"),
                     (dict(cuda, host={"kind": "llvm", "host": {"kind": "llvm"}}), "host.host"),
                     (dict(cuda, max_threads_per_block="1024"), "max_threads_per_block")]:
        with pytest.raises(tg.TargetRefused) as exc:
            tg.check_target(bad)
        assert exc.value.key == key


def test_tvm_never_parses_a_foreign_key():
    """Every dict the engine turns into a TVM target goes through make_target, which checks first: TVM's
    own Target constructor is not reached."""
    import tvm

    calls = []
    real = tvm.target.Target

    class Spy(real):
        def __init__(self, *args, **kwargs):
            calls.append(args)
            super().__init__(*args, **kwargs)

    hostile = {"kind": "llvm", "num-cores": 1, "cl-opt": ["-load=/tmp/evil.so"]}
    tvm.target.Target = Spy
    try:
        for call in (make_target, tg.canonical_key, tg.check_measurable_here,
                     lambda t: tg.resolve_run_target(t, threads=1)):
            with pytest.raises(tg.TargetRefused, match="cl-opt"):
                call(hostile)
        with pytest.raises(tg.TargetRefused, match="libs"):
            make_target(json.dumps({"kind": "llvm", "libs": ["/tmp/evil.so"]}))
        assert calls == []
        make_target({"kind": "llvm", "num-cores": 1})
        assert len(calls) == 1  # the spy sees a real construction
    finally:
        tvm.target.Target = real


def test_a_measuring_worker_refuses_a_foreign_key_before_tvm():
    from tuning.engine.measuring.measure import measure_payload

    payload = {"artifact_b64": "", "device_type": "cpu", "args_info": [], "queue": "measure.x.cpu",
               "target": {"kind": "llvm", "num-cores": 1, "cl-opt": ["-load=/tmp/evil.so"]}}
    outcome = measure_payload(payload)
    assert outcome["run_secs"] == [] and outcome["error"].startswith("TargetRefused: target['cl-opt']"), outcome
    assert tg.measurable_refusal("llvm -mattr=+avx512f").startswith("TargetRefused")


def _workload_line(graph: dict) -> bytes:
    raw = json.dumps(graph).encode()
    return json.dumps(["1", base64.b64encode(len(raw).to_bytes(8, "little") + raw).decode()]).encode() + b"\n"


RECORD = b'[0, [[[["GetSBlock", [], ["root", "main"], ["b0"]]], []], null, null, null]]\n'


def test_an_imported_workload_carrying_a_target_is_refused_before_tvm():
    """A workload is TVM's JSON graph of the task module; a target node in it would be built from
    unchecked attributes. The pure-Python precheck refuses it (and anything not in TVM's encoding)."""
    target_node = {"nodes": [{"type": "target.TargetKind", "data": "llvm"},
                             {"type": "target.Target", "data": {"kind": 0}}], "root_index": 1}
    with pytest.raises(RecordError, match="target.TargetKind"):
        precheck(_workload_line(target_node), RECORD, max_records=4)
    with pytest.raises(RecordError, match="not TVM's encoding"):
        precheck(b'["1", "not base64!"]\n', RECORD, max_records=4)
    wl, recs = precheck(_workload_line({"nodes": [{"type": "ir.IRModule", "data": {}}], "root_index": 0}), RECORD,
                        max_records=4)
    assert len(wl) == len(recs) == 1


def test_an_imported_record_keeps_its_trace_only():
    """A record's own target, run times and argument info never reach TVM's parser."""
    from tuning.engine.records.check import trace_only

    body = [[[], []], [1e-3], {"kind": "llvm", "cl-opt": ["-load=/tmp/evil.so"]}, [["TENSOR", "float32", [1]]]]
    assert trace_only(body) == [[[], []], None, None, None]
