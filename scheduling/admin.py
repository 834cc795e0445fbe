"""Admin console: nodes and GPUs (drain/undrain), telemetry, GPU jobs, placements, profiles (source shown),
predictor versions (activate), trace uploads and simulation runs."""
from __future__ import annotations

from django.contrib import admin, messages

from core.exceptions import ServiceError

from . import services
from .models import (
    GPU,
    GpuJob,
    GpuProfile,
    GpuTelemetry,
    Node,
    Placement,
    PredictorVersion,
    SimulationRun,
    TraceUpload,
)


class GPUInline(admin.TabularInline):
    model = GPU
    extra = 0
    can_delete = False
    fields = ["index", "name", "gpu_model", "memory_total_mb", "queue", "drained", "present"]
    readonly_fields = ["index", "name", "gpu_model", "memory_total_mb", "queue", "present"]


def _drain_action(service, kwarg: str, drained: bool, description: str):
    @admin.action(description=description)
    def act(modeladmin, request, queryset):
        done = 0
        for obj in queryset:
            try:
                service(actor=request.user, drained=drained, **{kwarg: obj})
                done += 1
            except ServiceError as exc:
                modeladmin.message_user(request, f"{obj}: {exc}", level=messages.WARNING)
        modeladmin.message_user(request, f"{'Drained' if drained else 'Undrained'} {done} item(s).")

    act.__name__ = f"{'drain' if drained else 'undrain'}_{kwarg}s"
    return act


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "hostname", "cpu_cores", "memory_mb", "gpu_count", "nvml_available", "drained",
                    "last_seen"]
    list_filter = ["drained", "nvml_available"]
    search_fields = ["name", "hostname"]
    readonly_fields = ["name", "hostname", "cpu_cores", "memory_mb", "queues", "nvml_available", "nvml_error",
                       "driver_version", "registered_at", "last_seen"]
    inlines = [GPUInline]
    actions = [_drain_action(services.set_node_drained, "node", True, "Drain selected nodes"),
               _drain_action(services.set_node_drained, "node", False, "Undrain selected nodes")]

    def has_add_permission(self, request):
        return False  # nodes register themselves from their Celery workers

    @admin.display(description="GPUs")
    def gpu_count(self, node: Node) -> int:
        return node.gpus.count()


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    list_display = ["__str__", "gpu_model", "memory_total_mb", "queue", "drained", "present"]
    list_filter = ["drained", "present", "gpu_model", "node"]
    search_fields = ["name", "uuid", "node__name"]
    readonly_fields = ["node", "index", "uuid", "name", "gpu_model", "memory_total_mb", "power_limit_w", "queue",
                       "present", "created_at"]
    actions = [_drain_action(services.set_gpu_drained, "gpu", True, "Drain selected GPUs"),
               _drain_action(services.set_gpu_drained, "gpu", False, "Undrain selected GPUs")]

    def has_add_permission(self, request):
        return False


@admin.register(GpuTelemetry)
class GpuTelemetryAdmin(admin.ModelAdmin):
    list_display = ["gpu", "ts", "util_pct", "mem_used_mb", "power_w", "temperature_c", "energy_mj"]
    list_filter = ["gpu__node"]
    date_hierarchy = "ts"
    raw_id_fields = ["gpu"]
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class PlacementInline(admin.TabularInline):
    model = Placement
    extra = 0
    can_delete = False
    fields = ["gpu", "queue", "policy", "score", "placed_at", "released_at"]
    readonly_fields = fields


@admin.register(GpuJob)
class GpuJobAdmin(admin.ModelAdmin):
    list_display = ["id", "model", "team", "batch_size", "state", "policy", "predicted_util_pct", "predicted_mem_mb",
                    "measured_util_pct", "created_at"]
    list_filter = ["state", "policy", "runtime", "team"]
    search_fields = ["model__name", "team__name"]
    date_hierarchy = "created_at"
    inlines = [PlacementInline]
    readonly_fields = [f.name for f in GpuJob._meta.fields]
    actions = ["cancel_jobs"]

    def has_add_permission(self, request):
        return False  # submitted through the API so predictions and the GPU-hour quota apply

    @admin.action(description="Cancel selected jobs")
    def cancel_jobs(self, request, queryset):
        done = 0
        for job in queryset:
            try:
                services.cancel_job(actor=request.user, job=job)
                done += 1
            except ServiceError as exc:
                self.message_user(request, f"Job {job.pk}: {exc}", level=messages.WARNING)
        self.message_user(request, f"Cancelled {done} job(s).")


@admin.register(Placement)
class PlacementAdmin(admin.ModelAdmin):
    list_display = ["id", "job", "gpu", "policy", "score", "queue", "placed_at", "released_at"]
    list_filter = ["policy"]
    raw_id_fields = ["job", "gpu"]
    readonly_fields = ["job", "gpu", "policy", "score", "queue", "placed_at", "released_at"]

    def has_add_permission(self, request):
        return False


@admin.register(GpuProfile)
class GpuProfileAdmin(admin.ModelAdmin):
    list_display = ["model_name", "batch_size", "gpu_model", "util_pct", "peak_mem_mb", "power_w", "source",
                    "synthetic"]
    list_filter = ["source", "gpu_model", "model_name"]
    search_fields = ["model_name"]
    readonly_fields = ["created_at"]

    @admin.display(boolean=True, description="Synthetic")
    def synthetic(self, profile: GpuProfile) -> bool:
        return profile.is_synthetic


@admin.register(PredictorVersion)
class PredictorVersionAdmin(admin.ModelAdmin):
    list_display = ["version", "active", "n_records", "util_rmsle_display", "mem_rmsle_display", "trained_at"]
    list_filter = ["active"]
    readonly_fields = ["version", "file", "metrics", "params", "sources", "n_records", "active", "trained_at",
                       "trained_by"]
    actions = ["activate"]

    def has_add_permission(self, request):
        return False  # trained by `manage.py train_predictor` or POST /api/predictors/train/

    @admin.display(description="util RMSLE")
    def util_rmsle_display(self, pv):
        return f"{pv.util_rmsle:.3f}" if pv.util_rmsle is not None else "-"

    @admin.display(description="mem RMSLE")
    def mem_rmsle_display(self, pv):
        return f"{pv.mem_rmsle:.3f}" if pv.mem_rmsle is not None else "-"

    @admin.action(description="Activate the selected version")
    def activate(self, request, queryset):
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one version.", level=messages.WARNING)
            return
        pv = services.activate_predictor(actor=request.user, version=queryset.get())
        self.message_user(request, f"Predictor v{pv.version} is active.")


@admin.register(TraceUpload)
class TraceUploadAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "kind", "n_jobs", "file_size", "created_at"]
    list_filter = ["kind", "team"]
    search_fields = ["name"]
    readonly_fields = ["team", "name", "kind", "file", "file_size", "sha256", "n_jobs", "summary", "created_by",
                       "created_at"]

    def has_add_permission(self, request):
        return False  # uploads go through the API so every row is validated


@admin.register(SimulationRun)
class SimulationRunAdmin(admin.ModelAdmin):
    list_display = ["id", "team", "trace", "policies", "seed", "status", "created_at", "finished_at"]
    list_filter = ["status", "trace", "team"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in SimulationRun._meta.fields]

    def has_add_permission(self, request):
        return False
