"""The cheaper API read path (core/api/fast.py, renderers.py) answers like plain DRF.

Issue 7: run list / run detail / model list had to fall from ~10 ms to a few ms of server CPU. Each
shortcut here is checked against the plain DRF result it replaces, plus query counts, token
revocation (never cached) and team isolation.
"""
from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from core import services
from core.api.fast import light_instances
from core.api.renderers import OrjsonRenderer
from core.api.serializers import DLModelSerializer
from core.models import ApiToken, DLModel, Team
from tests.helpers import client_for
from tuning.api.serializers import MeasurementSerializer, TuningRunSerializer
from tuning.api.views import RUN_LIST_VALUES
from tuning.models import Measurement, TuningRun, TuningTask

pytestmark = pytest.mark.django_db


def plain(serializer_class):
    """The same serializer without FastRepresentationMixin: DRF's own to_representation."""
    bases = tuple(b for b in serializer_class.__mro__[1:] if b.__name__ != "FastRepresentationMixin"
                  and issubclass(b, serializers.Serializer))
    return type("Plain" + serializer_class.__name__, (serializer_class,), {
        "to_representation": bases[0].to_representation})


def make_run(model, user, **extra) -> TuningRun:
    values = dict(team=model.team, model=model, created_by=user, target={"kind": "llvm", "num-cores": 2},
                  target_kind="llvm", max_trials=64, trials_per_round=32)
    values.update(extra)
    return TuningRun.objects.create(**values)


@pytest.fixture
def runs(model_a, user_owner):
    now = timezone.now()
    return [
        make_run(model_a, user_owner),  # mostly nulls and defaults
        make_run(model_a, user_owner, status="succeeded", trials_done=64, started_at=now - dt.timedelta(hours=1),
                 finished_at=now.replace(microsecond=0), tuned_latency_s=1e-4, untuned_latency_s=3e-4,
                 outputs_match=True, max_abs_diff=1e-6, energy_joules=1234.5, grid_intensity_g_per_kwh=400.0,
                 summary={"tasks": [{"index": 0, "best_s": 1e-4}], "note": "é \u2028"}, dop_fixed=3,
                 trimmer_enabled=True, trimmer_options={"plateau_rounds": 3}, wall_seconds=12.5),
        make_run(model_a, user_owner, status="failed", error="boom", outputs_match=False, trials_done=7),
    ]


def test_fast_representation_equals_drf(runs, model_a):
    for run in TuningRun.objects.select_related("model"):
        assert TuningRunSerializer(run).data == plain(TuningRunSerializer)(run).data
    model = DLModel.objects.select_related("team").get(pk=model_a.pk)
    assert DLModelSerializer(model).data == plain(DLModelSerializer)(model).data
    task = TuningTask.objects.create(run=runs[1], index=0, name="t0", flops=1e6, weight=1.0)
    Measurement.objects.create(run=runs[1], task=task, round_index=0, candidate_key="c0", run_secs=[1e-4],
                               latency_s=1e-4, worker="w", dop=2)
    Measurement.objects.create(run=runs[1], task=task, round_index=0, candidate_key="c1", run_secs=[],
                               error="build failed", worker="w", dop=2)
    for m in Measurement.objects.select_related("task"):
        assert MeasurementSerializer(m).data == plain(MeasurementSerializer)(m).data


def test_light_instances_match_orm_instances(runs):
    rows = list(TuningRun.objects.order_by("pk").values(*RUN_LIST_VALUES))
    light = light_instances(TuningRun, rows, related={"model": DLModel})
    orm = list(TuningRun.objects.order_by("pk").select_related("model"))
    with CaptureQueriesContext(connection) as ctx:
        fast = TuningRunSerializer(light, many=True).data
    assert not ctx.captured_queries  # every shown column was loaded
    assert fast == plain(TuningRunSerializer)(orm, many=True).data
    assert light[0].model.name == orm[0].model.name and light[0].pk == orm[0].pk
    # A column that was not read loads lazily, as with only(): correct, just a query.
    assert light[0].lease == orm[0].lease


def test_run_and_model_endpoints_query_counts_and_payload(api_owner, runs, model_a):
    api_owner.get("/api/me/")  # the token's first use also records last_used_at
    with CaptureQueriesContext(connection) as ctx:
        resp = api_owner.get("/api/runs/")
    assert resp.status_code == 200 and resp.json()["count"] == 3
    assert len(ctx.captured_queries) == 3  # token, count, page
    by_id = {r["id"]: r for r in resp.json()["results"]}
    orm = TuningRun.objects.select_related("model")
    assert by_id == {r.pk: json.loads(JSONRenderer().render(plain(TuningRunSerializer)(r).data)) for r in orm}

    with CaptureQueriesContext(connection) as ctx:
        resp = api_owner.get(f"/api/runs/{runs[1].pk}/")
    assert resp.status_code == 200 and resp.json() == by_id[runs[1].pk]
    assert len(ctx.captured_queries) == 2  # token, run with the caller's role

    with CaptureQueriesContext(connection) as ctx:
        resp = api_owner.get("/api/models/")
    assert resp.status_code == 200 and len(ctx.captured_queries) == 3
    model = DLModel.objects.select_related("team").get(pk=model_a.pk)
    assert resp.json()["results"] == [json.loads(JSONRenderer().render(plain(DLModelSerializer)(model).data))]


