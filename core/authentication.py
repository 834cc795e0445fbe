"""API token authentication (`Authorization: Token <key>` or `Bearer <key>`), and the password backend
that honours sign-in lockouts (core.login_guard)."""
from __future__ import annotations

import logging

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, transaction
from django.utils import timezone
from rest_framework import authentication, exceptions

from . import login_guard, outages
from .models import ApiToken

log = logging.getLogger(__name__)


class LockoutModelBackend(ModelBackend):
    """Django's user/password backend, refusing a locked user name before its password is checked.
    Raising PermissionDenied makes ``authenticate()`` stop (no other backend is tried) and answer None."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        name = username if username is not None else kwargs.get(get_user_model().USERNAME_FIELD)
        if login_guard.account_locked_for(name):
            raise PermissionDenied("This user name is locked after too many failed passwords.")
        return super().authenticate(request, username=username, password=password, **kwargs)


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keywords = ("token", "bearer")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Token <key>'.")
        key = header[1].decode(errors="replace")
        token = (
            ApiToken.objects.select_related("user")
            .filter(key_hash=ApiToken.hash_key(key), revoked_at__isnull=True)
            .first()
        )
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked API token.")
        # Touch at most once a minute: a write per request would serialize reads.
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            try:
                with transaction.atomic():
                    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            except DatabaseError as exc:  # a full disk must not fail every read for a timestamp
                if not outages.is_disk_full(exc):
                    raise
                log.warning("API token %s: last use not recorded (%s)", token.pk, exc)
        return token.user, token

    def authenticate_header(self, request):
        return "Token"
