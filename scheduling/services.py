"""Writes for the GPU cluster: node registration and heartbeats, profiles and predictors,
GPU jobs (submit, place, run, cancel), trace uploads and simulations.

Keyword-only, typed, atomic where they write. Celery tasks, views, admin and
commands call these; the algorithms live in ``scheduling.horus`` (Django-free)
and the NVML/runtime code in ``scheduling.telemetry`` / ``scheduling.gpu_runtime``.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import io
import logging
import os
import socket
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.base import ContentFile
from django.db import IntegrityError, connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from core.exceptions import ConflictError, PermissionDenied, QuotaExceeded, ServiceError
from core.models import DLModel, Membership, Quota, Team
from core.selectors import month_start
from core.services import lock_team_quota, require_ready

from . import selectors, telemetry
from .models import (
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
    gpu_queue_name,
)

if TYPE_CHECKING:
    from .horus.predictor import TrainedPredictor
    from .horus.profiles import ProfileRecord

log = logging.getLogger(__name__)

DEFAULT_POLICY = "horus"
MAX_TRACE_BYTES = 50 * 1024 * 1024


class TraceRejected(ServiceError):
    """An uploaded trace is malformed; ``line`` (1-based, header = 1) and ``column`` say where."""

    code = "trace_malformed"

    def __init__(self, message: str, *, line: int | None = None, column: str | None = None):
        super().__init__(message, code="trace_malformed", field="file")
        self.line, self.column = line, column


def default_policy() -> str:
    return getattr(settings, "SCHEDULING_POLICY", DEFAULT_POLICY)


def _require_staff(actor: AbstractBaseUser | None, what: str) -> None:
    if actor is not None and not actor.is_staff:
        raise PermissionDenied(f"Only staff can {what}.")


def _require_writer(actor: AbstractBaseUser | None, team_id: int, what: str = "do this") -> None:
    if actor is None or actor.is_staff:
        return
    if not Membership.objects.filter(user=actor, team_id=team_id,
                                     role__in=[Membership.Role.OWNER, Membership.Role.MEMBER]).exists():
        raise PermissionDenied(f"Viewers cannot {what}.")


# ==================================================================================================
# Nodes, GPUs, telemetry
# ==================================================================================================

@dataclass
class HostFacts:
    hostname: str
    cpu_cores: int
    memory_mb: int


def local_host_facts() -> HostFacts:
    try:
        import psutil

        mem = int(psutil.virtual_memory().total // (1024 * 1024))
    except Exception:  # pragma: no cover - psutil is pinned
        mem = 0
    return HostFacts(hostname=socket.gethostname(), cpu_cores=os.cpu_count() or 0, memory_mb=mem)


@transaction.atomic
def register_node(
    *,
    name: str,
    reading: telemetry.NvmlReading,
    hostname: str = "",
    cpu_cores: int = 0,
    memory_mb: int = 0,
    queues: list[str] | None = None,
    now: dt.datetime | None = None,
) -> Node:
    """Create or refresh a node and its GPUs from an NVML reading (a host with no GPU registers none).

    ``queues`` are the Celery queues the calling worker consumes; they are merged with the ones
    other workers of the same node reported. GPUs the reading no longer shows are marked absent.
    """
    name = (name or "").strip()
    if not name:
        raise ServiceError("A node needs a name.", field="name")
    now = now or timezone.now()
    node, _ = Node.objects.select_for_update().get_or_create(name=name)
    node.hostname = hostname or node.hostname
    node.cpu_cores = cpu_cores or node.cpu_cores
    node.memory_mb = memory_mb or node.memory_mb
    node.queues = sorted(set(node.queues or []) | set(queues or []))
    node.nvml_available = reading.available
    node.nvml_error = "" if reading.available else reading.error
    node.driver_version = reading.driver_version
    node.last_seen = now
    node.save()
    seen = set()
    for s in reading.gpus:
        seen.add(s.index)
        values = {"uuid": s.uuid, "name": s.name[:100], "gpu_model": s.gpu_model[:50],
                  "memory_total_mb": s.memory_total_mb, "power_limit_w": s.power_limit_w,
                  "queue": gpu_queue_name(node.name, s.index), "present": True}
        gpu = GPU.objects.filter(node=node, index=s.index).first()
        if gpu is None:
            GPU.objects.create(node=node, index=s.index, **values)
        elif any(getattr(gpu, k) != v for k, v in values.items()):
            for k, v in values.items():
                setattr(gpu, k, v)
            gpu.save(update_fields=list(values))
    GPU.objects.filter(node=node, present=True).exclude(index__in=seen).update(present=False)
    return node


@dataclass
class HeartbeatResult:
    node: str
    nvml_available: bool
    message: str
    samples: int = 0
    gpus: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "nvml_available": self.nvml_available, "message": self.message,
                "samples": self.samples, "gpus": self.gpus}


def record_heartbeat(
    *,
    node_name: str | None = None,
    queues: list[str] | None = None,
    nvml: Any = None,
    now: dt.datetime | None = None,
) -> HeartbeatResult:
    """Read this host's GPUs through NVML, register the node and store one telemetry sample per GPU.

    With no NVIDIA driver (or no GPU) the node is registered with no GPUs and the result says so.
    """
    name = node_name or settings.NODE_NAME
    now = now or timezone.now()
    reading = telemetry.read_gpus(nvml)
    facts = local_host_facts()
    with transaction.atomic():
        node = register_node(name=name, reading=reading, hostname=facts.hostname, cpu_cores=facts.cpu_cores,
                             memory_mb=facts.memory_mb, queues=queues, now=now)
        by_index = {g.index: g for g in GPU.objects.filter(node=node, present=True)}
        rows = [
            GpuTelemetry(gpu=by_index[s.index], ts=now, util_pct=s.util_pct, mem_used_mb=s.mem_used_mb,
                         mem_total_mb=s.memory_total_mb, power_w=s.power_w, temperature_c=s.temperature_c,
                         energy_mj=s.energy_mj)
            for s in reading.gpus if s.index in by_index
        ]
        GpuTelemetry.objects.bulk_create(rows)
    prune_telemetry(node=node)
    if reading.available:
        message = f"node {name}: {reading.summary}; stored {len(rows)} sample(s)"
    else:
        message = f"node {name} registered with no GPUs: {reading.summary}"
    log.info(message)
    return HeartbeatResult(node=name, nvml_available=reading.available, message=message, samples=len(rows),
                           gpus=[s.to_dict() for s in reading.gpus])


def prune_telemetry(*, node: Node | None = None, older_than: dt.timedelta | None = None) -> int:
    """Delete samples older than SCHEDULING_TELEMETRY_RETENTION_DAYS (default 7) - of one node's GPUs, or all."""
    days = float(getattr(settings, "SCHEDULING_TELEMETRY_RETENTION_DAYS", 7.0))
    cutoff = timezone.now() - (older_than or dt.timedelta(days=days))
    qs = GpuTelemetry.objects.filter(ts__lt=cutoff)
    if node is not None:
        qs = qs.filter(gpu__node=node)
    deleted, _ = qs.delete()
    return deleted


