"""Admin console: teams, members, quotas (limits beside usage), energy settings, models, tokens."""
from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from . import selectors, services
from .exceptions import ServiceError
from .models import ApiToken, DLModel, EnergySettings, Membership, Quota, Team, TeamInvitation, UsageCharge
from .onnx_models.errors import OnnxValidationError

admin.site.site_header = "dlopt administration"
admin.site.site_title = "dlopt admin"


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class QuotaInline(admin.StackedInline):
    model = Quota
    can_delete = False


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "member_count", "model_count", "grid_intensity_g_per_kwh", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [QuotaInline, MembershipInline]

    # Only staff reach the admin, and teams are created only by staff (each team gets its own quotas).
    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        Quota.objects.get_or_create(team=form.instance)  # an untouched quota inline saves nothing

    @admin.display(description="Members")
    def member_count(self, team: Team) -> int:
        return team.memberships.count()

    @admin.display(description="Models")
    def model_count(self, team: Team) -> int:
        return team.models.count()


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role", "created_at"]
    list_filter = ["role", "team"]
    list_editable = ["role"]
    search_fields = ["user__username", "team__name"]
    autocomplete_fields = ["user", "team"]


@admin.register(TeamInvitation)
class TeamInvitationAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role", "invited_by", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__username", "team__name"]
    autocomplete_fields = ["user", "team", "invited_by"]


def _usage_cell(used: float, limit: float, unit: str = "") -> str:
    share = (used / limit) if limit else (1.0 if used else 0.0)
    colour = "#b00" if share >= 1 else ("#c80" if share >= 0.8 else "#070")
    return format_html('<span style="color:{}">{} / {}{} ({}%)</span>', colour,
                       f"{used:g}", f"{limit:g}", unit, f"{share * 100:.0f}")


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    list_display = [
        "team", "max_concurrent_runs", "runs_now", "tuning_trials_per_month", "trials_used",
        "gpu_hours_per_month", "gpu_hours_used", "energy_kwh_per_month", "energy_used",
        "max_concurrent_simulations", "simulations_now", "max_simulation_job_gpus", "max_simulation_units",
        "updated_at",
    ]
    list_editable = ["max_concurrent_runs", "tuning_trials_per_month", "gpu_hours_per_month", "energy_kwh_per_month",
                     "max_concurrent_simulations", "max_simulation_job_gpus", "max_simulation_units"]
    search_fields = ["team__name"]
    readonly_fields = ["usage_summary"]

    def get_queryset(self, request):
        self._usage_cache = {}
        return super().get_queryset(request).select_related("team")

    def _usage(self, quota: Quota) -> selectors.QuotaUsage:
        cache = getattr(self, "_usage_cache", {})
        if quota.team_id not in cache:
            cache[quota.team_id] = selectors.quota_usage(quota.team_id)
        return cache[quota.team_id]

    @admin.display(description="Runs now")
    def runs_now(self, quota):
        return _usage_cell(self._usage(quota).concurrent_runs, quota.max_concurrent_runs)

    @admin.display(description="Trials used")
    def trials_used(self, quota):
        return _usage_cell(self._usage(quota).tuning_trials_this_month, quota.tuning_trials_per_month)

    @admin.display(description="GPU-h used")
    def gpu_hours_used(self, quota):
        return _usage_cell(round(self._usage(quota).gpu_hours_this_month, 2), quota.gpu_hours_per_month, " h")

    @admin.display(description="Energy used")
    def energy_used(self, quota):
        return _usage_cell(round(self._usage(quota).energy_kwh_this_month, 3), quota.energy_kwh_per_month, " kWh")

    @admin.display(description="Simulations now")
    def simulations_now(self, quota):
        return _usage_cell(self._usage(quota).concurrent_simulations, quota.max_concurrent_simulations)

    @admin.display(description="Usage this month")
    def usage_summary(self, quota):
        return self._usage(quota).as_dict() if quota.pk else "-"


