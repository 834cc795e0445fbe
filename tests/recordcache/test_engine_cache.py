"""The engine side of the record cache (no Django): the key, seeds without cached times, verification
(verified / stale / untrusted), verified tasks settled through the run's trial budget, export."""
from __future__ import annotations

import json
import os

import pytest

from tuning.engine.records import cache_key, exchange, publish, seeds, settle
from tuning.engine.workdir import DB_RECORDS, DB_WORKLOAD, IMPORTED_DIR, IMPORTED_RECORDS, has_imported
from tuning.engine.events import TaskInfo
from tuning.engine.trimmer.hooks import TrimmerRuntime
from tuning.engine.trimmer.rules import TrimmerConfig

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7B13
physical id\t: 0
siblings\t: 2
cpu cores\t: 1
processor\t: 1
model name\t: AMD EPYC 7B13
physical id\t: 0
siblings\t: 2
cpu cores\t: 1
"""


def test_hardware_fingerprint_names_cpu_model_and_core_layout():
    fp = cache_key.cpu_fingerprint(CPUINFO, "0-1\n")
    assert fp == "AMD EPYC 7B13 | 1s x 1c x 2t | cpus 0-1"
    assert cache_key.cpu_fingerprint(CPUINFO.replace("7B13", "9654"), "0-1") != fp  # another CPU model
    assert cache_key.cpu_fingerprint(CPUINFO.replace("cpu cores\t: 1", "cpu cores\t: 2"), "0-1") != fp  # another layout
    assert cache_key.cpu_fingerprint(CPUINFO, "0-3") != fp  # more CPUs
    assert cache_key.hardware_fingerprint({"kind": "llvm"}) == cache_key.cpu_fingerprint()


def test_hardware_fingerprint_reads_the_kind_of_every_target_form(monkeypatch):
    # a target stored as JSON text, a TVM-style string and a dict name the same machine: a CUDA target's
    # records describe the GPU, never the host CPU (the kind of a JSON string once read as '{"kind":')
    monkeypatch.setattr(cache_key, "gpu_fingerprint", lambda: "the gpu")
    for target in ({"kind": "cuda", "arch": "sm_90"}, '{"kind": "cuda", "arch": "sm_90"}', "cuda -arch=sm_90"):
        assert cache_key.hardware_fingerprint(target) == "the gpu", target
    for target in ({"kind": "llvm"}, '{"kind": "llvm", "num-cores": 2}', "llvm -num-cores=2"):
        assert cache_key.hardware_fingerprint(target) == cache_key.cpu_fingerprint(), target


def test_gpu_fingerprint_without_nvml_is_unknown_not_an_error():
    class NoDriver:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    assert cache_key.gpu_fingerprint(nvml=NoDriver()).startswith("unknown gpu")


def test_gpu_fingerprint_names_the_board_memory_and_driver():
    class Mem:
        total = 80 * (1 << 30)

    class FakeNvml:
        def nvmlInit(self): pass
        def nvmlShutdown(self): pass
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetName(self, h): return b"NVIDIA H100"
        def nvmlDeviceGetMemoryInfo(self, h): return Mem()
        def nvmlSystemGetDriverVersion(self): return "550.54"

    assert cache_key.gpu_fingerprint(nvml=FakeNvml()) == "NVIDIA H100 | 81920 MiB | driver 550.54"


def test_target_key_includes_the_pipeline_when_there_is_one():
    assert cache_key.cache_target_key("K") == "K"
    assert cache_key.cache_target_key("K", "p1") != cache_key.cache_target_key("K", "p2") != "K"


def _entry(eid, latency, digest=None, wl="h1"):
    body = [[[["GetSBlock", [], ["root", "main"], ["b0"]]], []], [latency], {"kind": "llvm"}, []]
    return {"id": eid, "source_run": 3, "workload_hash": wl, "workload_json": '{"wl": 1}',
            "record_json": json.dumps(body), "trace_digest": digest or f"d{eid}", "latency_s": latency,
            "run_secs": [latency]}


def test_seeds_carry_no_cached_time(tmp_path):
    n = seeds.write_seeds(str(tmp_path), {0: [_entry(1, 1e-9), _entry(2, 2e-3)]})
    assert n == 2 and has_imported(str(tmp_path))
    lines = [json.loads(x) for x in (tmp_path / IMPORTED_DIR / IMPORTED_RECORDS).read_text().splitlines()]
    # the trace only, on the run's task: the platform times every seed itself, no stored workload is parsed
    assert [i for i, _ in lines] == [0, 0] and all(body[1:] == [None, None, None] for _, body in lines)
    assert not (tmp_path / IMPORTED_DIR / DB_WORKLOAD).exists()
    manifest = json.loads((tmp_path / seeds.SEEDS_FILE).read_text())
    assert manifest["tasks"]["0"]["cache_best_s"] == 1e-9


def test_a_seed_whose_trace_fails_the_check_is_left_out_alone(tmp_path):
    """Cache entries are checked at import and again before a run uses them, one by one: a refused trace
    (here an annotation off the allow-list) costs its own seed, not the task's others."""
    bad = _entry(2, 2e-3)
    bad["record_json"] = bad["record_json"].replace('["b0"]]]', '["b0"]], ["Annotate", ["b0", 1], '
                                                    '["pragma_import_llvm"], []]]')
    assert "pragma_import_llvm" in bad["record_json"]
    assert seeds.write_seeds(str(tmp_path), {0: [_entry(1, 1e-3), bad]}) == 1
    lines = (tmp_path / IMPORTED_DIR / IMPORTED_RECORDS).read_text().splitlines()
    assert len(lines) == 1 and "pragma_import" not in lines[0]


