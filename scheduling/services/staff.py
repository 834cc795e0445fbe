"""Cluster-wide changes (draining, predictors) are staff's; ``actor=None`` is the platform itself."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser

from core.exceptions import PermissionDenied


def require_staff(actor: AbstractBaseUser | None, what: str) -> None:
    if actor is not None and not actor.is_staff:
        raise PermissionDenied(f"Only staff can {what}.")


def acting_user(actor: AbstractBaseUser | None) -> AbstractBaseUser | None:
    """The user to record as creator: None for the platform or an anonymous caller."""
    return actor if actor is not None and actor.is_authenticated else None