def recover_lost_jobs(*, now: dt.datetime | None = None) -> dict[str, list[int]]:
    """Jobs whose GPU's node stopped sending heartbeats: a placed job goes back to pending (it is placed
    again elsewhere), a running one fails naming the node. Their placements are released."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(seconds=selectors.node_stale_after_s())
    lost = (Placement.objects.filter(released_at__isnull=True, job__state__in=[GpuJob.State.PLACED,
                                                                              GpuJob.State.RUNNING])
            .filter(Q(gpu__node__last_seen__lt=cutoff) | Q(gpu__node__last_seen__isnull=True))
            .values_list("job_id", "gpu__node__name"))
    out: dict[str, list[int]] = {"requeued": [], "failed": []}
    for job_id, node_name in lost:
        with transaction.atomic():
            job = GpuJob.objects.select_for_update().filter(pk=job_id).first()
            if job is None or job.state not in (GpuJob.State.PLACED, GpuJob.State.RUNNING):
                continue
            _release_active(job, now)
            if job.state == GpuJob.State.PLACED:
                job.state, job.placed_at, job.policy = GpuJob.State.PENDING, None, ""
                job.save(update_fields=["state", "placed_at", "policy"])
                out["requeued"].append(job_id)
            else:
                job.state, job.finished_at = GpuJob.State.FAILED, now
                job.error = f"node {node_name} stopped sending heartbeats while the job ran (worker lost)"
                job.save(update_fields=["state", "finished_at", "error"])
                out["failed"].append(job_id)
    if out["requeued"] or out["failed"]:
        log.warning("lost GPU jobs: %s", out)
    return out


def heartbeat_fanout_targets(*, exclude: str) -> list[tuple[str, str]]:
    """``(node, queue)`` for every other live node: a queue only that node's workers consume."""
    out = []
    for node in Node.objects.exclude(name=exclude).order_by("name"):
        if not selectors.is_node_fresh(node):
            continue
        own = [q for q in (node.queues or []) if f".{node.name}." in q or q.endswith(f".{node.name}")]
        preferred = [q for q in own if q.startswith("telemetry.")] + [q for q in own if q.endswith(".cpu")] + own
        if preferred:
            out.append((node.name, preferred[0]))
    return out


@transaction.atomic
def set_node_drained(*, actor: AbstractBaseUser | None, node: Node, drained: bool) -> Node:
    _require_staff(actor, "drain or undrain nodes")
    node = Node.objects.select_for_update().get(pk=node.pk)
    node.drained = drained
    node.save(update_fields=["drained"])
    if not drained:
        _enqueue_placement()
    return node


@transaction.atomic
def set_gpu_drained(*, actor: AbstractBaseUser | None, gpu: GPU, drained: bool) -> GPU:
    _require_staff(actor, "drain or undrain GPUs")
    gpu = GPU.objects.select_for_update().get(pk=gpu.pk)
    gpu.drained = drained
    gpu.save(update_fields=["drained"])
    if not drained:
        _enqueue_placement()
    return gpu


# ==================================================================================================
# Profiles and predictors
# ==================================================================================================

_PROFILE_FIELDS = ("features", "util_pct", "peak_mem_mb", "power_w", "meta", "dl_model")


def _upsert_profiles(records: list["ProfileRecord"], dl_model: DLModel | None = None) -> list[GpuProfile]:
    """Insert or update profile rows keyed by (model, batch size, GPU model, source), in bulk."""
    def key(model_name, batch_size, gpu_model, source):
        return model_name[:100], int(batch_size), gpu_model[:50], source[:100]

    wanted = {key(r.model, r.batch_size, r.gpu_model, r.source): r for r in records}
    existing = {key(p.model_name, p.batch_size, p.gpu_model, p.source): p
                for p in GpuProfile.objects.filter(model_name__in={k[0] for k in wanted},
                                                   source__in={k[3] for k in wanted})}
    create, update = [], []
    for k, r in wanted.items():
        values = {"features": dict(r.features), "util_pct": r.gpu_util_pct, "peak_mem_mb": r.peak_mem_mb,
                  "power_w": r.power_w, "meta": dict(r.meta), "dl_model": dl_model}
        if k in existing:
            p = existing[k]
            for f, v in values.items():
                setattr(p, f, v)
            update.append(p)
        else:
            create.append(GpuProfile(model_name=k[0], batch_size=k[1], gpu_model=k[2], source=k[3], **values))
    GpuProfile.objects.bulk_create(create, batch_size=500)
    GpuProfile.objects.bulk_update(update, list(_PROFILE_FIELDS), batch_size=500)
    return [*create, *update]


@transaction.atomic
def load_seed_profiles(*, path: str | os.PathLike[str] | None = None) -> int:
    """Store the shipped profile set (synthetic unless the file says otherwise); idempotent."""
    from .horus.profiles import DEFAULT_SEED_PROFILES_PATH, load_profiles

    records = load_profiles(path or DEFAULT_SEED_PROFILES_PATH)
    _upsert_profiles(records)
    return len(records)


@transaction.atomic
def record_profiles(*, records: list["ProfileRecord"], dl_model: DLModel | None = None) -> list[GpuProfile]:
    """Store measured profile records (from `profile_gpu`)."""
    return _upsert_profiles(records, dl_model)


def profile_records(qs=None) -> list["ProfileRecord"]:
    from .horus.profiles import ProfileRecord

    qs = qs if qs is not None else GpuProfile.objects.all()
    return [
        ProfileRecord(model=p.model_name, batch_size=p.batch_size, gpu_model=p.gpu_model, features=dict(p.features),
                      gpu_util_pct=p.util_pct, peak_mem_mb=p.peak_mem_mb, power_w=p.power_w, source=p.source,
                      meta=dict(p.meta or {}))
        for p in qs.order_by("pk")
    ]


def training_records() -> list["ProfileRecord"]:
    """Profiles in the database; the shipped seed set is loaded first when there are none."""
    if not GpuProfile.objects.exists():
        load_seed_profiles()
    return profile_records()


