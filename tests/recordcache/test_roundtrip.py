"""Export the cache as a TVM JSON database and import it back as staff: TVM checks it in a sandbox, the
entries land pending (no time, never a verified hit); a hostile record is refused, nothing written."""
from __future__ import annotations

import io
import json
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from recordcache import adapters, selectors, services
from recordcache.models import CacheEntry
from tests.factories import TuningRunFactory
from tests.helpers import client_for
from tuning.engine.compile.passes import pipeline_key
from tuning.engine.compile.targets import canonical_key
from tuning.engine.testing import design_space_database, matmul_primfunc, tuning_database

from .cachedata import final_entries, give_final_database, opt_in

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def _upload(client, workloads: bytes, records: bytes, target):
    return client.post("/api/record-cache/import/", {
        "workloads": SimpleUploadedFile("database_workload.json", workloads),
        "records": SimpleUploadedFile("database_tuning_record.json", records),
        "target": json.dumps(target), "hardware": "another host", "tvm_version": "apache-tvm 0.27.0"},
        format="multipart")


def test_export_import_round_trip_lands_pending(tmp_path, monkeypatch, user_staff, cpu_target):
    model = matmul_primfunc(64)
    entries = final_entries(str(tmp_path), model, cpu_target, run_secs=(1e-3,), n_records=2)
    run = TuningRunFactory(succeeded=True, outputs_match=True, target_key='{"kind":"llvm"}')
    opt_in(run.team)
    monkeypatch.setattr(adapters, "publish_from_run",
                        lambda model_proto, r, cached, path: {"entries": entries, "cost_model_records": 0})
    give_final_database(run)
    assert services.publish_run(run=run, model_proto=None) == 2
    staff = client_for(user_staff)
    with zipfile.ZipFile(io.BytesIO(staff.get("/api/record-cache/export/").content)) as zf:
        workloads, records = zf.read("database_workload.json"), zf.read("database_tuning_record.json")
    r = _upload(staff, workloads, records, cpu_target)
    assert r.status_code == 200, r.json()
    assert r.json() == {"imported": 2, "status": "pending"}
    pending = CacheEntry.objects.filter(hardware="another host")
    assert {(e.workload_hash, e.trace_digest) for e in pending} == {(e["workload_hash"], e["trace_digest"])
                                                                   for e in entries}
    assert all(e.status == "pending" and e.latency_s is None and e.run_secs == [] for e in pending)
    assert "null" in pending[0].record_json and "0.001" not in pending[0].record_json  # the times were dropped
    key = {"target_key": pending[0].target_key, "hardware": "another host", "tvm_version": "apache-tvm 0.27.0"}
    assert selectors.trusted_entries(key) == []  # an import is never trusted by itself
    # stored under the key a run of that target looks up with (this platform's pipeline for it, timed as a
    # run of it is now: cold on a CPU), not under the bare target, where no run would ever find it
    from tuning.engine.measuring.timer import choose_evaluator

    importer = TuningRunFactory(target_key=canonical_key(cpu_target), pipeline_key=pipeline_key(target=cpu_target),
                                evaluator=choose_evaluator("llvm").to_dict())
    assert pending[0].target_key.endswith("|timing=cold")
    lookup_key = {**adapters.cache_key_of(importer), "hardware": "another host", "tvm_version": "apache-tvm 0.27.0"}
    assert {e["workload_hash"] for e in entries} <= set(selectors.lookup(lookup_key, [e["workload_hash"] for e in entries], 2))


def test_hostile_import_refused_by_tvm_nothing_written(user_staff, cpu_target):
    wl, rec = tuning_database(matmul_primfunc(64), cpu_target, annotations=(("pragma_import_llvm", "x"),))
    r = _upload(client_for(user_staff), wl, rec, cpu_target)
    assert r.status_code == 400 and "pragma_import_llvm" in r.json()["detail"]
    assert not CacheEntry.objects.exists()