def _verdict(measured, entries, tol=0.1):
    want = {"workload_hash": "h", "cache_best_s": min((e["latency_s"] for e in entries if e["latency_s"]),
                                                      default=None),
            "entries": {e["trace_digest"]: {"id": e["id"], "source_run": 3, "latency_s": e["latency_s"]}
                        for e in entries}}
    return seeds._task_verdict(0, "t", want, measured, tol)


def test_a_fake_nanosecond_entry_does_not_verify_and_goes_stale():
    v = _verdict({"d1": 4e-5}, [_entry(1, 1e-9)])
    assert not v["verified"] and v["stale_entry_ids"] == [1] and "slower" in v["reason"]


def test_verified_within_tolerance_of_the_cache_best():
    v = _verdict({"d1": 1.05e-3, "d2": 3e-3}, [_entry(1, 1e-3), _entry(2, 1.1e-3)])
    assert v["verified"] and v["measured_best_s"] == 1.05e-3
    assert v["stale_entry_ids"] == [2]  # d2 ran far slower than its own cached time


def test_a_seed_that_fails_here_is_stale():
    v = _verdict({"d1": None}, [_entry(1, 1e-3)])
    assert not v["verified"] and v["stale_entry_ids"] == [1] and v["reason"] == "failed on this host"


def test_imported_entries_never_verify_a_task():
    v = _verdict({"d1": 1e-3}, [_entry(1, None)])
    assert not v["verified"] and v["stale_entry_ids"] == [] and "imported" in v["reason"]


def _passive_with(infos, *, max_trials, per_round, settled=None, seeded=None, searched=None):
    """A run without Trimmer that the record cache seeded: the session's passive runtime, told the
    cache's decisions through its budget (``settle.apply_seed_decisions``)."""
    tr = TrimmerRuntime.passive(infos, max_trials=max_trials, per_round=per_round, seed=0)
    settle.apply_seed_decisions(tr.budget, settle.SeedDecisions(settled=settled or {}, searched=searched or {},
                                                                seeded=seeded or {}))
    return tr


def test_verified_tasks_are_preempted_from_the_start_not_reported_as_trimmer_savings():
    infos = [TaskInfo(0, "a", 1.0, 1.0), TaskInfo(1, "b", 1.0, 1.0)]
    tr = _passive_with(infos, max_trials=10, per_round=2, settled={0: 2})
    assert not tr.config.enabled and not tr.config.filter_enabled
    assert tr.take_pending() == [0] and tr.is_preempted(0) and not tr.is_preempted(1)
    assert tr.to_dict()["preempted_tasks"] == {}  # the cache's saving, not Trimmer's
    assert tr.choose([0, 1], remaining=8) == 1  # the share allocation gives the trials to the other task


