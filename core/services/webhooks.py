"""Team webhooks: owners set a URL; every tuning run and GPU job of the team that reaches a terminal state
is announced to it with a signed JSON body, delivered by a Celery task that retries with backoff.

**SSRF.** The platform makes the request, so a URL could aim it at the platform's own network (the
database, Redis, a cloud metadata service). A URL is accepted only as ``https://`` (``http://`` only to a
host in ``WEBHOOK_HTTP_HOSTS``), without credentials, to a host whose every address is public
(``ipaddress.is_global``); the check is made again at each delivery, and the request goes to the very
address that was checked (no second DNS lookup a rebinding name could answer differently), never
following redirects; one attempt lasts at most ``WEBHOOK_TIMEOUT_S`` in all (a receiver that drips
its answer is cut off) and reads the status line only. ``WEBHOOK_ALLOW_PRIVATE_ADDRESSES`` lifts the
address check (tests, a private deployment).

**Signature.** ``X-Dlopt-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`` under the team's
secret, with ``X-Dlopt-Timestamp`` (Unix seconds) so a receiver can refuse replays;
``verify_signature`` is the reference check.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import urllib3
import urllib3.connection
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from core.dispatch import send_on_commit
from core.exceptions import ServiceError
from core.models import Team, TeamWebhook, WebhookDelivery
from core.permissions import require_team_owner

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Dlopt-Signature"
TIMESTAMP_HEADER = "X-Dlopt-Timestamp"
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_URL_CHARS = 500


# --- the URL and where it points -------------------------------------------------------------------


def _refuse(message: str) -> ServiceError:
    return ServiceError(message, field="url", code="invalid_webhook_url")


def check_webhook_url(url: str) -> str:
    """The URL, normalised, if a webhook may be sent to it; ServiceError(field="url") naming why not."""
    url = (url or "").strip()
    if not url or len(url) > MAX_URL_CHARS or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise _refuse(f"Give a URL of at most {MAX_URL_CHARS} characters, without spaces.")
    if not url.isascii():  # IDN hosts fold in surprising ways (\u24db is "l"): the caller spells them out
        raise _refuse("Write the URL in ASCII: the host's xn-- (punycode) form, the path percent-encoded.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise _refuse("That is not a valid URL.") from None
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if scheme not in ("https", "http"):
        raise _refuse("A webhook URL starts with https://.")
    if parts.username is not None or parts.password is not None:
        raise _refuse("A webhook URL must not carry a user name or password.")
    if not host:
        raise _refuse("The URL names no host.")
    if scheme == "http" and host not in [h.lower() for h in settings.WEBHOOK_HTTP_HOSTS]:
        raise _refuse(f"Plain http:// is allowed only to the hosts in WEBHOOK_HTTP_HOSTS; use https://{host}/.")
    public_addresses(host, port or _default_port(scheme))
    return urlunsplit((scheme, parts.netloc.lower(), parts.path or "/", parts.query, ""))


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


WELL_KNOWN_NAT64 = ipaddress.ip_network("64:ff9b::/96")
LOCAL_TRANSLATION = (ipaddress.ip_network("64:ff9b:1::/48"), ipaddress.ip_network("::ffff:0:0:0/96"))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64): a translator on the way delivers
    to it, so it is the address that must be public."""
    if ip in WELL_KNOWN_NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.ipv4_mapped or ip.sixtofour


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6:
        if ip.is_reserved and ip not in WELL_KNOWN_NAT64 and ip.ipv4_mapped is None:
            return False  # ::/8 (IPv4-compatible ::127.0.0.1), SIIT, local-use NAT64 and other reserved space
        if ip.is_site_local or any(ip in net for net in LOCAL_TRANSLATION):
            return False  # fec0::/10, translators inside the network
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            ip = embedded
    return ip.is_global and not ip.is_multicast


def public_addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, if all are public (or private ones are allowed)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise _refuse(f"The host {host} does not resolve.") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES:
        private = [a for a in addresses if not is_public_address(a)]
        if private or not addresses:
            raise _refuse(f"{host} resolves to {private[0] if private else 'nothing'}, a private, loopback or "
                          "reserved address: webhooks go to public hosts only.")
    return addresses


# --- owners' settings ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookChange:
    webhook: TeamWebhook
    secret: str | None  # the signing secret, when it was just made: shown once


