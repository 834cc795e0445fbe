"""The web tier degrades instead of answering 500 (issue 40): the cache's Redis unreachable, a full disk.

The cache is pointed at a port nothing listens on (or at a private redis-server that is killed), the
disk is "full" where the product writes (the storage's save raising ENOSPC, the database refusing a
write as full). Reads answer 200, writes that cannot be honoured a 503 with a message and Retry-After.
"""
from __future__ import annotations

import errno

import pytest
from django.core.files.storage import FileSystemStorage
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import OperationalError
from django.test import Client
from rest_framework.test import APIClient

from core.models import DLModel

from .faults import DEAD_REDIS_URL, dead_cache, fail_nth

pytestmark = pytest.mark.django_db


def _api(key: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return api


def _rates(settings, **rates):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
                                                          **rates}}


# --- the cache's Redis unreachable ----------------------------------------------------------------------


def test_api_reads_and_writes_answer_while_the_cache_is_unreachable(world, settings, small_cnn_bytes,
                                                                      celery_outbox):
    dead_cache(settings)
    from django.core.cache import cache

    api = _api(world.tokens["owner"])
    for url in ("/api/runs/", f"/api/runs/{world.run.pk}/", "/api/models/", "/api/me/", "/api/gpu-jobs/"):
        assert api.get(url).status_code == 200, url
    assert cache.degraded  # it did try Redis, and answered from the local fallback
    upload = api.post("/api/models/", {"team": world.team_a.pk, "name": "during-outage",
                                       "file": SimpleUploadedFile("m.onnx", small_cnn_bytes)}, format="multipart")
    assert upload.status_code == 201, upload.content[:300]
    run = api.post("/api/runs/", {"model": world.model.pk, "max_trials": 8}, format="json")
    assert run.status_code == 201, run.content[:300]


def test_dashboard_pages_answer_while_the_cache_is_unreachable(world, settings, small_cnn_bytes, celery_outbox):
    dead_cache(settings)
    client = Client()
    client.force_login(world.users["owner"])
    pages = ["/", "/models/", "/models/upload/", "/runs/", f"/runs/{world.done_run.pk}/", f"/runs/{world.run.pk}/",
             "/cluster/", "/simulations/", "/energy/", f"/api/charts/runs/{world.done_run.pk}/curve/",
             f"/api/charts/runs/{world.run.pk}/live/"]
    for url in pages:
        assert client.get(url).status_code == 200, url
    resp = client.post("/models/upload/", {"team": world.team_a.pk, "name": "dash-outage",
                                           "file": SimpleUploadedFile("d.onnx", small_cnn_bytes)})
    assert resp.status_code == 302 and DLModel.objects.filter(name="dash-outage").exists()


def test_sign_in_works_while_the_cache_is_unreachable(world, settings):
    dead_cache(settings)
    world.users["owner"].set_password("pw-during-outage-1")
    world.users["owner"].save()
    client = Client()
    resp = client.post("/login/", {"username": "rel-owner", "password": "pw-during-outage-1"})
    assert resp.status_code == 302


def test_throttles_fail_open_to_per_process_counts(world, settings, small_cnn_bytes):
    """Fail open means: limits count in this process while Redis is away; they loosen, never vanish."""
    dead_cache(settings)
    _rates(settings, uploads="2/hour")
    api = _api(world.tokens["owner"])
    codes = [api.post("/api/models/", {"team": world.team_a.pk, "name": f"t{i}",
                                       "file": SimpleUploadedFile("m.onnx", small_cnn_bytes)},
                      format="multipart").status_code for i in range(3)]
    assert codes == [201, 201, 429]


def test_the_sign_in_lockout_still_counts_per_process_while_the_cache_is_unreachable(world, settings):
    dead_cache(settings)
    settings.LOGIN_LOCKOUT_FAILURES = 3
    _rates(settings, login="1000/minute")
    client = Client()
    for _ in range(3):
        assert client.post("/login/", {"username": "rel-owner", "password": "wrong"}).status_code == 200
    assert client.post("/login/", {"username": "rel-owner", "password": "wrong"}).status_code == 429


