"""Rate limits on API requests and on the expensive or sensitive writes: uploads and token creation.

Each throttle counts the requests it is about per user (per client address when anonymous, from
core.client_address: X-Forwarded-For is trusted only as far as settings.NUM_PROXIES says; an IPv6
client by its /64), at the rate named by its scope in REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], read
per request so a test can lower it.
Counts are atomic (core.ratelimit), so concurrent requests cannot slip past a limit. The dashboard's
upload and token pages call the same classes, so a user has one upload budget across API and dashboard.
Logins are limited in core.login_guard (per address and per account).
"""
from __future__ import annotations

from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from core import ratelimit
from core.client_address import client_network


class WindowThrottle(BaseThrottle):
    """Allow ``rate`` requests per window to each user (or anonymous client address)."""

    scope = ""
    counted_methods: frozenset[str] | None = None  # None: every request counts

    def __init__(self):
        self._wait: int | None = None

    def get_ident(self, request) -> str:
        return client_network(request)

    def cache_key(self, request) -> str:
        user = getattr(request, "user", None)
        ident = f"user-{user.pk}" if user is not None and user.is_authenticated else f"addr-{self.get_ident(request)}"
        return f"throttle_{self.scope}_{ident}"

    def allow_request(self, request, view) -> bool:
        self._wait = None
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)
        if rate is None or (self.counted_methods is not None and request.method not in self.counted_methods):
            return True
        limit, period = ratelimit.parse_rate(rate)
        key = self.cache_key(request)
        if ratelimit.hit(key, period) <= limit:
            return True
        self._wait = ratelimit.seconds_left(key, period)
        return False

    def wait(self) -> int | None:
        return self._wait


class UserThrottle(WindowThrottle):
    """Every API request (REST_FRAMEWORK's DEFAULT_THROTTLE_CLASSES)."""

    scope = "user"


class PostRateThrottle(WindowThrottle):
    """Only the POSTs of a view (e.g. a viewset's create) count."""

    counted_methods = frozenset({"POST"})


class UploadThrottle(PostRateThrottle):
    scope = "uploads"


class TokenCreateThrottle(PostRateThrottle):
    scope = "tokens"


def upload_throttled_message(throttle: UploadThrottle) -> str:
    """The dashboard's words for a refused upload."""
    return f"Too many uploads in the last hour; try again in {throttle.wait() or 60} s."
