"""Access-control matrix: EVERY API operation and EVERY dashboard URL, as every role.

The operations are enumerated from the URL resolver (router and extra paths) and cross-checked
against the OpenAPI schema, so a new endpoint shows up here by itself: until someone classifies it
in EXPECTED (who may do what), the test fails. Each request runs in a savepoint that is rolled back,
so every role meets the same objects in the same state.

Roles: anonymous, viewer / member / owner of team A, the owner of another team (B), and staff (in no
team). Objects: one of every kind in team A.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve, reverse
from rest_framework.test import APIClient

from tests.helpers import PHILLY_CSV

from .world import ROLES

pytestmark = pytest.mark.django_db


# --- expected outcomes ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    name: str
    check: Callable  # (response, world) -> bool

    def __repr__(self):
        return self.name


def _status(*codes):
    return lambda r, w: r.status_code in codes


OK = Outcome("2xx", lambda r, w: 200 <= r.status_code < 300)
UNAUTH = Outcome("401", _status(401))
FORBID = Outcome("403", _status(403))
HIDDEN = Outcome("404", _status(404))
NOT_ALLOWED = Outcome("405", _status(405))


def refused_field(field: str) -> Outcome:
    """Refused because the team/model named in the body is not one the caller may use: a 400 on that
    field (DRF's related-field validation), or 403/404."""
    def check(r, w):
        if r.status_code in (403, 404):
            return True
        return r.status_code == 400 and field in (r.json().get("errors") or {})
    return Outcome(f"400[{field}]/403/404", check)


def _profile(anon=UNAUTH, viewer=OK, member=OK, owner=OK, other=OK, staff=OK):
    return {"anon": anon, "viewer": viewer, "member": member, "owner": owner, "other": other, "staff": staff}


PUBLIC = _profile(anon=OK)
AUTH = _profile()                                                     # any signed-in user
TEAM_READ = _profile(other=HIDDEN, staff=HIDDEN)                      # team A's object, read
TEAM_WRITE = _profile(viewer=FORBID, other=HIDDEN, staff=HIDDEN)      # team A's object, write
OWNER_ONLY = _profile(viewer=FORBID, member=FORBID, other=HIDDEN, staff=HIDDEN)
STAFF_ONLY = _profile(viewer=FORBID, member=FORBID, owner=FORBID, other=FORBID)
SELF_ONLY = _profile(viewer=HIDDEN, owner=HIDDEN, other=HIDDEN, staff=HIDDEN)  # the member's own token
CONFLICT = Outcome("409", _status(409))
# team A's object, a write its state refuses (409) to the writers; others as TEAM_WRITE
TEAM_WRITE_CONFLICT = _profile(viewer=FORBID, member=CONFLICT, owner=CONFLICT, other=HIDDEN, staff=HIDDEN)


def create_in_team(field: str, viewer: Outcome | None = None):
    return _profile(viewer=viewer or refused_field(field), other=refused_field(field), staff=refused_field(field))


# (url name, METHOD) -> role -> outcome. Every API operation must be here.
EXPECTED = {
    ("schema", "GET"): AUTH,     # issue 11 s.7: login required unless API_DOCS_PUBLIC=1
    ("api-docs", "GET"): AUTH,
    ("api-root", "GET"): AUTH,
    ("api-me", "GET"): AUTH,
    ("team-list", "GET"): AUTH,
    ("team-list", "POST"): STAFF_ONLY,  # each team gets its own quotas: self-service teams multiply them
    ("team-detail", "GET"): TEAM_READ,
    ("team-detail", "PATCH"): OWNER_ONLY,
    ("membership-list", "GET"): AUTH,
    ("membership-detail", "GET"): TEAM_READ,
    ("membership-detail", "PATCH"): OWNER_ONLY,
    # world.membership is the member's own: they may leave; owners may remove them; the viewer may not
    ("membership-detail", "DELETE"): _profile(viewer=FORBID, other=HIDDEN, staff=HIDDEN),
    # issue 11 s.7: owners invite (202 whether or not the user exists), the invited user answers
    ("teaminvitation-list", "GET"): AUTH,
    ("teaminvitation-list", "POST"): _profile(viewer=FORBID, member=FORBID, other=refused_field("team"),
                                              staff=refused_field("team")),
    ("teaminvitation-accept", "POST"): _profile(viewer=HIDDEN, member=HIDDEN, owner=HIDDEN, staff=HIDDEN),
    ("teaminvitation-decline", "POST"): _profile(viewer=HIDDEN, member=HIDDEN, owner=HIDDEN, staff=HIDDEN),
    ("quota-list", "GET"): AUTH,
    ("quota-detail", "GET"): TEAM_READ,
    ("quota-detail", "PATCH"): STAFF_ONLY,
    ("dlmodel-list", "GET"): AUTH,
    ("dlmodel-list", "POST"): create_in_team("team"),
    ("dlmodel-detail", "GET"): TEAM_READ,
    ("dlmodel-detail", "DELETE"): TEAM_WRITE,  # archives (issue 39)
    ("dlmodel-restore", "POST"): TEAM_WRITE_CONFLICT,  # world.model is not archived: 409 for writers
    ("dlmodel-download", "GET"): TEAM_READ,
    ("apitoken-list", "GET"): AUTH,
    ("usagecharge-list", "GET"): AUTH,  # read-only: the ledger is append-only (issue 39)
    # issue 11 s.7: a token never mints tokens (the matrix calls with tokens); sessions do (test below)
    ("apitoken-list", "POST"): _profile(viewer=FORBID, member=FORBID, owner=FORBID, other=FORBID, staff=FORBID),
    ("apitoken-detail", "GET"): SELF_ONLY,
    ("apitoken-detail", "DELETE"): SELF_ONLY,
    ("tuningrun-list", "GET"): AUTH,
    ("tuningrun-list", "POST"): create_in_team("model", viewer=FORBID),
    ("tuningrun-detail", "GET"): TEAM_READ,
    ("tuningrun-cancel", "POST"): TEAM_WRITE,
    ("tuningrun-pause", "POST"): TEAM_WRITE,
    ("tuningrun-resume", "POST"): TEAM_WRITE,
    ("tuningrun-detail", "DELETE"): TEAM_WRITE_CONFLICT,  # world.run is queued: cancel it before archiving
    ("tuningrun-archive", "POST"): TEAM_WRITE,  # world.done_run
    ("tuningrun-restore", "POST"): TEAM_WRITE_CONFLICT,  # world.done_run is not archived
    ("tuningrun-import-records", "POST"): TEAM_WRITE,
    ("tuningrun-tasks", "GET"): TEAM_READ,
    ("tuningrun-measurements", "GET"): TEAM_READ,
    ("tuningrun-dop-rounds", "GET"): TEAM_READ,
    ("tuningrun-records", "GET"): TEAM_READ,
    ("tuningrun-module", "GET"): TEAM_READ,
    ("tuningrun-package", "GET"): TEAM_READ,
    ("node-list", "GET"): AUTH,
    ("node-detail", "GET"): AUTH,
    ("node-drain", "POST"): STAFF_ONLY,
    ("node-undrain", "POST"): STAFF_ONLY,
    ("gpu-list", "GET"): AUTH,
    ("gpu-detail", "GET"): AUTH,
    ("gpu-drain", "POST"): STAFF_ONLY,
    ("gpu-undrain", "POST"): STAFF_ONLY,
    ("gputelemetry-list", "GET"): AUTH,
    ("gputelemetry-detail", "GET"): AUTH,
    ("gpuprofile-list", "GET"): AUTH,
    ("gpuprofile-detail", "GET"): AUTH,
    ("predictorversion-list", "GET"): AUTH,
    ("predictorversion-detail", "GET"): AUTH,
    ("predictorversion-train", "POST"): STAFF_ONLY,
    ("predictorversion-training", "GET"): STAFF_ONLY,
    ("predictorversion-activate", "POST"): STAFF_ONLY,
    ("gpujob-list", "GET"): AUTH,
    ("gpujob-list", "POST"): create_in_team("model", viewer=FORBID),
    ("gpujob-place", "POST"): STAFF_ONLY,
    ("gpujob-detail", "GET"): TEAM_READ,
    ("gpujob-cancel", "POST"): TEAM_WRITE,
    ("placement-list", "GET"): AUTH,
    ("placement-detail", "GET"): TEAM_READ,
    ("traceupload-list", "GET"): AUTH,
    ("traceupload-list", "POST"): create_in_team("team"),
    ("traceupload-detail", "GET"): TEAM_READ,
    ("traceupload-detail", "DELETE"): TEAM_WRITE,
    ("simulationrun-list", "GET"): AUTH,
    ("simulationrun-list", "POST"): create_in_team("team"),
    ("simulationrun-detail", "GET"): TEAM_READ,
    ("simulationrun-cancel", "POST"): TEAM_WRITE,
    ("simulationrun-estimate", "POST"): create_in_team("team"),
    ("charts-model-ops", "GET"): TEAM_READ,
    ("charts-run-compare", "GET"): TEAM_READ,
    ("charts-run-curve", "GET"): TEAM_READ,
    ("charts-run-dop", "GET"): TEAM_READ,
    ("charts-run-live", "GET"): TEAM_READ,
    ("charts-energy", "GET"): TEAM_READ,
    ("api-energy", "GET"): TEAM_READ,
    ("api-energy-settings", "GET"): AUTH,
    ("api-energy-settings", "PATCH"): STAFF_ONLY,
    ("charts-cluster", "GET"): TEAM_READ,
    ("charts-simulation", "GET"): TEAM_READ,
    # issue 14: the shared record cache
    ("team-record-cache", "GET"): TEAM_READ,
    ("team-record-cache", "PATCH"): OWNER_ONLY,
    ("run-record-cache", "GET"): TEAM_READ,
    ("record-cache-stats", "GET"): STAFF_ONLY,
    ("record-cache-export", "GET"): STAFF_ONLY,
    ("record-cache-import", "POST"): STAFF_ONLY,
    ("record-cache-purge", "POST"): STAFF_ONLY,
}

# URLs whose object is named by another keyword than pk.
def _predictor_training_id(w) -> str:
    from django_celery_results.models import TaskResult

    return TaskResult.objects.get_or_create(task_id="0f0e0d0c-0b0a-4908-8706-050403020100", defaults={
        "task_name": "scheduling.train_predictor", "status": "SUCCESS", "result": "1"})[0].task_id


URL_KWARGS = {
    "predictorversion-training": lambda w: {"task_id": _predictor_training_id(w)},
    "team-record-cache": lambda w: {"team_ref": w.team_a.pk},
    "run-record-cache": lambda w: {"run_id": w.run.pk},
}

# Which object of the world a detail URL points at (by URL name, else by the name's basename).
OBJECT_FOR = {
    "team": "team_a", "membership": "membership", "teaminvitation": "invitation", "quota": "quota", "dlmodel": "model", "apitoken": "token",
    "tuningrun": "run", "tuningrun-resume": "paused_run", "tuningrun-records": "done_run",
    "tuningrun-archive": "done_run", "tuningrun-restore": "done_run",
    "tuningrun-module": "done_run", "tuningrun-package": "done_run", "node": "node", "gpu": "gpu", "gputelemetry": "telemetry",
    "gpuprofile": "profile", "predictorversion": "predictor", "gpujob": "job", "placement": "placement",
    "traceupload": "trace", "simulationrun": "simulation", "charts-model-ops": "model", "charts-run-curve": "run",
    "charts-run-dop": "run", "charts-run-live": "run", "charts-simulation": "simulation",
}

# Query strings some GETs need to name team A's objects.
QUERY = {
    "charts-run-compare": lambda w: f"?runs={w.run.pk},{w.done_run.pk}",
    "charts-energy": lambda w: f"?team={w.team_a.pk}",
    "api-energy": lambda w: f"?team={w.team_a.pk}",
    "charts-cluster": lambda w: f"?team={w.team_a.pk}",
}


_IMPORT_DB: dict = {}


def _import_body(w):
    """A valid TVM database for the world's model (a real trace of its first task), made once."""
    if not _IMPORT_DB:
        import onnx

        from tuning.engine.testing import tuning_database

        with w.model.file.open("rb") as f:
            model = onnx.load_model_from_string(f.read())
        _IMPORT_DB["db"] = tuning_database(model, w.run.target)
    wl, rec = _IMPORT_DB["db"]
    return ({"workloads": SimpleUploadedFile("database_workload.json", wl),
             "records": SimpleUploadedFile("database_tuning_record.json", rec)}, "multipart")


def _cache_import_body(w):
    """The world model's TVM database offered to the shared cache, for this host's target and TVM."""
    import json

    files, fmt = _import_body(w)
    return ({**files, "target": json.dumps(w.run.target), "hardware": "cpu:test", "tvm_version": "test"}, fmt)


def _onnx_upload(name="upload.onnx"):
    from core.onnx_models import zoo

    return SimpleUploadedFile(name, zoo.build_model("small_cnn").SerializeToString())


# Valid request bodies: an allowed role's request succeeds; a refusal can only be access control.
BODIES = {
    ("team-list", "POST"): lambda w: ({"name": "A brand new team"}, "json"),
    ("team-detail", "PATCH"): lambda w: ({"description": "changed"}, "json"),
    ("teaminvitation-list", "POST"): lambda w: ({"team": w.team_a.pk, "username": "rel-other", "role": "viewer"},
                                                "json"),
    ("membership-detail", "PATCH"): lambda w: ({"role": "viewer"}, "json"),
    ("quota-detail", "PATCH"): lambda w: ({"max_concurrent_runs": 7}, "json"),
    ("api-energy-settings", "PATCH"): lambda w: ({"grid_intensity_g_per_kwh": 120.0}, "json"),
    ("dlmodel-list", "POST"): lambda w: ({"team": w.team_a.pk, "name": "uploaded", "file": _onnx_upload()},
                                         "multipart"),
    ("apitoken-list", "POST"): lambda w: ({"name": "ci"}, "json"),
    ("tuningrun-list", "POST"): lambda w: ({"model": w.model.pk, "max_trials": 8}, "json"),
    ("tuningrun-import-records", "POST"): lambda w: _import_body(w),
    ("predictorversion-train", "POST"): lambda w: ({"k_folds": 2}, "json"),
    ("gpujob-list", "POST"): lambda w: ({"model": w.model.pk, "batch_size": 8, "duration_estimate_s": 60}, "json"),
    ("gpujob-place", "POST"): lambda w: ({}, "json"),
    ("traceupload-list", "POST"): lambda w: (
        {"team": w.team_a.pk, "name": "another", "file": SimpleUploadedFile("p.csv", PHILLY_CSV.encode())},
        "multipart"),
    ("team-record-cache", "PATCH"): lambda w: ({"publish": True}, "json"),  # opt in
    ("record-cache-purge", "POST"): lambda w: ({"target_key": w.run.target_key or "any"}, "json"),
    ("record-cache-import", "POST"): lambda w: _cache_import_body(w),
    ("simulationrun-list", "POST"): lambda w: (
        {"team": w.team_a.pk, "trace": "philly", "policies": ["horus"], "parameters": {"jobs": 20, "gpus": 4}},
        "json"),
    ("simulationrun-estimate", "POST"): lambda w: (
        {"team": w.team_a.pk, "trace": "philly", "policies": ["horus"], "parameters": {"jobs": 20, "gpus": 4}},
        "json"),
}

# List endpoints of team-scoped objects: other teams and staff must not see team A's object in them.
SCOPED_LISTS = {
    "team-list": "team_a", "membership-list": "membership", "quota-list": "quota", "dlmodel-list": "model",
    "tuningrun-list": "run", "gpujob-list": "job", "placement-list": "placement", "traceupload-list": "trace",
    "simulationrun-list": "simulation", "apitoken-list": "token",
}


# --- enumeration -------------------------------------------------------------------------------------

def _walk(patterns, prefix=""):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from _walk(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), p


def _methods(pattern: URLPattern) -> list[str]:
    cb = pattern.callback
    cls = getattr(cb, "cls", None)
    actions = getattr(cb, "actions", None)
    if cls is None:
        return []  # a function view (dashboard)
    allowed = [m for m in cls.http_method_names if m not in ("options", "head", "trace")]
    if actions:
        return sorted(m.upper() for m in actions if m in allowed)
    return sorted(m.upper() for m in allowed if hasattr(cls, m))


def api_operations() -> dict[tuple[str, str], str]:
    """(url name, METHOD) -> route of every API operation the resolver serves (format suffixes aside)."""
    ops = {}
    for route, pattern in _walk(get_resolver().url_patterns):
        if not route.startswith("api/") or "format" in route:
            continue
        for method in _methods(pattern):
            ops[(pattern.name, method)] = route
    return ops


def dashboard_routes() -> dict[str, str]:
    """url name -> route of every dashboard page (everything outside api/ and admin/; the scheduler
    extender's machine endpoints, token-only for every role, are covered by tests/scheduling/test_extender_api.py)."""
    return {p.name: route for route, p in _walk(get_resolver().url_patterns)
            if not route.startswith(("api/", "admin/", "scheduler/extender/"))}


def url_for(name: str, w) -> str:
    """The URL of an operation, pointing at team A's object of the right kind."""
    from django.urls import NoReverseMatch

    try:
        url = reverse(name, kwargs=URL_KWARGS[name](w)) if name in URL_KWARGS else reverse(name)
    except NoReverseMatch:
        if name in OBJECT_FOR:
            key = name
        else:  # "<router basename>-<action>": the longest basename that prefixes the name
            key = max((k for k in OBJECT_FOR if name.startswith(k + "-")), key=len)
        url = reverse(name, kwargs={"pk": getattr(w, OBJECT_FOR[key]).pk})
    return url + (QUERY[name](w) if name in QUERY else "")


def api_client(w, role) -> APIClient:
    client = APIClient()
    if role != "anon":
        client.credentials(HTTP_AUTHORIZATION=f"Token {w.tokens[role]}")
    return client


def call(client, method: str, url: str, body=None, *, after=None):
    """One request in a savepoint that is rolled back (and files it wrote removed)."""
    data, fmt = body if body else (None, None)
    with transaction.atomic():
        kwargs = {"format": fmt} if fmt and isinstance(client, APIClient) else {}
        resp = getattr(client, method.lower())(url, data, **kwargs) if data is not None else \
            getattr(client, method.lower())(url)
        result = after(resp) if after else None
        transaction.set_rollback(True)
    return resp, result


# --- the API matrix --------------------------------------------------------------------------------------

def test_every_api_operation_is_classified_and_in_the_schema(client, django_user_model):
    ops = api_operations()
    unclassified = sorted(set(ops) - set(EXPECTED))
    assert not unclassified, ("API operations nobody classified (add them to EXPECTED with who may do what): "
                              + ", ".join(f"{m} {ops[(n, m)]} ({n})" for n, m in unclassified))
    stale = sorted(set(EXPECTED) - set(ops))
    assert not stale, f"EXPECTED lists operations the resolver no longer serves: {stale}"

    client.force_login(django_user_model.objects.create_user(username="schema-reader", password="pw"))
    schema = client.get("/api/schema/?format=json").json()
    in_schema = set()
    for path, item in schema["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "1", path)
        name = resolve(concrete).url_name
        for method in item:
            if method in ("get", "post", "put", "patch", "delete"):
                in_schema.add((name, method.upper()))
                assert (name, method.upper()) in EXPECTED, f"schema operation {method.upper()} {path} unclassified"
    # Every served operation is documented, except the schema and docs themselves.
    undocumented = set(ops) - in_schema - {("schema", "GET"), ("api-docs", "GET"), ("api-root", "GET")}
    assert not undocumented, f"operations served but missing from the OpenAPI schema: {sorted(undocumented)}"


@pytest.fixture
def cleanup_run_files(world):
    def clean(_resp=None):
        for run in (world.run, world.paused_run):
            shutil.rmtree(Path(settings.MEDIA_ROOT) / "runs" / str(run.pk) / "work", ignore_errors=True)
    return clean


def test_api_access_matrix(world, cleanup_run_files):
    failures, checked = [], 0
    clients = {role: api_client(world, role) for role in ROLES}
    for (name, method), _route in sorted(api_operations().items()):
        url = url_for(name, world)
        for role in ROLES:
            body = BODIES[(name, method)](world) if (name, method) in BODIES else None
            expected = EXPECTED[(name, method)][role]
            resp, ok = call(clients[role], method, url, body, after=lambda r, expected=expected: expected.check(r, world))
            cleanup_run_files()
            checked += 1
            if os.environ.get("ACCESS_MATRIX_DUMP"):
                print(f"{method:6} {url:45} {role:7} {resp.status_code} {expected!r}")
            if resp.status_code >= 500 or not ok:
                detail = resp.content[:200].decode(errors="replace")
                failures.append(f"{method} {url} as {role}: got {resp.status_code}, expected {expected!r}: {detail}")
    assert not failures, f"{len(failures)} of {checked} checks failed:\n" + "\n".join(failures)
    assert checked >= 6 * 70


def test_methods_a_view_does_not_serve_are_405(world):
    """PUT on objects that only take PATCH, DELETE on objects that cannot be deleted, ..."""
    member = api_client(world, "member")
    cases = [("PUT", "team-detail"), ("PUT", "membership-detail"),
             ("PATCH", "tuningrun-detail"), ("DELETE", "gpujob-detail"),
             ("PATCH", "dlmodel-detail"), ("DELETE", "node-detail"), ("POST", "gputelemetry-list")]
    for method, name in cases:
        resp, _ = call(member, method, url_for(name, world), ({}, "json"))
        assert resp.status_code == 405, (method, name, resp.status_code)
    resp, _ = call(api_client(world, "staff"), "PUT", url_for("quota-detail", world), ({}, "json"))
    assert resp.status_code == 405  # staff may PATCH a quota, never PUT it
    # and anonymous callers learn nothing beyond "authenticate"
    for method, name in cases:
        resp, _ = call(APIClient(), method, url_for(name, world), ({}, "json"))
        assert resp.status_code == 401, (method, name, resp.status_code)


def test_lists_never_show_another_teams_objects(world):
    for name, key in SCOPED_LISTS.items():
        target = getattr(world, key).pk
        for role in ("other", "staff", "anon"):
            resp, _ = call(api_client(world, role), "GET", reverse(name) + "?page_size=500")
            if role == "anon":
                assert resp.status_code == 401
                continue
            assert resp.status_code == 200, (name, role)
            ids = [row["id"] for row in resp.json()["results"]]
            assert target not in ids, f"{name} shows team A's object {target} to {role}"
        # ...while the team's own members do see it (the scoping is not just "show nothing")
        owner = "member" if name == "apitoken-list" else "viewer"
        resp, _ = call(api_client(world, owner), "GET", reverse(name) + "?page_size=500")
        assert target in [row["id"] for row in resp.json()["results"]], (name, owner)


def test_unknown_and_foreign_ids_are_indistinguishable(world):
    """Another team's object is a 404 exactly like an object that does not exist (no id probing)."""
    other = api_client(world, "other")
    for name, key in (("dlmodel-detail", "model"), ("tuningrun-detail", "run"), ("gpujob-detail", "job"),
                      ("traceupload-detail", "trace"), ("simulationrun-detail", "simulation")):
        foreign, _ = call(other, "GET", reverse(name, kwargs={"pk": getattr(world, key).pk}))
        missing, _ = call(other, "GET", reverse(name, kwargs={"pk": 987654321}))
        assert foreign.status_code == missing.status_code == 404
        assert foreign.json()["code"] == missing.json()["code"] == "not_found"


def test_revoked_token_and_inactive_user_lose_access(world):
    from core import services
    from core.models import ApiToken

    member = api_client(world, "member")
    assert member.get("/api/me/").status_code == 200
    token = ApiToken.objects.get(user=world.users["member"], name="rel")
    assert member.delete(f"/api/tokens/{token.pk}/").status_code == 200
    resp = member.get("/api/me/")
    assert resp.status_code == 401 and "revoked" in resp.json()["detail"]
    assert member.post("/api/tokens/", {"name": "sneaky"}, format="json").status_code == 401
    # a malformed header is a 401 too, never a 500
    for header in ("Token", "Token a b", "Bearer \xff\xfe", "Token " + "x" * 5000):
        c = APIClient()
        c.credentials(HTTP_AUTHORIZATION=header)
        assert c.get("/api/me/").status_code == 401, header
    # a deactivated user's still-valid token stops working
    issued = services.create_api_token(user=world.users["viewer"], name="second")
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {issued.key}")
    assert c.get("/api/me/").status_code == 200
    type(world.users["viewer"]).objects.filter(pk=world.users["viewer"].pk).update(is_active=False)
    assert c.get("/api/me/").status_code == 401


# --- the dashboard matrix -------------------------------------------------------------------------------

def _login_redirect(r, w):
    return r.status_code == 302 and r["Location"].startswith(reverse("login"))


LOGIN = Outcome("302->login", _login_redirect)
PAGE = Outcome("200", _status(200))
REDIRECT = Outcome("302 (not to login)", lambda r, w: r.status_code == 302 and not _login_redirect(r, w))


def effect(base: Outcome, desc: str, predicate) -> Outcome:
    return Outcome(f"{base.name} and {desc}", lambda r, w: base.check(r, w) and predicate(w))


def _run_status(w):
    from tuning.models import TuningRun

    return TuningRun.objects.get(pk=w.run.pk).status


def _model_count(w):
    from core.models import DLModel

    return DLModel.objects.filter(team=w.team_a).count()


def _run_count(w):
    from tuning.models import TuningRun

    return TuningRun.objects.filter(team=w.team_a).count()


CANCELLED = effect(REDIRECT, "the run is cancelled", lambda w: _run_status(w) == "cancelled")
UNCHANGED_RUN = effect(REDIRECT, "the run is unchanged", lambda w: _run_status(w) == "queued")
MODEL_ADDED = effect(REDIRECT, "a model was added", lambda w: _model_count(w) == 2)
NO_MODEL = effect(PAGE, "no model was added", lambda w: _model_count(w) == 1)
RUN_ADDED = effect(REDIRECT, "a run was added", lambda w: _run_count(w) == 4)
NO_RUN = effect(PAGE, "no run was added", lambda w: _run_count(w) == 3)


def _model_archived(w) -> bool:
    from core.models import DLModel

    return DLModel.objects.get(pk=w.model.pk).archived_at is not None


MODEL_ARCHIVED = effect(REDIRECT, "the model is archived", _model_archived)
MODEL_LIVE = effect(REDIRECT, "the model is not archived", lambda w: not _model_archived(w))

def _count(model_path: str, **filters):
    def count(w):
        from django.apps import apps

        return apps.get_model(model_path).objects.filter(**{k: v(w) if callable(v) else v
                                                              for k, v in filters.items()}).count()
    return count


_invitations = _count("core.TeamInvitation", team=lambda w: w.team_a)
_member_role = lambda w: _member_of_a(w, "member")  # noqa: E731


def _member_of_a(w, role):
    from core.models import Membership

    return Membership.objects.filter(team=w.team_a, user=w.users[role]).values_list("role", flat=True).first()


def _token_active(w):
    from core.models import ApiToken

    return ApiToken.objects.get(pk=w.token.pk).is_active


def _has_webhook(w):
    from core.models import TeamWebhook

    return TeamWebhook.objects.filter(team=w.team_a).exists()


def _imported(w):
    from tuning.models import TuningRun

    return "imported_records" in TuningRun.objects.get(pk=w.run.pk).options


TOKEN_ADDED = effect(PAGE, "a token was added", lambda w: _count("core.ApiToken", name="dash-token")(w) == 1)
INVITED = effect(REDIRECT, "an invitation was made", lambda w: _invitations(w) == 2)
NOT_INVITED = effect(REDIRECT, "no invitation was made", lambda w: _invitations(w) == 1)
DEMOTED = effect(REDIRECT, "the member is now a viewer", lambda w: _member_role(w) == "viewer")
NOT_DEMOTED = effect(REDIRECT, "the member's role is unchanged", lambda w: _member_role(w) == "member")
REVOKED = effect(REDIRECT, "the token is revoked", lambda w: not _token_active(w))
WEBHOOK_SET = effect(PAGE, "the webhook is set", _has_webhook)
NO_WEBHOOK = effect(REDIRECT, "no webhook was set", lambda w: not _has_webhook(w))
NOT_IMPORTED = effect(REDIRECT, "nothing was imported", lambda w: not _imported(w))


def _cache_setting(w):
    from recordcache.selectors import team_settings

    s = team_settings(w.team_a.pk)
    return s.publish, s.read


CACHE_SET = effect(REDIRECT, "team A's runs opted in to publishing to the record cache and stopped reading it",
                   lambda w: _cache_setting(w) == (True, False))
CACHE_UNCHANGED = effect(REDIRECT, "team A's record-cache setting is unchanged (the default: no publishing, read)",
                         lambda w: _cache_setting(w) == (False, True))


def _left(role):
    return effect(REDIRECT, f"the {role} left", lambda w: _member_of_a(w, role) is None)


STAYED = effect(REDIRECT, "the last owner is still in the team", lambda w: _member_of_a(w, "owner") == "owner")
JOINED = effect(REDIRECT, "the invitee joined", lambda w: _member_of_a(w, "other") == "viewer")
def _job_count(w):
    from scheduling.models import GpuJob

    return GpuJob.objects.filter(team=w.team_a).count()


def _job_state(w):
    from scheduling.models import GpuJob

    return GpuJob.objects.get(pk=w.job.pk).state


def _sim_count(w):
    from scheduling.models import SimulationRun

    return SimulationRun.objects.filter(team=w.team_a).count()


def _sim_status(w):
    from scheduling.models import SimulationRun

    return SimulationRun.objects.get(pk=w.simulation.pk).status


JOB_ADDED = effect(REDIRECT, "a GPU job was added", lambda w: _job_count(w) == 3)
NO_JOB = effect(PAGE, "no GPU job was added", lambda w: _job_count(w) == 2)
JOB_CANCELLED = effect(REDIRECT, "the job is cancelled", lambda w: _job_state(w) == "cancelled")
JOB_UNCHANGED = effect(REDIRECT, "the job is unchanged", lambda w: _job_state(w) == "pending")
SIM_ADDED = effect(REDIRECT, "a simulation was added", lambda w: _sim_count(w) == 2)
NO_SIM = effect(PAGE, "no simulation was added", lambda w: _sim_count(w) == 1)
SIM_CANCELLED = effect(REDIRECT, "the simulation is cancelled", lambda w: _sim_status(w) == "cancelled")
SIM_UNCHANGED = effect(REDIRECT, "the simulation is unchanged", lambda w: _sim_status(w) == "queued")

SIGNED_IN_PAGE = _profile(anon=LOGIN, viewer=PAGE, member=PAGE, owner=PAGE, other=PAGE, staff=PAGE)
TEAM_PAGE = _profile(anon=LOGIN, viewer=PAGE, member=PAGE, owner=PAGE, other=HIDDEN, staff=HIDDEN)
POST_ONLY = _profile(anon=LOGIN, viewer=NOT_ALLOWED, member=NOT_ALLOWED, owner=NOT_ALLOWED, other=NOT_ALLOWED,
                     staff=NOT_ALLOWED)

# (url name, METHOD) -> role -> outcome for every dashboard URL.
DASHBOARD_EXPECTED = {
    ("login", "GET"): _profile(anon=PAGE, viewer=PAGE, member=PAGE, owner=PAGE, other=PAGE, staff=PAGE),
    ("logout", "GET"): _profile(anon=NOT_ALLOWED, viewer=NOT_ALLOWED, member=NOT_ALLOWED, owner=NOT_ALLOWED,
                                other=NOT_ALLOWED, staff=NOT_ALLOWED),
    ("logout", "POST"): _profile(anon=LOGIN, viewer=LOGIN, member=LOGIN, owner=LOGIN, other=LOGIN, staff=LOGIN),
    ("home", "GET"): SIGNED_IN_PAGE,
    ("switch-team", "GET"): POST_ONLY,
    ("switch-team", "POST"): _profile(anon=LOGIN, viewer=REDIRECT, member=REDIRECT, owner=REDIRECT, other=HIDDEN,
                                      staff=HIDDEN),
    ("model-list", "GET"): SIGNED_IN_PAGE,
    ("model-upload", "GET"): SIGNED_IN_PAGE,
    ("model-upload", "POST"): _profile(anon=LOGIN, viewer=NO_MODEL, member=MODEL_ADDED, owner=MODEL_ADDED,
                                       other=NO_MODEL, staff=NO_MODEL),
    ("model-detail", "GET"): TEAM_PAGE,
    ("model-archive", "GET"): POST_ONLY,
    ("model-archive", "POST"): _profile(anon=LOGIN, viewer=MODEL_LIVE, member=MODEL_ARCHIVED, owner=MODEL_ARCHIVED,
                                        other=HIDDEN, staff=HIDDEN),
    ("model-restore", "GET"): POST_ONLY,
    # world.model is not archived: restoring it changes nothing, for anyone
    ("model-restore", "POST"): _profile(anon=LOGIN, viewer=MODEL_LIVE, member=MODEL_LIVE, owner=MODEL_LIVE,
                                        other=HIDDEN, staff=HIDDEN),
    ("run-list", "GET"): SIGNED_IN_PAGE,
    ("run-start", "GET"): SIGNED_IN_PAGE,
    ("run-start", "POST"): _profile(anon=LOGIN, viewer=NO_RUN, member=RUN_ADDED, owner=RUN_ADDED, other=NO_RUN,
                                    staff=NO_RUN),
    ("run-compare", "GET"): SIGNED_IN_PAGE,
    ("run-detail", "GET"): TEAM_PAGE,
    ("run-control", "GET"): POST_ONLY,
    ("run-control", "POST"): _profile(anon=LOGIN, viewer=UNCHANGED_RUN, member=CANCELLED, owner=CANCELLED,
                                      other=HIDDEN, staff=HIDDEN),
    ("cluster", "GET"): SIGNED_IN_PAGE,
    ("job-new", "GET"): SIGNED_IN_PAGE,
    ("job-new", "POST"): _profile(anon=LOGIN, viewer=NO_JOB, member=JOB_ADDED, owner=JOB_ADDED, other=NO_JOB,
                                  staff=NO_JOB),
    # the preview predicts only for models the caller may submit: a viewer's or another team's is a 404
    ("job-preview", "GET"): _profile(anon=LOGIN, viewer=HIDDEN, member=PAGE, owner=PAGE, other=HIDDEN,
                                     staff=HIDDEN),
    ("job-detail", "GET"): TEAM_PAGE,
    ("job-cancel", "GET"): POST_ONLY,
    ("job-cancel", "POST"): _profile(anon=LOGIN, viewer=JOB_UNCHANGED, member=JOB_CANCELLED, owner=JOB_CANCELLED,
                                     other=HIDDEN, staff=HIDDEN),
    ("simulations", "GET"): SIGNED_IN_PAGE,
    ("simulation-new", "GET"): SIGNED_IN_PAGE,
    ("simulation-new", "POST"): _profile(anon=LOGIN, viewer=NO_SIM, member=SIM_ADDED, owner=SIM_ADDED,
                                         other=NO_SIM, staff=NO_SIM),
    ("simulation-detail", "GET"): TEAM_PAGE,
    ("simulation-progress", "GET"): TEAM_PAGE,
    ("simulation-cancel", "GET"): POST_ONLY,
    ("simulation-cancel", "POST"): _profile(anon=LOGIN, viewer=SIM_UNCHANGED, member=SIM_CANCELLED,
                                            owner=SIM_CANCELLED, other=HIDDEN, staff=HIDDEN),
    ("energy", "GET"): SIGNED_IN_PAGE,
    # issue 17: tokens, teams and members, webhooks, record import
    ("settings-tokens", "GET"): SIGNED_IN_PAGE,
    ("settings-tokens", "POST"): _profile(anon=LOGIN, viewer=TOKEN_ADDED, member=TOKEN_ADDED, owner=TOKEN_ADDED,
                                          other=TOKEN_ADDED, staff=TOKEN_ADDED),
    ("token-revoke", "GET"): POST_ONLY,
    ("token-revoke", "POST"): _profile(anon=LOGIN, viewer=HIDDEN, member=REVOKED, owner=HIDDEN, other=HIDDEN,
                                       staff=HIDDEN),  # world.token is the member's
    ("team-list-page", "GET"): SIGNED_IN_PAGE,
    ("team-page", "GET"): TEAM_PAGE,
    ("team-invite", "GET"): POST_ONLY,
    ("team-invite", "POST"): _profile(anon=LOGIN, viewer=NOT_INVITED, member=NOT_INVITED, owner=INVITED,
                                      other=HIDDEN, staff=HIDDEN),
    ("team-leave", "GET"): POST_ONLY,
    ("team-leave", "POST"): _profile(anon=LOGIN, viewer=_left("viewer"), member=_left("member"), owner=STAYED,
                                     other=HIDDEN, staff=HIDDEN),
    ("team-member", "GET"): POST_ONLY,
    ("team-member", "POST"): _profile(anon=LOGIN, viewer=NOT_DEMOTED, member=NOT_DEMOTED, owner=DEMOTED,
                                      other=HIDDEN, staff=HIDDEN),
    ("team-webhook", "GET"): POST_ONLY,
    ("team-webhook", "POST"): _profile(anon=LOGIN, viewer=NO_WEBHOOK, member=NO_WEBHOOK, owner=WEBHOOK_SET,
                                       other=HIDDEN, staff=HIDDEN),
    ("team-record-cache", "GET"): POST_ONLY,
    ("team-record-cache", "POST"): _profile(anon=LOGIN, viewer=CACHE_UNCHANGED, member=CACHE_UNCHANGED,
                                            owner=CACHE_SET, other=HIDDEN, staff=HIDDEN),
    ("invitation-answer", "GET"): POST_ONLY,
    # world.invitation invites "other" (team B's owner) into team A: only they see and answer it
    ("invitation-answer", "POST"): _profile(anon=LOGIN, viewer=HIDDEN, member=HIDDEN, owner=HIDDEN, other=JOINED,
                                            staff=HIDDEN),
    ("run-import-records", "GET"): POST_ONLY,
    ("run-import-records", "POST"): _profile(anon=LOGIN, viewer=NOT_IMPORTED, member=NOT_IMPORTED,
                                             owner=NOT_IMPORTED, other=HIDDEN, staff=HIDDEN),
    ("favicon", "GET"): {role: Outcome("301", _status(301)) for role in ("anon", "viewer", "member", "owner",
                                                                          "other", "staff")},
}

DASHBOARD_OBJECTS = {"model-detail": "model", "model-archive": "model", "model-restore": "model",
                     "run-detail": "run", "simulation-detail": "simulation",
                     "simulation-progress": "simulation", "simulation-cancel": "simulation", "job-detail": "job",
                     "job-cancel": "job",
                     "team-page": "team_a", "team-invite": "team_a", "team-leave": "team_a",
                     "token-revoke": "token", "run-import-records": "run", "team-record-cache": "team_a"}
DASHBOARD_ACTIONS = {  # name -> (object, extra kwargs)
    "team-member": ("team_a", lambda w: {"member_pk": w.membership.pk, "action": "role"}),
    "team-webhook": ("team_a", lambda w: {"action": "set"}),
    "invitation-answer": ("invitation", lambda w: {"action": "accept"}),
}
DASHBOARD_QUERY = {"job-preview": lambda w: f"?model={w.model.pk}&batch_size=8"}


def dashboard_url(name: str, w) -> str:
    if name == "run-control":
        return reverse(name, kwargs={"pk": w.run.pk, "action": "cancel"})
    if name in DASHBOARD_ACTIONS:
        key, extra = DASHBOARD_ACTIONS[name]
        return reverse(name, kwargs={"pk": getattr(w, key).pk, **extra(w)})
    if name in DASHBOARD_OBJECTS:
        return reverse(name, kwargs={"pk": getattr(w, DASHBOARD_OBJECTS[name]).pk})
    return reverse(name) + (DASHBOARD_QUERY[name](w) if name in DASHBOARD_QUERY else "")


def dashboard_body(name: str, w, role: str | None = None):
    if name == "settings-tokens":
        user = w.users.get(role)
        return {"name": "dash-token", "password": f"pw-{user.username}" if user else "?"}
    if name == "team-invite":
        return {"username": "rel-staff", "role": "viewer"}
    if name == "team-member":
        return {"role": "viewer"}
    if name == "team-webhook":
        return {"url": "http://127.0.0.1:9/hook"}  # the matrix test allow-lists it (no DNS here)
    if name == "team-record-cache":
        return {"publish": "on"}  # read unchecked: both differ from the default
    if name == "run-import-records":
        return {"workloads": SimpleUploadedFile("database_workload.json", b"[1]\n"),
                "records": SimpleUploadedFile("database_tuning_record.json", b"[1]\n")}
    if name == "switch-team":
        return {"team": w.team_a.pk}
    if name == "model-upload":
        return {"team": w.team_a.pk, "name": "dash-upload", "description": "", "file": _onnx_upload("d.onnx")}
    if name == "run-start":
        return {"model": w.model.pk, "target_kind": "llvm", "num_cores": 2, "max_trials": 16,
                "trials_per_round": 8, "measurement_mode": "doppler", "dop_mode": "auto", "dop_fixed": "",
                "threads": "", "search_population": "", "seed": ""}
    if name == "job-new":
        return {"model": w.model.pk, "batch_size": 8, "iterations": 10, "duration_estimate_s": 60,
                "runtime": "auto"}
    if name == "simulation-new":
        return {"team": w.team_a.pk, "trace": "philly", "policies": ["horus"], "seeds": "0", "jobs": 20, "gpus": 4}
    return {}


def test_every_dashboard_url_is_classified():
    routes = dashboard_routes()
    classified = {name for name, _ in DASHBOARD_EXPECTED}
    assert not set(routes) - classified, f"dashboard URLs nobody classified: {sorted(set(routes) - classified)}"
    assert not classified - set(routes), f"classified URLs that no longer exist: {sorted(classified - set(routes))}"


def test_dashboard_access_matrix(world, celery_outbox, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES, settings.WEBHOOK_HTTP_HOSTS = True, ["127.0.0.1"]
    failures = []
    for (name, method), per_role in sorted(DASHBOARD_EXPECTED.items()):
        url = dashboard_url(name, world)
        for role in ROLES:
            client = Client()
            if role != "anon":
                client.force_login(world.users[role])
            body = (dashboard_body(name, world, role), None) if method == "POST" else None
            expected = per_role[role]
            resp, ok = call(client, method, url, body, after=lambda r, expected=expected: expected.check(r, world))
            if resp.status_code >= 500 or not ok:
                failures.append(f"{method} {url} as {role}: got {resp.status_code} "
                                f"{resp.get('Location', '')}, expected {expected!r}")
    assert not failures, "\n".join(failures)


def test_admin_is_staff_only(world):
    from django.contrib.auth.models import Permission

    for role in ROLES:
        client = Client()
        if role != "anon":
            client.force_login(world.users[role])
        resp = client.get("/admin/")
        if role == "staff":
            assert resp.status_code == 200
        else:
            assert resp.status_code == 302 and "/admin/login/" in resp["Location"], role
    # staff without model permissions sees no team data in the admin
    staff = Client()
    staff.force_login(world.users["staff"])
    assert not Permission.objects.filter(user=world.users["staff"]).exists()
    assert staff.get("/admin/core/dlmodel/").status_code == 403


# --- CSRF ---------------------------------------------------------------------------------------------

FORM_RE = re.compile(r"<form\b([^>]*)>", re.I)


def _post_forms(html: str, page_url: str) -> set[str]:
    out = set()
    for attrs in FORM_RE.findall(html):
        if re.search(r'method\s*=\s*"post"', attrs, re.I):
            m = re.search(r'action\s*=\s*"([^"]*)"', attrs)
            out.add(m.group(1) if m and m.group(1) else page_url)
    return out


def test_every_dashboard_form_refuses_a_post_without_csrf_token(world, celery_outbox):
    """Find every POST form on every dashboard page (rendered for the owner, who sees all controls),
    then POST to each without the token: 403, and nothing changes."""
    from core.services import create_team
    from tuning.models import TuningRun

    create_team(name="Rel Team C", owner=world.users["owner"])  # two teams: the team switcher shows
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.users["owner"])
    actions: dict[str, str] = {}
    for name, method in DASHBOARD_EXPECTED:
        if method != "GET" or name in ("logout", "switch-team", "run-control", "favicon") or \
                DASHBOARD_EXPECTED[(name, method)] is POST_ONLY:
            continue
        url = dashboard_url(name, world)
        resp = strict.get(url)
        assert resp.status_code == 200, url
        for action in _post_forms(resp.content.decode(), url):
            actions.setdefault(action, url)
    # every dashboard view that accepts POST has a form somewhere, and we found it
    posted_names = {resolve(a.split("?")[0]).url_name for a in actions}
    assert {"login", "logout", "switch-team", "model-upload", "run-start", "run-control", "settings-tokens",
            "token-revoke", "team-invite", "team-leave", "team-member", "team-webhook", "team-record-cache",
            "run-import-records", "job-new", "job-cancel", "simulation-new", "simulation-cancel",
            "model-archive"} <= posted_names, \
        posted_names

    def state():
        from core.models import ApiToken, Membership

        return (TuningRun.objects.filter(team=world.team_a).count(), _model_count(world), _run_status(world),
                _invitations(world), _has_webhook(world), _imported(world), ApiToken.objects.filter(
                    revoked_at__isnull=True).count(), sorted(Membership.objects.values_list("pk", "role")),
                _job_count(world), _job_state(world), _sim_count(world), _sim_status(world),
                _cache_setting(world), _model_archived(world))
    before = state()
    for action in sorted(actions):
        name = resolve(action.split("?")[0]).url_name
        resp = strict.post(action, dashboard_body(name, world, "owner"))
        assert resp.status_code == 403, f"POST {action} without a CSRF token got {resp.status_code}"
    assert state() == before
    anon = Client(enforce_csrf_checks=True)
    assert anon.post("/login/", {"username": "rel-owner", "password": "pw-rel-owner"}).status_code == 403


def test_session_authenticated_api_writes_need_csrf(world):
    """The API takes session auth too (the dashboard's fetch()): a cross-site POST riding on the session
    cookie must be refused on every unsafe operation."""
    strict = APIClient(enforce_csrf_checks=True)
    strict.force_login(world.users["owner"])
    # force_login + APIClient: authenticate through the session, not force_authenticate
    failures = []
    for (name, method), _route in sorted(api_operations().items()):
        if method == "GET":
            continue
        url = url_for(name, world)
        body = BODIES[(name, method)](world) if (name, method) in BODIES else ({}, "json")
        resp, _ = call(strict, method, url, body)
        if resp.status_code != 403 or "CSRF" not in resp.content.decode():
            failures.append(f"{method} {url}: {resp.status_code} {resp.content[:120]!r}")
    assert not failures, "\n".join(failures)
    # with the token the same session works (it is CSRF, not the session, being refused)
    resp = strict.get("/api/me/")
    assert resp.status_code == 200 and resp.json()["username"] == "rel-owner"


# --- issue 11 s.7: token minting, team grid intensity, throttles --------------------------------------------

def test_a_token_cannot_mint_tokens_but_a_session_can(world):
    from core.models import ApiToken

    before = ApiToken.objects.count()
    for role in ("viewer", "member", "owner", "staff"):
        resp = api_client(world, role).post("/api/tokens/", {"name": "child"}, format="json")
        assert resp.status_code == 403 and "session login" in resp.json()["detail"], (role, resp.content)
    assert ApiToken.objects.count() == before
    session = APIClient()
    session.force_login(world.users["member"])
    resp = session.post("/api/tokens/", {"name": "from-session", "password": "pw-rel-member"}, format="json")
    assert resp.status_code == 201 and resp.json()["key"]
    # revoking the leaked parent leaves no children it made
    assert not ApiToken.objects.filter(user=world.users["member"], name="child").exists()


@pytest.mark.parametrize("value", [0, 1e308, 400.0, None])
def test_team_owners_cannot_set_their_grid_intensity(world, value):
    team = world.team_a
    resp = api_client(world, "owner").patch(f"/api/teams/{team.pk}/", {"grid_intensity_g_per_kwh": value},
                                            format="json")
    assert resp.status_code in (400, 403), resp.content  # 1e308 may fail the bounds first
    team.refresh_from_db()
    assert team.grid_intensity_g_per_kwh is None
    # the owner can still rename/describe it
    resp = api_client(world, "owner").patch(f"/api/teams/{team.pk}/", {"description": "ours"}, format="json")
    assert resp.status_code == 200


def test_staff_set_team_grid_intensity_within_energy_limits(world):
    from core import services
    from core.exceptions import PermissionDenied, ServiceError
    from core.models import ENERGY_LIMITS

    team, staff = world.team_a, world.users["staff"]
    low, high = ENERGY_LIMITS["grid_intensity_g_per_kwh"]
    for bad in (high * 10, 1e308, -1.0, float("nan"), float("inf")):
        with pytest.raises(ServiceError):
            services.update_team(actor=staff, team=team, grid_intensity_g_per_kwh=bad)
    with pytest.raises(PermissionDenied):
        services.update_team(actor=world.users["owner"], team=team, grid_intensity_g_per_kwh=120.0)
    services.update_team(actor=staff, team=team, grid_intensity_g_per_kwh=120.0)
    team.refresh_from_db()
    assert team.grid_intensity_g_per_kwh == 120.0
    # the admin form (staff) applies the same bounds
    type(staff).objects.filter(pk=staff.pk).update(is_superuser=True)  # may edit every model in the admin
    admin = Client()
    admin.force_login(staff)
    resp = admin.post(f"/admin/core/team/{team.pk}/change/", {
        "name": team.name, "slug": team.slug, "description": "", "grid_intensity_g_per_kwh": "1e308",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "quota-TOTAL_FORMS": "0", "quota-INITIAL_FORMS": "0"})
    assert resp.status_code == 200 and b"errornote" in resp.content
    team.refresh_from_db()
    assert team.grid_intensity_g_per_kwh == 120.0


def _small_rates(settings, **rates):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
                                                          **rates}}


