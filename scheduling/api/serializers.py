from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core import selectors as core_selectors
from core.api.serializers import TeamScopedPrimaryKeyField
from core.api.strict import RejectUnknownFieldsMixin
from core.models import DLModel
from scheduling.adapters import EXPERIMENT_PARAMETERS, POLICY_NAMES, SIMULATION_SECONDS_PER_UNIT
from scheduling.models import (
    GPU,
    GPU_JOB_LIMITS,
    GpuJob,
    GpuProfile,
    GpuTelemetry,
    Node,
    Placement,
    PredictorVersion,
    SimulationRun,
    TraceUpload,
)

SYNTHETIC_NOTE = ("Synthetic: no GPU measured this (seeded roofline model of a training step, "
                  "scheduling/horus/profiles.py). Run `manage.py profile_gpu` on a GPU worker for real records.")


class NodeSerializer(serializers.ModelSerializer):
    gpu_count = serializers.IntegerField(read_only=True)
    gpu_note = serializers.SerializerMethodField(help_text="Why the node has no GPUs, when it has none.")

    class Meta:
        model = Node
        fields = ["id", "name", "hostname", "cpu_cores", "cpu_mcpu", "cpu_triple", "cpu_llc_bytes", "memory_mb", "queues",
                  "nvml_available", "nvml_error", "driver_version", "drained", "gpu_count", "gpu_note",
                  "registered_at", "last_seen"]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_gpu_note(self, node: Node) -> str | None:
        if node.nvml_available:
            return None
        return f"no NVIDIA GPU found (pynvml: {node.nvml_error or 'unknown'})"


class GPUSerializer(serializers.ModelSerializer):
    node_name = serializers.CharField(source="node.name", read_only=True)
    served = serializers.SerializerMethodField(help_text="A worker of the node consumes this GPU's queue.")
    latest_util_pct = serializers.FloatField(read_only=True, allow_null=True)
    latest_mem_used_mb = serializers.FloatField(read_only=True, allow_null=True)
    latest_ts = serializers.DateTimeField(read_only=True, allow_null=True)
    active_jobs = serializers.IntegerField(read_only=True)

    class Meta:
        model = GPU
        fields = ["id", "node", "node_name", "index", "uuid", "name", "gpu_model", "memory_total_mb", "power_limit_w",
                  "queue", "served", "drained", "present", "active_jobs", "latest_util_pct", "latest_mem_used_mb",
                  "latest_ts", "created_at"]
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_served(self, gpu: GPU) -> bool:
        return gpu.queue in (gpu.node.queues or [])


class GpuTelemetrySerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="gpu.node.name", read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)

    class Meta:
        model = GpuTelemetry
        fields = ["id", "gpu", "node", "gpu_index", "ts", "util_pct", "mem_used_mb", "mem_total_mb", "power_w",
                  "temperature_c", "energy_mj"]
        read_only_fields = fields


class GpuProfileSerializer(serializers.ModelSerializer):
    synthetic = serializers.BooleanField(source="is_synthetic", read_only=True)
    note = serializers.SerializerMethodField()

    class Meta:
        model = GpuProfile
        fields = ["id", "model_name", "dl_model", "batch_size", "gpu_model", "util_pct", "peak_mem_mb", "power_w",
                  "source", "synthetic", "note", "features", "meta", "created_at"]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_note(self, profile: GpuProfile) -> str | None:
        return SYNTHETIC_NOTE if profile.is_synthetic else None


class PredictorVersionSerializer(serializers.ModelSerializer):
    util_rmsle = serializers.FloatField(read_only=True, allow_null=True)
    mem_rmsle = serializers.FloatField(read_only=True, allow_null=True)

    class Meta:
        model = PredictorVersion
        fields = ["id", "version", "active", "n_records", "sources", "util_rmsle", "mem_rmsle", "metrics", "params",
                  "trained_at"]
        read_only_fields = fields


class TrainPredictorSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    k_folds = serializers.IntegerField(min_value=2, max_value=20, default=5)
    seed = serializers.IntegerField(min_value=0, max_value=2**31 - 1, default=0)
    activate = serializers.BooleanField(default=True)


class PredictorTrainingSerializer(serializers.Serializer):
    """A requested predictor training (scheduling.selectors.PredictorTraining), polled at ``url``: output only."""

    task_id = serializers.CharField(read_only=True)
    state = serializers.ChoiceField(choices=["queued", "running", "succeeded", "failed"], read_only=True)
    version = serializers.IntegerField(allow_null=True, read_only=True, help_text="The trained version, once succeeded.")
    error = serializers.CharField(allow_blank=True, read_only=True)
    requested_at = serializers.DateTimeField(read_only=True)
    finished_at = serializers.DateTimeField(allow_null=True, read_only=True)
    url = serializers.SerializerMethodField()

    def get_url(self, training) -> str:
        from django.urls import reverse

        return reverse("predictorversion-training", kwargs={"task_id": training.task_id})


@extend_schema_field(OpenApiTypes.INT)
class TeamModelField(serializers.PrimaryKeyRelatedField):
    def get_queryset(self):
        request = self.context.get("request")
        if request is None:
            return DLModel.objects.none()
        return core_selectors.models_for_user(request.user)


class PlacementSerializer(serializers.ModelSerializer):
    node = serializers.CharField(source="gpu.node.name", read_only=True)
    gpu_index = serializers.IntegerField(source="gpu.index", read_only=True)
    active = serializers.BooleanField(source="is_active", read_only=True)

    class Meta:
        model = Placement
        fields = ["id", "job", "gpu", "gang_gpu_ids", "node", "gpu_index", "queue", "policy", "score", "placed_at",
                  "released_at",
                  "active"]
        read_only_fields = fields


class GpuJobSerializer(serializers.ModelSerializer):
    model_name = serializers.CharField(source="model.name", read_only=True)
    predictor = serializers.IntegerField(source="predictor_version.version", read_only=True, allow_null=True)
    placement = serializers.SerializerMethodField(help_text="The active placement, if any.")

    class Meta:
        model = GpuJob
        fields = ["id", "team", "model", "model_name", "kind", "optimizer", "learning_rate", "batch_size", "num_gpus", "runtime",
                  "iterations", "duration_estimate_s",
                  "predicted_util_pct", "predicted_mem_mb", "predicted_for_gpu_model", "predictor", "state",
                  "policy", "placement", "error", "worker", "measured_util_pct", "measured_mem_mb", "result",
                  "replacements", "created_at", "placed_at", "started_at", "finished_at"]
        read_only_fields = fields

    @extend_schema_field(PlacementSerializer(allow_null=True))
    def get_placement(self, job: GpuJob) -> dict | None:
        active = [p for p in job.placements.all() if p.released_at is None]
        return PlacementSerializer(active[0]).data if active else None


class GpuJobCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    model = TeamModelField(help_text="A model of one of your teams.")
    batch_size = serializers.IntegerField(min_value=GPU_JOB_LIMITS["batch_size"][0],
                                          max_value=GPU_JOB_LIMITS["batch_size"][1])
    iterations = serializers.IntegerField(min_value=GPU_JOB_LIMITS["iterations"][0],
                                          max_value=GPU_JOB_LIMITS["iterations"][1], default=100)
    # The maximum is checked by the service: SCHEDULING_MAX_JOB_DURATION_S (24 h by default) lowers it.
    duration_estimate_s = serializers.FloatField(
        min_value=GPU_JOB_LIMITS["duration_estimate_s"][0], required=False,
        help_text="GPU time reserved against the monthly GPU-hour quota (default SCHEDULING_DEFAULT_JOB_ESTIMATE_S, "
        "600 s; at most SCHEDULING_MAX_JOB_DURATION_S, 24 h). The job is stopped, and fails, when it has run "
        "this long (counted from its start on the GPU worker, model loading included).")
    runtime = serializers.ChoiceField(choices=GpuJob.Runtime.choices, default=GpuJob.Runtime.AUTO)
    num_gpus = serializers.IntegerField(
        min_value=GPU_JOB_LIMITS["num_gpus"][0], max_value=GPU_JOB_LIMITS["num_gpus"][1], default=1,
        help_text="GPUs of one node the job runs on, data-parallel (one replica at batch_size each), placed "
        "together or not at all; it reserves num_gpus x duration_estimate_s of the GPU-hour quota.")
    kind = serializers.ChoiceField(
        choices=GpuJob.Kind.choices, default=GpuJob.Kind.INFERENCE,
        help_text="inference: `iterations` timed inferences; train: `iterations` training steps (forward, backward, "
        "optimizer update; TVM Relax training on a fixed synthetic batch, runtime auto or tvm).")
    optimizer = serializers.ChoiceField(choices=GpuJob.Optimizer.choices, default=GpuJob.Optimizer.ADAM,
                                        help_text="The optimizer of a training job.")
    learning_rate = serializers.FloatField(
        min_value=GPU_JOB_LIMITS["learning_rate"][0], max_value=GPU_JOB_LIMITS["learning_rate"][1], required=False,
        allow_null=True, help_text="The training job's learning rate (default: the optimizer's, 1e-4).")


class PlaceSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    policy = serializers.ChoiceField(choices=sorted(POLICY_NAMES), required=False,
                                     help_text="Default: SCHEDULING_POLICY (horus).")


class TraceUploadSerializer(serializers.ModelSerializer):
    class Meta:
        model = TraceUpload
        fields = ["id", "team", "name", "kind", "file_size", "sha256", "n_jobs", "summary", "created_at"]
        read_only_fields = fields


class TraceUploadCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    team = TeamScopedPrimaryKeyField(help_text="A team you are an owner or member of.")
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    file = serializers.FileField(help_text="CSV (or .csv.gz): Philly jobs (timestamp,duration,num_gpus) or an "
                                 "Alibaba pod list (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,creation_time,"
                                 "deletion_time]).")


class SimulationRunSerializer(serializers.ModelSerializer):
    # A plain string in the schema: an enum named "status" would collide with the tuning runs' one.
    status = serializers.CharField(read_only=True, help_text="queued, running, succeeded, failed or cancelled.")
    trace_upload_name = serializers.CharField(source="trace_upload.name", read_only=True, allow_null=True)
    table = serializers.SerializerMethodField(help_text="One summary row per policy (when succeeded).")
    cost_units = serializers.IntegerField(read_only=True, help_text="Estimated cost in simulation units, checked "
                                          "against the team's max_simulation_units.")
    estimated_worker_s = serializers.SerializerMethodField(help_text="The estimate in simulation-worker seconds.")
    waiting_in_fair_queue = serializers.SerializerMethodField(
        help_text="Queued but not yet sent to the worker: the team already has one simulation there.")
    cancel_requested = serializers.SerializerMethodField(help_text="A cancel was asked for (a running one stops at "
                                                         "its next check).")

    class Meta:
        model = SimulationRun
        fields = ["id", "team", "trace", "trace_upload", "trace_upload_name", "policies", "seed", "parameters",
                  "status", "error", "table", "cost_units", "estimated_worker_s", "waiting_in_fair_queue",
                  "cancel_requested", "created_at", "started_at", "finished_at"]
        read_only_fields = fields

    def get_estimated_worker_s(self, run: SimulationRun) -> float:
        return round(run.cost_units * SIMULATION_SECONDS_PER_UNIT, 1)

    def get_waiting_in_fair_queue(self, run: SimulationRun) -> bool:
        return run.status == SimulationRun.Status.QUEUED and run.dispatched_at is None

    def get_cancel_requested(self, run: SimulationRun) -> bool:
        return run.cancel_requested_at is not None

    @extend_schema_field(serializers.ListField(child=serializers.DictField()))
    def get_table(self, run: SimulationRun) -> list:
        return (run.results or {}).get("table", [])