@transaction.atomic
def set_team_webhook(*, actor: AbstractBaseUser, team: Team, url: str) -> WebhookChange:
    """Owners set (or change) their team's webhook URL; the first one comes with a new secret."""
    require_team_owner(actor, team.pk, "set its webhook")
    url = check_webhook_url(url)
    hook = TeamWebhook.objects.select_for_update().filter(team=team).first()
    if hook is not None:
        hook.url, hook.updated_by = url, actor
        hook.save(update_fields=["url", "updated_by", "updated_at"])
        return WebhookChange(hook, None)
    secret = TeamWebhook.generate_secret()
    hook = TeamWebhook.objects.create(team=team, url=url, secret=secret, updated_by=actor,
                                      secret_rotated_at=timezone.now())
    return WebhookChange(hook, secret)


@transaction.atomic
def rotate_webhook_secret(*, actor: AbstractBaseUser, team: Team) -> WebhookChange:
    """A new signing secret (the old one stops verifying at once); shown once."""
    require_team_owner(actor, team.pk, "rotate its webhook secret")
    hook = TeamWebhook.objects.select_for_update().filter(team=team).first()
    if hook is None:
        raise ServiceError("The team has no webhook: set its URL first.")
    hook.secret, hook.secret_rotated_at, hook.updated_by = TeamWebhook.generate_secret(), timezone.now(), actor
    hook.save(update_fields=["secret", "secret_rotated_at", "updated_by", "updated_at"])
    return WebhookChange(hook, hook.secret)


@transaction.atomic
def remove_team_webhook(*, actor: AbstractBaseUser, team: Team) -> None:
    require_team_owner(actor, team.pk, "remove its webhook")
    TeamWebhook.objects.filter(team=team).delete()


# --- events ---------------------------------------------------------------------------------------------


def notify_terminal(*, team_id: int, kind: str, object_id: int, state: str, data: dict) -> WebhookDelivery | None:
    """Announce that the team's ``kind`` object (``tuning_run``, ``gpu_job``) reached terminal ``state``.

    Called inside the transaction that made the transition: the delivery row commits with it, and its
    task is sent after commit. Once per object (a repeated announcement is a no-op); nothing when the
    team has no webhook."""
    if not TeamWebhook.objects.filter(team_id=team_id).exists():
        return None
    event = f"{kind}.{state}"
    payload = {"event": event, "team": team_id, "occurred_at": timezone.now().isoformat(),
               "object": {"type": kind, "id": object_id, "state": state, **data}}
    delivery, created = WebhookDelivery.objects.get_or_create(
        event_key=f"{kind}:{object_id}", defaults={"team_id": team_id, "event": event, "payload": payload})
    if created:
        send_delivery(delivery.pk)
    return delivery if created else None


def send_delivery(delivery_id: int, countdown: float | None = None) -> None:
    from core.tasks import deliver_webhook

    options = {"countdown": countdown} if countdown else {}
    send_on_commit(lambda: deliver_webhook.apply_async(args=[delivery_id], **options),
                   what=f"webhook delivery {delivery_id}")


# --- delivery ------------------------------------------------------------------------------------------


def signature(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(secret: str, timestamp: str, body: bytes, header: str, *, tolerance_s: float = 300.0,
                     now: float | None = None) -> bool:
    """What a receiver checks: the signature matches, and the timestamp is recent."""
    try:
        fresh = abs((now if now is not None else time.time()) - int(timestamp)) <= tolerance_s
    except (TypeError, ValueError):
        return False
    return fresh and hmac.compare_digest(signature(secret, timestamp, body), header or "")


def retry_delay_s(attempts: int) -> float:
    """Exponential backoff after the ``attempts``-th failed attempt: base, 2 x base, 4 x base, ..."""
    return min(settings.WEBHOOK_RETRY_BASE_S * 2 ** (attempts - 1), 3600.0)


@dataclass(frozen=True)
class Answer:
    status: int | None
    error: str = ""


def deliver(*, delivery_id: int) -> float | None:
    """One attempt at a pending delivery. Returns the seconds to wait before the next attempt, or None
    when it is settled (delivered, refused, out of attempts, or nothing to do)."""
    with transaction.atomic():
        delivery = (WebhookDelivery.objects.select_for_update().filter(pk=delivery_id,
                                                                        state=WebhookDelivery.State.PENDING).first())
        if delivery is None:
            return None
        hook = TeamWebhook.objects.filter(team_id=delivery.team_id).first()
        if hook is None:
            _settle(delivery, WebhookDelivery.State.FAILED, Answer(None, "the team removed its webhook"))
            return None
        if delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:  # re-sent after a worker died mid-attempt
            _settle(delivery, WebhookDelivery.State.FAILED, Answer(delivery.last_status_code,
                                                                   delivery.last_error or "out of attempts"))
            return None
        delivery.attempts += 1
        delivery.last_attempt_at = timezone.now()
        delivery.save(update_fields=["attempts", "last_attempt_at"])
    answer = _post(hook, delivery)  # outside the transaction: no row is locked while the receiver thinks
    if answer.status is not None and 200 <= answer.status < 300:
        _settle(delivery, WebhookDelivery.State.DELIVERED, answer)
        return None
    retryable = answer.status is None or answer.status in RETRY_STATUSES
    if retryable and delivery.attempts < settings.WEBHOOK_MAX_ATTEMPTS:
        _settle(delivery, WebhookDelivery.State.PENDING, answer)
        return retry_delay_s(delivery.attempts)
    _settle(delivery, WebhookDelivery.State.FAILED, answer)
    return None


def resend_lost_deliveries(*, now=None) -> list[int]:
    """Send again the pending deliveries whose message was lost (a broker outage when it was sent, a
    worker killed before it retried): those whose next attempt is overdue by WEBHOOK_LOST_AFTER_S.
    Beat runs this; a receiver may see a delivery twice, and dedupes by its ``delivery`` id."""
    now = now or timezone.now()
    grace = dt.timedelta(seconds=settings.WEBHOOK_LOST_AFTER_S)
    lost = []
    for pk, attempts, created, last in WebhookDelivery.objects.filter(state=WebhookDelivery.State.PENDING) \
            .values_list("pk", "attempts", "created_at", "last_attempt_at"):
        due = (last + dt.timedelta(seconds=retry_delay_s(attempts))) if attempts and last else created
        if due + grace < now:
            lost.append(pk)
            send_delivery(pk)
    return lost


def _settle(delivery: WebhookDelivery, state: str, answer: Answer) -> None:
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        state=state, last_status_code=answer.status, last_error=answer.error[:300])