def test_import_of_a_trace_that_unrolls_a_whole_loop_nest_is_refused(user_staff, cpu_target):
    """The cache's checker replays as a run's import does: a fully unrolled 64^3 matmul (refused at its second loop: 64 x 64; its seed would
    time out every builder that tried it) is refused, nothing stored."""
    from tuning.engine.testing import loop_kind_database

    wl, rec = loop_kind_database(matmul_primfunc(64), cpu_target, "unroll")
    r = _upload(client_for(user_staff), wl, rec, cpu_target)
    assert r.status_code == 400 and "unrolls loops 4096 times over" in r.json()["detail"], r.content[:300]
    assert not CacheEntry.objects.exists()


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"1e400"])
def test_import_of_a_number_tvm_cannot_load_back_is_refused(user_staff, cpu_target, number):
    """A NaN in a staff import was stored pending, then seeded into every team's run of that workload,
    whose imported database TVM could not load: each such run failed until staff purged the entry."""
    wl, rec = tuning_database(matmul_primfunc(64), cpu_target)
    line = json.loads(rec.decode().splitlines()[0])
    line[1][0][0].append(["Annotate", ["b0", 7], ["meta_schedule.vectorize"], []])
    rec = (json.dumps(line) + "\n").encode().replace(b'"b0", 7]', b'"b0", ' + number + b"]")
    r = _upload(client_for(user_staff), wl, rec, cpu_target)
    assert r.status_code == 400 and "Tuning record line 1" in r.json()["detail"], r.content[:300]
    assert not CacheEntry.objects.exists()


def test_import_trusts_nothing_the_checker_returns(monkeypatch, user_staff, cpu_target):
    """The cache's checker parses hostile bytes in C++ too: a subverted one's entries are refused by the
    parent's plain-Python check (trace, times, digests), nothing stored; a well-formed answer is stored."""
    from tuning.engine.process import procpool

    wl, rec = tuning_database(matmul_primfunc(64), cpu_target)
    body = json.loads(rec.decode().splitlines()[0])[1]
    good = {"task_name": "main", "workload_hash": "123", "workload_json": '["0x1", "AAAA"]',
            "record_json": json.dumps([body[0], None, {"kind": "llvm"}, []]), "trace_digest": "a" * 40,
            "args_info": [], "run_secs": [], "latency_s": None}
    hostile = json.loads(json.dumps(good).replace("meta_schedule.parallel", "pragma_import_llvm"))
    assert hostile != good
    cases = [(hostile, "pragma_import_llvm"), (good | {"latency_s": 1e-9}, "times"),
             (good | {"record_json": json.dumps([body[0], [1e-9], None, None])}, "run times"),
             (good | {"trace_digest": "../../x"}, "sha1"), (good | {"workload_json": '{"type_key": "x"}'}, "workload"),
             (good | {"record_json": "[" * 50_000 + "]" * 50_000}, "nested too deeply")]
    for bad, reason in cases:
        monkeypatch.setattr(procpool, "run_isolated",
                            lambda *a, bad=bad, **k: {"entries": [bad], "target_key": '{"kind":"llvm"}'})
        r = _upload(client_for(user_staff), wl, rec, cpu_target)
        assert r.status_code == 400 and reason in r.json()["detail"], (reason, r.content[:300])
        assert not CacheEntry.objects.exists()
    monkeypatch.setattr(procpool, "run_isolated", lambda *a, **k: {"entries": [good], "target_key": '{"kind":"llvm"}'})
    assert _upload(client_for(user_staff), wl, rec, cpu_target).status_code == 200
    assert CacheEntry.objects.get().trace_digest == "a" * 40


def test_staff_import_accepts_the_records_metaschedule_writes(user_staff, cpu_target):
    """Real traces (sampled tiles, compute locations, unroll steps: FloatImm probabilities, IntImm
    extents, sampled variables) pass the checker, not only the hand-made ones of the other tests."""
    wl, rec = design_space_database(matmul_primfunc(64), cpu_target, n_records=3)
    r = _upload(client_for(user_staff), wl, rec, cpu_target)
    assert r.status_code == 200, r.json()
    assert r.json() == {"imported": 3, "status": "pending"} and CacheEntry.objects.count() == 3
