"""API tokens: issued with their key shown once (only a hash is stored), revoked by their owner or staff."""
from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import authenticate
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from core import login_guard
from core.exceptions import PermissionDenied, TooManyAttempts
from core.fieldtext import fit_to_field
from core.models import ApiToken


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    key: str  # shown once, never stored


def create_api_token(*, user: AbstractBaseUser, name: str) -> IssuedToken:
    name = (name or "").strip() or "default"
    key = ApiToken.generate_key()
    token = ApiToken.objects.create(
        user=user, name=fit_to_field(ApiToken, "name", name), prefix=key[: ApiToken.PREFIX_LEN],
        key_hash=ApiToken.hash_key(key),
    )
    return IssuedToken(token=token, key=key)


def create_api_token_confirmed(*, user: AbstractBaseUser, name: str, password: str) -> IssuedToken:
    """A token made from a session (the dashboard's page and POST /api/tokens/): the account password is
    typed again, so a session left open (or stolen) cannot mint a long-lived key without it. The check
    goes through ``authenticate()``, so wrong passwords count towards the account's sign-in lockout
    (core.login_guard) and a locked account mints nothing."""
    username = user.get_username()
    locked_for = login_guard.account_locked_for(username)
    if locked_for:
        raise TooManyAttempts(login_guard.REFUSAL_MESSAGE, retry_after=locked_for, field="password")
    confirmed = authenticate(request=None, username=username, password=password) if password else None
    if confirmed is None or confirmed.pk != user.pk:
        raise PermissionDenied("Wrong password: type your account password to create a token.", field="password")
    return create_api_token(user=user, name=name)


def revoke_api_token(*, user: AbstractBaseUser, token: ApiToken) -> ApiToken:
    if token.user_id != user.pk and not user.is_staff:
        raise PermissionDenied("You can only revoke your own tokens.")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
