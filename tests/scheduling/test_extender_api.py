"""The scheduler extender over HTTP: kube-scheduler's recorded requests in, its result shapes out, the
Bearer token, and bind through a (local, recording) Kubernetes API server."""
from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock

import pytest
from django.test import Client

from scheduling import tasks
from scheduling.models import PodBinding
from scheduling.services import place_pending_jobs, set_node_drained

from .fakes import fake_gpu, make_job, register_gpu_node

FIXTURES = Path(__file__).parent / "extender_fixtures"
TOKEN = "s3cret-extender-token"
POD_UID = "0f6d3c52-5b0e-4a55-9f1e-2d7c1c9c7a10"


def fixture(name: str, model_ref: str) -> dict:
    return json.loads((FIXTURES / name).read_text().replace("MODEL_REF", model_ref))


@pytest.fixture
def extender_on(settings):
    settings.SCHEDULER_EXTENDER_TOKEN = TOKEN
    return settings


@pytest.fixture
def nodes(db):
    """Two dlopt GPU nodes named as their Kubernetes nodes, two V100s each."""
    return register_gpu_node("gpu-a"), register_gpu_node("gpu-b", [fake_gpu(), fake_gpu(), fake_gpu(), fake_gpu()])


def post(verb: str, body, token: str | None = TOKEN, content_type="application/json"):
    headers = {} if token is None else {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return Client(enforce_csrf_checks=True).post(f"/scheduler/extender/{verb}", data=data,
                                                 content_type=content_type, **headers)


class FakeApiServer:
    """A real HTTP server speaking the three Kubernetes API calls bind makes; it records them."""

    def __init__(self, pods: dict[tuple[str, str], dict], fail_binding: bool = False):
        self.pods, self.requests, self.fail_binding = pods, [], fail_binding
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                outer.requests.append({"method": self.command, "path": self.path, "body": body,
                                       "auth": self.headers.get("Authorization"),
                                       "content_type": self.headers.get("Content-Type")})
                parts = self.path.strip("/").split("/")  # api v1 namespaces NS pods NAME [binding]
                pod = outer.pods.get((parts[3], parts[5])) if len(parts) >= 6 else None
                if pod is None:
                    return self._answer(404, {"kind": "Status", "reason": "NotFound"})
                if self.command == "PATCH":
                    pod["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
                if self.command == "POST" and outer.fail_binding:
                    return self._answer(409, {"kind": "Status", "reason": "Conflict"})
                return self._answer(201 if self.command == "POST" else 200, pod)

            do_GET = do_PATCH = do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def no_celery():
    with mock.patch.object(tasks.run_job, "apply_async"), mock.patch.object(tasks.place_pending, "delay"):
        yield


# ------------------------------------------------------------------ authentication (attack tests)

@pytest.mark.parametrize("token", [None, "", "wrong", TOKEN + "x", TOKEN[:-1]])
def test_every_verb_refuses_a_missing_or_wrong_token(extender_on, model_a, token):
    for verb in ("filter", "prioritize", "bind", "release"):
        r = post(verb, fixture("filter_args_nodelist.json", str(model_a.pk)), token=token)
        assert r.status_code == 401, verb
        assert "Bearer" in r.json()["Error"] and r["WWW-Authenticate"].startswith("Bearer")


def test_a_dlopt_api_token_scheme_or_session_is_not_the_extender_token(extender_on, client, user_owner, user_staff,
                                                                       model_a):
    from core.models import ApiToken

    for user in (user_owner, user_staff):  # not even a staff session or a staff API token
        client.force_login(user)
        key = ApiToken.objects.create(user=user, name="t", prefix="k", key_hash=ApiToken.hash_key(f"k-{user.pk}"))
        for header in (f"Token {TOKEN}", f"Bearer k-{user.pk}", ""):
            r = client.post("/scheduler/extender/filter", data=json.dumps(fixture("filter_args_nodelist.json", "1")),
                            content_type="application/json", HTTP_AUTHORIZATION=header)
            assert r.status_code == 401, (user, header)
        key.delete()


def test_with_no_token_configured_the_extender_is_off(settings, db):
    settings.SCHEDULER_EXTENDER_TOKEN = ""
    r = post("filter", {"Pod": {}, "NodeNames": []}, token="")
    assert r.status_code == 503 and "SCHEDULER_EXTENDER_TOKEN" in r.json()["Error"]


def test_only_post(extender_on):
    r = Client().get("/scheduler/extender/filter", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert r.status_code == 405


@pytest.mark.parametrize("body,content_type", [("{not json", "application/json"), ("[]", "application/json"),
                                               ('{"Pod": {}}', "application/json"),
                                               ("Pod=1", "application/x-www-form-urlencoded")])
def test_malformed_requests_are_a_400_naming_the_problem(extender_on, db, body, content_type):
    r = post("filter", body, content_type=content_type)
    assert r.status_code == 400 and r.json()["Error"]


def test_a_pod_naming_an_unknown_or_other_teams_archived_model_gets_the_error(extender_on, nodes, model_a, predictor):
    result = post("filter", fixture("filter_args_nodelist.json", "team-a/no-such-model")).json()
    assert result["Error"].startswith("No registered model") and result["FailedNodes"] == {}
    model_a.archived_at = model_a.created_at
    model_a.save(update_fields=["archived_at"])
    assert "No registered model" in post("filter", fixture("filter_args_nodelist.json", str(model_a.pk))).json()["Error"]
    r = post("prioritize", fixture("prioritize_args_nodenames.json", str(model_a.pk)))
    assert r.status_code == 404


# ------------------------------------------------------------------ contract: filter and prioritize

def test_filter_answers_the_nodelist_form_with_failed_nodes(extender_on, nodes, model_a, predictor):
    args = fixture("filter_args_nodelist.json", f"{model_a.team.slug}/{model_a.name}")
    r = post("filter", args)
    assert r.status_code == 200
    result = r.json()
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-a", "gpu-b"]
    assert result["NodeNames"] is None and result["Error"] == ""
    assert list(result["FailedNodes"]) == ["cpu-only-1"]


def test_filter_drops_a_node_whose_gpus_are_full_and_passes_foreign_pods(extender_on, nodes, model_a, predictor,
                                                                          no_celery):
    gpu_a, gpu_b = nodes
    set_node_drained(actor=None, node=gpu_b, drained=True)
    for _ in range(6):  # three jobs on each of gpu-a's two GPUs: Horus's limit
        make_job(model_a, util=10, mem=500)
    assert len(place_pending_jobs(policy="horus")) == 6
    set_node_drained(actor=None, node=gpu_b, drained=False)
    args = fixture("prioritize_args_nodenames.json", str(model_a.pk))
    args["Pod"]["metadata"]["annotations"]["dlopt.io/gpus"] = "1"
    result = post("filter", args).json()
    assert result["NodeNames"] == ["gpu-b"] and set(result["FailedNodes"]) == {"gpu-a", "cpu-only-1"}
    assert "jobs per GPU" in result["FailedNodes"]["gpu-a"]
    foreign = post("filter", {"Pod": {"metadata": {"name": "nginx", "namespace": "web", "uid": "u-1"}},
                              "NodeNames": ["gpu-a", "cpu-only-1"]}).json()
    assert foreign["NodeNames"] == ["gpu-a", "cpu-only-1"] and foreign["FailedNodes"] == {}


def test_prioritize_prefers_the_idle_node_in_host_priority_list_form(extender_on, nodes, model_a, predictor,
                                                                     no_celery):
    for _ in range(2):
        make_job(model_a, util=70, mem=7000)
    place_pending_jobs(policy="horus")  # ties go to the lowest index: gpu-a's GPUs
    args = fixture("prioritize_args_nodenames.json", str(model_a.pk))
    args["Pod"]["metadata"]["annotations"]["dlopt.io/gpus"] = "1"
    r = post("prioritize", args)
    assert r.status_code == 200
    scores = r.json()
    assert [s["Host"] for s in scores] == ["gpu-a", "gpu-b", "cpu-only-1"]
    by_host = {s["Host"]: s["Score"] for s in scores}
    assert by_host == {"gpu-a": 0, "gpu-b": 10, "cpu-only-1": 0}


# ------------------------------------------------------------------ bind

def pod_object(model_ref: str, gpus: str = "1", uid: str = POD_UID) -> dict:
    pod = fixture("filter_args_nodelist.json", model_ref)["Pod"]
    pod["metadata"]["annotations"]["dlopt.io/gpus"] = gpus
    pod["metadata"]["uid"] = uid
    return pod


def test_bind_records_the_gpus_writes_the_index_annotation_and_binds(extender_on, nodes, model_a, predictor,
                                                                     tmp_path, no_celery):
    token_file = tmp_path / "token"
    token_file.write_text("sa-token\n")
    extender_on.SCHEDULER_EXTENDER_KUBE_TOKEN_FILE = str(token_file)
    pod = pod_object(str(model_a.pk), gpus="2")
    with FakeApiServer({("team-a", "resnet-infer-7f9c"): pod}) as api:
        extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
        r = post("bind", fixture("bind_args.json", ""))
        assert r.status_code == 200 and r.json() == {"Error": ""}
        rows = list(PodBinding.objects.filter(pod_uid=POD_UID).select_related("gpu__node").order_by("gpu__index"))
        assert len(rows) == 2 and {b.gpu.node.name for b in rows} == {"gpu-b"}  # a gang: one node
        assert all(b.num_gpus == 2 and b.model == model_a and b.predicted_util_pct > 0 for b in rows)
        methods = [(q["method"], q["path"]) for q in api.requests]
        base = "/api/v1/namespaces/team-a/pods/resnet-infer-7f9c"
        assert methods == [("GET", base), ("PATCH", base), ("POST", base + "/binding")]
        assert all(q["auth"] == "Bearer sa-token" for q in api.requests)
        patch, binding = api.requests[1], api.requests[2]
        assert patch["content_type"] == "application/merge-patch+json"
        index = patch["body"]["metadata"]["annotations"]["dlopt.io/gpu-index"]
        assert index == ",".join(str(b.gpu.index) for b in rows)
        assert binding["body"]["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-b"}
        assert binding["body"]["metadata"]["uid"] == POD_UID

        # a retried bind reuses the recorded GPUs
        assert post("bind", fixture("bind_args.json", "")).json() == {"Error": ""}
        assert PodBinding.objects.filter(pod_uid=POD_UID).count() == 2


def test_bound_pods_are_load_for_placement_passes_until_released(extender_on, nodes, model_a, predictor, no_celery):
    pod = pod_object(str(model_a.pk), gpus="4")
    with FakeApiServer({("team-a", "resnet-infer-7f9c"): pod}) as api:
        extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
        assert post("bind", fixture("bind_args.json", "")).json() == {"Error": ""}
    gpu_b = set(nodes[1].gpus.values_list("pk", flat=True))
    assert set(PodBinding.objects.values_list("gpu_id", flat=True)) == gpu_b
    job = make_job(model_a, util=50, mem=3000)
    placed = place_pending_jobs(policy="horus")
    assert placed and placed[0].job == job and placed[0].gpu.node.name == "gpu-a"  # gpu-b is taken by the pod
    r = post("release", {"PodUID": POD_UID})
    assert r.json() == {"Released": 4, "Error": ""}
    assert not PodBinding.objects.filter(released_at__isnull=True).exists()
    assert post("release", {"PodUID": POD_UID}).json()["Released"] == 0
    assert post("release", {"PodUID": ["x"]}).status_code == 400


def test_a_failed_api_call_keeps_nothing_and_says_why(extender_on, nodes, model_a, predictor):
    pod = pod_object(str(model_a.pk))
    with FakeApiServer({("team-a", "resnet-infer-7f9c"): pod}, fail_binding=True) as api:
        extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
        result = post("bind", fixture("bind_args.json", "")).json()
    assert "409" in result["Error"] and not PodBinding.objects.exists()


def test_bind_refuses_a_replaced_pod_and_a_node_without_room(extender_on, nodes, model_a, predictor):
    replaced = pod_object(str(model_a.pk), uid="11111111-2222-4333-8444-555555555555")
    with FakeApiServer({("team-a", "resnet-infer-7f9c"): replaced}) as api:
        extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
        assert "replaced" in post("bind", fixture("bind_args.json", "")).json()["Error"]
    too_big = pod_object(str(model_a.pk), gpus="3")
    args = {**fixture("bind_args.json", ""), "Node": "gpu-a"}  # gpu-a has 2 GPUs
    with FakeApiServer({("team-a", "resnet-infer-7f9c"): too_big}) as api:
        extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
        error = post("bind", args).json()["Error"]
        assert "3 GPUs requested" in error and [q["method"] for q in api.requests] == ["GET"]
    assert not PodBinding.objects.exists()


def test_bind_without_an_api_server_says_so(extender_on, nodes, model_a, monkeypatch):
    extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = ""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert "No Kubernetes API server" in post("bind", fixture("bind_args.json", "")).json()["Error"]


@pytest.mark.parametrize("key,value", [("Node", "gpu-b/../../x"), ("PodUID", ""), ("PodNamespace", "A B")])
def test_bind_args_are_validated_before_any_api_call(extender_on, db, key, value):
    args = {**fixture("bind_args.json", ""), key: value}
    r = post("bind", args)
    assert r.status_code == 400 and key in r.json()["Error"]


def test_bind_of_a_pod_naming_no_model_binds_it_without_gpus(extender_on, nodes):
    pod = copy.deepcopy(fixture("filter_args_foreign_pod.json", "")["Pod"])
    pod["metadata"]["uid"] = POD_UID
    with FakeApiServer({("team-a", "resnet-infer-7f9c"): pod}) as api:
        extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
        assert post("bind", fixture("bind_args.json", "")).json() == {"Error": ""}
        assert [q["method"] for q in api.requests] == ["GET", "POST"]
    assert not PodBinding.objects.exists()


def test_a_pod_may_not_use_another_teams_model(extender_on, nodes, model_a, model_b, predictor):
    """model_b belongs to team-b: a pod in namespace team-a naming it is refused at filter, prioritize and bind."""
    args = fixture("filter_args_nodelist.json", str(model_b.pk))
    result = post("filter", args).json()
    assert "namespace 'team-a' may use only the models of team 'team-a'" in result["Error"]
    assert result["Nodes"] is None and result["NodeNames"] is None
    assert post("prioritize", args).status_code == 403
    pod = pod_object(f"{model_b.team.slug}/{model_b.name}")
    with FakeApiServer({("team-a", "resnet-infer-7f9c"): pod}) as api:
        extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
        assert "may use only the models of team" in post("bind", fixture("bind_args.json", "")).json()["Error"]
        assert [q["method"] for q in api.requests] == ["GET"]  # nothing written, nothing bound
    assert not PodBinding.objects.exists()
    extender_on.SCHEDULER_EXTENDER_TEAM_NAMESPACES = False
    assert post("filter", args).json()["Error"] == ""


# ------------------------------------------------------------------ the pod's team pays (GPU-hour quota)

def test_a_bound_pod_reserves_its_teams_gpu_hours_and_its_held_time_is_charged_on_release(
        extender_on, nodes, model_a, team_a, predictor, no_celery):
    import datetime as dt

    from django.utils import timezone

    from core.exceptions import QuotaExceeded
    from core.models import Quota, UsageCharge
    from core.selectors import quota_usage
    from scheduling import selectors
    from scheduling.services import settle_expired_pod_bindings, submit_job
    from scheduling.services.extender import release_pod

    extender_on.SCHEDULER_EXTENDER_BINDING_TTL_S = 3600.0  # a pod holds its GPUs at most 1 h unreleased
    Quota.objects.filter(team=team_a).update(gpu_hours_per_month=3.0)
    pod = pod_object(str(model_a.pk), gpus="2")
    with FakeApiServer({("team-a", "resnet-infer-7f9c"): pod}) as api:
        extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
        assert post("bind", fixture("bind_args.json", "")).json() == {"Error": ""}
    # 2 GPUs x the 1 h TTL reserved: a job declaring 1.5 h no longer fits the 3 h quota
    assert selectors.gpu_hours_committed(team_a.pk) == pytest.approx(2.0, abs=0.01)
    with pytest.raises(QuotaExceeded, match="GPU hours per month"):
        submit_job(actor=model_a.created_by, model=model_a, batch_size=1, duration_estimate_s=5400.0, place=False)

    # released 30 minutes after the bind: 2 x 0.5 h charged to team A, the reservation gone
    bound_at = PodBinding.objects.filter(pod_uid=POD_UID).first().bound_at
    assert release_pod(pod_uid=POD_UID, now=bound_at + dt.timedelta(minutes=30)) == 2
    charges = UsageCharge.objects.filter(kind="gpu_seconds")
    assert {c.team_id for c in charges} == {team_a.pk} and sum(c.amount for c in charges) == pytest.approx(3600.0)
    assert quota_usage(team_a.pk).gpu_hours_this_month == pytest.approx(1.0, abs=0.01)
    assert selectors.gpu_hours_committed(team_a.pk) == pytest.approx(1.0, abs=0.01)
    assert release_pod(pod_uid=POD_UID) == 0 and charges.count() == 2  # charged once

    # a pod never released: it counts while bound, and once its TTL has passed the sweep charges the TTL
    other = pod_object(str(model_a.pk), gpus="1", uid="22222222-2222-4222-8222-222222222222")
    args = {**fixture("bind_args.json", ""), "PodUID": other["metadata"]["uid"]}
    with FakeApiServer({("team-a", "resnet-infer-7f9c"): other}) as api:
        extender_on.SCHEDULER_EXTENDER_KUBE_API_URL = api.url
        assert post("bind", args).json() == {"Error": ""}
    assert selectors.gpu_hours_committed(team_a.pk) == pytest.approx(2.0, abs=0.01)  # 1 h used + 1 h reserved
    later = timezone.now() + dt.timedelta(hours=2)
    assert settle_expired_pod_bindings(now=later) == 1 and settle_expired_pod_bindings(now=later) == 0
    expired = UsageCharge.objects.filter(kind="gpu_seconds").order_by("-pk").first()
    assert expired.amount == pytest.approx(3600.0) and expired.team_id == team_a.pk  # the TTL, not 2 h
    assert selectors.gpu_hours_committed(team_a.pk) == pytest.approx(2.0, abs=0.01)  # now all of it charged
    assert not PodBinding.objects.filter(released_at__isnull=True).exists()