class SimulationRunDetailSerializer(SimulationRunSerializer):
    class Meta(SimulationRunSerializer.Meta):
        fields = SimulationRunSerializer.Meta.fields + ["results"]
        read_only_fields = fields


class SimulationParametersSerializer(serializers.Serializer):
    """Documented shape of `parameters` (every key optional). Open: SimulationCreateSerializer refuses a key
    that is no experiment parameter and passes the ones not listed here to the service."""

    method = serializers.ChoiceField(choices=["replay", "fill"], required=False,
                                     help_text="Default: replay for Philly, fill (ATC'23) for Alibaba pods.")
    jobs = serializers.IntegerField(required=False, help_text="Replay: jobs in the slice (default 1000).")
    start = serializers.IntegerField(required=False, help_text="Replay: index of the slice's first job.")
    gpus = serializers.IntegerField(required=False, help_text="Philly-style traces: cluster GPUs (default 64).")
    gpus_per_node = serializers.IntegerField(required=False)
    gpu_model = serializers.CharField(required=False, help_text="Cluster GPU model / profile table (V100).")
    scale = serializers.FloatField(required=False, help_text="Alibaba: fraction of its 1,213 GPU nodes (0.05).")
    compress = serializers.FloatField(required=False, help_text="Divide inter-arrival times by this.")
    max_duration_s = serializers.FloatField(required=False)
    backfill = serializers.IntegerField(required=False)
    predictor_error = serializers.FloatField(required=False, help_text="Extra log-normal sigma on predictions.")
    predictions = serializers.ChoiceField(choices=["predictor", "oracle"], required=False)
    until = serializers.FloatField(required=False, help_text="Fill: stop at this share of capacity requested.")


class SimulationCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    team = TeamScopedPrimaryKeyField(help_text="A team you are an owner or member of.")
    trace = serializers.CharField(help_text="'philly', 'alibaba' or the id of a trace your team uploaded.")
    policies = serializers.ListField(child=serializers.CharField(), required=False, default=["all"],
                                     help_text=f"Policy names or ['all']: {', '.join(POLICY_NAMES)}.")
    seed = serializers.IntegerField(min_value=0, max_value=2**31 - 1, default=0)
    parameters = SimulationParametersSerializer(required=False, default=dict)

    def validate_parameters(self, value):
        known = set(EXPERIMENT_PARAMETERS)
        extra = set(self.initial_data.get("parameters") or {}) - known if isinstance(
            self.initial_data.get("parameters"), dict) else set()
        if extra:
            raise serializers.ValidationError(f"Unknown parameter(s): {', '.join(sorted(extra))}.")
        # every experiment parameter is accepted, documented above or not: the ones the shape does not
        # list pass to the service as sent (it validates them all), instead of being dropped unseen
        raw = self.initial_data.get("parameters")
        return {**raw, **value} if isinstance(raw, dict) else value


class SimulationEstimateSerializer(serializers.Serializer):
    """A simulation request's estimated cost against the team's limits (nothing is stored)."""

    units = serializers.IntegerField(help_text="Simulation units of the request (all its seeds).")
    units_per_simulation = serializers.IntegerField()
    seconds = serializers.FloatField(help_text="The estimate in simulation-worker seconds.")
    seeds = serializers.IntegerField()
    jobs = serializers.IntegerField()
    gpus = serializers.IntegerField()
    decisions = serializers.IntegerField(help_text="Placement decisions per policy (replay: jobs; fill: pod cap).")
    per_policy = serializers.DictField(child=serializers.IntegerField())
    limit_units = serializers.IntegerField(help_text="The team's max_simulation_units (per simulation).")
    job_gpus = serializers.IntegerField()
    limit_job_gpus = serializers.IntegerField()
    within_limit = serializers.BooleanField()
