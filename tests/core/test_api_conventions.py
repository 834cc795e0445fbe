"""The API's conventions: teams by id or slug, unknown fields and parameters refused, JSON 404s that name no
model class, structured JSON, searchable runs, and every operation's error answers in the schema."""
from __future__ import annotations

import importlib
import inspect

import pytest
import yaml
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework import generics, serializers
from rest_framework.views import APIView

from core.api.fast import QuickFilterBackend
from core.api.strict import RejectUnknownFieldsMixin, StrictQueryParamsMixin
from core.models import TeamInvitation
from tests.factories import TuningRunFactory, UserFactory
from tuning.models import TuningRun

pytestmark = [pytest.mark.django_db]


def _run(model, **kwargs):
    return TuningRunFactory(model=model, team=model.team, created_by=model.created_by, **kwargs)


# --- teams by id or slug ------------------------------------------------------------------------------


def test_me_lists_team_slugs(api_owner, team_a):
    teams = api_owner.get("/api/me/").json()["teams"]
    assert teams == [{"id": team_a.pk, "slug": team_a.slug, "name": team_a.name, "role": "owner"}]


def test_a_team_is_taken_by_slug_or_id(api_owner, team_a):
    for ref in (team_a.slug, team_a.pk, str(team_a.pk)):
        assert api_owner.get(f"/api/teams/{ref}/").json()["id"] == team_a.pk
        assert api_owner.get(f"/api/teams/{ref}/record-cache/").status_code == 200
    for ref in (team_a.slug, team_a.pk):
        user = UserFactory()
        resp = api_owner.post("/api/invitations/", {"team": ref, "username": user.username}, format="json")
        assert resp.status_code == 202, resp.content
        assert TeamInvitation.objects.filter(team=team_a, user=user).exists()


def test_runs_filter_by_team_slug(api_owner, model_a, team_a):
    run = _run(model_a)
    assert [r["id"] for r in api_owner.get(f"/api/runs/?team={team_a.slug}").json()["results"]] == [run.pk]
    assert [r["id"] for r in api_owner.get(f"/api/runs/?team={team_a.pk}").json()["results"]] == [run.pk]


def test_another_teams_slug_is_the_same_error_as_no_team(api_owner, team_b):
    """Attack: a slug of a team one is not in tells nothing about it (same answer as an unknown slug)."""
    answers = []
    user = UserFactory()
    for ref in (team_b.slug, "no-such-team"):
        resp = api_owner.post("/api/invitations/", {"team": ref, "username": user.username}, format="json")
        answers.append((resp.status_code, resp.json()["errors"]))
        assert api_owner.get(f"/api/teams/{ref}/").status_code == 404
        assert api_owner.get(f"/api/teams/{ref}/record-cache/").status_code == 404
        assert api_owner.get(f"/api/runs/?team={ref}").json()["count"] == 0
    assert answers[0] == answers[1] == (400, {"team": ["No such team among yours."]})
    assert not TeamInvitation.objects.filter(team=team_b).exists()


def test_a_team_field_refuses_other_types(api_owner):
    user = UserFactory()
    for bad in ([1], {"id": 1}, True, 1.5):
        resp = api_owner.post("/api/invitations/", {"team": bad, "username": user.username}, format="json")
        assert resp.status_code == 400 and "team" in resp.json()["errors"], bad


# --- unknown fields and parameters --------------------------------------------------------------------


def test_a_misspelt_body_field_is_a_400_naming_it(api_owner, model_a):
    resp = api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 16, "max_trails": 9999}, format="json")
    assert resp.status_code == 400
    body = resp.json()
    assert list(body["errors"]) == ["max_trails"] and "max_trials" in body["errors"]["max_trails"][0]
    assert not TuningRun.objects.exists()


def test_old_field_names_are_refused(api_owner, model_a):
    resp = api_owner.post("/api/runs/", {"model": model_a.pk, "max_trials": 16, "trimmer_enabled": True,
                                         "dop_fixed": 2}, format="json")
    assert resp.status_code == 400 and set(resp.json()["errors"]) == {"trimmer_enabled", "dop_fixed"}