def _seeded_run(tmp_path, verdicts, *, trimmer=None):
    """What the session hands the cache after the seeds were measured: a run whose verification is on disk."""
    from types import SimpleNamespace

    from tuning.engine.config import TuningConfig

    tmp_path.mkdir()
    (tmp_path / seeds.VERIFY_FILE).write_text(json.dumps({"tolerance": 0.1, "tasks": verdicts}))
    infos = [TaskInfo(0, "a", 1.0, 1.0), TaskInfo(1, "b", 1.0, 1.0)]
    cfg = TuningConfig(target={"kind": "llvm"}, work_dir=str(tmp_path), max_trials=40, trials_per_round=4, seed=0)
    return SimpleNamespace(work_dir=str(tmp_path), tasks=infos, database=None, infos=infos, cfg=cfg, n_existing=0,
                           remaining=36, state=SimpleNamespace(trimmer=trimmer))


def _verdict_of(task, *, settled, verified=True):
    return {"task_index": task, "task_name": "t", "verified": verified, "settled": settled, "share_trials": 20,
            "measured_best_s": 1e-3, "n_seeds": 2}


def test_the_session_settles_through_a_passive_runtime_only_when_the_seeds_need_a_budget(tmp_path):
    from tuning.engine.session import _apply_cache_seeds

    run = _seeded_run(tmp_path / "a", [_verdict_of(0, settled=True), _verdict_of(1, settled=False, verified=False)])
    _apply_cache_seeds(run, retime=None)
    tr = run.state.trimmer
    assert tr is not None and not tr.config.enabled and tr.settled == {0} and tr.budget.trials == {0: 2, 1: 2}
    assert tr.budget.per_round == 4 and tr.take_pending() == [0]
    # seeds that verified nothing change nothing without Trimmer: no runtime is made for them
    run = _seeded_run(tmp_path / "b", [_verdict_of(0, settled=False, verified=False)])
    _apply_cache_seeds(run, retime=None)
    assert run.state.trimmer is None
    # with Trimmer on, the cache uses the run's own budget
    own = TrimmerRuntime(TrimmerConfig(), run.infos, max_trials=40)
    run = _seeded_run(tmp_path / "c", [_verdict_of(1, settled=False)], trimmer=own)
    _apply_cache_seeds(run, retime=None)
    assert run.state.trimmer is own and own.budget.judged_after == {1: 20} and own.budget.seed_best == {1: 1e-3}


def _manifest(entries, tol=0.1):
    return {"tolerance": tol, "tasks": {"0": {"workload_hash": "h", "cache_best_s": min(
        e["latency_s"] for e in entries), "entries": {e["trace_digest"]: {"id": e["id"], "source_run": 3,
                                                                          "latency_s": e["latency_s"]}
                                                      for e in entries}}}}


def test_one_slow_retime_is_timed_again_and_the_faster_time_decides():
    """A busy host: the good entry's first re-time is 2x its cached time, the second is on time. It
    verifies and draws no strike; the second look is asked for the slow seed only."""
    entries = [_entry(1, 1e-3), _entry(2, 2e-3)]
    measured = {0: {"d1": 2e-3, "d2": 2.05e-3}}
    asked = []

    def second(suspects):
        asked.append(suspects)
        return {(0, "d1"): 1.02e-3}

    assert seeds.second_look(_manifest(entries), measured, second) == {0: 1}
    assert asked == [{0: ["d1"]}]  # d2 (2.05e-3 against 2e-3 cached) was within tolerance: not re-timed
    v = seeds._task_verdict(0, "t", _manifest(entries)["tasks"]["0"], measured[0], 0.1, retimed=1)
    assert v["verified"] and v["stale_entry_ids"] == [] and v["confirmed_entry_ids"] == [1, 2]
    assert v["measured_best_s"] == 1.02e-3 and v["n_retimed"] == 1


def test_a_seed_slow_twice_stays_a_suspect_and_a_failure_is_not_retimed():
    entries = [_entry(1, 1e-3), _entry(2, 1e-3)]
    measured = {0: {"d1": 2e-3, "d2": None}}
    seeds.second_look(_manifest(entries), measured, lambda s: {(0, d): 1.9e-3 for d in s[0]})
    assert measured[0] == {"d1": 1.9e-3, "d2": None}  # the faster of two slow times; the failure untouched
    v = seeds._task_verdict(0, "t", _manifest(entries)["tasks"]["0"], measured[0], 0.1)
    assert not v["verified"] and v["stale_entry_ids"] == [1, 2] and v["confirmed_entry_ids"] == []
    assert seeds.second_look(_manifest(entries), {0: {"d1": 2e-3}}, None) == {}  # no re-timer: one look