@pytest.mark.dialect
def test_filters_ordering_and_pagination_still_apply(api_owner, runs):
    assert [r["id"] for r in api_owner.get("/api/runs/?status=failed").json()["results"]] == [runs[2].pk]
    assert api_owner.get("/api/runs/?status=nonsense").status_code == 400
    ids = [r["id"] for r in api_owner.get("/api/runs/?ordering=trials_done").json()["results"]]
    assert ids == [runs[0].pk, runs[2].pk, runs[1].pk]
    page = api_owner.get("/api/runs/?page_size=2&page=2").json()
    assert page["count"] == 3 and len(page["results"]) == 1 and page["next"] is None
    assert api_owner.get("/api/runs/?page=9").status_code == 404
    assert api_owner.get(f"/api/runs/{runs[0].pk}/?status=failed").status_code == 404  # filters apply to detail


def test_teams_never_see_each_other(api_owner, api_other, runs, model_b, user_other):
    other_run = make_run(model_b, user_other)
    mine = api_owner.get("/api/runs/").json()["results"]
    theirs = api_other.get("/api/runs/").json()["results"]
    assert {r["id"] for r in mine} == {r.pk for r in runs}
    assert [r["id"] for r in theirs] == [other_run.pk]
    assert api_other.get(f"/api/runs/{runs[0].pk}/").status_code == 404
    assert api_owner.get(f"/api/runs/{other_run.pk}/").status_code == 404
    assert [m["id"] for m in api_other.get("/api/models/").json()["results"]] == [model_b.pk]
    assert api_other.get("/api/models/").json()["results"][0]["team_name"] == "Team B"


def test_viewer_reads_but_cannot_cancel_with_annotated_role(user_viewer, runs):
    viewer = client_for(user_viewer)
    assert viewer.get(f"/api/runs/{runs[0].pk}/").status_code == 200
    resp = viewer.post(f"/api/runs/{runs[0].pk}/cancel/")
    assert resp.status_code == 403 and resp.json()["code"] == "permission_denied"


def test_revoked_token_is_refused_at_once(user_owner, team_a):
    issued = services.create_api_token(user=user_owner, name="t")
    other = services.create_api_token(user=user_owner, name="u")
    client = client_for(None)
    client.credentials(HTTP_AUTHORIZATION=f"Token {issued.key}")
    assert client.get("/api/runs/").status_code == 200
    assert client.delete(f"/api/tokens/{other.token.pk}/").status_code == 200  # revoke another token via API
    client.credentials(HTTP_AUTHORIZATION=f"Token {other.key}")
    resp = client.get("/api/runs/")
    assert resp.status_code == 401 and resp.json()["code"] == "authentication_failed"
    # The admin's bulk action revokes with a queryset update (no signal): refused at once as well.
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.key}")
    assert client.get("/api/models/").status_code == 200
    ApiToken.objects.filter(pk=issued.token.pk).update(revoked_at=timezone.now())
    assert client.get("/api/models/").status_code == 401
    # A deactivated user's live token is refused too.
    third = services.create_api_token(user=user_owner, name="v")
    client.credentials(HTTP_AUTHORIZATION=f"Token {third.key}")
    assert client.get("/api/me/").status_code == 200
    type(user_owner).objects.filter(pk=user_owner.pk).update(is_active=False)
    assert client.get("/api/me/").status_code == 401
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-key")
    assert client.get("/api/me/").status_code == 401


def test_orjson_renderer_reads_like_drf():
    data = {"a": 1, "b": [1.5, None, True, "é"], "when": dt.datetime(2026, 1, 2, 3, 4, 5, 600, tzinfo=dt.UTC),
            "day": dt.date(2026, 1, 2), "n": {"1": 2}, "s": "line\u2028sep\u2029", 3: "int key",
            "big": 2**70}
    ours, drf = OrjsonRenderer().render(data), JSONRenderer().render(data)
    assert json.loads(ours) == json.loads(drf)
    assert b"\\u2028" in ours and b"\\u2029" in ours and "é".encode() in ours
    assert OrjsonRenderer().render(None) == b""
    indented = OrjsonRenderer().render({"a": 1}, "application/json; indent=2")
    assert indented == JSONRenderer().render({"a": 1}, "application/json; indent=2")
    small = {"x": [1, 2], "t": Team(name="n").name}
    assert OrjsonRenderer().render(small) == JSONRenderer().render(small)