@admin.register(EnergySettings)
class EnergySettingsAdmin(admin.ModelAdmin):
    """One row: the list page opens it (created from the ENERGY_* defaults the first time)."""

    fields = ["cpu_watts_per_core", "gpu_board_watts", "grid_intensity_g_per_kwh", "joules_per_trial_estimate",
              "updated_at", "updated_by"]
    readonly_fields = ["updated_at", "updated_by"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_or_change_permission(request):
            return super().changelist_view(request, extra_context)
        row = services.ensure_energy_settings()
        return redirect(reverse("admin:core_energysettings_change", args=[row.pk]))

    def save_model(self, request, obj, form, change):
        # Through the service: staff-only, validated, and who changed it is recorded.
        saved = services.update_energy_settings(
            actor=request.user, **{name: form.cleaned_data[name] for name in form.changed_data})
        obj.updated_by, obj.updated_at = saved.updated_by, saved.updated_at
        self.message_user(request, "Energy settings saved: new tuning runs use them; finished runs keep the "
                                   "values they were measured or modeled with.", messages.SUCCESS)


class DLModelAdminForm(forms.ModelForm):
    upload = forms.FileField(required=False, help_text="An .onnx file; it is validated before anything is stored.")

    class Meta:
        model = DLModel
        fields = ["team", "name", "description"]


@admin.register(DLModel)
class DLModelAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "source", "gflops_display", "param_count", "num_tuning_tasks", "opset",
                    "created_at", "archived_at"]
    list_filter = ["source", "team", "opset", ("archived_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "description", "team__name"]
    readonly_fields = [
        "source", "file", "file_size", "sha256", "opset", "ir_version", "producer", "inputs", "outputs",
        "batch_size", "total_flops", "param_count", "activation_bytes", "conv_count", "linear_count",
        "activation_count", "other_count", "op_histogram", "num_tuning_tasks", "tuning_task_names",
        "created_by", "created_at", "archived_at",
    ]

    # Staff may delete a model for good here (teams archive theirs); its usage charges stay in the ledger.
    def delete_model(self, request, obj):
        services.delete_model(actor=request.user, model=obj)

    def delete_queryset(self, request, queryset):
        for obj in queryset:
            services.delete_model(actor=request.user, model=obj)

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = DLModelAdminForm
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["team", "name", "description", "upload"]
        return ["team", "name", "description", *self.readonly_fields]

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly_fields

    @admin.display(description="GFLOPs", ordering="total_flops")
    def gflops_display(self, obj):
        return f"{obj.gflops:.3f}"

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["name", "description", "team"])
            return
        upload = form.cleaned_data.get("upload")
        if not upload:
            raise forms.ValidationError("Choose an .onnx file to upload.")
        data = services.read_upload(upload)
        model = services.register_model(
            team=form.cleaned_data["team"], name=form.cleaned_data["name"],
            description=form.cleaned_data.get("description", ""), data=data, filename=upload.name,
            actor=request.user,
        )
        obj.pk = model.pk

    def add_view(self, request, form_url="", extra_context=None):
        try:
            return super().add_view(request, form_url, extra_context)
        except (OnnxValidationError, ServiceError) as exc:
            self.message_user(request, f"Upload refused: {exc}", level=messages.ERROR)
            from django.http import HttpResponseRedirect

            return HttpResponseRedirect(request.path)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__username", "prefix"]
    readonly_fields = ["user", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # keys are issued through the API so the key is shown once to its owner

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        n = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {n} token(s).")


@admin.register(UsageCharge)
class UsageChargeAdmin(admin.ModelAdmin):
    """The usage ledger, read-only: a charge is never edited nor deleted, not even by staff."""

    list_display = ["created_at", "team", "kind", "amount", "source", "meter", "label"]
    list_filter = ["kind", "source", "team"]
    search_fields = ["label", "team__name", "idempotency_key"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
