"""Attacks on team webhooks: SSRF spellings the first checks missed, and a hostile receiver that hangs,
drips or floods its answer (the worker must stay bounded). The ones that once succeeded say so."""
from __future__ import annotations

import socket
import threading

import pytest

from core import services
from core.exceptions import ServiceError
from core.models import WebhookDelivery
from core.services import webhooks
from tests.core.test_webhooks import Receiver, fake_dns, local_receivers  # noqa: F401 - a fixture

pytestmark = pytest.mark.django_db

# Addresses that carry a private IPv4 address inside an IPv6 one, or that Python calls "global" though
# they are not (was broken: all of these were accepted).
EMBEDDED_PRIVATE = [
    "2002:a00:1::1",        # 6to4 of 10.0.0.1
    "2002:7f00:1::1",       # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",    # 6to4 of 169.254.169.254 (cloud metadata)
    "64:ff9b::a00:1",       # NAT64 of 10.0.0.1
    "64:ff9b::a9fe:a9fe",   # NAT64 of 169.254.169.254
    "64:ff9b:1::a00:1",     # local-use NAT64 prefix
    "::7f00:1",             # IPv4-compatible ::127.0.0.1 (deprecated, reserved)
    "fec0::1",              # site-local (deprecated, still routed inside some networks)
    "::ffff:0:7f00:1",      # SIIT IPv4-translated 127.0.0.1
]


