"""Password guessing, bounded two ways: per client address and per account.

- Per address: each sign-in attempt counts against REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["login"] for
  the client address (core.client_address; a forged X-Forwarded-For does not make a new address).
- Per account: LOGIN_LOCKOUT_FAILURES failed passwords for one username within
  LOGIN_LOCKOUT_WINDOW_SECONDS lock that username for LOGIN_LOCKOUT_SECONDS, from every address. Failures
  are counted from Django's ``user_login_failed`` signal, so every password check that goes through
  ``authenticate()`` counts: the dashboard and admin logins and the token pages' password confirmation.
  While locked, ``LockoutModelBackend`` (core.authentication) refuses before checking the password.
  Names that match no account are counted and locked the same way, so a lock tells nothing about whether
  an account exists; a successful sign-in clears the username's failures.

Counts live in Django's cache (core.ratelimit). Sign-in forms mix in ``GuardedLoginFormMixin``; their
views pass the response through ``refused_status`` so a refusal is a 429 with Retry-After.
"""
from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from rest_framework.settings import api_settings

from core import ratelimit
from core.client_address import client_network

logger = logging.getLogger(__name__)

REFUSAL_MESSAGE = "Too many login attempts; wait a few minutes, then try again."
REFUSAL_CODE = "throttled"


@dataclass(frozen=True)
class Refusal:
    message: str
    retry_after: int  # seconds


def _account(username: str) -> str:
    # Hashed: the cache key must not carry (or be broken by) whatever was typed as a user name.
    return hashlib.sha256(username.strip().casefold().encode()).hexdigest()


def _failures_key(username: str) -> str:
    return f"login_failures_{_account(username)}"


def _lock_key(username: str) -> str:
    return f"login_locked_{_account(username)}"


def account_locked_for(username: str | None) -> int | None:
    """Seconds left on ``username``'s lock, or None when it is not locked."""
    if not username:
        return None
    until = cache.get(_lock_key(username))
    if until is None:
        return None
    left = math.ceil(until - time.time())
    return left if left > 0 else None


def record_failure(username: str | None) -> None:
    """A wrong password for ``username``: count it, and lock the name at the threshold."""
    if not username or account_locked_for(username):
        return  # attempts refused by a lock checked no password: they neither count nor extend it
    key = _failures_key(username)
    if ratelimit.hit(key, settings.LOGIN_LOCKOUT_WINDOW_SECONDS) < settings.LOGIN_LOCKOUT_FAILURES:
        return
    lock_seconds = settings.LOGIN_LOCKOUT_SECONDS
    cache.set(_lock_key(username), time.time() + lock_seconds, timeout=lock_seconds)
    ratelimit.reset(key)  # after the lock, a fresh count
    logger.warning("Sign-in locked for %s s after %s failed passwords (account %s…)", lock_seconds,
                   settings.LOGIN_LOCKOUT_FAILURES, _account(username)[:12])


def record_success(username: str) -> None:
    ratelimit.reset(_failures_key(username))


def _address_wait(request) -> int | None:
    """Count one attempt from the request's client address; the seconds to wait when over the rate."""
    rate = api_settings.DEFAULT_THROTTLE_RATES.get("login")
    if request is None or rate is None:
        return None
    limit, period = ratelimit.parse_rate(rate)
    key = f"throttle_login_addr-{client_network(request)}"
    if ratelimit.hit(key, period) <= limit:
        return None
    return ratelimit.seconds_left(key, period)


def check(request, username: str | None) -> Refusal | None:
    """Call once per sign-in attempt, before the password is checked: a Refusal when it must not be.
    The refusal reads the same whether the address or the account is over its limit."""
    waits = [w for w in (_address_wait(request), account_locked_for(username)) if w]
    return Refusal(REFUSAL_MESSAGE, max(waits)) if waits else None


class GuardedLoginFormMixin:
    """For an AuthenticationForm: refuse the attempt (without checking the password) when ``check`` says so.
    The refusal is kept on ``form.refusal`` for ``refused_status``."""

    refusal: Refusal | None = None

    def clean(self):
        self.refusal = check(self.request, self.cleaned_data.get("username"))
        if self.refusal is not None:
            raise ValidationError(self.refusal.message, code=REFUSAL_CODE)
        return super().clean()


def refused_status(response):
    """A sign-in page's response: 429 with Retry-After when its form was refused by ``check``."""
    form = (getattr(response, "context_data", None) or {}).get("form")
    refusal = getattr(form, "refusal", None)
    if refusal is not None:
        response.status_code = 429
        response["Retry-After"] = str(refusal.retry_after)
    return response


def on_login_failed(sender, credentials, request=None, **kwargs) -> None:
    record_failure(credentials.get("username"))


def on_logged_in(sender, request, user, **kwargs) -> None:
    record_success(user.get_username())
