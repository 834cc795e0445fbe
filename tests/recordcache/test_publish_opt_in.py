"""Publishing to the shared record cache is opt-in, and what another team sees of it is anonymous.

Each feature beside its attack: a team that did not opt in publishes nothing (and a team that withdraws
takes its records and the cost models trained on them back); another team's run page and API never show
team A's run ids or model names, only that a task hit the shared cache."""
from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from recordcache import adapters, selectors, services
from recordcache.models import CacheEntry, CacheLookup, CostModelFile, TeamCacheSettings
from tests.factories import CacheEntryFactory, DLModelFactory, TuningRunFactory
from tests.helpers import client_for

from .cachedata import give_final_database

pytestmark = pytest.mark.django_db

KEY = '{"kind":"llvm","mcpu":"znver3"}'
ENTRY = {"task_index": 0, "task_name": "fused_secret_conv", "workload_hash": "111", "workload_json": "{}",
         "record_json": "[]", "trace_digest": "ab" * 20, "args_info": [], "run_secs": [2e-3], "latency_s": 2e-3}


def _finished_run(team, **kw):
    run = TuningRunFactory(succeeded=True, target_key=KEY, outputs_match=True, model__team=team, **kw)
    give_final_database(run)
    return run


# --------------------------------------------------------------------------- a team that did not opt in
def test_a_team_that_did_not_opt_in_publishes_nothing(monkeypatch, team_a):
    monkeypatch.setattr(adapters, "publish_from_run",
                        lambda *a: pytest.fail("a team that did not opt in had its records read for the cache"))
    run = _finished_run(team_a)
    assert not TeamCacheSettings.objects.filter(team=team_a).exists()  # never chose
    assert services.publish_run(run=run, model_proto=None) == 0
    services.record_run_outcome(run_id=run.pk, model_proto=None)  # the executor's hook after a run
    TeamCacheSettings.objects.create(team=team_a, publish=False, read=True)  # chose not to
    assert services.publish_run(run=run, model_proto=None) == 0
    assert not CacheEntry.objects.exists() and not CostModelFile.objects.exists()


def test_an_opted_in_team_publishes(monkeypatch, team_a, user_owner):
    monkeypatch.setattr(adapters, "publish_from_run",
                        lambda model_proto, r, cached, path: {"entries": [ENTRY], "cost_model_records": 0})
    run = _finished_run(team_a)
    services.update_team_settings(actor=user_owner, team=team_a, publish=True)
    assert services.publish_run(run=run, model_proto=None) == 1
    assert CacheEntry.objects.get().source_team == team_a


# --------------------------------------------------------------------------- withdrawal
def test_withdrawing_stops_serving_the_teams_entries_and_drops_their_cost_models(team_a, team_b, user_owner,
                                                                                   user_staff, tmp_path):
    a_entry = CacheEntryFactory(source_run=_finished_run(team_a), workload_hash="111")
    key = {"target_key": a_entry.target_key, "hardware": a_entry.hardware, "tvm_version": a_entry.tvm_version}
    model_path = tmp_path / "cm.xgb"
    model_path.write_bytes(b"placeholder")
    row = CostModelFile(**key, n_records=1)
    row.file.save("cost-model-a.xgb", open(model_path, "rb"), save=True)
    assert selectors.lookup(key, ["111"], 2)["111"][0]["id"] == a_entry.pk  # team B's run would be seeded

    services.update_team_settings(actor=user_owner, team=team_a, publish=False)
    assert selectors.lookup(key, ["111"], 2) == {} and not selectors.has_usable_entries(key)
    assert selectors.trusted_entries(key) == []  # nor trained on
    assert selectors.entries_for_export() == []
    assert client_for(user_staff).get("/api/record-cache/export/").status_code == 200
    assert not CostModelFile.objects.exists()  # trained on the withdrawn records: retrained without them

    services.update_team_settings(actor=user_owner, team=team_a, publish=True)
    assert selectors.lookup(key, ["111"], 2)["111"][0]["id"] == a_entry.pk


def test_only_pending_staff_imports_are_served_without_a_team(team_a):
    pending = CacheEntryFactory(source_run=None, source_team=None, status="pending", latency_s=None,
                                target_key=KEY, workload_hash="111")
    orphan = CacheEntryFactory(source_run=None, source_team=None, target_key=KEY, workload_hash="111")  # team gone
    key = {"target_key": KEY, "hardware": pending.hardware, "tvm_version": pending.tvm_version}
    assert [e["id"] for e in selectors.lookup(key, ["111"], 5)["111"]] == [pending.pk]
    assert orphan.pk not in [e["id"] for e in selectors.trusted_entries(key)]