@pytest.mark.integration
def test_the_cache_goes_back_to_redis_when_it_returns(private_redis, settings):
    import redis as redis_lib

    from core.cache import DegradingRedisCache

    cache = DegradingRedisCache(private_redis.url, {"OUTAGE_RETRY_S": 0.2})
    cache.set("k", "from-redis")
    private_redis.kill()
    assert cache.get("k") is None and cache.degraded  # a miss, not an error
    assert cache.add("counter", 1) is True and cache.incr("counter") == 2  # counting goes on locally
    private_redis.start()
    import time

    time.sleep(0.3)  # the outage window ends; the next call tries Redis again
    cache.set("k", "back")
    assert not cache.degraded
    assert redis_lib.Redis.from_url(private_redis.url).exists(cache.make_and_validate_key("k")) == 1


def test_only_outages_are_swallowed_not_other_redis_errors(private_redis):
    """A programming error (a wrong type) is raised, not hidden behind the fallback."""
    import redis as redis_lib

    from core.cache import DegradingRedisCache

    cache = DegradingRedisCache(private_redis.url, {})
    key = cache.make_and_validate_key("a-list")
    redis_lib.Redis.from_url(private_redis.url).rpush(key, "x")
    with pytest.raises(redis_lib.exceptions.ResponseError):
        cache.incr("a-list")
    assert not cache.degraded


def test_a_redis_that_refuses_writes_is_an_outage():
    """A full disk under Redis: it refuses writes with MISCONF; that is an outage, not a bug."""
    from redis.exceptions import ResponseError

    from core.cache import is_cache_outage

    assert is_cache_outage(ResponseError("MISCONF Errors writing to the AOF file: No space left on device"))
    assert not is_cache_outage(ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"))


# --- a full disk ------------------------------------------------------------------------------------------


@pytest.fixture
def full_disk(monkeypatch):
    """The media storage cannot write: every save raises ENOSPC, as on a full volume."""
    def save(self, name, content):
        raise OSError(errno.ENOSPC, "No space left on device", name)
    monkeypatch.setattr(FileSystemStorage, "_save", save)


def test_an_upload_onto_a_full_disk_is_a_503_and_reads_still_work(world, full_disk, small_cnn_bytes):
    api = _api(world.tokens["owner"])
    resp = api.post("/api/models/", {"team": world.team_a.pk, "name": "no-room",
                                     "file": SimpleUploadedFile("m.onnx", small_cnn_bytes)}, format="multipart")
    assert resp.status_code == 503
    body = resp.json()
    assert body["code"] == "disk_full" and "storage is full" in body["detail"] and body["errors"] == {}
    assert int(resp["Retry-After"]) > 0
    assert not DLModel.objects.filter(name="no-room").exists()
    for url in ("/api/models/", "/api/runs/", f"/api/models/{world.model.pk}/"):
        assert api.get(url).status_code == 200, url


def test_the_dashboard_upload_onto_a_full_disk_is_a_503(world, full_disk, small_cnn_bytes):
    client = Client()
    client.force_login(world.users["owner"])
    resp = client.post("/models/upload/", {"team": world.team_a.pk, "name": "no-room",
                                           "file": SimpleUploadedFile("d.onnx", small_cnn_bytes)})
    assert resp.status_code == 503 and "storage is full" in resp.content.decode() and resp["Retry-After"]
    assert client.get("/models/").status_code == 200


def test_a_database_that_is_full_answers_writes_503_and_reads_200(world):
    api = _api(world.tokens["owner"])
    with fail_nth(1, r"^\s*INSERT", message="could not extend file \"base/16384/2619\": No space left on device"):
        resp = api.post("/api/runs/", {"model": world.model.pk, "max_trials": 8}, format="json")
    assert resp.status_code == 503 and resp.json()["code"] == "disk_full" and resp["Retry-After"]
    # the token's last-use stamp is a write too: a full disk must not fail the read it rides on
    world.token.__class__.objects.filter(pk=world.token.pk).update(last_used_at=None)
    member = _api(world.tokens["member"])
    with fail_nth(1, r"^\s*UPDATE", message="database or disk is full"):
        assert member.get("/api/runs/").status_code == 200


def test_other_errors_stay_500s(world, monkeypatch):
    """Not every OSError is an outage: a permission error is a bug, and must not pass for one."""
    from core.outages import classify

    assert classify(OSError(errno.EACCES, "Permission denied")) is None
    assert classify(OperationalError("injected failure of statement #1")) is None
    assert classify(ValueError("no")) is None
    assert classify(OSError(errno.ENOSPC, "No space left on device")).code == "disk_full"
    # a database error caused by a full disk is one too; a service's own refusal keeps its status
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise OperationalError("write failed") from exc
    except OperationalError as exc:
        assert classify(exc).code == "disk_full"
    from core.exceptions import ServiceError

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise ServiceError("That name is taken.") from None
    except ServiceError as exc:
        assert classify(exc) is None


def test_an_outage_raised_outside_a_view_is_a_503(rf):
    """handler500 (settings) turns an outage raised by a middleware into a 503 too; other errors stay 500."""
    from core.outages import server_error

    request = rf.post("/models/upload/")
    try:
        raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
        resp = server_error(request)
    assert resp.status_code == 503 and resp["Retry-After"]
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        assert server_error(request).status_code == 500


def test_the_dead_cache_url_is_really_dead():
    import socket

    host, port = DEAD_REDIS_URL.split("//")[1].split("/")[0].split(":")
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=1):
        pass