def test_uploads_are_throttled(world, settings):
    _small_rates(settings, uploads="2/hour")
    member = api_client(world, "member")
    statuses = []
    for i in range(3):
        resp = member.post("/api/models/", {"team": world.team_a.pk, "name": f"throttled-{i}",
                                            "file": _onnx_upload()}, format="multipart")
        statuses.append(resp.status_code)
    assert statuses == [201, 201, 429], statuses
    assert resp.json()["code"] == "throttled" and int(resp["Retry-After"]) > 0
    assert not world.model.team.models.filter(name="throttled-2").exists()
    # reads are not counted, and other users have their own count
    assert member.get("/api/models/").status_code == 200
    owner = api_client(world, "owner")
    assert owner.post("/api/models/", {"team": world.team_a.pk, "name": "by-owner", "file": _onnx_upload()},
                      format="multipart").status_code == 201
    # trace uploads count against the same scope
    resp = member.post("/api/traces/", {"team": world.team_a.pk, "name": "t", "file": SimpleUploadedFile(
        "p.csv", PHILLY_CSV.encode())}, format="multipart")
    assert resp.status_code == 429


def test_token_creation_is_throttled(world, settings):
    _small_rates(settings, tokens="2/hour")
    session = APIClient()
    session.force_login(world.users["member"])
    statuses = [session.post("/api/tokens/", {"name": f"t{i}", "password": "pw-rel-member"},
                             format="json").status_code for i in range(3)]
    assert statuses == [201, 201, 429], statuses


