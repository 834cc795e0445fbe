"""Teams and members (/teams/): the user's teams with quotas and usage, invitations to answer; on a team's
page its members, and for owners the invitation form, role changes, removals, the team's webhook and its
record-cache setting (publish to / read from the shared tuning-record cache).

Every team URL takes only a team of the user (another team, staff included: 404); writes go through
core.services, whose refusals (a viewer, a non-owner, the last owner) come back as a message."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from core import services as core_services
from core.exceptions import ServiceError
from core.models import Membership

from . import accountdata, webhook_test
from recordcache import selectors as record_cache
from recordcache import services as record_cache_services

from .forms_account import InviteForm, RecordCacheSettingsForm, RoleForm, WebhookForm
from .scope import get_scope, set_current_team


@login_required
def team_list(request):
    return render(request, "frontend/team_list.html", {
        "scope": get_scope(request), "rows": accountdata.team_rows(request.user),
        "invitations": accountdata.invitations_for(request.user), "nav": "teams"})


@never_cache
@login_required
def team_detail(request, pk: int, *, webhook_form=None, secret=None):
    team, role = accountdata.team_of_user(request.user, pk)
    context = accountdata.team_page(team)
    if webhook_form is None:
        webhook_form = WebhookForm(initial={"url": context["webhook"].url if context["webhook"] else ""})
    cache = record_cache.team_settings(team.pk)
    return render(request, "frontend/team_detail.html", {
        "scope": get_scope(request), "team": team, "role": role, "is_owner": role == Membership.Role.OWNER,
        "invite_form": InviteForm(), "role_choices": Membership.Role.choices, "secret": secret,
        "webhook_form": webhook_form, "cache_settings": cache,
        "cache_form": RecordCacheSettingsForm(initial={"publish": cache.publish, "read": cache.read}),
        **context, "nav": "teams"})


def _attempt(request, write, success: str) -> bool:
    """Run a service write; its refusal becomes the page's error message."""
    try:
        write()
    except ServiceError as exc:
        messages.error(request, exc.message)
        return False
    messages.success(request, success)
    return True


@login_required
@require_POST
def team_invite(request, pk: int):
    team, _ = accountdata.team_of_user(request.user, pk)
    form = InviteForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give a user name or e-mail address and a role.")
        return redirect("team-page", pk=team.pk)
    name = form.cleaned_data["username"]
    # the same answer whether the account exists or not (invitations must not reveal who has one)
    _attempt(request, lambda: core_services.invite_member(actor=request.user, team=team, username=name,
                                                          role=form.cleaned_data["role"]),
             f"If '{name}' has an account and is not in {team.name} yet, they are invited as "
             f"{form.cleaned_data['role']}: they accept on their Teams page.")
    return redirect("team-page", pk=team.pk)


@login_required
@require_POST
def team_member(request, pk: int, member_pk: int, action: str):
    """An owner changes a member's role (``role``) or removes them (``remove``)."""
    team, _ = accountdata.team_of_user(request.user, pk)
    membership = accountdata.membership_in_team(team, member_pk)
    name = membership.user.get_username()
    if action == "remove":
        _attempt(request, lambda: core_services.remove_member(actor=request.user, membership=membership),
                 f"{name} was removed from {team.name}.")
    elif action == "role":
        form = RoleForm(request.POST)
        if not form.is_valid():
            messages.error(request, "Choose one of the roles owner, member or viewer.")
        else:
            role = form.cleaned_data["role"]
            _attempt(request, lambda: core_services.change_member_role(actor=request.user, membership=membership,
                                                                       role=role), f"{name} is now {role}.")
    else:
        raise Http404("Unknown action.")
    return redirect("team-page", pk=team.pk)


@login_required
@require_POST
def team_leave(request, pk: int):
    team, _ = accountdata.team_of_user(request.user, pk)
    mine = Membership.objects.get(team=team, user=request.user)
    if not _attempt(request, lambda: core_services.remove_member(actor=request.user, membership=mine),
                    f"You left {team.name}."):
        return redirect("team-page", pk=team.pk)
    if get_scope(request).current == team:
        set_current_team(request, None)
    return redirect("team-list-page")


@login_required
@require_POST
def invitation_answer(request, pk: int, action: str):
    invitation = accountdata.own_invitation(request.user, pk)
    team = invitation.team
    if action == "accept":
        _attempt(request, lambda: core_services.accept_invitation(actor=request.user, invitation=invitation),
                 f"You joined {team.name} as {invitation.role}.")
    elif action == "decline":
        _attempt(request, lambda: core_services.decline_invitation(actor=request.user, invitation=invitation),
                 f"You declined the invitation to {team.name}.")
    else:
        raise Http404("Unknown action.")
    return redirect("team-list-page")


@never_cache
@login_required
@require_POST
def team_webhook(request, pk: int, action: str):
    """Owners set the URL (``set``), rotate the signing secret (``rotate``) or remove the webhook; a new
    secret is shown once, in this answer."""
    team, _ = accountdata.team_of_user(request.user, pk)
    try:
        if action == "set":
            form = WebhookForm(request.POST)
            if not form.is_valid():
                return team_detail(request, pk, webhook_form=form)
            change = core_services.set_team_webhook(actor=request.user, team=team, url=form.cleaned_data["url"])
        elif action == "rotate":
            change = core_services.rotate_webhook_secret(actor=request.user, team=team)
        elif action == "test":
            webhook_test.send_test_delivery(actor=request.user, team=team)
            messages.success(request, "Test notification queued: its answer shows under Last deliveries below "
                                      "(reload in a few seconds).")
            return redirect("team-page", pk=team.pk)
        elif action == "remove":
            core_services.remove_team_webhook(actor=request.user, team=team)
            messages.success(request, "Webhook removed: no more notifications are sent.")
            return redirect("team-page", pk=team.pk)
        else:
            raise Http404("Unknown action.")
    except ServiceError as exc:
        form = WebhookForm(request.POST if action == "set" else None)
        if action == "set" and exc.field == "url":
            form.add_error("url", exc.message)
            return team_detail(request, pk, webhook_form=form)
        messages.error(request, exc.message)
        if action == "test":  # a refused test answers its status (403 not an owner, 429 too soon)
            response = team_detail(request, pk)
            response.status_code = exc.status
            return response
        return redirect("team-page", pk=team.pk)
    if change.secret is None:
        messages.success(request, f"Webhook URL changed to {change.webhook.url}.")
        return redirect("team-page", pk=team.pk)
    return team_detail(request, pk, secret=change.secret)


@login_required
@require_POST
def team_record_cache(request, pk: int):
    """Owners choose whether the team's runs publish to and read from the shared record cache."""
    team, _ = accountdata.team_of_user(request.user, pk)
    form = RecordCacheSettingsForm(request.POST)
    if not form.is_valid():  # two check boxes: only a forged body gets here
        messages.error(request, "The record-cache setting takes two check boxes, publish and read.")
        return redirect("team-page", pk=team.pk)
    publish, read = form.cleaned_data["publish"], form.cleaned_data["read"]
    _attempt(request, lambda: record_cache_services.update_team_settings(actor=request.user, team=team,
                                                                         publish=publish, read=read),
             f"Record cache: {team.name}'s runs {'publish' if publish else 'do not publish'} their records and "
             f"{'read' if read else 'do not read'} the shared cache.")
    return redirect("team-page", pk=team.pk)