def train_predictor(
    *,
    actor: AbstractBaseUser | None = None,
    k_folds: int = 5,
    seed: int = 0,
    activate: bool = True,
    xgb_params: dict[str, Any] | None = None,
) -> PredictorVersion:
    """Train the Horus predictor on every stored profile, store it with its k-fold RMSLE/MAE, activate it."""
    _require_staff(actor, "train predictors")
    from .horus.predictor import UtilizationPredictor

    if not 2 <= k_folds <= 20:
        raise ServiceError("k_folds must be between 2 and 20.", field="k_folds")
    records = training_records()
    try:
        trained = UtilizationPredictor(**(xgb_params or {})).train(records, k_folds=k_folds, seed=seed)
    except ValueError as exc:
        raise ServiceError(f"Cannot train a predictor: {exc}", code="not_enough_profiles") from None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "predictor.json"
        trained.save(path)
        data = path.read_bytes()
    with transaction.atomic():
        # Serialize version numbering (PostgreSQL advisory-free: lock the current rows).
        list(PredictorVersion.objects.select_for_update().values_list("pk", flat=True))
        number = (PredictorVersion.objects.aggregate(m=Max("version"))["m"] or 0) + 1
        pv = PredictorVersion(version=number, metrics=trained.metrics, params=trained.params,
                              sources=trained.sources, n_records=trained.n_records,
                              trained_by=actor if actor is not None and actor.is_authenticated else None)
        pv.file.save(f"predictor-v{number}.json", ContentFile(data), save=False)
        if activate:
            PredictorVersion.objects.filter(active=True).update(active=False)
            pv.active = True
        pv.save()
    _cache_predictor(pv, trained)
    return pv


@transaction.atomic
def activate_predictor(*, actor: AbstractBaseUser | None, version: PredictorVersion) -> PredictorVersion:
    _require_staff(actor, "activate predictors")
    PredictorVersion.objects.select_for_update().filter(active=True).update(active=False)
    PredictorVersion.objects.filter(pk=version.pk).update(active=True)
    version.refresh_from_db()
    return version


_predictor_cache: dict[tuple[int, str], "TrainedPredictor"] = {}
_predictor_lock = threading.Lock()


def _cache_predictor(pv: PredictorVersion, trained: "TrainedPredictor") -> None:
    with _predictor_lock:
        _predictor_cache[(pv.pk, pv.file.name)] = trained


def load_predictor(pv: PredictorVersion) -> "TrainedPredictor":
    from .horus.predictor import TrainedPredictor

    key = (pv.pk, pv.file.name)
    with _predictor_lock:
        cached = _predictor_cache.get(key)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.json"
        with pv.file.open("rb") as f:
            path.write_bytes(f.read())
        trained = TrainedPredictor.load(path)
    _cache_predictor(pv, trained)
    return trained


def ensure_active_predictor() -> tuple[PredictorVersion, "TrainedPredictor"]:
    """The active predictor; one is trained from the stored (or seed) profiles when none exists."""
    pv = selectors.active_predictor_version()
    if pv is None:
        pv = train_predictor(actor=None)
    return pv, load_predictor(pv)


_features_cache: dict[tuple[int, str, int], dict[str, Any]] = {}


def model_features(model: DLModel, batch_size: int) -> dict[str, Any]:
    """Cached :func:`_model_features` (recomputing reads the ONNX file: seconds for a large model)."""
    key = (model.pk, model.sha256, int(batch_size))
    if key not in _features_cache:
        if len(_features_cache) > 512:
            _features_cache.clear()
        _features_cache[key] = _model_features(model, batch_size)
    return dict(_features_cache[key])


def _model_features(model: DLModel, batch_size: int) -> dict[str, Any]:
    """Graph features of a registered model at ``batch_size``.

    Recomputed from the stored ONNX file when the batch differs; if the graph hard-codes its
    batch, FLOPs and activation bytes are scaled linearly from the stored features (and the
    result says ``"batch_scaled": True``).
    """
    feats = dict(model.features or {})
    if batch_size == model.batch_size and feats:
        return feats
    try:
        import onnx

        from core.onnx_models.features import compute_features

        with model.file.open("rb") as f:
            proto = onnx.load_from_string(f.read())
        return compute_features(proto, batch_size=batch_size).to_dict()
    except Exception as exc:
        log.info("features of %s at batch %s scaled linearly (%s)", model, batch_size, exc)
        base = max(1, int(feats.get("batch_size") or model.batch_size or 1))
        ratio = batch_size / base
        return {**feats, "total_flops": int(model.total_flops * ratio),
                "activation_bytes": int(model.activation_bytes * ratio), "param_count": model.param_count,
                "conv_count": model.conv_count, "linear_count": model.linear_count,
                "activation_count": model.activation_count, "other_count": model.other_count,
                "batch_size": batch_size, "batch_scaled": True}


def predict_job(*, model: DLModel, batch_size: int, gpu_model: str | None = None) -> dict[str, Any]:
    """Predicted GPU utilization (%) and peak memory (MB) of the model at ``batch_size``."""
    pv, trained = ensure_active_predictor()
    gpu_model = gpu_model or selectors.fleet_gpu_model() or "V100"
    util, mem = trained.predict(model_features(model, batch_size), gpu_model=gpu_model)
    return {"util_pct": round(float(util), 3), "mem_mb": round(float(mem), 1), "gpu_model": gpu_model,
            "predictor_version": pv}


# ==================================================================================================
# GPU jobs: quota, submit, cancel
# ==================================================================================================

def _reserved_hours(team_id: int, now: dt.datetime, states=GpuJob.ACTIVE) -> float:
    """GPU-hours the team's jobs in ``states`` have declared and not used yet: a running job is stopped
    at its declared duration counted from its start, so it reserves what is left of it; others all of it."""
    reserved = 0.0
    for estimate, started_at in GpuJob.objects.filter(team_id=team_id, state__in=states).values_list(
            "duration_estimate_s", "started_at"):
        elapsed = (now - started_at).total_seconds() if started_at else 0.0
        reserved += max(0.0, estimate - elapsed)
    return reserved / 3600.0


def gpu_hours_committed(team_id: int, now: dt.datetime | None = None) -> float:
    """GPU-hours used this month (running placements so far, finished ones in full) plus what the team's
    active jobs have reserved and not yet used."""
    now = now or timezone.now()
    return selectors.gpu_hours_used(team_id, month_start(now), now) + _reserved_hours(team_id, now)


def _check_gpu_quota(*, team_id: int, hours: float) -> None:
    quota = lock_team_quota(team_id)
    committed = gpu_hours_committed(team_id)
    if committed + hours > quota.gpu_hours_per_month + 1e-9:
        left = max(0.0, quota.gpu_hours_per_month - committed)
        raise QuotaExceeded(
            f"Quota 'GPU hours per month' would be exceeded: {hours:.3f} h requested, {left:.3f} h left of "
            f"{quota.gpu_hours_per_month:g} h this month.", quota="gpu_hours_per_month")


