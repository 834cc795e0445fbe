"""Account settings: the user's API tokens (/settings/tokens/). A new key is shown once, in the answer
to the POST that made it (never stored in the session, never cacheable); only its hash is kept."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from core import services as core_services
from core.api.throttles import TokenCreateThrottle
from core.exceptions import ServiceError, TooManyAttempts

from . import accountdata
from .forms_account import TokenCreateForm
from .scope import get_scope


@never_cache
@login_required
def tokens(request):
    form = TokenCreateForm(request.POST or None)
    issued, status = None, 200
    if request.method == "POST":
        if not TokenCreateThrottle().allow_request(request, None):  # also bounds password guessing
            form.add_error(None, "Too many tokens created (or wrong passwords) in the last hour; try again later.")
            status = 429
        elif form.is_valid():
            try:
                issued = core_services.create_api_token_confirmed(
                    user=request.user, name=form.cleaned_data["name"], password=form.cleaned_data["password"])
            except ServiceError as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
                status = 429 if isinstance(exc, TooManyAttempts) else status
            else:
                form = TokenCreateForm()
    return render(request, "frontend/settings_tokens.html", {
        "scope": get_scope(request), "form": form, "issued": issued, "tokens": accountdata.tokens_of(request.user),
        "nav": "settings"}, status=status)


@login_required
@require_POST
def token_revoke(request, pk: int):
    token = accountdata.own_token(request.user, pk)  # another user's token: 404, as for none
    core_services.revoke_api_token(user=request.user, token=token)
    messages.success(request, f"Token '{token.name}' ({token.prefix}…) revoked: it no longer authenticates.")
    return redirect("settings-tokens")
