"""The cache's services: key correctness, only trusted records enter, seeding, verdicts, team opt-outs,
purge and the staff import (the engine calls that need TVM on a model are stubbed where the test is
about the rows; the engine's own behaviour is tested in test_engine_cache.py)."""
from __future__ import annotations

import json

import pytest

from core.exceptions import PermissionDenied, ServiceError
from recordcache import adapters, selectors, services
from recordcache.models import CacheEntry, CacheLookup, TeamCacheSettings
from tests.factories import CacheEntryFactory, TeamFactory, TuningRunFactory, TuningTaskFactory
from tuning.engine.records import cache_key, seeds
from tuning.engine.workdir import has_imported

from .cachedata import give_final_database, opt_in

pytestmark = pytest.mark.django_db

KEY = '{"kind":"llvm","mcpu":"znver3"}'


@pytest.fixture
def tasks(monkeypatch):
    """The run's tasks as the lookup sees them (the engine's extraction is tested elsewhere)."""
    found = [{"index": 0, "name": "conv", "weight": 1.0, "workload_hash": "111"},
             {"index": 1, "name": "dense", "weight": 1.0, "workload_hash": "222"}]
    monkeypatch.setattr(adapters, "task_workloads", lambda model_proto, run: found)
    return found


def _run(**kw):
    kw.setdefault("target_key", KEY)
    kw.setdefault("resolved_target", {"kind": "llvm", "mcpu": "znver3"})
    return TuningRunFactory(running=True, **kw)


def test_same_key_hits_other_mcpu_tvm_version_or_device_misses():
    run = _run()
    e = CacheEntryFactory(workload_hash="111", target_key=KEY)
    key = adapters.cache_key_of(run)
    assert [x["id"] for x in selectors.lookup(key, ["111"], 2)["111"]] == [e.id]
    for other in ({"target_key": '{"kind":"llvm","mcpu":"skylake"}'}, {"tvm_version": "apache-tvm 0.26.0"},
                  {"hardware": "Intel Xeon 8480 | 2s x 56c x 2t | cpus 0-223"}):
        assert selectors.lookup({**key, **other}, ["111"], 2) == {}, other


def test_the_pipeline_key_is_part_of_the_target_key():
    run = _run(options={"pipeline_key": "fold-bn-v2"})
    assert adapters.cache_key_of(run)["target_key"] == cache_key.cache_target_key(KEY, "fold-bn-v2")


def test_seed_run_records_hits_and_misses_and_writes_seeds_without_times(tasks):
    src = TuningRunFactory(succeeded=True, target_key=KEY)
    best = CacheEntryFactory(workload_hash="111", latency_s=1e-3, source_run=src)
    CacheEntryFactory(workload_hash="111", latency_s=2e-3)
    CacheEntryFactory(workload_hash="111", latency_s=3e-3)  # beyond top-k
    CacheEntryFactory(workload_hash="111", latency_s=1e-4, status=CacheEntry.Status.STALE)  # never used
    CacheEntryFactory(workload_hash="111", latency_s=None, run_secs=[], status=CacheEntry.Status.PENDING)  # last
    run = _run()
    assert services.seed_run(run=run, model_proto=None) == 2
    rows = {r.task_index: r for r in selectors.lookups_of_run(run)}
    assert rows[0].hit and rows[0].n_seeds == 2 and rows[0].source_run == src and rows[0].verification == "pending"
    assert not rows[1].hit and rows[1].n_seeds == 0
    work = str(adapters.run_work_dir(run.pk))
    assert has_imported(work)
    manifest = json.loads((adapters.run_work_dir(run.pk) / seeds.SEEDS_FILE).read_text())
    assert manifest["tasks"]["0"]["cache_best_s"] == 1e-3
    best.refresh_from_db()
    assert best.hits == 1


def test_an_empty_cache_costs_no_task_extraction(monkeypatch):
    monkeypatch.setattr(adapters, "task_workloads", lambda *a: pytest.fail("looked up an empty cache"))
    CacheEntryFactory(workload_hash="111", target_key="another target")
    assert services.seed_run(run=_run(), model_proto=None) == 0


def _data_only_cost_model(path) -> bytes:
    from tvm.s_tir import meta_schedule as ms

    from tuning.engine.records.cost_model_file import data_only

    data_only(ms.cost_model.XGBModel(num_tuning_cores=1)).save(str(path))
    return path.read_bytes()


