"""API tokens: issued with their key shown once (only a hash is stored), revoked by their owner or staff."""
from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from core.exceptions import PermissionDenied
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
    """The dashboard's creation: the account password is typed again, so a session left open (or
    stolen) cannot mint a long-lived key without it."""
    if not password or not user.check_password(password):
        raise PermissionDenied("Wrong password: type your account password to create a token.", field="password")
    return create_api_token(user=user, name=name)


def revoke_api_token(*, user: AbstractBaseUser, token: ApiToken) -> ApiToken:
    if token.user_id != user.pk and not user.is_staff:
        raise PermissionDenied("You can only revoke your own tokens.")
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token