def _manifest_tasks(cached: dict[int, dict[str, float]], tol=0.1):
    return {"tolerance": tol, "tasks": {str(i): {"workload_hash": f"h{i}", "cache_best_s": min(c.values()),
                                                 "entries": {d: {"id": n, "source_run": 3, "latency_s": t}
                                                             for n, (d, t) in enumerate(c.items(), start=10 * i)}}
                                        for i, c in cached.items()}}


def test_a_busier_host_moves_every_seed_a_bad_record_only_its_own():
    """The cache timed four records on a quieter machine: now all run ~2x slower (load), one 6x (a bad
    record). The host factor (median ratio) is 2: the four verify against it, the bad one does not."""
    cached = {0: {"a": 1e-3}, 1: {"b": 2e-3}, 2: {"c": 1e-4}, 3: {"d": 5e-5}, 4: {"e": 1e-3}}
    measured = {0: {"a": 2.1e-3}, 1: {"b": 3.9e-3}, 2: {"c": 2e-4}, 3: {"d": 1.0e-4}, 4: {"e": 6e-3}}
    m = _manifest_tasks(cached)
    factor = seeds.host_factor(m, measured)
    assert factor == pytest.approx(2.0)
    assert seeds.suspect_seeds(m, measured, factor) == {4: ["e"]}  # only the outlier is re-timed
    allowed = (1 + 0.1) * factor - 1
    v = {i: seeds._task_verdict(i, "t", m["tasks"][str(i)], measured[i], allowed) for i in measured}
    assert all(v[i]["verified"] for i in range(4)) and not v[4]["verified"] and v[4]["stale_entry_ids"] == [40]
    # without the factor (the host's state ignored) the load would fail all five
    assert not any(seeds._task_verdict(i, "t", m["tasks"][str(i)], measured[i], 0.1)["verified"] for i in measured)


def test_the_host_factor_needs_seeds_counts_only_a_slower_host_and_is_bounded():
    cached = {0: {"a": 1e-3}, 1: {"b": 1e-3}, 2: {"c": 1e-3}}
    assert seeds.host_factor(_manifest_tasks({0: {"a": 1e-3}, 1: {"b": 1e-3}}), {0: {"a": 3e-3}, 1: {"b": 3e-3}}) == 1.0
    m = _manifest_tasks(cached)
    assert seeds.host_factor(m, {0: {"a": 5e-4}, 1: {"b": 5e-4}, 2: {"c": 5e-4}}) == 1.0  # faster now: no credit
    capped = seeds.host_factor(m, {0: {"a": 1e-2}, 1: {"b": 1e-2}, 2: {"c": 1e-2}})
    assert capped == seeds.HOST_FACTOR_MAX  # 10x: capped
    assert seeds.host_factor(m, {0: {"a": 2e-3}, 1: {"b": None}, 2: {"c": 2e-3}}) == 1.0  # a failure is no ratio
    # a fake nanosecond time among real ones is one ratio of many: it does not move the factor, nor verify
    poisoned = _manifest_tasks({0: {"a": 1e-3}, 1: {"b": 1e-3}, 2: {"c": 1e-3}, 3: {"f": 1e-9}})
    measured = {0: {"a": 1.5e-3}, 1: {"b": 1.5e-3}, 2: {"c": 1.5e-3}, 3: {"f": 4e-5}}
    factor = seeds.host_factor(poisoned, measured)
    assert factor == pytest.approx(1.5)
    assert not seeds._task_verdict(3, "t", poisoned["tasks"]["3"], measured[3], 1.1 * factor - 1)["verified"]


def test_when_every_task_is_verified_none_is_resumed_and_the_budget_is_saved():
    infos = [TaskInfo(0, "a", 1.0, 1.0), TaskInfo(1, "b", 1.0, 1.0)]
    tr = _passive_with(infos, max_trials=40, per_round=4, settled={0: 2, 1: 2}, seeded={0: (1e-3, 2), 1: (5e-4, 2)})
    assert sorted(tr.take_pending()) == [0, 1] and tr.settled == {0, 1}
    assert tr.choose([0, 1], remaining=36) is None  # settled: never resumed (a parked task would be)
    assert tr.trials_saved() == 0 and tr.resumptions == []  # the saving is the cache's, not Trimmer's