def _usage_provider(team_id: int, since: dt.datetime) -> dict:
    return {"gpu_hours_this_month": selectors.gpu_hours_used(team_id, since),
            "concurrent_simulations": _active_simulations(team_id)}


def default_job_estimate_s() -> float:
    return float(getattr(settings, "SCHEDULING_DEFAULT_JOB_ESTIMATE_S", 600.0))


def gpu_job_limits() -> dict[str, tuple[float, float]]:
    """GPU_JOB_LIMITS with the declared duration capped by SCHEDULING_MAX_JOB_DURATION_S."""
    low, high = GPU_JOB_LIMITS["duration_estimate_s"]
    cap = float(getattr(settings, "SCHEDULING_MAX_JOB_DURATION_S", high))
    return {**GPU_JOB_LIMITS, "duration_estimate_s": (low, max(low, min(high, cap)))}


def _check_job_request(*, batch_size, iterations, duration_estimate_s: float, runtime: str) -> None:
    for name, value in (("batch_size", batch_size), ("iterations", iterations),
                        ("duration_estimate_s", duration_estimate_s)):
        low, high = gpu_job_limits()[name]
        integral = name != "duration_estimate_s"
        if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)) \
                or not low <= value <= high:
            unit = "" if integral else " s"
            raise ServiceError(f"{name} must be {'an integer' if integral else 'a number'} from {low:g}{unit} "
                               f"to {high:g}{unit}.", field=name)
    if runtime not in GpuJob.Runtime.values:
        raise ServiceError(f"runtime must be one of {', '.join(GpuJob.Runtime.values)}.", field="runtime")


def submit_job(
    *,
    actor: AbstractBaseUser,
    model: DLModel,
    batch_size: int,
    iterations: int = 100,
    duration_estimate_s: float | None = None,
    runtime: str = GpuJob.Runtime.AUTO,
    place: bool = True,
) -> GpuJob:
    """Queue a GPU job with its predicted utilization and memory. Refused (QuotaExceeded) when its
    declared GPU time would exceed the team's monthly GPU-hour quota. The job is stopped (failed) when it
    reaches that duration, and the quota is checked again when it is placed."""
    _require_writer(actor, model.team_id, "submit GPU jobs")
    require_ready(model)
    estimate = duration_estimate_s if duration_estimate_s is not None else default_job_estimate_s()
    _check_job_request(batch_size=batch_size, iterations=iterations, duration_estimate_s=estimate,
                       runtime=runtime)
    estimate = float(estimate)
    # Outside the quota lock: the first prediction may train a predictor (seconds).
    prediction = predict_job(model=model, batch_size=batch_size)
    with transaction.atomic():
        _check_gpu_quota(team_id=model.team_id, hours=estimate / 3600.0)
        job = GpuJob.objects.create(
            team_id=model.team_id, model=model, created_by=actor, batch_size=batch_size, runtime=runtime,
            iterations=iterations, duration_estimate_s=estimate, predicted_util_pct=prediction["util_pct"],
            predicted_mem_mb=prediction["mem_mb"], predicted_for_gpu_model=prediction["gpu_model"],
            predictor_version=prediction["predictor_version"],
        )
        if place:
            _enqueue_placement()
    return job


def _release_active(job: GpuJob, now: dt.datetime) -> Placement | None:
    placement = Placement.objects.select_for_update().filter(job=job, released_at__isnull=True).first()
    if placement is not None:
        placement.released_at = now
        placement.save(update_fields=["released_at"])
    return placement


@transaction.atomic
def cancel_job(*, actor: AbstractBaseUser, job: GpuJob) -> GpuJob:
    job = GpuJob.objects.select_for_update().get(pk=job.pk)
    _require_writer(actor, job.team_id, "cancel GPU jobs")
    if job.state in GpuJob.TERMINAL:
        raise ConflictError(f"GPU job {job.pk} is already {job.state}.")
    now = timezone.now()
    freed = _release_active(job, now)
    job.state, job.finished_at = GpuJob.State.CANCELLED, now
    job.save(update_fields=["state", "finished_at"])
    if freed is not None:
        _enqueue_placement()
    return job


# ==================================================================================================
# Placement
# ==================================================================================================

# A job with no prediction (none could be made) is taken as the JobView defaults.
FALLBACK_UTIL_PCT = 50.0
FALLBACK_MEM_MB = 2048.0


@dataclass
class _Cluster:
    state: Any  # horus.cluster.ClusterState
    gpus: list[GPU]  # flat index -> GPU


def _job_view(job: GpuJob):
    from .horus.cluster import JobView

    return JobView(
        job_id=str(job.pk), submit_time=job.created_at.timestamp(), num_gpus=1,
        pred_util_pct=job.predicted_util_pct if job.predicted_util_pct is not None else FALLBACK_UTIL_PCT,
        pred_mem_mb=job.predicted_mem_mb if job.predicted_mem_mb is not None else FALLBACK_MEM_MB,
        model=job.model.name if job.model_id else None, batch_size=job.batch_size,
    )


def build_cluster_state(gpus: list[GPU], *, now: dt.datetime) -> _Cluster:
    """The live cluster as a ``horus.cluster.ClusterState`` (this adapter is the only place that
    turns database rows into the simulator's state).

    * predicted load of a GPU = sum of the predictions of the jobs placed on it (what Horus sees);
    * measured load = its latest NVML sample when fresh (what Gandiva-like policies see), plus the
      predictions of jobs placed after that sample; with no fresh sample, the placed jobs' predictions.
    """
    from .horus.cluster import ClusterSpec, ClusterState, NodeSpec

    # One NodeSpec per run of same-model GPUs of a node, so flat GPU indices follow `gpus`.
    specs: list[NodeSpec] = []
    run: list[GPU] = []

    def flush():
        if run:
            g0 = run[0]
            specs.append(NodeSpec(g0.node.name, len(run), g0.gpu_model, float(g0.memory_total_mb)))

    for g in gpus:
        if run and (g.node_id != run[0].node_id or g.gpu_model != run[0].gpu_model
                    or g.memory_total_mb != run[0].memory_total_mb):
            flush()
            run = []
        run.append(g)
    flush()
    state = ClusterState(ClusterSpec(tuple(specs), "live"))
    flat = {g.pk: i for i, g in enumerate(gpus)}
    active = (Placement.objects.filter(released_at__isnull=True, gpu_id__in=list(flat))
              .select_related("job", "job__model").order_by("placed_at", "pk"))
    fresh = selectors.latest_samples(list(flat), since=now - dt.timedelta(seconds=selectors.telemetry_fresh_s()))
    newer_util = [0.0] * len(gpus)  # predictions of jobs placed after the GPU's latest sample
    newer_mem = [0.0] * len(gpus)
    for p in active:
        view = _job_view(p.job)
        i = flat[p.gpu_id]
        state.add(view, [i], true_util=view.pred_util_pct, true_mem=view.pred_mem_mb, now=p.placed_at.timestamp())
        sample = fresh.get(p.gpu_id)
        if sample is not None and p.placed_at > sample.ts:
            newer_util[i] += view.pred_util_pct
            newer_mem[i] += view.pred_mem_mb
    for gpu_id, sample in fresh.items():
        i = flat[gpu_id]
        state.true_util[i] = float(sample.util_pct) + newer_util[i]
        state.true_mem[i] = float(sample.mem_used_mb) + newer_mem[i]
    return _Cluster(state=state, gpus=gpus)


