"""Writes for teams and memberships: creation (staff), renaming, members and their roles (owners)."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from core.exceptions import ConflictError, NotFound, PermissionDenied, ServiceError
from core.fieldtext import fit_to_field
from core.models import Membership, Quota, Team
from core.permissions import require_team_owner

from .energy import check_energy_value

TEAM_FIELDS = ("name", "description", "grid_intensity_g_per_kwh")


def require_team_creator(actor: AbstractBaseUser | None) -> None:
    """Teams are created by staff (or the platform itself, ``actor=None``: commands, bootstrap).

    Every team gets its own quota, so teams anyone could create would multiply every quota.
    """
    if actor is not None and not actor.is_staff:
        raise PermissionDenied("Only staff can create teams (each team gets its own quotas); ask an "
                               "administrator to create one for you.")


@transaction.atomic
def create_team(*, name: str, owner: AbstractBaseUser, description: str = "",
                actor: AbstractBaseUser | None = None) -> Team:
    """A team with the default quota, ``owner`` its first owner. ``actor`` must be staff (None = the platform)."""
    require_team_creator(actor)
    name = name.strip()
    if not name:
        raise ServiceError("A team needs a name.", field="name")
    slug = fit_to_field(Team, "slug", slugify(name)) or "team"
    if Team.objects.filter(name__iexact=name).exists() or Team.objects.filter(slug=slug).exists():
        raise ConflictError(f"A team named '{name}' already exists.", field="name")
    team = Team.objects.create(name=name, slug=slug, description=description)
    Quota.objects.create(team=team)
    Membership.objects.create(team=team, user=owner, role=Membership.Role.OWNER)
    return team


@transaction.atomic
def update_team(*, actor: AbstractBaseUser, team: Team, **fields) -> Team:
    """Owners rename or describe their team; only staff set its grid intensity (its carbon figures),
    within ENERGY_LIMITS, or clear it (None: the platform default)."""
    unknown = set(fields) - set(TEAM_FIELDS)
    if unknown:
        raise ServiceError(f"Unknown team field(s): {', '.join(sorted(unknown))}.")
    if "grid_intensity_g_per_kwh" in fields:
        if not actor.is_staff:
            raise PermissionDenied("Only staff can set a team's grid intensity (it sets the team's carbon figures).")
        if fields["grid_intensity_g_per_kwh"] is not None:
            check_energy_value("grid_intensity_g_per_kwh", fields["grid_intensity_g_per_kwh"])
    if set(fields) - {"grid_intensity_g_per_kwh"}:
        require_team_owner(actor, team.pk, "change it")
    for name, value in fields.items():
        setattr(team, name, value)
    team.save(update_fields=list(fields) or None)
    return team


def check_role(role: str) -> None:
    if role not in Membership.Role.values:
        raise ServiceError(f"Unknown role '{role}'; use one of {', '.join(Membership.Role.values)}.", field="role")


@transaction.atomic
def add_member(*, actor: AbstractBaseUser, team: Team, user: AbstractBaseUser, role: str) -> Membership:
    """Staff (admin, commands) put a user in a team directly; owners invite (invite_member)."""
    if not actor.is_staff:
        raise PermissionDenied("Owners invite users (POST /api/invitations/); the user joins by accepting.")
    check_role(role)
    try:
        with transaction.atomic():
            return Membership.objects.create(team=team, user=user, role=role)
    except IntegrityError:
        raise ConflictError(f"{user} is already a member of {team}.", field="user") from None


def _ensure_an_owner_remains(team: Team, excluding: Membership,
                             message: str = "A team must keep at least one owner.") -> None:
    others = Membership.objects.filter(team=team, role=Membership.Role.OWNER).exclude(pk=excluding.pk)
    if not others.exists():
        raise ConflictError(message)


def _lock_team_memberships(team_id: int) -> None:
    """Serialise the writes that may take a team's last owner away: two owners demoting (or removing)
    each other at once would each see the other still an owner, and both commit. Locks the team row
    first, always in this order (team, then membership), so two of them never deadlock."""
    Team.objects.select_for_update().filter(pk=team_id).values_list("pk", flat=True).first()


def _locked_membership(pk: int) -> Membership:
    membership = Membership.objects.select_for_update().select_related("team").filter(pk=pk).first()
    if membership is None:  # removed by a write that held the lock before us
        raise NotFound("No such member (they were just removed).")
    return membership


@transaction.atomic
def change_member_role(*, actor: AbstractBaseUser, membership: Membership, role: str) -> Membership:
    _lock_team_memberships(membership.team_id)
    membership = _locked_membership(membership.pk)
    require_team_owner(actor, membership.team_id)
    check_role(role)
    if membership.role == Membership.Role.OWNER and role != Membership.Role.OWNER:
        _ensure_an_owner_remains(membership.team, membership, **({"message": (
            "You are the team's last owner: make another member an owner before changing your own role.")}
            if membership.user_id == actor.pk else {}))
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def remove_member(*, actor: AbstractBaseUser, membership: Membership) -> None:
    """Owners remove members; any member removes themself (leaves), except the last owner."""
    _lock_team_memberships(membership.team_id)
    membership = _locked_membership(membership.pk)
    leaving = membership.user_id == actor.pk
    if not leaving:
        require_team_owner(actor, membership.team_id)
    if membership.role == Membership.Role.OWNER:
        _ensure_an_owner_remains(membership.team, membership, **({"message": (
            "You are the team's last owner: make another member an owner before leaving.")} if leaving else {}))
    membership.delete()