def test_seed_times_feed_the_allocator_so_freed_trials_follow_the_real_shares():
    infos = [TaskInfo(i, n, 1.0, 1.0) for i, n in enumerate("abc")]
    tr = _passive_with(infos, max_trials=40, per_round=4, settled={0: 2},
                       seeded={0: (1e-3, 2), 1: (1e-3, 2), 2: (1e-6, 2)})
    assert tr.budget.best[1] == 1e-3 and tr.budget.best[2] == 1e-6 and tr.budget.trials == {0: 2, 1: 2, 2: 2}
    assert [tr.choose([0, 1, 2], remaining=34) for _ in range(3)] == [1, 1, 1]  # the slow task's share


def _seeded_verdicts(source, *, agreeing_runs=1, verified=True):
    """A run of two tasks of 96 trials: task 0 was seeded from the cache (``source``: how far its source
    run tuned it), task 1 is a miss (the mean share: half the budget each)."""
    manifest = {"tolerance": 0.1, "tasks": {"0": {"workload_hash": "h0", "cache_best_s": 1e-3, "entries": {},
                                                  "agreeing_runs": agreeing_runs, **source}}}
    result = {"tasks": [{"task_index": 0, "task_name": "conv", "verified": verified, "measured_best_s": 1e-3,
                         "cache_best_s": 1e-3, "n_seeds": 2, "reason": "verified" if verified else "slower"}]}
    infos = [TaskInfo(0, "conv", 1.0, 1.0), TaskInfo(1, "dense", 1.0, 1.0)]
    return settle.settle_decisions(result, manifest, infos, max_trials=96)["tasks"][0], infos


def test_a_record_from_an_under_tuned_source_does_not_settle_its_task():
    """The source spent 16 trials on the task; this run would give it most of its 96 (its latency share):
    the record verifies (this host runs it as fast as the cache says) but is no converged result."""
    v, _ = _seeded_verdicts({"source_trials": 16, "source_converged": False})
    assert v["verified"] and not v["converged"] and not v["settled"]
    assert v["share_trials"] > 16 and "searched on" in v["reason"]
    # trials alone prove nothing: a source that spent more than this run's share had not plateaued
    long, _ = _seeded_verdicts({"source_trials": 96})
    assert not long["settled"] and long["share_trials"] < 96
    legacy, _ = _seeded_verdicts({})  # an entry that does not say how far it was tuned
    assert not legacy["settled"] and "unknown" in legacy["convergence"]


def test_a_converged_record_settles_its_task():
    for source, agreeing in (({"source_trials": 16, "source_converged": True}, 1),  # its search had plateaued
                             ({"source_trials": 16}, 2)):  # two independent runs agree on the best
        v, _ = _seeded_verdicts(source, agreeing_runs=agreeing)
        assert v["converged"] and v["settled"], (source, agreeing)
    stale, _ = _seeded_verdicts({"source_trials": 96, "source_converged": True}, verified=False)
    assert stale["converged"] and not stale["settled"]  # converged, but not on this host: never settled


def test_agreeing_runs_count_distinct_source_runs_within_tolerance_of_the_best(tmp_path):
    near = [_entry(1, 1e-3) | {"source_run": 3}, _entry(2, 1.05e-3) | {"source_run": 4}]
    seeds.write_seeds(str(tmp_path / "a"), {0: near}, tolerance=0.1)
    far = [_entry(1, 1e-3) | {"source_run": 3}, _entry(2, 2e-3) | {"source_run": 4}]
    seeds.write_seeds(str(tmp_path / "b"), {0: far}, tolerance=0.1)
    same = [_entry(1, 1e-3) | {"source_run": 3}, _entry(2, 1e-3) | {"source_run": 3}]
    seeds.write_seeds(str(tmp_path / "c"), {0: same}, tolerance=0.1)
    got = {d: json.loads((tmp_path / d / seeds.SEEDS_FILE).read_text())["tasks"]["0"]["agreeing_runs"] for d in "abc"}
    assert got == {"a": 2, "b": 1, "c": 1}