class _GpuHourBudget:
    """The GPU-hour quota re-checked as a placement pass places jobs: what each team has used this month
    (running placements so far, finished ones in full), plus what its placed and running jobs still
    reserve, plus the jobs this pass placed. A job that fits is placed; one that would fit once the team's
    placed and running jobs end waits (stays pending); one that cannot fit even then fails, naming the quota."""

    def __init__(self, now: dt.datetime):
        self.now, self.teams = now, {}

    def _team(self, team_id: int) -> dict[str, float]:
        if team_id not in self.teams:
            quota, _ = Quota.objects.get_or_create(team_id=team_id)
            self.teams[team_id] = {
                "limit": quota.gpu_hours_per_month,
                "used": selectors.gpu_hours_used(team_id, month_start(self.now), self.now),
                "reserved": _reserved_hours(team_id, self.now, states=(GpuJob.State.PLACED, GpuJob.State.RUNNING)),
            }
        return self.teams[team_id]

    def verdict(self, job: GpuJob) -> str:
        """``"place"``, ``"wait"`` or ``"refuse"``."""
        t, hours = self._team(job.team_id), job.duration_estimate_s / 3600.0
        if t["used"] + t["reserved"] + hours <= t["limit"] + 1e-9:
            return "place"
        return "wait" if t["used"] + hours <= t["limit"] + 1e-9 else "refuse"

    def charge(self, job: GpuJob) -> None:
        self._team(job.team_id)["reserved"] += job.duration_estimate_s / 3600.0

    def refusal(self, job: GpuJob) -> str:
        t = self._team(job.team_id)
        return (f"Quota 'GPU hours per month' exhausted when the job was due to be placed: "
                f"{t['used']:.3f} h of {t['limit']:g} h already used this month, {job.duration_estimate_s / 3600:.3f} "
                "h declared. It was not run.")


def _refuse_at_placement(job: GpuJob, budget: _GpuHourBudget, now: dt.datetime) -> None:
    job.state, job.finished_at, job.error = GpuJob.State.FAILED, now, budget.refusal(job)
    job.save(update_fields=["state", "finished_at", "error"])
    log.warning("GPU job %s refused at placement: %s", job.pk, job.error)


def _lock_gpus(gpus: list[GPU]) -> None:
    """Serialize placement passes: row locks on every schedulable GPU (PostgreSQL); on SQLite,
    which ignores FOR UPDATE, a write takes the database write lock for the transaction."""
    ids = sorted(g.pk for g in gpus)
    list(GPU.objects.select_for_update().filter(pk__in=ids).order_by("pk").values_list("pk", flat=True))
    if connection.vendor == "sqlite":
        GPU.objects.filter(pk__in=ids).update(present=True)


def place_pending_jobs(*, policy: str | None = None, limit: int | None = None,
                       now: dt.datetime | None = None) -> list[Placement]:
    """Place pending jobs (oldest first) with ``policy`` on the schedulable GPUs.

    Each placed job gets a Placement, state ``placed``, and a ``scheduling.run_job`` message on its
    GPU's queue (``measure.<node>.gpu<i>``), sent after commit. Concurrent passes serialize on the
    GPU rows, and the database refuses a second active placement of a job.
    """
    from .horus.cluster import workload_types
    from .horus.policies import POLICIES, make_policy

    name = policy or default_policy()
    if name not in POLICIES:
        raise ServiceError(f"Unknown policy '{name}'; use one of {', '.join(POLICIES)}.", field="policy")
    now = now or timezone.now()
    placed: list[Placement] = []
    with transaction.atomic():
        candidates = selectors.schedulable_gpus(now)
        if not candidates:
            return []
        _lock_gpus(candidates)
        # Re-read after the lock: another pass may have drained or changed GPUs meanwhile.
        gpus = [g for g in selectors.schedulable_gpus(now) if g.pk in {c.pk for c in candidates}]
        if not gpus:
            return []
        qs = GpuJob.objects.select_for_update(skip_locked=True).filter(state=GpuJob.State.PENDING)
        pending = list(qs.order_by("created_at", "pk")[:limit] if limit else qs.order_by("created_at", "pk"))
        if not pending:
            return []
        models = {m.pk: m for m in DLModel.objects.filter(pk__in={j.model_id for j in pending})}
        for j in pending:
            j.model = models[j.model_id]
        cluster = build_cluster_state(gpus, now=now)
        views = [_job_view(j) for j in pending]
        cluster.state.workload = workload_types(views)
        pol = make_policy(name)
        pol.reset(int(now.timestamp()))
        budget = _GpuHourBudget(now)
        for job, view in zip(pending, views):
            verdict = budget.verdict(job)
            if verdict != "place":
                if verdict == "refuse":
                    _refuse_at_placement(job, budget, now)
                continue
            placement = _place_one(job, view, pol, cluster, name=name, now=now)
            if placement is not None:
                budget.charge(job)
                placed.append(placement)
    return placed


def _place_one(job: GpuJob, view, pol, cluster: _Cluster, *, name: str, now: dt.datetime) -> Placement | None:
    """Ask the policy for a GPU for one job; record and dispatch the placement it chose."""
    state, cv, t = cluster.state, cluster.state.view(), now.timestamp()
    chosen = pol.place(view, cv, t)
    if not chosen:
        return None
    g = int(chosen[0])
    score = None
    if hasattr(pol, "cost"):
        cost, _ = pol.cost(view, cv)
        score = float(cost[g])
    # Until a heartbeat reports, the job's measured load is taken as its prediction.
    state.add(view, [g], true_util=view.pred_util_pct, true_mem=view.pred_mem_mb, now=t)
    gpu = cluster.gpus[g]
    try:
        with transaction.atomic():
            placement = Placement.objects.create(job=job, gpu=gpu, policy=name, score=score,
                                                 queue=gpu.queue, placed_at=now)
    except IntegrityError:  # already actively placed: never twice
        log.warning("job %s already has an active placement; skipped", job.pk)
        return None
    job.state, job.policy, job.placed_at = GpuJob.State.PLACED, name, now
    job.save(update_fields=["state", "policy", "placed_at"])
    _dispatch(placement)
    return placement


