"""Team webhooks: the URL's SSRF checks, the signature, delivery with retries and backoff, and the
announcements made where tuning runs and GPU jobs become terminal."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from core import services
from core.exceptions import PermissionDenied, ServiceError
from core.models import TeamWebhook, WebhookDelivery
from core.services import webhooks
from tests.factories import GpuJobFactory, TuningRunFactory

pytestmark = pytest.mark.django_db


class Receiver:
    """A local HTTP server that records what it is sent and answers with the next status of ``statuses``."""

    def __init__(self, statuses=(200,)):
        self.requests: list[dict] = []
        self.statuses = list(statuses)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                status = receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                self.send_response(status)
                if status in (301, 302):
                    self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/dlopt?x=1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def local_receivers(settings):
    """What tests need to reach a receiver on 127.0.0.1 (a deployment never sets these)."""
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_HTTP_HOSTS = ["127.0.0.1"]
    settings.WEBHOOK_RETRY_BASE_S = 30.0
    settings.WEBHOOK_MAX_ATTEMPTS = 3


def fake_dns(monkeypatch, answers: dict[str, list[str]]):
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in answers:
            return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                    for a in answers[host]]
        return real(host, port, *args, **kwargs)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


# --- SSRF: where a webhook may point -------------------------------------------------------------------

SSRF_URLS = [
    "http://127.0.0.1/", "https://127.0.0.1/", "https://localhost/", "https://[::1]/", "https://0.0.0.0/",
    "https://169.254.169.254/latest/meta-data/", "https://10.0.0.5/", "https://192.168.1.1/", "https://172.16.0.1/",
    "https://100.64.0.1/",  # carrier-grade NAT
    "https://[::ffff:127.0.0.1]/", "https://[fe80::1]/", "https://[fd00::1]/",
    "https://2130706433/", "https://0x7f000001/", "https://017700000001/",  # 127.0.0.1 spelled otherwise
    "https://224.0.0.1/",  # multicast
    "https://internal.example/",  # a public-looking name that resolves to a private address
    "https://rebind.example/",    # one public and one private address
    "file:///etc/passwd", "gopher://example.org/", "ftp://example.org/", "javascript:alert(1)",
    "https://user:pw@public.example/", "https://public.example:99999/", "https:///nohost", "",
    "https://public.example/\r\nX-Injected: 1", "https://public.example/ spaces",
    "http://public.example/",  # plain http to a host not allow-listed
    "https://no-such-host.invalid/",
]


@pytest.mark.parametrize("url", SSRF_URLS)
def test_webhook_urls_that_could_reach_the_platforms_network_are_refused(url, monkeypatch, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    settings.WEBHOOK_HTTP_HOSTS = []
    fake_dns(monkeypatch, {"public.example": ["93.184.216.34"], "internal.example": ["10.1.2.3"],
                           "rebind.example": ["93.184.216.34", "127.0.0.1"]})
    with pytest.raises(ServiceError) as err:
        webhooks.check_webhook_url(url)
    assert err.value.field == "url" and err.value.message


def test_public_https_urls_are_accepted_and_normalised(monkeypatch, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    fake_dns(monkeypatch, {"hooks.example.org": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]})
    assert webhooks.check_webhook_url(" https://Hooks.Example.org/in?k=v#frag ") == "https://hooks.example.org/in?k=v"
    assert webhooks.check_webhook_url("https://hooks.example.org:8443") == "https://hooks.example.org:8443/"
    settings.WEBHOOK_HTTP_HOSTS = ["hooks.example.org"]
    assert webhooks.check_webhook_url("http://hooks.example.org/x").startswith("http://")


def test_only_owners_set_rotate_and_remove_the_webhook(team_a, user_owner, user_member, user_viewer, local_receivers):
    for user in (user_member, user_viewer):
        with pytest.raises(PermissionDenied):
            services.set_team_webhook(actor=user, team=team_a, url="http://127.0.0.1:9/")
    first = services.set_team_webhook(actor=user_owner, team=team_a, url="http://127.0.0.1:9/")
    assert first.secret and len(first.secret) == 64 and first.webhook.secret == first.secret
    changed = services.set_team_webhook(actor=user_owner, team=team_a, url="http://127.0.0.1:10/")
    assert changed.secret is None and changed.webhook.url == "http://127.0.0.1:10/"  # the secret is kept
    with pytest.raises(PermissionDenied):
        services.rotate_webhook_secret(actor=user_member, team=team_a)
    rotated = services.rotate_webhook_secret(actor=user_owner, team=team_a)
    assert rotated.secret not in (None, first.secret)
    with pytest.raises(PermissionDenied):
        services.remove_team_webhook(actor=user_viewer, team=team_a)
    services.remove_team_webhook(actor=user_owner, team=team_a)
    assert not TeamWebhook.objects.filter(team=team_a).exists()


# --- signature and delivery ---------------------------------------------------------------------------


def test_signature_verifies_and_tampering_does_not():
    secret, ts, body = "s" * 64, "1700000000", b'{"event":"tuning_run.succeeded"}'
    header = webhooks.signature(secret, ts, body)
    assert header.startswith("sha256=") and len(header) == 7 + 64
    assert webhooks.verify_signature(secret, ts, body, header, now=1700000010)
    assert not webhooks.verify_signature(secret, ts, body + b" ", header, now=1700000010)
    assert not webhooks.verify_signature("t" * 64, ts, body, header, now=1700000010)
    assert not webhooks.verify_signature(secret, "1700000001", body, header, now=1700000010)  # timestamp is signed
    assert not webhooks.verify_signature(secret, ts, body, header, now=1700009999)  # a replay, too late
    assert not webhooks.verify_signature(secret, "junk", body, header)


def _announce(team, *, kind="tuning_run", object_id=1, state="succeeded", execute=True, capture=None):
    with capture(execute=execute):
        return services.notify_terminal(team_id=team.pk, kind=kind, object_id=object_id, state=state,
                                        data={"model": "cnn"})


def test_a_delivery_is_signed_and_sent_once_per_object(team_a, user_owner, local_receivers, celery_outbox,
                                                       django_capture_on_commit_callbacks):
    with Receiver() as rx:
        change = services.set_team_webhook(actor=user_owner, team=team_a, url=rx.url)
        delivery = _announce(team_a, capture=django_capture_on_commit_callbacks)
        assert _announce(team_a, capture=django_capture_on_commit_callbacks) is None  # announced twice: sent once
        assert celery_outbox.args_of("core.deliver_webhook") == [(delivery.pk,)]
        assert webhooks.deliver(delivery_id=delivery.pk) is None
    (req,) = rx.requests
    headers = req["headers"]
    assert req["path"] == "/hooks/dlopt?x=1" and headers["Content-Type"] == "application/json"
    assert webhooks.verify_signature(change.secret, headers["X-Dlopt-Timestamp"], req["body"],
                                     headers["X-Dlopt-Signature"])
    body = json.loads(req["body"])
    assert body["event"] == "tuning_run.succeeded" and body["object"] == {
        "type": "tuning_run", "id": 1, "state": "succeeded", "model": "cnn"}
    assert body["team"] == team_a.pk and body["delivery"] == delivery.pk
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == ("delivered", 1, 200)
    assert webhooks.deliver(delivery_id=delivery.pk) is None and len(rx.requests) == 1  # settled: never again


def test_failures_are_retried_with_exponential_backoff_then_given_up(team_a, user_owner, local_receivers,
                                                                      django_capture_on_commit_callbacks,
                                                                      celery_outbox):
    with Receiver(statuses=[503, 500, 502]) as rx:
        services.set_team_webhook(actor=user_owner, team=team_a, url=rx.url)
        delivery = _announce(team_a, capture=django_capture_on_commit_callbacks)
        delays = [webhooks.deliver(delivery_id=delivery.pk) for _ in range(3)]
    assert delays == [30.0, 60.0, None] and len(rx.requests) == 3
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status_code) == ("failed", 3, 502)


def test_a_refusal_is_not_retried_and_a_redirect_is_not_followed(team_a, user_owner, local_receivers,
                                                                  django_capture_on_commit_callbacks, celery_outbox):
    with Receiver(statuses=[302]) as rx:
        services.set_team_webhook(actor=user_owner, team=team_a, url=rx.url)
        delivery = _announce(team_a, capture=django_capture_on_commit_callbacks)
        assert webhooks.deliver(delivery_id=delivery.pk) is None
    delivery.refresh_from_db()
    assert (delivery.state, delivery.last_status_code) == ("failed", 302) and len(rx.requests) == 1


def test_an_unreachable_receiver_is_retried_and_the_task_backs_off(team_a, user_owner, local_receivers,
                                                                    django_capture_on_commit_callbacks,
                                                                    celery_outbox, monkeypatch):
    from core.tasks import deliver_webhook

    services.set_team_webhook(actor=user_owner, team=team_a, url="http://127.0.0.1:9/closed")  # discard port
    delivery = _announce(team_a, capture=django_capture_on_commit_callbacks)
    retries = []

    class Retry(Exception):
        pass

    def retry(countdown):
        retries.append(countdown)
        return Retry()
    monkeypatch.setattr(deliver_webhook, "retry", retry)
    with pytest.raises(Retry):
        deliver_webhook(delivery.pk)
    delivery.refresh_from_db()
    assert retries == [30.0] and delivery.state == "pending" and delivery.last_status_code is None
    assert "Connection" in delivery.last_error or "refused" in delivery.last_error.lower()


def test_a_host_that_turned_private_since_it_was_set_is_not_called(team_a, user_owner, settings, monkeypatch,
                                                                    django_capture_on_commit_callbacks, celery_outbox):
    """DNS rebinding: the URL was checked when set; the delivery checks the address again and connects to
    the address it checked."""
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    fake_dns(monkeypatch, {"hooks.example.org": ["93.184.216.34"]})
    services.set_team_webhook(actor=user_owner, team=team_a, url="https://hooks.example.org/in")
    fake_dns(monkeypatch, {"hooks.example.org": ["127.0.0.1"]})
    delivery = _announce(team_a, capture=django_capture_on_commit_callbacks)
    assert webhooks.deliver(delivery_id=delivery.pk) == settings.WEBHOOK_RETRY_BASE_S
    delivery.refresh_from_db()
    assert delivery.last_status_code is None and "private" in delivery.last_error


def test_no_webhook_no_delivery(team_a, django_capture_on_commit_callbacks, celery_outbox):
    assert _announce(team_a, capture=django_capture_on_commit_callbacks) is None
    assert not WebhookDelivery.objects.exists() and celery_outbox.args_of("core.deliver_webhook") == []


# --- the hooks: where runs and GPU jobs become terminal ------------------------------------------------


@pytest.fixture
def hooked_team(team_a, user_owner, local_receivers):
    services.set_team_webhook(actor=user_owner, team=team_a, url="http://127.0.0.1:9/")
    return team_a


def test_cancelling_a_queued_run_and_a_gpu_job_announces_them(hooked_team, user_owner, model_a, celery_outbox,
                                                              django_capture_on_commit_callbacks):
    from scheduling import services as sched_services
    from tuning import services as tuning_services

    run = TuningRunFactory(model=model_a, created_by=user_owner, max_trials=8, trials_per_round=32)
    job = GpuJobFactory(model=model_a)
    with django_capture_on_commit_callbacks(execute=True):
        tuning_services.cancel_run(actor=user_owner, run=run)
        sched_services.cancel_job(actor=user_owner, job=job)
    events = dict(WebhookDelivery.objects.values_list("event_key", "event"))
    assert events == {f"tuning_run:{run.pk}": "tuning_run.cancelled", f"gpu_job:{job.pk}": "gpu_job.cancelled"}
    assert len(celery_outbox.args_of("core.deliver_webhook")) == 2


def test_a_finished_gpu_job_and_a_failed_run_are_announced(hooked_team, user_owner, model_a, celery_outbox,
                                                           django_capture_on_commit_callbacks):
    from scheduling.services.execution import finish_job
    from tuning.services.executor import _executor_lost

    job = GpuJobFactory(model=model_a, placed=True)
    run = TuningRunFactory(model=model_a, created_by=user_owner, max_trials=8, trials_per_round=32)
    run.executor_losses = 10
    with django_capture_on_commit_callbacks(execute=True):
        finish_job(job_id=job.pk, result={"util_mean_pct": 40.0})
        _executor_lost(run)
    payloads = {d.event: d.payload["object"] for d in WebhookDelivery.objects.all()}
    assert payloads["gpu_job.finished"]["id"] == job.pk
    assert payloads["tuning_run.failed"]["id"] == run.pk and "executor died" in payloads["tuning_run.failed"]["error"]


def test_a_transition_that_rolls_back_announces_nothing(hooked_team, user_owner, model_a, celery_outbox,
                                                        django_capture_on_commit_callbacks):
    from django.db import transaction

    from tuning import services as tuning_services

    run = TuningRunFactory(model=model_a, created_by=user_owner, max_trials=8, trials_per_round=32)
    with django_capture_on_commit_callbacks(execute=True):
        with transaction.atomic():
            tuning_services.cancel_run(actor=user_owner, run=run)
            transaction.set_rollback(True)
    assert not WebhookDelivery.objects.exists() and celery_outbox.args_of("core.deliver_webhook") == []


def test_deliveries_whose_message_was_lost_are_sent_again(team_a, user_owner, local_receivers, celery_outbox,
                                                          django_capture_on_commit_callbacks, settings):
    """A broker outage when the transition committed (or a worker killed before its retry) leaves a
    delivery pending with no message: beat's sweep sends it again once its attempt is overdue."""
    import datetime as dt

    from django.utils import timezone

    settings.WEBHOOK_LOST_AFTER_S = 600.0
    services.set_team_webhook(actor=user_owner, team=team_a, url="http://127.0.0.1:9/")
    fresh = _announce(team_a, capture=django_capture_on_commit_callbacks, execute=False)  # message never sent
    retried = _announce(team_a, object_id=2, capture=django_capture_on_commit_callbacks, execute=False)
    now = timezone.now()
    WebhookDelivery.objects.filter(pk=retried.pk).update(attempts=2, last_attempt_at=now)  # next try in 60 s
    with django_capture_on_commit_callbacks(execute=True):
        assert webhooks.resend_lost_deliveries(now=now) == []  # nothing overdue yet
        later = now + dt.timedelta(seconds=601)
        assert sorted(webhooks.resend_lost_deliveries(now=later)) == [fresh.pk]
        assert sorted(webhooks.resend_lost_deliveries(now=later + dt.timedelta(seconds=60))) == [fresh.pk, retried.pk]
    WebhookDelivery.objects.filter(pk=fresh.pk).update(state="delivered")
    with django_capture_on_commit_callbacks(execute=True):
        assert webhooks.resend_lost_deliveries(now=later + dt.timedelta(days=1)) == [retried.pk]
    assert celery_outbox.args_of("core.deliver_webhook").count((fresh.pk,)) == 2