def test_dashboard_login_is_throttled(world, settings):
    _small_rates(settings, login="3/minute")
    c = Client()
    statuses = [c.post("/login/", {"username": "rel-member", "password": "wrong"}).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]
    resp = c.post("/login/", {"username": "rel-member", "password": "pw-rel-member"})  # right, but too late
    assert resp.status_code == 429 and b"Too many login attempts" in resp.content
    assert "_auth_user_id" not in c.session


# --- issue 11 s.7: invitations instead of adding; anyone can leave; nothing tells who exists ------------------

def test_owner_cannot_add_anyone_only_invite(world):
    from core import services
    from core.exceptions import PermissionDenied
    from core.models import Membership

    owner = api_client(world, "owner")
    resp = owner.post("/api/memberships/", {"team": world.team_a.pk, "username": "rel-staff", "role": "viewer"},
                      format="json")
    assert resp.status_code == 405
    with pytest.raises(PermissionDenied):
        services.add_member(actor=world.users["owner"], team=world.team_a, user=world.users["staff"], role="viewer")
    assert not Membership.objects.filter(team=world.team_a, user=world.users["staff"]).exists()


def test_invitation_does_not_reveal_whether_a_user_exists(world):
    from core.models import TeamInvitation

    owner = api_client(world, "owner")
    answers = {}
    for username in ("rel-staff", "no-such-user-anywhere", "rel-member"):  # exists / unknown / already member
        resp = owner.post("/api/invitations/", {"team": world.team_a.pk, "username": username, "role": "member"},
                          format="json")
        answers[username] = (resp.status_code, resp.json()["detail"].replace(username, "NAME"))
    assert len(set(answers.values())) == 1 and answers["rel-staff"][0] == 202, answers
    assert TeamInvitation.objects.filter(user=world.users["staff"]).exists()
    assert not TeamInvitation.objects.filter(user=world.users["member"]).exists()
    # an unknown team and another team's id are refused alike
    bodies = []
    for team_id in (world.team_b.pk, 10**9):
        resp = owner.post("/api/invitations/", {"team": team_id, "username": "rel-staff"}, format="json")
        bodies.append((resp.status_code, resp.json()["detail"]))
    assert bodies[0] == bodies[1] and bodies[0][0] == 400, bodies