def test_unknown_fields_in_a_patch_are_refused(api_owner, team_a):
    resp = api_owner.patch(f"/api/teams/{team_a.pk}/", {"name": "Renamed", "descripton": "typo"}, format="json")
    assert resp.status_code == 400 and list(resp.json()["errors"]) == ["descripton"]
    team_a.refresh_from_db()
    assert team_a.name == "Team A"


@pytest.mark.parametrize("url", ["/api/runs/?stauts=failed", "/api/models/?nmae=x", "/api/me/?verbose=1",
                                 "/api/runs/{run}/?expand=tasks", "/api/runs/{run}/measurements/?task=0",
                                 "/api/energy-settings/?x=1", "/api/teams/{team}/record-cache/?team=1"])
def test_an_unknown_query_parameter_is_a_400_naming_it(api_owner, model_a, team_a, url):
    run = _run(model_a)
    resp = api_owner.get(url.format(run=run.pk, team=team_a.pk))
    assert resp.status_code == 400, resp.content
    name = url.split("?")[1].split("=")[0]
    assert list(resp.json()["errors"]) == [name] and resp.json()["code"] == "invalid"


@pytest.mark.parametrize("url", ["/api/runs/?status=queued&ordering=-created_at&page=1&page_size=5&format=json",
                                 "/api/runs/?search=cnn&archived=false", "/api/runs/{run}/measurements/?task_index=0",
                                 "/api/models/?archived=true&search=x", "/api/teams/?search=Team",
                                 "/api/runs/{run}/?format=json"])
def test_the_parameters_an_endpoint_reads_are_accepted(api_owner, model_a, url):
    run = _run(model_a)
    resp = api_owner.get(url.format(run=run.pk))
    assert resp.status_code == 200, resp.content


def test_an_unknown_parameter_on_another_teams_run_reveals_nothing(api_owner, model_b):
    """Attack: the parameter check answers the same for a run one cannot see and one that does not exist."""
    run = _run(model_b)
    seen = api_owner.get(f"/api/runs/{run.pk}/?x=1")
    missing = api_owner.get("/api/runs/987654321/?x=1")
    assert seen.status_code == missing.status_code == 400 and seen.json() == missing.json()
    assert api_owner.get(f"/api/runs/{run.pk}/").status_code == 404


# --- search ------------------------------------------------------------------------------------------


def test_runs_search_by_model_name_status_and_id(api_owner, model_a, model_b):
    queued, done = _run(model_a), _run(model_a, succeeded=True)
    _run(model_b)  # another team's: never found

    def found(term):
        return sorted(r["id"] for r in api_owner.get("/api/runs/", {"search": term}).json()["results"])

    assert found("cnn-a") == sorted([queued.pk, done.pk])
    assert found("succeeded") == [done.pk]
    assert found(str(queued.pk)) == [queued.pk]
    assert found("cnn-b") == []
    assert found("' OR 1=1 --") == []  # attack: a search term is data, never SQL
    for action in ("tasks", "measurements", "dop-rounds"):  # a run's own lists filter the same way: no 500
        assert api_owner.get(f"/api/runs/{done.pk}/{action}/", {"search": "m"}).status_code < 500


# --- 404s --------------------------------------------------------------------------------------------


def test_an_unknown_api_path_answers_json(api_owner, client):
    for c in (api_owner, client):
        resp = c.get("/api/no-such-thing/")
        assert resp.status_code == 404 and resp["Content-Type"].startswith("application/json")
        assert resp.json() == {"detail": "Not found.", "code": "not_found", "errors": {}}
    assert api_owner.get("/api/runs").status_code == 301  # only the trailing slash is missing
    resp = api_owner.post("/api/runs", {}, format="json")
    assert resp.status_code == 404 and "/api/runs/" in resp.json()["detail"]
    assert client.get("/no-such-page/")["Content-Type"].startswith("text/html")  # the dashboard's own page


