"""Invitations: an owner invites a user by name; only the invitee sees, accepts or declines it."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from core.exceptions import NotFound
from core.models import Membership, Team, TeamInvitation
from core.permissions import is_team_owner, require_team_owner

from .teams import check_role


@transaction.atomic
def invite_member(*, actor: AbstractBaseUser, team: Team, username: str, role: str) -> TeamInvitation | None:
    """An owner invites a user by user name or e-mail address (a unique, active account). The outcome is not told to the caller: an unknown or inactive
    name, or a user already in the team, makes no invitation but looks the same (None here, the same
    202 at the API), so invitations cannot be used to find out who has an account."""
    require_team_owner(actor, team.pk)
    check_role(role)
    user = _find_user(username)
    if user is None or Membership.objects.filter(team=team, user=user).exists():
        return None
    invitation, _ = TeamInvitation.objects.update_or_create(
        team=team, user=user, defaults={"role": role, "invited_by": actor})
    return invitation


def _find_user(name_or_email: str) -> AbstractBaseUser | None:
    User = get_user_model()
    value = (name_or_email or "").strip()
    if not value:
        return None
    by_name = User.objects.filter(**{User.USERNAME_FIELD: value}, is_active=True).first()
    if by_name is not None or "@" not in value:
        return by_name
    matches = list(User.objects.filter(email__iexact=value, is_active=True)[:2])
    return matches[0] if len(matches) == 1 else None  # an address two accounts share names nobody


@transaction.atomic
def accept_invitation(*, actor: AbstractBaseUser, invitation: TeamInvitation) -> Membership:
    invitation = _own_invitation(actor, invitation)
    inviter = invitation.invited_by
    if inviter is None or not is_team_owner(inviter, invitation.team_id):
        # only the invitee sees an invitation, so the team cannot revoke it: it lapses with its
        # inviter's ownership (an owner being removed cannot leave a way back in behind them)
        raise NotFound("No such invitation.")
    membership, _ = Membership.objects.get_or_create(team=invitation.team, user=actor,
                                                     defaults={"role": invitation.role})
    invitation.delete()
    return membership


@transaction.atomic
def decline_invitation(*, actor: AbstractBaseUser, invitation: TeamInvitation) -> None:
    _own_invitation(actor, invitation).delete()


def _own_invitation(actor: AbstractBaseUser, invitation: TeamInvitation) -> TeamInvitation:
    row = TeamInvitation.objects.select_for_update().filter(pk=invitation.pk, user=actor).first()
    if row is None:
        raise NotFound("No such invitation.")
    return row