def test_invited_user_accepts_or_declines_and_any_member_can_leave(world):
    from core.models import Membership, TeamInvitation

    other = api_client(world, "other")
    (inv,) = other.get("/api/invitations/").json()["results"]
    assert inv["team"] == world.team_a.pk and inv["role"] == "viewer"
    assert api_client(world, "owner").get("/api/invitations/").json()["count"] == 0  # only the invitee sees it
    assert api_client(world, "owner").post(f"/api/invitations/{inv['id']}/accept/").status_code == 404
    resp = other.post(f"/api/invitations/{inv['id']}/accept/")
    assert resp.status_code == 201 and resp.json()["role"] == "viewer"
    assert not TeamInvitation.objects.filter(pk=inv["id"]).exists()
    membership = Membership.objects.get(team=world.team_a, user=world.users["other"])
    # the added user can leave again, as can any member
    assert other.delete(f"/api/memberships/{membership.pk}/").status_code == 204
    assert api_client(world, "viewer").delete(
        f"/api/memberships/{Membership.objects.get(team=world.team_a, user=world.users['viewer']).pk}/"
    ).status_code == 204
    # decline: the invitation goes, no membership appears
    api_client(world, "owner").post("/api/invitations/", {"team": world.team_a.pk, "username": "rel-other"},
                                    format="json")
    (inv,) = other.get("/api/invitations/").json()["results"]
    assert other.post(f"/api/invitations/{inv['id']}/decline/").status_code == 204
    assert not Membership.objects.filter(team=world.team_a, user=world.users["other"]).exists()


