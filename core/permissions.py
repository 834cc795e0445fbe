"""The rules for who may change a team's objects. Writers: its owners and members, and staff (viewers
read only); every service that writes a team's object calls ``require_team_writer``. Owners (and staff)
also manage the team itself: its members, invitations, name (``require_team_owner``).

Both raise the services' ``PermissionDenied`` (a ``ServiceError``: 403 at the API, a message on the
dashboard), never Django's."""
from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser

from .exceptions import PermissionDenied
from .models import Membership


def is_team_writer(actor: AbstractBaseUser | None, team_id: int) -> bool:
    """``actor=None`` is the platform itself (a task or a command acting for nobody in particular)."""
    if actor is None or actor.is_staff:
        return True
    return Membership.objects.filter(
        user=actor, team_id=team_id, role__in=[Membership.Role.OWNER, Membership.Role.MEMBER]
    ).exists()


def require_team_writer(actor: AbstractBaseUser | None, team_id: int, what: str = "change this team's objects") -> None:
    """Raises PermissionDenied("Viewers cannot <what>.") unless ``actor`` may write in the team."""
    if not is_team_writer(actor, team_id):
        raise PermissionDenied(f"Viewers cannot {what}.")


def is_team_owner(actor: AbstractBaseUser, team_id: int) -> bool:
    if actor.is_staff:
        return True
    return Membership.objects.filter(team_id=team_id, user=actor, role=Membership.Role.OWNER).exists()


def require_team_owner(actor: AbstractBaseUser, team_id: int, what: str = "manage its members") -> None:
    """Raises PermissionDenied("Only the team's owners can <what>.") unless ``actor`` owns the team (or is staff)."""
    if not is_team_owner(actor, team_id):
        raise PermissionDenied(f"Only the team's owners can {what}.")
