"""The one rule for who may change a team's objects: its owners and members, and staff. Viewers
read only. Every service that writes a team's object calls ``require_team_writer``."""
from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from .exceptions import PermissionDenied  # the services' 403 (a ServiceError the API and dashboard answer)
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