def test_the_last_owner_cannot_leave(world):
    from core.models import Membership

    mine = Membership.objects.get(team=world.team_a, user=world.users["owner"])
    resp = api_client(world, "owner").delete(f"/api/memberships/{mine.pk}/")
    assert resp.status_code == 409 and "last owner" in resp.json()["detail"]
    assert Membership.objects.filter(pk=mine.pk).exists()


def test_an_invitation_dies_with_its_inviters_ownership(world):
    """A hostile owner about to be removed invites a second account as owner; only the invitee sees
    the invitation, so the team cannot revoke it. Once the inviter is no longer an owner of the team,
    accepting it is refused (404, as for any invitation that is not there) and makes no membership."""
    from core import services
    from core.models import Membership

    owner, staff = world.users["owner"], world.users["staff"]
    Membership.objects.create(team=world.team_a, user=world.users["staff"], role=Membership.Role.OWNER)
    services.invite_member(actor=owner, team=world.team_a, username="rel-other", role="owner")
    services.remove_member(actor=staff, membership=Membership.objects.get(team=world.team_a, user=owner))
    other = api_client(world, "other")
    (inv,) = other.get("/api/invitations/").json()["results"]
    assert inv["role"] == "owner"
    assert other.post(f"/api/invitations/{inv['id']}/accept/").status_code == 404
    assert not Membership.objects.filter(team=world.team_a, user=world.users["other"]).exists()


def test_record_imports_count_as_uploads_for_the_throttle(world, settings):
    """An import is a 250 MB upload that holds a web worker while TVM checks it: it had only the
    catch-all user rate (100000/hour), so a member could hold every web worker with imports."""
    from tuning import services as tuning_services

    _small_rates(settings, uploads="1/hour")
    run = tuning_services.start_run(actor=world.users["member"], model=world.model, max_trials=4, enqueue=False)
    member = api_client(world, "member")
    statuses = [member.post(f"/api/runs/{run.pk}/import-records/", {
        "workloads": SimpleUploadedFile("w.json", b"x\n"), "records": SimpleUploadedFile("r.json", b"y\n")},
        format="multipart").status_code for _ in range(2)]
    assert statuses == [400, 429], statuses
