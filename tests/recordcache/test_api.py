"""Record-cache API, each feature next to its attacks: other team 404, viewer/member read-only, anonymous
401/403, non-staff refused on staff endpoints, hostile input 400 with nothing written."""
from __future__ import annotations

import io
import json
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from recordcache.models import CacheEntry, CacheLookup, TeamCacheSettings
from tests.factories import CacheEntryFactory, TuningRunFactory
from tests.helpers import client_for

pytestmark = pytest.mark.django_db


def test_team_setting_read_by_members_changed_by_owners(api_owner, team_a, user_member, user_viewer):
    url = f"/api/teams/{team_a.pk}/record-cache/"
    assert api_owner.get(url).json() | {"updated_at": None} == {"team": team_a.pk, "publish": False, "read": True,
                                                                "updated_at": None}  # publishing is opt-in
    assert client_for(user_member).get(url).status_code == 200
    for user in (user_member, user_viewer):
        r = client_for(user).patch(url, {"publish": True}, format="json")
        assert r.status_code == 403 and "owners" in r.json()["detail"]
    assert not TeamCacheSettings.objects.exists()
    r = api_owner.patch(url, {"read": False}, format="json")
    assert r.status_code == 200 and r.json()["read"] is False and r.json()["publish"] is False
    r = api_owner.patch(url, {"publish": True}, format="json")
    assert r.status_code == 200 and r.json()["publish"] is True and r.json()["read"] is False


def test_team_setting_of_another_team_is_404_and_anonymous_refused(api_other, api_anon, team_a):
    url = f"/api/teams/{team_a.pk}/record-cache/"
    assert api_other.get(url).status_code == 404
    assert api_other.patch(url, {"publish": False}, format="json").status_code == 404
    assert api_anon.get(url).status_code in (401, 403)
    assert not TeamCacheSettings.objects.exists()


def test_team_setting_hostile_value_is_400(api_owner, team_a):
    r = api_owner.patch(f"/api/teams/{team_a.pk}/record-cache/", {"publish": "<script>"}, format="json")
    assert r.status_code == 400 and not TeamCacheSettings.objects.exists()


def test_run_cache_use_per_task_and_other_team_404(api_owner, api_other, team_a):
    run = TuningRunFactory(model__team=team_a)
    src = TuningRunFactory(model__team=team_a)
    CacheLookup.objects.create(run=run, task_index=0, task_name="conv", workload_hash="1", hit=True, n_seeds=2,
                               source_run=src, verification="verified", trials_saved=30)
    r = api_owner.get(f"/api/runs/{run.pk}/record-cache/")
    assert r.status_code == 200
    task = r.json()["tasks"][0]
    got = (task["hit"], task["source_run"], task["verification"], task["trials_saved"])
    assert got == (True, src.pk, "verified", 30)
    assert r.json()["savings"]["trials_saved"] == 30 and r.json()["savings"]["basis"].startswith("estimated")
    assert api_other.get(f"/api/runs/{run.pk}/record-cache/").status_code == 404


@pytest.mark.parametrize("method,url", [("get", "/api/record-cache/"), ("get", "/api/record-cache/export/"),
                                        ("post", "/api/record-cache/purge/"), ("post", "/api/record-cache/import/")])
def test_staff_endpoints_refuse_non_staff(api_owner, api_anon, method, url):
    CacheEntryFactory(target_key="T")
    for client in (api_owner, api_anon):
        r = getattr(client, method)(url, {"target_key": "T"}) if method == "post" else client.get(url)
        assert r.status_code in (401, 403)
    assert CacheEntry.objects.count() == 1


def test_staff_stats_purge_and_export(user_staff):
    staff = client_for(user_staff)
    CacheEntryFactory(target_key="T", workload_hash="1", latency_s=1e-3)
    CacheEntryFactory(target_key="U", workload_hash="2")
    assert staff.get("/api/record-cache/").json()["entries"] == 2
    r = staff.get("/api/record-cache/export/", {"target_key": "T"})
    assert r.status_code == 200 and r["Content-Type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        records = zf.read("database_tuning_record.json").decode().splitlines()
        assert len(records) == 1 and json.loads(records[0])[1][1] == [1e-3] * 3
        assert len(zf.read("database_workload.json").decode().splitlines()) == 1
    assert staff.post("/api/record-cache/purge/", {}, format="json").status_code == 400  # names nothing
    assert staff.post("/api/record-cache/purge/", {"target_key": "T"}, format="json").json() == {"deleted": 1}
    assert list(CacheEntry.objects.values_list("target_key", flat=True)) == ["U"]


def test_staff_import_refuses_hostile_records_writes_nothing(user_staff):
    staff = client_for(user_staff)
    body = {"workloads": SimpleUploadedFile("w.json", b"{}\n"),
            "records": SimpleUploadedFile("r.json", b'[0, [[[["Evil", [], [], []]], []]]]\n'),
            "target": json.dumps({"kind": "llvm"}), "hardware": "h", "tvm_version": "v"}
    r = staff.post("/api/record-cache/import/", body, format="multipart")
    assert r.status_code == 400 and "not one of MetaSchedule's own" in r.json()["detail"]
    r = staff.post("/api/record-cache/import/", {**body, "target": json.dumps({"kind": "c"})}, format="multipart")
    assert r.status_code == 400
    assert not CacheEntry.objects.exists()