@pytest.mark.parametrize("address", EMBEDDED_PRIVATE)
def test_ipv6_addresses_embedding_a_private_ipv4_are_refused(address, monkeypatch, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    assert not webhooks.is_public_address(address)
    fake_dns(monkeypatch, {"hooks.example.org": [address]})
    for url in ("https://hooks.example.org/in", f"https://[{address}]/in"):
        with pytest.raises(ServiceError) as err:
            webhooks.check_webhook_url(url)
        assert err.value.field == "url"


def test_public_addresses_in_the_same_forms_are_still_accepted(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    for address in ("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "64:ff9b::5db8:d822",
                    "2002:5db8:d822::1"):
        assert webhooks.is_public_address(address), address


LOCAL_SPELLINGS = [
    "https://localhost./", "https://LOCALHOST/", "https://127.1/", "https://0/", "https://[::]/",
    "https://[0:0:0:0:0:0:0:1]/", "https://[::ffff:7f00:1]/", "https://0177.0.0.1/", "https://127.0.0.1:443@x/",
    "https://x@127.0.0.1/", "https://127.0.0.1#@public.example/", "https://public.example\\@127.0.0.1/",
    "https://[fe80::1%25eth0]/", "https://%31%32%37.0.0.1/",
    "https://ⓛocalhost/",          # IDN that folds to localhost (was accepted up to DNS; now refused as non-ASCII)
    "https://public.example/\u2028x", "https://public.example/caf\u00e9",  # non-ASCII (was accepted)
    "https://public.example/\x7f",
]


@pytest.mark.parametrize("url", LOCAL_SPELLINGS)
def test_other_spellings_of_local_hosts_and_odd_characters_are_refused(url, monkeypatch, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    fake_dns(monkeypatch, {"public.example": ["93.184.216.34"]})
    with pytest.raises(ServiceError):
        webhooks.check_webhook_url(url)


def test_a_stored_url_that_cannot_be_sent_fails_the_delivery_instead_of_crashing_it(
        team_a, user_owner, local_receivers, django_capture_on_commit_callbacks, celery_outbox, settings):  # noqa: F811
    """A URL stored before the checks tightened (or by the admin): the attempt fails and is counted, so
    the delivery ends after WEBHOOK_MAX_ATTEMPTS instead of being re-sent by beat forever (held)."""
    services.set_team_webhook(actor=user_owner, team=team_a, url="http://127.0.0.1:9/")
    team_a.webhook.url = "http://127.0.0.1:9/caf\u00e9"
    team_a.webhook.save()
    with django_capture_on_commit_callbacks(execute=True):
        delivery = services.notify_terminal(team_id=team_a.pk, kind="tuning_run", object_id=1, state="failed",
                                            data={})
    delays = [webhooks.deliver(delivery_id=delivery.pk) for _ in range(settings.WEBHOOK_MAX_ATTEMPTS)]
    assert delays[-1] is None
    delivery.refresh_from_db()
    assert delivery.state == "failed" and delivery.attempts == settings.WEBHOOK_MAX_ATTEMPTS


def test_a_delivery_out_of_attempts_is_not_sent_again(team_a, user_owner, local_receivers, settings,  # noqa: F811
                                                     django_capture_on_commit_callbacks, celery_outbox):
    """A worker killed mid-attempt leaves a delivery pending; beat re-sends it: past its attempts it ends."""
    with Receiver() as rx:
        services.set_team_webhook(actor=user_owner, team=team_a, url=rx.url)
        with django_capture_on_commit_callbacks(execute=True):
            delivery = services.notify_terminal(team_id=team_a.pk, kind="gpu_job", object_id=3, state="failed",
                                                data={})
        WebhookDelivery.objects.filter(pk=delivery.pk).update(attempts=settings.WEBHOOK_MAX_ATTEMPTS)
        assert webhooks.deliver(delivery_id=delivery.pk) is None
    delivery.refresh_from_db()
    assert delivery.state == "failed" and rx.requests == []


# --- a hostile receiver: the worker's attempt stays bounded -----------------------------------------------


class HostileReceiver:
    """A raw TCP server that reads the request, then answers with ``answer(sock)``; it records how many
    bytes it managed to send before the client went away."""

    def __init__(self, answer):
        self.answer, self.sent, self.stop = answer, 0, threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/hook"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self):
        self.server.settimeout(10)
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        with conn:
            conn.recv(65536)
            try:
                self.answer(self, conn)
            except OSError:
                pass

    def send(self, conn, data: bytes):
        conn.sendall(data)
        self.sent += len(data)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.server.close()
        self.thread.join(15)


def drip_headers(rx, conn):
    rx.send(conn, b"HTTP/1.1 200 OK\r\nX-Slow: ")
    while not rx.stop.wait(0.05):  # a byte every 50 ms: no single read ever times out
        rx.send(conn, b"a")


def flood_body(rx, conn):
    rx.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
    chunk = b"x" * 65536
    while not rx.stop.is_set() and rx.sent < 1_000_000_000:
        rx.send(conn, chunk)


def silent(rx, conn):
    rx.stop.wait(30)


def _attempt_in_thread(delivery_id: int) -> tuple[threading.Thread, list]:
    from django.db import connection

    result: list = []

    def attempt():
        try:
            result.append(webhooks.deliver(delivery_id=delivery_id))
        finally:
            connection.close()
    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    return t, result


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("answer", [drip_headers, flood_body, silent], ids=["drip", "flood", "silent"])
def test_a_receiver_that_hangs_drips_or_floods_does_not_hold_the_worker(answer, settings):
    """Was broken for drip and flood: the read timeout is per read, so an answer trickled a byte at a
    time (or a body of a gigabyte drained to its end) held a worker for as long as the receiver liked."""
    from tests.factories import TeamFactory, UserFactory

    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_HTTP_HOSTS = ["127.0.0.1"]
    settings.WEBHOOK_TIMEOUT_S = 1.0
    owner = UserFactory(username="alice")
    team = TeamFactory(name="Hooked", owner=owner)
    with HostileReceiver(answer) as rx:
        services.set_team_webhook(actor=owner, team=team, url=rx.url)
        delivery = WebhookDelivery.objects.create(team=team, event="tuning_run.failed", event_key="tuning_run:1",
                                                  payload={"event": "tuning_run.failed"})
        t, result = _attempt_in_thread(delivery.pk)
        t.join(20)  # a generous liveness bound, not a timing measurement
        hung = t.is_alive()
        sent = rx.sent
    assert not hung, f"the attempt was still running; the receiver had sent {sent} bytes"
    delivery.refresh_from_db()
    if answer is flood_body:
        assert delivery.state == "delivered" and sent < 200_000_000  # the status is all that is read
    else:
        assert delivery.state == "pending" and delivery.last_status_code is None and result == [30.0]
        assert delivery.last_error and (answer is silent or "no complete answer" in delivery.last_error)


@pytest.mark.django_db(transaction=True)
def test_an_https_receiver_that_stalls_the_tls_handshake_does_not_hold_the_worker(settings):
    """The https path (certificate checked against the named host, bounded like http): a receiver that
    answers no TLS fails the attempt, to be retried."""
    from tests.factories import TeamFactory, UserFactory

    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_TIMEOUT_S = 1.0
    owner = UserFactory(username="alice")
    team = TeamFactory(name="Hooked", owner=owner)
    with HostileReceiver(drip_headers) as rx:  # bytes that are no TLS ServerHello, a byte at a time
        services.set_team_webhook(actor=owner, team=team, url=rx.url.replace("http://", "https://"))
        delivery = WebhookDelivery.objects.create(team=team, event="gpu_job.failed", event_key="gpu_job:1",
                                                  payload={"event": "gpu_job.failed"})
        t, result = _attempt_in_thread(delivery.pk)
        t.join(20)
        hung = t.is_alive()
    assert not hung
    delivery.refresh_from_db()
    assert delivery.state == "pending" and delivery.last_status_code is None and delivery.last_error


def html_status_line(rx, conn):
    rx.send(conn, b"<script>alert(1)</script> 200 OK\r\n\r\n")


@pytest.mark.django_db(transaction=True)
def test_what_a_receiver_answers_is_shown_as_text_on_the_team_page(settings):
    """The receiver's garbage reaches the delivery's last error, which members see: escaped (held)."""
    from django.test import Client

    from tests.factories import TeamFactory, UserFactory

    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_HTTP_HOSTS = ["127.0.0.1"]
    owner = UserFactory(username="alice")
    team = TeamFactory(name="Hooked", owner=owner)
    with HostileReceiver(html_status_line) as rx:
        services.set_team_webhook(actor=owner, team=team, url=rx.url)
        delivery = WebhookDelivery.objects.create(team=team, event="gpu_job.failed", event_key="gpu_job:2",
                                                  payload={"event": "gpu_job.failed"})
        webhooks.deliver(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    assert "<script>" in delivery.last_error
    c = Client()
    c.force_login(owner)
    html = c.get(f"/teams/{team.pk}/").content.decode()
    assert "&lt;script&gt;alert(1)" in html and "<script>alert(1)" not in html
