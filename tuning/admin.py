from django.contrib import admin, messages

from core.exceptions import ServiceError

from . import services
from .models import DopRound, Measurement, TuningRun, TuningTask


class TuningTaskInline(admin.TabularInline):
    model = TuningTask
    extra = 0
    can_delete = False
    fields = ["index", "name", "flops", "weight", "trials", "best_latency_s", "status"]
    readonly_fields = fields


@admin.register(TuningRun)
class TuningRunAdmin(admin.ModelAdmin):
    list_display = ["id", "model", "team", "target_kind", "measurement_mode", "status", "trials_done", "max_trials",
                    "wall_seconds", "tuned_latency_s", "created_at"]
    list_filter = ["status", "measurement_mode", "target_kind", "team"]
    search_fields = ["model__name", "team__name"]
    date_hierarchy = "created_at"
    inlines = [TuningTaskInline]
    actions = ["cancel_runs"]
    readonly_fields = [f.name for f in TuningRun._meta.fields]

    def has_add_permission(self, request):
        return False  # runs start through the API, dashboard or `manage.py tune` so quotas apply

    @admin.action(description="Cancel selected runs")
    def cancel_runs(self, request, queryset):
        done = 0
        for run in queryset:
            try:
                services.cancel_run(actor=request.user, run=run)
                done += 1
            except ServiceError as exc:
                self.message_user(request, f"Run {run.pk}: {exc}", level=messages.WARNING)
        self.message_user(request, f"Cancel requested for {done} run(s).")


@admin.register(Measurement)
class MeasurementAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "task", "round_index", "latency_s", "dop", "remeasured_serially", "error"]
    list_filter = ["remeasured_serially"]
    raw_id_fields = ["run", "task"]
    show_full_result_count = False


@admin.register(DopRound)
class DopRoundAdmin(admin.ModelAdmin):
    list_display = ["run", "round_index", "task_index", "dop", "mean_error", "n_candidates", "n_remeasured"]
    raw_id_fields = ["run"]
