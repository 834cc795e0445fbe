"""Reads of the account pages (API tokens) and team pages (members, invitations, webhook deliveries),
always scoped to the signed-in user: another user's token or another team's row is a 404."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count
from django.http import Http404

from core import selectors as core_selectors
from core.models import ApiToken, Membership, Team, TeamInvitation, TeamWebhook, WebhookDelivery

RECENT_DELIVERIES = 20


def tokens_of(user: AbstractBaseUser) -> list[ApiToken]:
    """The user's tokens, active first, then revoked (kept so a user sees when one was revoked)."""
    return sorted(ApiToken.objects.filter(user=user), key=lambda t: (not t.is_active, -t.created_at.timestamp()))


def own_token(user: AbstractBaseUser, pk: int) -> ApiToken:
    token = ApiToken.objects.filter(user=user, pk=pk).first()
    if token is None:
        raise Http404("No such token among yours.")
    return token


def team_of_user(user: AbstractBaseUser, pk: int) -> tuple[Team, str]:
    """One of the user's teams with the user's role in it; 404 for any other team (staff included)."""
    membership = Membership.objects.select_related("team").filter(user=user, team_id=pk).first()
    if membership is None:
        raise Http404("No such team among yours.")
    return membership.team, membership.role


def membership_in_team(team: Team, pk: int) -> Membership:
    membership = Membership.objects.select_related("user").filter(team=team, pk=pk).first()
    if membership is None:
        raise Http404("No such member in this team.")
    return membership


def invitations_for(user: AbstractBaseUser):
    return TeamInvitation.objects.filter(user=user).select_related("team", "invited_by")


def own_invitation(user: AbstractBaseUser, pk: int) -> TeamInvitation:
    invitation = invitations_for(user).filter(pk=pk).first()
    if invitation is None:
        raise Http404("No such invitation.")
    return invitation


def team_rows(user: AbstractBaseUser) -> list[dict]:
    """Each of the user's teams with the user's role, its member count, quota and this month's usage."""
    memberships = (Membership.objects.filter(user=user).select_related("team", "team__quota")
                   .annotate(team_size=Count("team__memberships")).order_by("team__name"))
    return [{"team": m.team, "role": m.role, "quota": getattr(m.team, "quota", None), "members": m.team_size,
             "usage": core_selectors.quota_usage(m.team_id)} for m in memberships]


def team_page(team: Team) -> dict:
    """What the team page shows besides the team itself: members, webhook, its last deliveries."""
    return {"members": list(team.memberships.select_related("user").order_by("user__username")),
            "webhook": TeamWebhook.objects.filter(team=team).first(),
            "deliveries": list(WebhookDelivery.objects.filter(team=team).order_by("-created_at", "-pk")
                               [:RECENT_DELIVERIES])}
