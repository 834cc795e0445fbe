"""The team page's "Send test" button: one signed test notification to the team's webhook.

It goes through the same delivery path as a real event (core.services.webhooks.send_delivery -> the
deliver task -> the URL's SSRF checks at send time, signature, timeout), so a test that arrives proves the
real ones will. Only owners may send one, and at most one per team per WEBHOOK_TEST_INTERVAL_S, so the
button cannot be used to make the platform hammer a URL.
"""
from __future__ import annotations

import uuid

from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from core.exceptions import ServiceError
from core.models import Team, TeamWebhook, WebhookDelivery
from core.permissions import require_team_owner
from core.services.webhooks import send_delivery

WEBHOOK_TEST_INTERVAL_S = 60
TEST_EVENT = "webhook.test"


class SentTooSoon(ServiceError):
    status = 429
    code = "throttled"


@transaction.atomic
def send_test_delivery(*, actor: AbstractBaseUser, team: Team) -> WebhookDelivery:
    """Queue a test delivery to the team's webhook (sent after commit); ServiceError when the actor is not
    an owner, the team has no webhook, or a test was sent less than WEBHOOK_TEST_INTERVAL_S ago."""
    require_team_owner(actor, team.pk, "send a test notification")
    if not TeamWebhook.objects.filter(team=team).exists():
        raise ServiceError("Set a webhook URL first: there is nothing to test.", field="url")
    if not cache.add(f"webhook-test:{team.pk}", 1, timeout=WEBHOOK_TEST_INTERVAL_S):
        raise SentTooSoon(f"A test was sent less than {WEBHOOK_TEST_INTERVAL_S} s ago; wait a minute and "
                          "look at its answer under Last deliveries.")
    payload = {"event": TEST_EVENT, "team": team.pk, "occurred_at": timezone.now().isoformat(),
               "object": {"type": "test", "id": 0, "state": "test", "sent_by": actor.get_username()}}
    delivery = WebhookDelivery.objects.create(team=team, event=TEST_EVENT, payload=payload,
                                              event_key=f"test:{team.pk}:{uuid.uuid4().hex}")
    send_delivery(delivery.pk)
    return delivery
