"""The GPU cluster and its jobs: nodes, GPUs, telemetry, GPU jobs, placements,
profiles, predictor versions, trace uploads and simulation runs.

State lives here; the Django-free algorithms (predictor, policies, simulator)
live in ``scheduling.horus`` and are driven by ``scheduling.services``.
"""
from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from core.models import DLModel, Team


class Node(models.Model):
    """A worker machine. Registered by its Celery worker (on start and at every heartbeat)."""

    name = models.CharField(max_length=100, unique=True, help_text="DLOPT_NODE_NAME of the worker (queue prefix).")
    hostname = models.CharField(max_length=255, blank=True)
    cpu_cores = models.PositiveIntegerField(default=0)
    cpu_mcpu = models.CharField(max_length=100, blank=True,
                                help_text="The node's CPU as LLVM names it (e.g. znver3): remote runs build for it.")
    cpu_triple = models.CharField(max_length=100, blank=True, help_text="The node's LLVM target triple.")
    cpu_llc_bytes = models.PositiveBigIntegerField(
        null=True, blank=True,
        help_text="The node's last-level CPU cache as one core sees it, in bytes (sysfs); empty where unknown.")
    memory_mb = models.PositiveBigIntegerField(default=0, help_text="Host RAM in MB.")
    queues = models.JSONField(default=list, blank=True,
                              help_text="Celery queues this node's workers serve, e.g. measure.<node>.gpu0.")
    nvml_available = models.BooleanField(default=False)
    nvml_error = models.TextField(blank=True, help_text="Why no GPU was found (pynvml's error), if none was.")
    driver_version = models.CharField(max_length=50, blank=True)
    drained = models.BooleanField(default=False, help_text="A drained node gets no new placements.")
    registered_at = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def cpu_queue(self) -> str:
        return f"measure.{self.name.replace('.', '-')}.cpu"


def gpu_queue_name(node_name: str, index: int) -> str:
    return f"measure.{node_name.replace('.', '-')}.gpu{int(index)}"


class GPU(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField(help_text="NVML device index on its node.")
    uuid = models.CharField(max_length=100, blank=True, db_index=True)
    name = models.CharField(max_length=100, help_text="NVML device name, e.g. 'NVIDIA H200'.")
    gpu_model = models.CharField(max_length=50, help_text="Normalized model the predictor knows (V100, T4, ...).")
    memory_total_mb = models.FloatField(validators=[MinValueValidator(0.0)])
    power_limit_w = models.FloatField(null=True, blank=True)
    queue = models.CharField(max_length=200, help_text="Celery queue of this GPU: measure.<node>.gpu<index>.")
    drained = models.BooleanField(default=False)
    present = models.BooleanField(default=True, help_text="False when the last heartbeat no longer saw it.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node__name", "index"]
        verbose_name = "GPU"
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="unique_gpu_index_per_node")]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index} ({self.name})"


class GpuTelemetry(models.Model):
    """One NVML sample of one GPU (a heartbeat)."""

    gpu = models.ForeignKey(GPU, on_delete=models.CASCADE, related_name="telemetry")
    ts = models.DateTimeField()
    util_pct = models.FloatField()
    mem_used_mb = models.FloatField()
    mem_total_mb = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    energy_mj = models.FloatField(null=True, blank=True,
                                  help_text="NVML total energy counter since driver load (mJ), where supported.")

    class Meta:
        ordering = ["-ts"]
        verbose_name = "GPU telemetry sample"
        indexes = [models.Index(fields=["gpu", "ts"], name="gputelemetry_gpu_ts"),
                   models.Index(fields=["ts"], name="gputelemetry_ts")]

    def __str__(self) -> str:
        return f"{self.gpu} @ {self.ts:%Y-%m-%d %H:%M:%S}: {self.util_pct:.0f}%"