def test_publish_saves_the_keys_cost_model_trained_with_the_cached_entries(monkeypatch):
    old = CacheEntryFactory(target_key=KEY)
    CacheEntryFactory(target_key=KEY, publishing=False, source_run__team=TeamFactory())  # its team did not opt in
    run = TuningRunFactory(succeeded=True, target_key=KEY, outputs_match=True)
    opt_in(run.team)
    seen = {}

    def fake(model_proto, r, cached, path):
        seen["cached"] = [e["id"] for e in cached]
        path.parent.mkdir(parents=True, exist_ok=True)
        seen["bytes"] = _data_only_cost_model(path)
        return {"entries": [], "cost_model_records": 5}

    monkeypatch.setattr(adapters, "publish_from_run", fake)
    give_final_database(run)
    services.publish_run(run=run, model_proto=None)
    model = selectors.cost_model_for(adapters.cache_key_of(run))
    assert seen["cached"] == [old.id] and model.n_records == 5 and model.file.read() == seen["bytes"]


def test_a_retrained_cost_model_in_another_format_is_not_stored(monkeypatch, tmp_path):
    """The child that trained it handled a team's model: a pickle (TVM's format) never enters the cache."""
    run = TuningRunFactory(succeeded=True, target_key=KEY, outputs_match=True)
    opt_in(run.team)

    def fake(model_proto, r, cached, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x1f\x8b" + b"\0" * 64)  # gzip: TVM's tar with a pickled data.npy
        return {"entries": [], "cost_model_records": 5}

    monkeypatch.setattr(adapters, "publish_from_run", fake)
    give_final_database(run)
    services.publish_run(run=run, model_proto=None)
    assert selectors.cost_model_for(adapters.cache_key_of(run)) is None


def test_team_that_does_not_read_gets_no_seeds(tasks):
    run = _run()
    TeamCacheSettings.objects.create(team=run.team, read=False)
    CacheEntryFactory(workload_hash="111")
    assert services.seed_run(run=run, model_proto=None) == 0
    assert not CacheLookup.objects.filter(run=run).exists() and not has_imported(str(adapters.run_work_dir(run.pk)))


def test_a_run_with_user_imported_records_is_neither_seeded_nor_published(tasks, monkeypatch):
    CacheEntryFactory(workload_hash="111")
    run = _run(options={"imported_records": 2})
    assert services.seed_run(run=run, model_proto=None) == 0
    run.status, run.outputs_match = "succeeded", True
    monkeypatch.setattr(adapters, "publish_from_run", lambda *a: pytest.fail("an imported run must not publish"))
    assert services.publish_run(run=run, model_proto=None) == 0


def _published(run, monkeypatch, latency=2e-3, **effort):
    entry = {"task_index": 0, "task_name": "conv", "workload_hash": "111", "workload_json": "{}",
             "record_json": "[]", "trace_digest": "ab" * 20, "args_info": [], "run_secs": [latency],
             "latency_s": latency, **effort}
    monkeypatch.setattr(adapters, "publish_from_run",
                        lambda model_proto, r, cached, path: {"entries": [entry], "cost_model_records": 0})
    give_final_database(run)
    return services.publish_run(run=run, model_proto=None)


def test_no_final_serial_remeasure_nothing_published_and_the_switch_turns_the_cache_off(monkeypatch, settings,
                                                                                       tasks):
    run = TuningRunFactory(succeeded=True, target_key=KEY, outputs_match=True)
    monkeypatch.setattr(adapters, "publish_from_run", lambda *a: pytest.fail("nothing serial to publish"))
    assert services.publish_run(run=run, model_proto=None) == 0
    settings.RECORD_CACHE_ENABLED = False
    give_final_database(run)
    assert services.publish_run(run=run, model_proto=None) == 0
    CacheEntryFactory(workload_hash="111")
    assert services.seed_run(run=_run(), model_proto=None) == 0


def test_publish_only_a_successful_validated_run_of_a_publishing_team(monkeypatch):
    run = TuningRunFactory(succeeded=True, target_key=KEY, outputs_match=True)
    assert _published(run, monkeypatch) == 0  # the team never chose: publishing is opt-in
    TeamCacheSettings.objects.create(team=run.team, publish=True, read=False)
    run.outputs_match = False
    assert _published(run, monkeypatch) == 0  # outputs did not validate
    run.outputs_match = True
    run.options = {"measure_queues": ["measure.n1.cpu"]}
    assert _published(run, monkeypatch) == 0  # measured on another host
    run.options = {}
    TeamCacheSettings.objects.filter(team=run.team).update(publish=False)
    assert _published(run, monkeypatch) == 0  # the team does not publish
    TeamCacheSettings.objects.filter(team=run.team).update(publish=True)
    assert _published(run, monkeypatch) == 1
    e = CacheEntry.objects.get()
    assert e.status == "trusted" and e.run_secs == [2e-3] and e.source_run == run
    assert (e.target_key, e.hardware, e.tvm_version) == tuple(adapters.cache_key_of(run).values())


def test_republishing_a_stale_schedule_takes_the_new_platform_measurement(monkeypatch):
    run = TuningRunFactory(succeeded=True, target_key=KEY, outputs_match=True)
    opt_in(run.team)
    _published(run, monkeypatch)
    CacheEntry.objects.update(status="stale")
    _published(run, monkeypatch, latency=3e-3)
    e = CacheEntry.objects.get()
    assert e.status == "trusted" and e.latency_s == 3e-3


def test_an_entry_keeps_how_far_its_workload_was_tuned_and_a_rediscovery_does_not_lower_it(monkeypatch):
    run = TuningRunFactory(succeeded=True, target_key=KEY, outputs_match=True)
    opt_in(run.team)
    _published(run, monkeypatch, source_trials=48, source_converged=True)
    e = CacheEntry.objects.get()
    assert (e.source_trials, e.source_converged) == (48, True)
    assert selectors.lookup(adapters.cache_key_of(run), ["111"], 2)["111"][0]["source_trials"] == 48
    _published(TuningRunFactory(succeeded=True, target_key=KEY, outputs_match=True, team=run.team), monkeypatch,
               source_trials=16, source_converged=False)  # a short run found the same schedule again
    e.refresh_from_db()
    assert (e.source_trials, e.source_converged) == (48, True)


def test_a_verified_hit_searched_on_saves_no_trials():
    src = TuningRunFactory(succeeded=True)
    TuningTaskFactory(run=src, index=0, name="conv", trials=40)
    CacheEntryFactory(workload_hash="111")
    run = _run()
    CacheLookup.objects.create(run=run, task_index=0, task_name="conv", workload_hash="111", hit=True, n_seeds=2)
    _verification(run, [
        {"task_index": 0, "task_name": "conv", "verified": True, "settled": False, "cache_best_s": 1e-3,
         "measured_best_s": 1e-3, "n_seeds": 2, "stale_entry_ids": [], "source_run": src.pk,
         "reason": "verified; not converged (the source spent 40 trials, this run's share is 70): searched on"}])
    services.apply_verification(run)
    row = selectors.lookups_of_run(run).get()
    assert row.verification == "verified" and row.trials_saved == 0 and "searched on" in row.reason


def _verification(run, verdicts):
    d = adapters.run_work_dir(run.pk)
    d.mkdir(parents=True, exist_ok=True)
    (d / seeds.VERIFY_FILE).write_text(json.dumps({"tolerance": 0.1, "tasks": verdicts}))


def test_verdicts_mark_stale_entries_and_count_trials_saved():
    src = TuningRunFactory(succeeded=True)
    TuningTaskFactory(run=src, index=0, name="conv", trials=40)
    good, bad = CacheEntryFactory(workload_hash="111"), CacheEntryFactory(workload_hash="222")
    run = _run()
    CacheLookup.objects.create(run=run, task_index=0, task_name="conv", workload_hash="111", hit=True, n_seeds=2)
    CacheLookup.objects.create(run=run, task_index=1, task_name="dense", workload_hash="222", hit=True, n_seeds=1)
    _verification(run, [
        {"task_index": 0, "task_name": "conv", "verified": True, "cache_best_s": 1e-3, "measured_best_s": 1e-3,
         "n_seeds": 2, "stale_entry_ids": [], "reason": "verified", "source_run": src.pk},
        {"task_index": 1, "task_name": "dense", "verified": False, "cache_best_s": 1e-9, "measured_best_s": 4e-5,
         "n_seeds": 1, "stale_entry_ids": [bad.pk], "reason": "slower on this host", "source_run": src.pk}])
    services.apply_verification(run)
    rows = {r.task_index: r for r in selectors.lookups_of_run(run)}
    assert rows[0].verification == "verified" and rows[0].trials_saved == 38
    assert rows[1].verification == "stale" and rows[1].trials_saved == 0
    good.refresh_from_db()
    bad.refresh_from_db()
    assert good.status == "trusted" and bad.status == "trusted" and bad.strikes == 1  # one run: a strike
    run.energy_joules, run.trials_done = 100.0, 10
    s = selectors.run_cache_savings(run)
    assert s["trials_saved"] == 38 and s["energy_saved_joules"] == pytest.approx(380.0)
    assert s["basis"].startswith("estimated")
    run.save()
    assert selectors.team_cache_savings([run.team_id]) == {"trials_saved": 38, "energy_saved_joules": 380.0,
                                                           "source": "estimated"}


def _stale_verdict(entry_ids, confirmed=()):
    return {"task_index": 0, "task_name": "conv", "verified": not entry_ids, "cache_best_s": 1e-3,
            "measured_best_s": 2e-3 if entry_ids else 1e-3, "n_seeds": 1, "stale_entry_ids": list(entry_ids),
            "confirmed_entry_ids": list(confirmed), "reason": "slower on this host" if entry_ids else "verified",
            "source_run": None}


def _verify_in_a_new_run(verdict):
    run = _run()
    CacheLookup.objects.create(run=run, task_index=0, task_name="conv", workload_hash="111", hit=True, n_seeds=1)
    _verification(run, [verdict])
    services.apply_verification(run)


def test_one_slow_run_is_a_strike_two_in_a_row_make_the_entry_stale_a_confirmation_clears_them():
    entry = CacheEntryFactory(workload_hash="111")
    key = {"target_key": entry.target_key, "hardware": entry.hardware, "tvm_version": entry.tvm_version}
    _verify_in_a_new_run(_stale_verdict([entry.pk]))  # a busy host: slow even when timed twice
    entry.refresh_from_db()
    assert entry.status == "trusted" and entry.strikes == 1
    assert [e["id"] for e in selectors.lookup(key, ["111"], 2)["111"]] == [entry.pk]  # still seeds runs
    _verify_in_a_new_run(_stale_verdict([], confirmed=[entry.pk]))  # the next run: on time again
    entry.refresh_from_db()
    assert entry.status == "trusted" and entry.strikes == 0
    _verify_in_a_new_run(_stale_verdict([entry.pk]))
    _verify_in_a_new_run(_stale_verdict([entry.pk]))  # two runs in a row: stale, no longer looked up
    entry.refresh_from_db()
    assert entry.status == "stale" and entry.strikes == services.STALE_STRIKES
    assert selectors.lookup(key, ["111"], 2) == {}


def test_outcome_never_fails_a_run(monkeypatch):
    run = TuningRunFactory(succeeded=True, target_key=KEY, outputs_match=True)
    give_final_database(run)
    monkeypatch.setattr(adapters, "publish_from_run", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    services.record_run_outcome(run_id=run.pk, model_proto=None)  # logged, not raised
    assert not CacheEntry.objects.exists()


def test_team_settings_default_no_publish_and_read_and_only_owners_change_them(user_owner, user_member, team_a):
    assert (selectors.team_settings(team_a.pk).publish, selectors.team_settings(team_a.pk).read) == (False, True)
    with pytest.raises(PermissionDenied):
        services.update_team_settings(actor=user_member, team=team_a, publish=True)
    assert not TeamCacheSettings.objects.exists()
    row = services.update_team_settings(actor=user_owner, team=team_a, publish=True)
    assert (row.publish, row.read) == (True, True)


def test_purge_by_target_or_tvm_version_staff_only(user_staff, user_owner):
    CacheEntryFactory(target_key="A")
    CacheEntryFactory(target_key="B", tvm_version="old")
    CacheEntryFactory(target_key="B")
    with pytest.raises(PermissionDenied):
        services.purge(actor=user_owner, target_key="A")
    with pytest.raises(ServiceError):
        services.purge(actor=user_staff)  # nothing named: not the whole cache by accident
    assert services.purge(actor=user_staff, target_key="A") == 1
    assert services.purge(actor=user_staff, tvm_version="old") == 1
    assert CacheEntry.objects.count() == 1


def test_stats_size_and_hit_rate():
    CacheEntryFactory()
    run = TuningRunFactory()
    CacheLookup.objects.create(run=run, task_index=0, task_name="a", workload_hash="1", hit=True)
    CacheLookup.objects.create(run=run, task_index=1, task_name="b", workload_hash="2", hit=False)
    s = selectors.cache_stats()
    assert s["entries"] == 1 and s["hit_rate"] == 0.5


def test_import_is_staff_only_and_hostile_input_writes_nothing(user_owner, user_staff):
    with pytest.raises(PermissionDenied):
        services.import_entries(actor=user_owner, workloads=b"{}", records=b"[0, []]", target={"kind": "llvm"},
                                hardware="h", tvm_version="v")
    with pytest.raises(ServiceError, match="Tuning record line 1"):
        services.import_entries(actor=user_staff, workloads=b"{}\n", records=b'[0, [[[["Evil", [], [], []]], []]]]\n',
                                target={"kind": "llvm"}, hardware="h", tvm_version="v")
    assert not CacheEntry.objects.exists()


def test_other_team_is_isolated_from_lookups_rows():
    team = TeamFactory()
    run = TuningRunFactory(model__team=team)
    assert selectors.lookups_of_run(run).count() == 0