def _send_on_commit(send, *, what: str, on_error=None) -> None:
    """Publish after commit. The work is committed by then, so a broker outage is logged (and handed to
    `on_error`), never raised into the request or task that committed it."""
    from kombu.exceptions import OperationalError as BrokerError

    def callback():
        try:
            send()
        except (BrokerError, OSError) as exc:
            log.error("could not send %s: %s", what, exc)
            if on_error is not None:
                on_error(exc)

    transaction.on_commit(callback)


def _dispatch(placement: Placement) -> None:
    from . import tasks

    job_id, placement_id, queue = placement.job_id, placement.pk, placement.queue

    def unplace(exc):  # nobody will run it: back to pending, the next placement pass (beat) retries
        with transaction.atomic():
            job = GpuJob.objects.select_for_update().filter(pk=job_id, state=GpuJob.State.PLACED).first()
            if job is not None:
                _release_active(job, timezone.now())
                job.state, job.placed_at, job.policy = GpuJob.State.PENDING, None, ""
                job.save(update_fields=["state", "placed_at", "policy"])

    _send_on_commit(lambda: tasks.run_job.apply_async(args=[job_id, placement_id], queue=queue),
                    what=f"GPU job {job_id} to {queue}", on_error=unplace)


def _enqueue_placement() -> None:
    from . import tasks

    # On a broker outage pending jobs wait for the heartbeat's next placement pass.
    _send_on_commit(lambda: tasks.place_pending.delay(), what="a placement pass")


# ==================================================================================================
# Running a placed job (on its GPU's worker)
# ==================================================================================================

def claim_job(*, job_id: int, placement_id: int, worker: str) -> GpuJob | None:
    """Mark a placed job running on this worker; None when it was cancelled, re-placed or already taken."""
    with transaction.atomic():
        job = GpuJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.state != GpuJob.State.PLACED:
            return None
        if not Placement.objects.filter(pk=placement_id, job=job, released_at__isnull=True).exists():
            return None
        job.state, job.started_at, job.worker = GpuJob.State.RUNNING, timezone.now(), worker[:200]
        job.save(update_fields=["state", "started_at", "worker"])
    return job


@transaction.atomic
def finish_job(*, job_id: int, result: dict[str, Any] | None = None, error: str = "") -> GpuJob | None:
    """Record a job's outcome (finished, or failed with ``error``) and free its GPU."""
    job = GpuJob.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        return None
    now = timezone.now()
    _release_active(job, now)
    if job.state in GpuJob.TERMINAL:  # cancelled while it ran: keep the cancellation
        return job
    job.finished_at = now
    job.result = result or {}
    if error:
        job.state, job.error = GpuJob.State.FAILED, error[:5000]
    else:
        job.state = GpuJob.State.FINISHED
        job.measured_util_pct = (result or {}).get("util_mean_pct")
        job.measured_mem_mb = (result or {}).get("mem_used_by_job_mb")
    job.save()
    _enqueue_placement()
    return job


def reconcile_restarted_gpu_worker(*, queues: list[str], started_before: dt.datetime) -> dict[str, list[int]]:
    """Settle the jobs a GPU worker's previous incarnation left behind when it died (SIGKILL, OOM, crash)
    and the worker came back on the same node, whose heartbeats never stopped (recover_lost_jobs only
    acts on silent nodes). Each GPU queue has one consumer, so a job still ``running`` on one of this
    worker's queues since before it started was being run by the dead incarnation: it fails, saying so,
    and frees its GPU. A job still ``placed`` there may have had its run_job message taken by the dead
    worker (it comes back only after the visibility timeout): it is sent again; the claim makes a
    duplicate a no-op."""
    active = (Placement.objects.filter(released_at__isnull=True, queue__in=list(queues))
              .values_list("pk", "job_id", "job__state", "job__started_at", "job__placed_at", "queue"))
    out: dict[str, list[int]] = {"failed": [], "redispatched": []}
    for placement_id, job_id, state, started_at, placed_at, queue in active:
        if state == GpuJob.State.RUNNING and started_at is not None and started_at < started_before:
            with transaction.atomic():
                job = GpuJob.objects.select_for_update().filter(pk=job_id, state=GpuJob.State.RUNNING).first()
                if job is not None:
                    finish_job(job_id=job_id, error="The GPU worker running this job restarted (it was killed "
                                                    "or crashed mid-job); the job did not finish. Resubmit it.")
                    out["failed"].append(job_id)
        elif state == GpuJob.State.PLACED and placed_at is not None and placed_at < started_before:
            from . import tasks

            tasks.run_job.apply_async(args=[job_id, placement_id], queue=queue)
            out["redispatched"].append(job_id)
    if out["failed"] or out["redispatched"]:
        log.warning("GPU worker on %s restarted: %s", ", ".join(queues), out)
    return out


def _job_cancelled(job_id: int) -> bool:
    return GpuJob.objects.filter(pk=job_id, state=GpuJob.State.CANCELLED).exists()


def _overran_message(job: GpuJob) -> str:
    high = gpu_job_limits()["duration_estimate_s"][1]
    return (f"Stopped: the job reached its declared duration (duration_estimate_s = {job.duration_estimate_s:g} s, "
            f"counted from its start, model loading included) before finishing its {job.iterations} iterations. "
            f"Submit it again with a longer duration_estimate_s (at most {high:g} s) or fewer iterations.")


