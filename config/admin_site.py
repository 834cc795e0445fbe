"""The admin site: Django's, with its sign-in limited like the dashboard's (core.login_guard: per client
address and per account, a 429 with Retry-After when refused)."""
from __future__ import annotations

from django.contrib.admin import AdminSite
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.decorators import login_not_required
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache

from core import login_guard


class GuardedAdminAuthenticationForm(login_guard.GuardedLoginFormMixin, AdminAuthenticationForm):
    pass


class PlatformAdminSite(AdminSite):
    login_form = GuardedAdminAuthenticationForm

    @method_decorator(never_cache)
    @method_decorator(login_not_required)
    def login(self, request, extra_context=None):
        return login_guard.refused_status(super().login(request, extra_context))
