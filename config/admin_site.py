"""The admin site: Django's, with its sign-in limited like the dashboard's (core.login_guard: per client
address and per account, a 429 with Retry-After when refused), and its password change counted against
the same per-account lockout (it checks the current password: a stolen staff session must not be able to
guess it there without limit)."""
from __future__ import annotations

from django.contrib.admin import AdminSite
from django.contrib.admin.forms import AdminAuthenticationForm, AdminPasswordChangeForm
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils.decorators import method_decorator
from django.views.decorators.cache import never_cache

from core import login_guard


class GuardedAdminAuthenticationForm(login_guard.GuardedLoginFormMixin, AdminAuthenticationForm):
    pass


class GuardedAdminPasswordChangeForm(AdminPasswordChangeForm):
    """The current password is checked only while the account is not locked, and a wrong one counts as a
    failed sign-in (core.login_guard.record_failure)."""

    refusal: login_guard.Refusal | None = None

    def clean_old_password(self):
        name = self.user.get_username()
        locked = login_guard.account_locked_for(name)
        if locked:
            self.refusal = login_guard.Refusal(login_guard.REFUSAL_MESSAGE, locked)
            raise ValidationError(login_guard.REFUSAL_MESSAGE, code=login_guard.REFUSAL_CODE)
        try:
            return super().clean_old_password()
        except ValidationError:
            login_guard.record_failure(name)
            raise


class PlatformAdminSite(AdminSite):
    login_form = GuardedAdminAuthenticationForm

    @method_decorator(never_cache)
    @method_decorator(login_not_required)
    def login(self, request, extra_context=None):
        return login_guard.refused_status(super().login(request, extra_context))

    def password_change(self, request, extra_context=None):
        """Django's view (AdminSite.password_change) with the guarded form."""
        from django.contrib.auth.views import PasswordChangeView

        defaults = {
            "form_class": GuardedAdminPasswordChangeForm,
            "success_url": reverse("admin:password_change_done", current_app=self.name),
            "extra_context": {**self.each_context(request), **(extra_context or {})},
        }
        if self.password_change_template is not None:
            defaults["template_name"] = self.password_change_template
        request.current_app = self.name
        return login_guard.refused_status(PasswordChangeView.as_view(**defaults)(request))