def execute_job(*, job_id: int, placement_id: int, worker: str, nvml: Any = None) -> GpuJob | None:
    """Run a placed job's model on its GPU (the Celery task `scheduling.run_job` calls this).

    With no GPU the job fails with "no NVIDIA GPU found (pynvml: ...)"; with no CUDA-capable
    runtime it fails naming what is missing.
    """
    from .gpu_runtime import DurationReached, GpuRuntimeError, JobStopped, NoGpuError, run_model_on_gpu

    job = claim_job(job_id=job_id, placement_id=placement_id, worker=worker)
    if job is None:
        log.info("GPU job %s: not placed (cancelled or already run); nothing to do", job_id)
        return None
    placement = Placement.objects.select_related("gpu", "gpu__node").get(pk=placement_id)
    try:
        with job.model.file.open("rb") as f:
            data = f.read()
        result = run_model_on_gpu(data, batch_size=job.batch_size, iterations=job.iterations,
                                  device_index=placement.gpu.index, runtime=job.runtime, nvml=nvml,
                                  should_stop=lambda: _job_cancelled(job_id), max_seconds=job.duration_estimate_s)
    except DurationReached as exc:
        log.info("GPU job %s stopped on %s at its declared duration (%g s)", job_id, worker, exc.limit_s)
        return finish_job(job_id=job_id, error=_overran_message(job))
    except JobStopped:
        # cancel_job already recorded the cancellation and freed the GPU; finish_job keeps both
        log.info("GPU job %s cancelled while running on %s: stopped", job_id, worker)
        return finish_job(job_id=job_id, error="cancelled while running")
    except (NoGpuError, GpuRuntimeError) as exc:
        log.warning("GPU job %s failed on %s: %s", job_id, worker, exc)
        return finish_job(job_id=job_id, error=str(exc))
    except Exception as exc:  # the model itself failed: record it, do not retry forever
        log.exception("GPU job %s failed", job_id)
        return finish_job(job_id=job_id, error=f"{type(exc).__name__}: {exc}")
    return finish_job(job_id=job_id, result=result)


# ==================================================================================================
# Traces and simulations
# ==================================================================================================

def _trace_summary(jobs) -> dict[str, Any]:
    import numpy as np

    if not jobs:
        return {}
    dur = np.array([j.duration_s for j in jobs])
    sub = np.array([j.submit_time for j in jobs])
    gpus: dict[str, int] = {}
    for j in jobs:
        gpus[str(j.num_gpus)] = gpus.get(str(j.num_gpus), 0) + 1
    return {"jobs": len(jobs), "span_s": float(sub.max() - sub.min()), "median_duration_s": float(np.median(dur)),
            "num_gpus": dict(sorted(gpus.items(), key=lambda kv: int(kv[0]))),
            "sharing_jobs": sum(1 for j in jobs if 0 < j.gpu_milli < 1000)}


def _gunzip_bounded(data: bytes, *, limit: int, filename: str) -> bytes:
    """Inflate gzip data (all members), refusing it as soon as it passes `limit` bytes or is corrupt."""
    import zlib

    out, rest = bytearray(), data
    while rest:
        d = zlib.decompressobj(wbits=31)
        try:
            while not d.eof:  # 1 MB of output at a time
                chunk = d.decompress(rest, 2**20)
                rest = d.unconsumed_tail
                if not chunk and not rest:
                    break  # input exhausted before the end of the stream
                out += chunk
                if len(out) > limit:
                    raise ServiceError(f"{filename} inflates to more than {limit / 2**20:.0f} MB, the trace size "
                                       "limit.", code="too_large", field="file")
        except zlib.error as exc:
            raise TraceRejected(f"{filename}: corrupt gzip data ({exc}).") from None
        if not d.eof:
            raise TraceRejected(f"{filename}: the gzip data is cut short (incomplete upload or copy).")
        rest = d.unused_data.lstrip(b"\0")
    return bytes(out)


def upload_trace(*, actor: AbstractBaseUser, team: Team, name: str, data: bytes, filename: str) -> TraceUpload:
    """Validate a trace row by row (horus's parser) and store it. A malformed row raises
    TraceRejected naming the line and column, and nothing is stored."""
    from .horus.traces import TraceFormatError, parse_trace

    _require_writer(actor, team.pk, "upload traces")
    name = (name or "").strip() or Path(filename).stem
    if len(name) > 100:
        raise ServiceError("Trace names are at most 100 characters.", field="name")
    if len(data) > MAX_TRACE_BYTES:
        raise ServiceError(f"The file is over the {MAX_TRACE_BYTES // 2**20} MB limit.", code="too_large",
                           field="file")
    if TraceUpload.objects.filter(team=team, name=name).exists():
        raise ConflictError(f"Team {team} already has a trace named '{name}'.", field="name")
    # A .gz upload is inflated here, bounded: a gzip bomb (or a corrupt stream) never reaches the parser.
    text = _gunzip_bounded(data, limit=MAX_TRACE_BYTES, filename=filename) if data[:2] == b"\x1f\x8b" else data
    try:
        parsed = parse_trace(io.BytesIO(text), name=filename)
    except TraceFormatError as exc:
        raise TraceRejected(str(exc), line=exc.line, column=exc.column) from None
    except (ValueError, OverflowError, OSError, EOFError) as exc:  # hostile input the parser did not foresee
        raise TraceRejected(f"{filename}: cannot be read as a trace ({exc}).") from None
    if parsed.kind not in TraceUpload.Kind.values:
        raise TraceRejected(f"{filename}: a {parsed.kind.replace('_', ' ')} describes a cluster, not jobs; "
                            "upload Philly jobs or an Alibaba pod list.")
    digest = hashlib.sha256(data).hexdigest()
    trace = TraceUpload(team=team, name=name, kind=parsed.kind, file_size=len(data), sha256=digest,
                        n_jobs=len(parsed.jobs), summary=_trace_summary(parsed.jobs),
                        created_by=actor if actor is not None and actor.is_authenticated else None)
    stored = None
    try:
        with transaction.atomic():
            trace.file.save(Path(filename).name or "trace.csv", ContentFile(data), save=False)
            stored = trace.file.name
            trace.save()
    except IntegrityError:
        _delete_stored(stored)
        raise ConflictError(f"Team {team} already has a trace named '{name}'.", field="name") from None
    except BaseException:
        _delete_stored(stored)
        raise
    return trace


def _delete_stored(name: str | None) -> None:
    if not name:
        return
    from django.core.files.storage import default_storage

    try:
        default_storage.delete(name)
    except OSError:  # pragma: no cover
        log.warning("could not delete stored file %s", name)


@transaction.atomic
def delete_trace(*, actor: AbstractBaseUser, trace: TraceUpload) -> None:
    _require_writer(actor, trace.team_id, "delete traces")
    name = trace.file.name
    trace.delete()
    transaction.on_commit(lambda: _delete_stored(name))


def _resolve_trace(team: Team, trace: str | int) -> tuple[str, TraceUpload | None, str]:
    """``(trace label, upload or None, kind)``."""
    from .experiments import SHIPPED_TRACES

    ref = str(trace).strip()
    if ref in SHIPPED_TRACES:
        return ref, None, "alibaba_pods" if ref == "alibaba" else "philly"
    if ref.isdigit():
        upload = TraceUpload.objects.filter(pk=int(ref), team=team).first()
        if upload is not None:
            return "upload", upload, upload.kind
    raise ServiceError(f"Unknown trace '{ref}': use {', '.join(SHIPPED_TRACES)} or the id of a trace your "
                       "team uploaded.", field="trace")