class PredictorVersion(models.Model):
    """A trained Horus utilization/memory predictor (XGBoost), with its k-fold error."""

    version = models.PositiveIntegerField(unique=True)
    file = models.FileField(upload_to="predictors/", max_length=255)
    metrics = models.JSONField(default=dict, help_text="k-fold RMSLE / MAE of utilization and memory.")
    params = models.JSONField(default=dict, blank=True)
    sources = models.JSONField(default=list, blank=True, help_text="Profile sources it was trained on.")
    n_records = models.PositiveIntegerField()
    active = models.BooleanField(default=False)
    trained_at = models.DateTimeField(auto_now_add=True)
    trained_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["-version"]
        constraints = [
            models.UniqueConstraint(fields=["active"], condition=Q(active=True), name="one_active_predictor"),
        ]

    def __str__(self) -> str:
        return f"predictor v{self.version}{' (active)' if self.active else ''}"

    @property
    def util_rmsle(self) -> float | None:
        return (self.metrics.get("util") or {}).get("rmsle")

    @property
    def mem_rmsle(self) -> float | None:
        return (self.metrics.get("mem") or {}).get("rmsle")


class GpuProfile(models.Model):
    """What a model at a batch size used on a GPU model: measured by `profile_gpu`, or the synthetic seed set."""

    SYNTHETIC_PREFIX = "synthetic"
    #: the source of a finished team job's own figures (services.replacement.record_measured_profile)
    MEASURED_JOB_SOURCE = "measured:job"

    model_name = models.CharField(max_length=100, db_index=True)
    dl_model = models.ForeignKey(DLModel, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    batch_size = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    gpu_model = models.CharField(max_length=50, db_index=True)
    features = models.JSONField(help_text="Graph features at this batch size (predictor inputs).")
    util_pct = models.FloatField(validators=[MinValueValidator(0.0), MaxValueValidator(100.0)])
    peak_mem_mb = models.FloatField(validators=[MinValueValidator(0.0)])
    power_w = models.FloatField(null=True, blank=True)
    source = models.CharField(max_length=100, db_index=True,
                              help_text="Where the numbers come from: 'synthetic-roofline-v1' or 'profile_gpu:<gpu>'.")
    meta = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["model_name", "gpu_model", "batch_size"]
        verbose_name = "GPU profile"
        constraints = [
            models.UniqueConstraint(fields=["model_name", "batch_size", "gpu_model", "source"],
                                    name="unique_profile_per_config_and_source"),
        ]

    def __str__(self) -> str:
        return f"{self.model_name} bs{self.batch_size} on {self.gpu_model} ({self.source})"

    @property
    def is_synthetic(self) -> bool:
        return self.source.startswith(self.SYNTHETIC_PREFIX)


# A job's or a simulation's error text (a TextField) keeps at most this much: an exception's message can be huge.
ERROR_TEXT_MAX_CHARS = 5000

# (min, max) of what a GPU job may ask for: the API and the service check these. The declared duration's
# maximum is lowered by the SCHEDULING_MAX_JOB_DURATION_S setting (scheduling.services.jobs.gpu_job_limits).
GPU_JOB_LIMITS = {
    "batch_size": (1, 4096),
    "iterations": (1, 10_000_000),
    "duration_estimate_s": (1.0, 30 * 24 * 3600.0),
    "num_gpus": (1, 8),
    "learning_rate": (1e-7, 1.0),
}


class GpuJob(models.Model):
    """A job that runs a registered model on its GPUs (one, or a gang of one node), placed by a policy:
    an inference loop or a training step loop (``kind``)."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        PLACED = "placed", "Placed"
        RUNNING = "running", "Running"
        FINISHED = "finished", "Finished"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    ACTIVE = (State.PENDING, State.PLACED, State.RUNNING)
    TERMINAL = (State.FINISHED, State.FAILED, State.CANCELLED)

    class Kind(models.TextChoices):
        INFERENCE = "inference", "Inference loop"
        TRAIN = "train", "Training step loop (TVM Relax training, synthetic batch)"

    class Optimizer(models.TextChoices):
        ADAM = "adam", "Adam"
        SGD = "sgd", "SGD"

    class Runtime(models.TextChoices):
        AUTO = "auto", "Auto (onnxruntime CUDA, else TVM CUDA)"
        ONNXRUNTIME = "onnxruntime", "onnxruntime (CUDA execution provider)"
        TVM = "tvm", "TVM (CUDA target)"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="gpu_jobs")
    model = models.ForeignKey(DLModel, on_delete=models.CASCADE, related_name="gpu_jobs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    batch_size = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(4096)])
    runtime = models.CharField(max_length=12, choices=Runtime.choices, default=Runtime.AUTO)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.INFERENCE,
                            help_text="inference: timed inferences; train: training steps (forward, backward, "
                                      "optimizer update) compiled by TVM Relax training.")
    optimizer = models.CharField(max_length=8, choices=Optimizer.choices, default=Optimizer.ADAM,
                                 help_text="The optimizer of a training job (unused by inference).")
    learning_rate = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(1e-7), MaxValueValidator(1.0)],
        help_text="The training job's learning rate; empty: the optimizer's default (scheduling.train_step).")
    num_gpus = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(8)],
        help_text="GPUs of one node the job runs on data-parallel, placed as one unit (a gang).")
    iterations = models.PositiveIntegerField(default=100, validators=[MinValueValidator(1)],
                                             help_text="Inferences (inference) or training steps (train) the job runs.")
    duration_estimate_s = models.FloatField(validators=[MinValueValidator(1.0)],
                                            help_text="GPU time reserved against the team's GPU-hour quota.")
    predicted_util_pct = models.FloatField(null=True, blank=True)
    predicted_mem_mb = models.FloatField(null=True, blank=True)
    predicted_for_gpu_model = models.CharField(max_length=50, blank=True)
    predictor_version = models.ForeignKey(PredictorVersion, null=True, blank=True, on_delete=models.SET_NULL,
                                          related_name="jobs")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING, db_index=True)
    policy = models.CharField(max_length=30, blank=True, help_text="Policy that placed the job.")
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True)
    measured_util_pct = models.FloatField(null=True, blank=True)
    measured_mem_mb = models.FloatField(null=True, blank=True)
    measured_source = models.CharField(
        max_length=20, blank=True,
        help_text="Where measured_* come from: nvml-process (the job's own process) or nvml-device (its GPU's).")
    # The running job's own per-process NVML figures, refreshed by its worker about once a second (the
    # policies read these as the job's measured load; none until the driver reports one).
    live_util_pct = models.FloatField(null=True, blank=True)
    live_mem_mb = models.FloatField(null=True, blank=True)
    live_sampled_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)
    replacements = models.JSONField(
        default=list, blank=True,
        help_text="Each time the job was stopped and placed again: when, why (oom, interference) and the figures.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    placed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "GPU job"
        indexes = [models.Index(fields=["team", "state"]), models.Index(fields=["state", "created_at"])]

    def __str__(self) -> str:
        return f"GPU job {self.pk} ({self.model.name} bs{self.batch_size}, {self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in self.ACTIVE


# The usage ledger's key of a released placement's GPU-seconds: "gpu_seconds:placement:<placement id>".
PLACEMENT_CHARGE_PREFIX = "gpu_seconds:placement:"


class Placement(models.Model):
    """A job on a GPU. At most one active (unreleased) placement per job - a DB constraint."""

    job = models.ForeignKey(GpuJob, on_delete=models.CASCADE, related_name="placements")
    gpu = models.ForeignKey(GPU, on_delete=models.PROTECT, related_name="placements")
    gang_gpu_ids = models.JSONField(
        default=list, blank=True,
        help_text="Every GPU of a multi-GPU job (ids, lead GPU first; all on the lead's node); [] for one GPU.")
    policy = models.CharField(max_length=30)
    score = models.FloatField(null=True, blank=True, help_text="The policy's cost of this GPU (lower is better).")
    queue = models.CharField(max_length=200)
    placed_at = models.DateTimeField(db_index=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-placed_at"]
        constraints = [
            models.UniqueConstraint(fields=["job"], condition=Q(released_at__isnull=True),
                                    name="one_active_placement_per_job"),
        ]
        indexes = [models.Index(fields=["gpu", "released_at"])]

    def __str__(self) -> str:
        return f"job {self.job_id} on {self.gpu} ({self.policy})"

    @property
    def is_active(self) -> bool:
        return self.released_at is None


# The usage ledger's key of a released pod binding's GPU-seconds: "gpu_seconds:pod-binding:<binding id>".
POD_BINDING_CHARGE_PREFIX = "gpu_seconds:pod-binding:"


class PodBinding(models.Model):
    """A Kubernetes pod bound by the scheduler extender to one GPU of a node (a gang: one row per GPU).
    Active (unreleased) bindings count as load on their GPUs for the extender and the placement passes
    alike. kube-scheduler never says when a pod ends: a binding is released by the extender's release
    call or counts no more once its ``expires_at`` has passed (its bind time plus the
    SCHEDULER_EXTENDER_BINDING_TTL_S of that moment: a later change of the setting changes no binding's
    expiry, reservation or cost). It belongs to its model's team, whose GPU-hour quota it is charged to
    (reserved while active, the time held once released or expired)."""

    pod_uid = models.CharField(max_length=64, db_index=True)
    pod_namespace = models.CharField(max_length=253)
    pod_name = models.CharField(max_length=253)
    gpu = models.ForeignKey(GPU, on_delete=models.PROTECT, related_name="pod_bindings")
    model = models.ForeignKey(DLModel, on_delete=models.PROTECT, related_name="pod_bindings")
    batch_size = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    num_gpus = models.PositiveIntegerField(default=1, help_text="GPUs of the pod's gang (all on this node).")
    predicted_util_pct = models.FloatField()
    predicted_mem_mb = models.FloatField()
    policy = models.CharField(max_length=30)
    score = models.FloatField(null=True, blank=True, help_text="The policy's cost of the gang's GPUs.")
    bound_at = models.DateTimeField(db_index=True)
    expires_at = models.DateTimeField(db_index=True, help_text="Unreleased, it counts as load and cost until then.")
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-bound_at"]
        constraints = [
            models.UniqueConstraint(fields=["pod_uid", "gpu"], condition=Q(released_at__isnull=True),
                                    name="one_active_binding_per_pod_gpu"),
        ]
        indexes = [models.Index(fields=["gpu", "released_at"])]

    def __str__(self) -> str:
        return f"pod {self.pod_namespace}/{self.pod_name} on {self.gpu}"


def trace_upload_path(instance: TraceUpload, filename: str) -> str:
    return f"traces/{instance.team_id}/{instance.sha256[:16]}-{filename[-60:]}"


class TraceUpload(models.Model):
    """A cluster trace a team uploaded (Philly jobs or an Alibaba pod list), validated row by row."""

    class Kind(models.TextChoices):
        PHILLY = "philly", "Philly jobs (timestamp, duration, num_gpus)"
        ALIBABA_PODS = "alibaba_pods", "Alibaba pod list"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="traces")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    file = models.FileField(upload_to=trace_upload_path, max_length=255)
    file_size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    n_jobs = models.PositiveIntegerField()
    summary = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="unique_trace_name_per_team")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind}, {self.n_jobs} jobs)"


class SimulationRun(models.Model):
    """A trace-driven simulation of one or more placement policies, run by a Celery task."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    ACTIVE = (Status.QUEUED, Status.RUNNING)
    TERMINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="simulations")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    trace = models.CharField(max_length=20, help_text="'philly', 'alibaba' or 'upload'.")
    trace_upload = models.ForeignKey(TraceUpload, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="simulations")
    policies = models.JSONField(help_text="Policy names, in the order they were run.")
    seed = models.IntegerField(default=0)
    parameters = models.JSONField(default=dict, help_text="Method, cluster scale, job slice, predictor error...")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    results = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    cost_units = models.PositiveBigIntegerField(
        default=0, help_text="Estimated cost in simulation units (scheduling.horus.cost), checked against the team's "
                             "max_simulation_units when requested and again when it starts.")
    dispatched_at = models.DateTimeField(
        null=True, blank=True, help_text="When it was sent to the simulation worker's queue; a queued run without it "
                                         "waits in the fair queue (one dispatched simulation per team at a time).")
    cancel_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="A running simulation stops at its next check once this is set.")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["team", "-created_at"]),
                   models.Index(fields=["status", "dispatched_at"], name="simulation_fair_queue")]

    def __str__(self) -> str:
        return f"Simulation {self.pk} of {self.trace} ({self.status})"


def placement_gpu_ids(placement: Placement) -> list[int]:
    """The GPUs a placement holds: its gang, or its one GPU."""
    return list(placement.gang_gpu_ids or [placement.gpu_id])