def _body(delivery: WebhookDelivery) -> bytes:
    return json.dumps({**delivery.payload, "delivery": delivery.pk}, sort_keys=True,
                      separators=(",", ":")).encode()


def _post(hook: TeamWebhook, delivery: WebhookDelivery) -> Answer:
    body, timestamp = _body(delivery), str(int(time.time()))
    parts = urlsplit(hook.url)
    scheme, host = parts.scheme, parts.hostname or ""
    port = parts.port or _default_port(scheme)
    try:
        address = public_addresses(host, port)[0]  # checked again: DNS may have changed since it was set
    except ServiceError as exc:
        return Answer(None, exc.message)
    headers = {"Content-Type": "application/json", "User-Agent": "dlopt-webhooks/1",
               "Host": parts.netloc.rsplit("@", 1)[-1], "X-Dlopt-Event": delivery.event,
               "X-Dlopt-Delivery": str(delivery.pk), TIMESTAMP_HEADER: timestamp,
               SIGNATURE_HEADER: signature(hook.secret, timestamp, body)}
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _exchange(_connection(scheme, address, port, host), path, body, headers)


def _connection(scheme: str, address: str, port: int, host: str) -> urllib3.connection.HTTPConnection:
    """A connection to the checked address; over https it verifies the certificate of the named host."""
    timeout = settings.WEBHOOK_TIMEOUT_S
    if scheme == "https":
        return urllib3.connection.HTTPSConnection(address, port, timeout=timeout, server_hostname=host,
                                                  assert_hostname=host, cert_reqs="CERT_REQUIRED")
    return urllib3.connection.HTTPConnection(address, port, timeout=timeout)


def _exchange(conn: urllib3.connection.HTTPConnection, path: str, body: bytes, headers: dict) -> Answer:
    """POST and read the status line, within WEBHOOK_TIMEOUT_S for the whole exchange: a socket timeout
    bounds each read only, so a receiver dripping its answer a byte at a time could hold the worker for
    ever; a watchdog shuts the socket at the deadline. The body of the answer is never read."""
    expired, error = threading.Event(), ""
    deadline = threading.Timer(settings.WEBHOOK_TIMEOUT_S, _shut, args=(conn, expired))
    deadline.start()
    try:
        conn.request("POST", path, body=body, headers=headers, preload_content=False)
        status = conn.getresponse().status
    except Exception as exc:  # noqa: BLE001 - whatever a hostile receiver causes is a failed attempt
        status, error = None, f"{type(exc).__name__}: {exc}"[:300]
    finally:
        deadline.cancel()
        conn.close()
    if expired.is_set():  # a cut-off answer can still parse (headers end at EOF): it does not count
        return Answer(None, f"no complete answer within {settings.WEBHOOK_TIMEOUT_S:g} s")
    return Answer(status) if status is not None else Answer(None, error)


def _shut(conn: urllib3.connection.HTTPConnection, expired: threading.Event) -> None:
    expired.set()
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the read blocked in the delivering thread
        except OSError:
            pass