def test_an_unconverged_seed_is_searched_and_stopped_by_the_plateau_rule_after_its_share():
    """Trimmer off: the seeded task still gets trials (not settled), is judged from the seed's time, and is
    parked only once it has had its share and two rounds no longer beat the seed; the parking is the
    cache's, not a Trimmer pre-emption."""
    v, infos = _seeded_verdicts({"source_trials": 16})
    tr = _passive_with(infos, max_trials=96, per_round=16, seeded={0: (1e-3, 2)}, searched={0: v["share_trials"]})
    assert not tr.config.enabled and tr.settled == set() and not tr.is_preempted(0)
    assert tr.tracker.baseline(0) == 1e-3 and tr.tracker.judged == {0: v["share_trials"]}
    n = 2
    while n + 16 < v["share_trials"]:  # no gain over the seed, but the share is not reached yet
        tr.observe_batch(0, [1.2e-3] * 16, round_index=0)
        n += 16
        assert not tr.is_preempted(0)
    for _ in range(2):
        tr.observe_batch(0, [1.2e-3] * 16, round_index=1)
    assert tr.is_preempted(0) and 0 in tr.cache_parked and tr.to_dict()["preempted_tasks"] == {}
    for _ in range(5):
        tr.observe_batch(1, [1e-4] * 16, round_index=2)  # the task Trimmer does not judge: never parked
    assert not tr.is_preempted(1)


def test_an_unconverged_seed_that_the_search_beats_keeps_its_trials():
    v, infos = _seeded_verdicts({"source_trials": 16})
    tr = _passive_with(infos, max_trials=96, per_round=16, seeded={0: (1e-3, 2)}, searched={0: v["share_trials"]})
    best = 1e-3
    for _ in range(8):
        best *= 0.9  # every round beats the seed by 10 %
        tr.observe_batch(0, [best] * 16, round_index=0)
    assert not tr.is_preempted(0)


def test_export_is_a_tvm_json_database_with_the_platform_times():
    wl, recs = exchange.export_lines([_entry(1, 1e-3), _entry(2, 2e-3), _entry(3, 5e-4, wl="h2")])
    assert len(wl) == 2 and len(recs) == 3
    rows = [json.loads(x) for x in recs]
    assert [r[0] for r in rows] == [0, 0, 1] and rows[0][1][1] == [1e-3]


def test_place_cost_model_only_for_a_fresh_run(tmp_path):
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.records.cost_model_file import data_only

    src = tmp_path / "cm.xgb"
    data_only(ms.cost_model.XGBModel(num_tuning_cores=1)).save(str(src))  # the platform's data-only format
    wd = tmp_path / "run"
    assert publish.place_cost_model(str(wd), str(src)) and (wd / "cost_model.xgb").read_bytes() == src.read_bytes()
    placed = src.read_bytes()
    src.write_bytes(b"other")
    assert not publish.place_cost_model(str(wd), str(src))  # a run's own model is never overwritten
    assert (wd / "cost_model.xgb").read_bytes() == placed
    assert not publish.place_cost_model(str(wd), None)
    (wd / "cost_model.xgb").unlink()
    assert not publish.place_cost_model(str(wd), str(src)) and not (wd / "cost_model.xgb").exists()  # not the format


def test_tvm_version_names_tvm_and_its_ffi():
    assert cache_key.tvm_version().startswith("apache-tvm 0.27")