@pytest.mark.dialect
@pytest.mark.django_db(transaction=True)  # the executor migrates back and forth
def test_the_migration_withdraws_consent_given_by_the_old_default(team_a, team_b):
    before = [("recordcache", "0001_initial")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old_settings = executor.loader.project_state(before).apps.get_model("recordcache", "TeamCacheSettings")
        old_settings.objects.create(team_id=team_a.pk, publish=True, read=False)
        old_settings.objects.create(team_id=team_b.pk, publish=False, read=True)
    finally:  # forward through 0002_withdraw_default_publish_consent to today's schema
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert set(TeamCacheSettings.objects.values_list("publish", "read")) == {(False, False), (False, True)}


# --------------------------------------------------------------------------- what another team sees
@pytest.fixture
def b_run_seeded_by_a(team_a, team_b):
    """Team B's run whose task 0 hit a record of team A's run (model "secret-model-a"), task 1 one of its
    own earlier runs, task 2 a miss."""
    a_run = TuningRunFactory(model=DLModelFactory(team=team_a, name="secret-model-a"), succeeded=True)
    b_src = TuningRunFactory(model__team=team_b, succeeded=True)
    b_run = TuningRunFactory(model__team=team_b, energy_joules=50.0, trials_done=10)
    CacheLookup.objects.create(run=b_run, task_index=0, task_name="fused_conv", workload_hash="1", hit=True,
                               n_seeds=2, source_run=a_run, verification="verified", reason="verified",
                               trials_saved=30)
    CacheLookup.objects.create(run=b_run, task_index=1, task_name="fused_dense", workload_hash="2", hit=True,
                               n_seeds=1, source_run=b_src, verification="verified", reason="verified")
    CacheLookup.objects.create(run=b_run, task_index=2, task_name="fused_add", workload_hash="3", hit=False)
    return a_run, b_src, b_run


def test_another_teams_run_api_shows_no_run_id_of_team_a(b_run_seeded_by_a, api_other):
    a_run, b_src, b_run = b_run_seeded_by_a
    r = api_other.get(f"/api/runs/{b_run.pk}/record-cache/")
    assert r.status_code == 200
    tasks = r.json()["tasks"]
    assert [(t["hit"], t["source_run"], t["from_shared_cache"]) for t in tasks] == [
        (True, None, True), (True, b_src.pk, False), (False, None, False)]
    text = json.dumps(r.json())
    assert "secret-model-a" not in text and "Team A" not in text
    # no field that names a run holds team A's (a task index may equal its id by chance: not a run)
    assert all(a_run.pk not in (v for k, v in t.items() if "run" in k) for t in tasks)


def test_another_teams_run_page_shows_no_run_id_of_team_a(b_run_seeded_by_a, user_other):
    a_run, b_src, b_run = b_run_seeded_by_a
    c = Client()
    c.force_login(user_other)
    html = c.get(f"/runs/{b_run.pk}/").content.decode()
    table = re.search(r'<table class="data" id="record-cache-table">.*?</table>', html, re.S).group(0)
    assert f"#{a_run.pk}<" not in table and f"#{b_src.pk}<" in table and "shared cache" in table
    assert "secret-model-a" not in html and "Team A" not in html


def test_the_team_page_shows_publishing_off_until_an_owner_opts_in(user_owner, team_a):
    c = Client()
    c.force_login(user_owner)
    page = c.get(f"/teams/{team_a.pk}/").content.decode()
    publish = re.search(r'<input[^>]*name="publish"[^>]*>', page).group(0)
    read = re.search(r'<input[^>]*name="read"[^>]*>', page).group(0)
    assert "checked" not in publish and "checked" in read and "opt-in" in page


def test_staff_cannot_opt_a_team_in_from_the_admin(user_staff, team_a):
    row = TeamCacheSettings.objects.create(team=team_a, publish=False)
    c = Client()
    c.force_login(user_staff)
    user_staff.is_superuser = True
    user_staff.save()
    url = f"/admin/recordcache/teamcachesettings/{row.pk}/change/"
    c.post(url, {"publish": "on", "read": "on"})
    row.refresh_from_db()
    assert row.publish is False