# --- the compose shape: one Redis is both the broker and the cache -----------------------------------------


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_run_started_while_the_shared_redis_is_down_is_stored_paused(aof_redis, user_owner, team_a,
                                                                       small_cnn_bytes, settings):
    """docker-compose.yml: the broker (REDIS_URL) and the cache (DJANGO_CACHE_URL) are one Redis. With it
    down, starting a run is the documented 201 with the run paused and the reason, never a 500."""
    from core import services as core_services
    from core.models import Quota
    from tuning.models import TuningRun

    from .test_broker_faults import web_broker

    model = core_services.register_model(team=team_a, name="m", data=small_cnn_bytes, filename="m.onnx",
                                         actor=user_owner)
    Quota.objects.filter(team=team_a).update(max_concurrent_runs=10)
    settings.CACHES = {"default": {"BACKEND": "core.cache.DegradingRedisCache",
                                   "LOCATION": aof_redis.url.replace("/0", "/1"), "OUTAGE_RETRY_S": 60.0}}
    api = _api(core_services.create_api_token(user=user_owner, name="t").key)
    assert api.get("/api/runs/").status_code == 200  # counted in Redis
    with web_broker(aof_redis.url):
        aof_redis.kill()
        resp = api.post("/api/runs/", {"model": model.pk, "max_trials": 8}, format="json")
        assert resp.status_code == 201, resp.content[:300]
        run = TuningRun.objects.get(pk=resp.json()["id"])
        assert run.status == "paused" and "broker" in run.error.lower()
        assert api.get(f"/api/runs/{run.pk}/").status_code == 200


def test_the_outage_warning_names_the_cache_without_its_password(caplog):
    from core.cache import DegradingRedisCache

    cache = DegradingRedisCache("redis://:s3cret-pass@127.0.0.1:1/3", {"OUTAGE_RETRY_S": 60.0})
    with caplog.at_level("WARNING", logger="core.cache"):
        assert cache.get("anything", "default") == "default"
    assert "127.0.0.1:1/3" in caplog.text and "s3cret-pass" not in caplog.text


def test_a_body_that_stops_arriving_is_a_400_not_a_500(world, monkeypatch, small_cnn_bytes):
    """The web server's idle timeout (config/gunicorn.py) cuts a stalled upload: the read fails, the answer
    says the body was incomplete, and nothing is stored."""
    from django.core.handlers.wsgi import LimitedStream

    def stalled(self, size=-1):
        raise TimeoutError("timed out")
    monkeypatch.setattr(LimitedStream, "read", stalled)
    resp = _api(world.tokens["owner"]).post("/api/models/", {
        "team": world.team_a.pk, "name": "stalled", "file": SimpleUploadedFile("m.onnx", small_cnn_bytes)},
        format="multipart")
    assert resp.status_code == 400 and resp.json()["code"] == "request_incomplete"
    assert not DLModel.objects.filter(name="stalled").exists()