def _resolve_policies(policies: list[str] | str) -> list[str]:
    from .horus.policies import POLICIES

    names = [policies] if isinstance(policies, str) else list(policies or [])
    if names == ["all"] or not names:
        return list(POLICIES)
    bad = [n for n in names if n not in POLICIES]
    if bad:
        raise ServiceError(f"Unknown policy '{bad[0]}'; use 'all' or some of {', '.join(POLICIES)}.",
                           field="policies")
    return list(dict.fromkeys(names))


def _active_simulations(team_id: int) -> int:
    return SimulationRun.objects.filter(team_id=team_id, status__in=SimulationRun.ACTIVE).count()


def _check_simulation_quota(*, team_id: int, jobs: int, gpus: int) -> None:
    """Per-team limits: simulations queued or running at once, and jobs x GPUs of one simulation."""
    quota = lock_team_quota(team_id)
    if jobs * gpus > quota.max_simulation_job_gpus:
        raise QuotaExceeded(
            f"Quota 'simulation size' would be exceeded: {jobs} jobs x {gpus} GPUs = {jobs * gpus} job-GPUs, the "
            f"limit is {quota.max_simulation_job_gpus} per simulation. Simulate fewer jobs or a smaller cluster.",
            quota="max_simulation_job_gpus")
    active = _active_simulations(team_id)
    if active >= quota.max_concurrent_simulations:
        raise QuotaExceeded(
            f"Quota 'concurrent simulations' reached: {active} of {quota.max_concurrent_simulations} simulations "
            "are queued or running; start this one when one of them has finished.",
            quota="max_concurrent_simulations")


def _simulation_size(label: str, upload: TraceUpload | None, kind: str, params, seed: int) -> tuple[int, int]:
    from .experiments import load_jobs, simulation_size

    if upload is not None:
        trace_jobs = upload.n_jobs
    elif params.method == "fill":  # every GPU pod of the shipped trace (parsed once per process)
        trace_jobs = len(load_jobs(label)[1])
    else:
        trace_jobs = None
    return simulation_size(kind, params, trace_jobs=trace_jobs, seed=seed)


def start_simulation(
    *,
    actor: AbstractBaseUser,
    team: Team,
    trace: str | int,
    policies: list[str] | str = "all",
    seed: int = 0,
    parameters: dict[str, Any] | None = None,
    enqueue: bool = True,
) -> SimulationRun:
    """Validate and queue a simulation (the `scheduling.run_simulation` task runs it, on the `simulations`
    queue). Refused (QuotaExceeded) past the team's concurrency or size limits."""
    from .experiments import ExperimentError, ExperimentParams

    _require_writer(actor, team.pk, "start simulations")
    label, upload, kind = _resolve_trace(team, trace)
    names = _resolve_policies(policies)
    try:
        params = ExperimentParams.from_dict(parameters).validate(kind)
    except ExperimentError as exc:
        raise ServiceError(str(exc), field=f"parameters.{exc.field}" if exc.field else "parameters") from None
    jobs, gpus = _simulation_size(label, upload, kind, params, int(seed))
    with transaction.atomic():
        _check_simulation_quota(team_id=team.pk, jobs=jobs, gpus=gpus)
        run = SimulationRun.objects.create(
            team=team, created_by=actor if actor is not None and actor.is_authenticated else None, trace=label,
            trace_upload=upload, policies=names, seed=int(seed), parameters=params.to_dict())
        if enqueue:
            from . import tasks

            def failed(exc):
                run.status, run.finished_at = SimulationRun.Status.FAILED, timezone.now()
                run.error = f"Could not be queued: the task broker is unreachable ({exc}). Start it again."
                SimulationRun.objects.filter(pk=run.pk, status=SimulationRun.Status.QUEUED).update(
                    status=run.status, finished_at=run.finished_at, error=run.error)

            _send_on_commit(lambda: tasks.run_simulation.delay(run.pk), what=f"simulation {run.pk}",
                            on_error=failed)
    return run


def simulation_inputs(params: dict[str, Any]) -> tuple[list["ProfileRecord"], Any]:
    """Profiles (stored, else the shipped seed file) and the predictor a simulation uses."""
    from .horus.profiles import load_profiles

    records = profile_records() if GpuProfile.objects.exists() else load_profiles()
    predictor = None
    if params.get("predictions", "predictor") == "predictor":
        _, predictor = ensure_active_predictor()
    return records, predictor


def execute_simulation(*, run_id: int) -> SimulationRun | None:
    """Run a queued simulation and store its results (idempotent: a run already taken is left alone)."""
    from .experiments import ExperimentError, load_jobs, run_experiment
    from .horus.traces import TraceFormatError

    n = SimulationRun.objects.filter(pk=run_id, status=SimulationRun.Status.QUEUED).update(
        status=SimulationRun.Status.RUNNING, started_at=timezone.now())
    if not n:
        log.info("simulation %s is not queued; not running it again", run_id)
        return None
    run = SimulationRun.objects.select_related("trace_upload").get(pk=run_id)
    try:
        kind = jobs = None
        if run.trace_upload is not None:
            with run.trace_upload.file.open("rb") as f:
                kind, jobs = load_jobs(run.trace_upload.name, io.BytesIO(f.read()))
        elif run.trace == "upload":
            raise ServiceError("The uploaded trace of this simulation was deleted.")
        records, predictor = simulation_inputs(run.parameters)
        results = run_experiment(trace=run.trace_upload.name if run.trace_upload else run.trace,
                                 policies=run.policies, seed=run.seed, params=run.parameters, profiles=records,
                                 predictor=predictor, kind=kind, jobs=jobs)
        if predictor is not None:
            pv = selectors.active_predictor_version()
            results["predictor"] = {**(results.get("predictor") or {}), "version": pv.version if pv else None}
    except (ServiceError, ExperimentError, TraceFormatError, ValueError) as exc:
        run.status, run.error = SimulationRun.Status.FAILED, str(exc)[:5000]
    except Exception as exc:  # keep the run's state truthful; the task logs the traceback
        log.exception("simulation %s failed", run_id)
        run.status, run.error = SimulationRun.Status.FAILED, f"{type(exc).__name__}: {exc}"[:5000]
    else:
        run.status, run.results = SimulationRun.Status.SUCCEEDED, results
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "results", "finished_at"])
    return run