def test_a_404_names_no_model_class(api_owner):
    for url in ("/api/runs/987654321/", "/api/models/987654321/", "/api/teams/no-such-team/"):
        body = api_owner.get(url).json()
        assert body == {"detail": "Not found.", "code": "not_found", "errors": {}}, url


# --- structured JSON ---------------------------------------------------------------------------------


def test_target_key_and_result_identity_are_objects(api_owner, model_a):
    run = _run(model_a, target_key='{"kind":"llvm","num-cores":2}', pipeline_key="relax-0.27")
    body = api_owner.get(f"/api/runs/{run.pk}/").json()
    assert body["target_key"] == {"kind": "llvm", "num-cores": 2}
    assert body["result_identity"] == {"target": {"kind": "llvm", "num-cores": 2}, "pipeline": "relax-0.27"}
    assert {"dop", "trimmer"} <= set(body) and not {"dop_mode", "dop_fixed", "trimmer_enabled"} & set(body)
    listed = api_owner.get("/api/runs/").json()["results"][0]
    assert listed["result_identity"] == body["result_identity"] and listed["dop"] == "auto"


# --- the schema --------------------------------------------------------------------------------------


def test_every_operation_documents_its_errors_with_the_error_body(client, user_owner):
    client.force_login(user_owner)
    schema = yaml.safe_load(client.get("/api/schema/").content)
    assert set(schema["components"]["schemas"]["Error"]["required"]) == {"detail", "code", "errors"}
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            expected = {"400", "403", "429"} | ({"404"} if "{" in path else set())
            assert expected <= set(op["responses"]), (method, path, sorted(op["responses"]))
    cancel = schema["paths"]["/api/runs/{id}/cancel/"]["post"]["responses"]
    assert cancel["409"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert "search" in [p["name"] for p in schema["paths"]["/api/runs/"]["get"]["parameters"]]


# --- applied project-wide -----------------------------------------------------------------------------

API_MODULES = ["core.api.serializers", "core.api.energy", "scheduling.api.serializers",
               "recordcache.api.serializers", "tuning.api.serializers"]
OUTPUT_ONLY = {"MeSerializer", "MeTeamSerializer", "InvitationSentSerializer", "ApiTokenCreatedSerializer",
               "CacheLookupSerializer", "SimulationEstimateSerializer",
               # nested in SimulationCreateSerializer, which refuses keys that are no experiment parameter
               "SimulationParametersSerializer"}


def test_every_input_serializer_refuses_unknown_fields():
    lax = []
    for name in API_MODULES:
        module = importlib.import_module(name)
        for cls_name, cls in vars(module).items():
            if not (inspect.isclass(cls) and issubclass(cls, serializers.Serializer) and cls.__module__ == name):
                continue
            writable = [f for f in cls().fields.values() if not f.read_only]
            if writable and cls_name not in OUTPUT_ONLY and not issubclass(cls, RejectUnknownFieldsMixin):
                lax.append(f"{name}.{cls_name}")
    assert not lax, lax


def _api_views(resolver=None, prefix=""):
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _api_views(entry, route)
        elif isinstance(entry, URLPattern) and route.lstrip("^").startswith("api/") \
                and not route.lstrip("^").startswith(("api/charts/", "api/schema", "api/docs")):
            cls = getattr(entry.callback, "cls", None)
            if cls is not None:
                yield route, cls


def test_every_api_view_refuses_unknown_query_parameters():
    lax = []
    for route, cls in _api_views():
        filtered = issubclass(cls, generics.GenericAPIView) and any(
            issubclass(b, QuickFilterBackend) for b in cls.filter_backends)
        if not (filtered or issubclass(cls, StrictQueryParamsMixin)) and issubclass(cls, APIView):
            lax.append(f"{route}: {cls.__name__}")
    assert not lax, lax
