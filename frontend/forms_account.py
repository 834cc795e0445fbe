"""Forms of the token and team pages. They only validate input; views hand it to core.services."""
from __future__ import annotations

from django import forms
from django.contrib.auth.forms import AuthenticationForm

from core.login_guard import GuardedLoginFormMixin
from core.models import ApiToken, Membership


class GuardedAuthenticationForm(GuardedLoginFormMixin, AuthenticationForm):
    """The login form, refusing attempts over the per-address rate or for a locked user name."""


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=ApiToken._meta.get_field("name").max_length,
                           help_text="What the token is for, e.g. 'CI' or 'laptop'.")
    password = forms.CharField(label="Your password", strip=False,
                               widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}),
                               help_text="Typed again: a token acts as you until it is revoked.")


class InviteForm(forms.Form):
    username = forms.CharField(label="User name or e-mail", max_length=254)
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Membership.Role.choices)


class WebhookForm(forms.Form):
    url = forms.CharField(label="Webhook URL", max_length=500,
                          widget=forms.URLInput(attrs={"size": 60, "placeholder": "https://hooks.example.com/dlopt"}),
                          help_text="An https:// URL on a public host, e.g. https://hooks.example.com/dlopt "
                                    "(addresses on this machine or a private network, such as 127.0.0.1 or "
                                    "10.x, are refused). Called when a tuning run or GPU job of the team ends, "
                                    "with a JSON body signed with HMAC-SHA256.")


class RecordCacheSettingsForm(forms.Form):
    """The team's record-cache setting (unchecked boxes are not posted: absent = off)."""

    publish = forms.BooleanField(required=False, label="Publish this team's tuning records to the shared cache",
                                 help_text="Off unless you opt in. Records reveal your models' tensor shapes to "
                                           "the platform's other teams' runs (as schedules, never as models, run "
                                           "ids or team names); turning it off withdraws them.")
    read = forms.BooleanField(required=False, label="Seed this team's runs from the shared cache",
                              help_text="Cached records are re-timed on the run's host before any is trusted.")


class RecordImportForm(forms.Form):
    workloads = forms.FileField(label="database_workload.json")
    records = forms.FileField(label="database_tuning_record.json")
