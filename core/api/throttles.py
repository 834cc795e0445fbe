"""Rate limits on the expensive or sensitive writes: uploads, login, token creation.

Each throttle counts only the requests it is about (POSTs), per user (per client address when
anonymous), at the rate named by its scope in REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], read per
request so a test can lower it. Counts live in Django's cache ("default": Redis in the compose
deployment, DJANGO_CACHE_URL, so all web workers share them; per process otherwise).
"""
from __future__ import annotations

from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle


class PostRateThrottle(SimpleRateThrottle):
    """Throttle the POSTs of a view (e.g. a viewset's create) at the rate of ``scope``."""

    scope = ""

    def __init__(self):  # the rate is read per request, not bound at import (see get_rate)
        pass

    def get_rate(self):
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def allow_request(self, request, view):
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request, view):
        if request.method != "POST":
            return None  # not counted
        user = getattr(request, "user", None)
        ident = f"user-{user.pk}" if user is not None and user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class UploadThrottle(PostRateThrottle):
    scope = "uploads"


class TokenCreateThrottle(PostRateThrottle):
    scope = "tokens"


class LoginThrottle(PostRateThrottle):
    """Login attempts per client address (the user is not known before the password is checked)."""

    scope = "login"

    def get_cache_key(self, request, view):
        if request.method != "POST":
            return None
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