@pytest.mark.slow
def test_seeded_run_verifies_skips_and_refuses_a_poisoned_entry(tmp_path, cpu_target):
    """Task 0 has a cached record within tolerance (verified: no search trials), task 1 a record whose
    cached time is a fake 1e-9 s (re-timed here: stale, never the run's best)."""
    import tvm

    from tuning.engine.events import ListSink
    from tuning.engine.config import TuningConfig
    from tuning.engine.session import run_tuning
    from tuning.engine.testing import matmul_primfunc
    from tuning.engine.measuring.timer import EvaluatorConfig

    from .cachedata import final_entries

    model = tvm.IRModule({"a": matmul_primfunc(64), "b": matmul_primfunc(32)})
    ok = final_entries(str(tmp_path / "src0"), model, cpu_target, run_secs=(1.0,), task_index=0, first_id=1)
    for e in ok:  # a converged source (its search had plateaued): a verified hit settles the task
        e["source_converged"] = True
    poisoned = final_entries(str(tmp_path / "src1"), model, cpu_target, run_secs=(1e-9,), task_index=1, first_id=9)
    work = str(tmp_path / "run")
    assert seeds.write_seeds(work, {0: ok, 1: poisoned}) == 2
    sink = ListSink()
    cfg = TuningConfig(target=cpu_target, max_trials=8, trials_per_round=2, work_dir=work, seed=1,
                       search_population=16, genetic_num_iters=1,
                       evaluator=EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20))
    s = run_tuning(model, cfg, sink)
    assert s.status == "succeeded"
    verdicts = {v["task_index"]: v for v in seeds.load_verification(work)["tasks"]}
    assert verdicts[0]["verified"] and verdicts[0]["source_run"] == 7
    assert not verdicts[1]["verified"] and verdicts[1]["stale_entry_ids"] == [9]
    assert verdicts[1]["n_retimed"] == 1 and verdicts[0]["n_retimed"] == 0  # slow: timed a second time first
    assert verdicts[0]["confirmed_entry_ids"] == [1]
    by_task = {0: [r for r in sink.records if r.task_index == 0], 1: [r for r in sink.records if r.task_index == 1]}
    assert len(by_task[0]) == 1  # the verification measurement only: its trials went to task 1
    assert len(by_task[1]) > 1 and all(min(r.run_secs) > 1e-7 for r in sink.records if r.run_secs)
    assert s.tasks[1].best_latency_s > 1e-7 and s.best_latency_s > 1e-7
    assert os.path.exists(os.path.join(work, seeds.VERIFY_FILE))


@pytest.mark.slow
def test_publish_reads_only_the_final_database_and_trains_a_loadable_cost_model(tmp_path, cpu_target):
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.testing import matmul_primfunc

    from .cachedata import final_entries

    model = matmul_primfunc(64)
    assert publish.entries_from_run(str(tmp_path), model, cpu_target) == []  # no final re-measure: nothing trusted
    entries = final_entries(str(tmp_path), model, cpu_target, run_secs=(2e-3,), n_records=3)
    assert len(entries) == 3 and all(e["run_secs"] == [2e-3] for e in entries)
    path = str(tmp_path / "cm.xgb")
    out = publish.publish_from_run(str(tmp_path), model, cpu_target, [], path)
    assert len(out["entries"]) == 3 and out["cost_model_records"] == 3
    from tuning.engine.records.cost_model_file import check_cost_model_file
    from tuning.engine.search.loop import load_cost_model

    assert check_cost_model_file(path) == 3  # data only: XGBoost JSON and plain arrays
    cm = ms.cost_model.XGBModel(num_tuning_cores=1)
    load_cost_model(cm, path)  # what search() loads at a run's start
    assert cm._inst.data_size == 3


@pytest.mark.slow
def test_published_entries_say_how_far_the_source_tuned_their_task(tmp_path, cpu_target):
    """A run's entries carry its trials on the task (its own records plus the trials behind the seeds it
    started from) and whether its search had converged (Trimmer state, or a settled cache verdict)."""
    from pathlib import Path

    from tuning.engine.workdir import DB_WORKLOAD, TRIMMER_STATE, save_exhausted
    from tuning.engine.testing import matmul_primfunc, tuning_database

    from .cachedata import final_entries

    model = matmul_primfunc(64)
    wl, rec = tuning_database(model, cpu_target, run_secs=(2e-3,), n_records=3)
    Path(tmp_path, DB_WORKLOAD).write_bytes(wl)  # the run's own database: 3 trials on the task
    Path(tmp_path, DB_RECORDS).write_bytes(rec)
    entries = final_entries(str(tmp_path), model, cpu_target, run_secs=(2e-3,))
    assert [(e["source_trials"], e["source_converged"]) for e in entries] == [(3, False)]
    (tmp_path / seeds.SEEDS_FILE).write_text(json.dumps({"tasks": {"0": {"source_trials": 40}}}))
    (tmp_path / TRIMMER_STATE).write_text(json.dumps({"exhausted_tasks": [0]}))
    entries = publish.entries_from_run(str(tmp_path), model, cpu_target)
    assert [(e["source_trials"], e["source_converged"]) for e in entries] == [(43, True)]
    (tmp_path / TRIMMER_STATE).unlink()  # a run without Trimmer: its search's own record of exhaustion
    assert not publish.entries_from_run(str(tmp_path), model, cpu_target)[0]["source_converged"]
    save_exhausted(str(tmp_path), {0})
    assert publish.entries_from_run(str(tmp_path), model, cpu_target)[0]["source_converged"]
