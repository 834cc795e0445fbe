"""Reads for the GPU cluster, its jobs and simulations; team data is scoped to the caller."""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ImproperlyConfigured
from django.db.models import CharField, Count, Exists, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Cast, Concat
from django.utils import timezone
from django_celery_results.models import TaskResult

from core.models import UsageCharge
from core.selectors import energy_model, month_start, teams_for_user
from tuning.engine.compile.target_schema import valid_mcpu, valid_triple

from . import adapters
from .models import (
    GPU,
    PLACEMENT_CHARGE_PREFIX,
    POD_BINDING_CHARGE_PREFIX,
    GpuJob,
    GpuProfile,
    GpuTelemetry,
    Node,
    Placement,
    PodBinding,
    PredictorVersion,
    SimulationRun,
    TraceUpload,
)


def node_stale_after_s() -> float:
    return float(settings.SCHEDULING_NODE_STALE_S)


def telemetry_fresh_s() -> float:
    """A GPU's latest sample counts as its current load for this long (Gandiva-like policies)."""
    return float(settings.SCHEDULING_TELEMETRY_FRESH_S)


# --- cluster (visible to every authenticated user) ----------------------------------------

def nodes() -> QuerySet[Node]:
    return Node.objects.annotate(gpu_count=Count("gpus")).order_by("name")


def gpus() -> QuerySet[GPU]:
    latest = GpuTelemetry.objects.filter(gpu=OuterRef("pk")).order_by("-ts")
    return (GPU.objects.select_related("node")
            .annotate(latest_util_pct=Subquery(latest.values("util_pct")[:1]),
                      latest_mem_used_mb=Subquery(latest.values("mem_used_mb")[:1]),
                      latest_ts=Subquery(latest.values("ts")[:1]),
                      active_jobs=Count("placements", filter=Q(placements__released_at__isnull=True),
                                        distinct=True))
            .order_by("node__name", "index"))


def telemetry() -> QuerySet[GpuTelemetry]:
    return GpuTelemetry.objects.select_related("gpu", "gpu__node").order_by("-ts", "-id")


def is_node_fresh(node: Node, now: dt.datetime | None = None) -> bool:
    now = now or timezone.now()
    return node.last_seen is not None and node.last_seen >= now - dt.timedelta(seconds=node_stale_after_s())


def nodes_serving(queues: list[str]) -> list[Node]:
    """The nodes whose CPU queue is one of `queues`."""
    wanted = set(queues)
    return [n for n in Node.objects.all() if n.cpu_queue in wanted]


def cpus_serving(queues: list[str]) -> set[tuple[str, str]]:
    """The (LLVM CPU name, triple) pairs the nodes whose CPU queue is one of `queues` registered ("" when a
    node has not named its CPU)."""
    return {(n.cpu_mcpu, n.cpu_triple) for n in nodes_serving(queues)}


def registered_cpus() -> dict[str, str]:
    """``{LLVM CPU name: triple}`` the nodes registered: the only CPU names a run's target may name (the
    first triple in sorted order when nodes of one CPU name several). Names that fail the engine's
    patterns (a row written around ``register_node``) are left out."""
    out: dict[str, str] = {}
    for mcpu, triple in Node.objects.exclude(cpu_mcpu="").order_by("cpu_mcpu", "cpu_triple").values_list(
            "cpu_mcpu", "cpu_triple"):
        if valid_mcpu(mcpu) and (not triple or valid_triple(triple)):
            out.setdefault(mcpu, triple)
    return out


def most_registered_cores() -> int:
    """The most CPU cores a registered node reported (0 when none did)."""
    return max(Node.objects.values_list("cpu_cores", flat=True), default=0) or 0


def schedulable_gpus(now: dt.datetime | None = None) -> list[GPU]:
    """GPUs that may get new jobs: present, not drained, on a live undrained node, whose queue a worker serves."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(seconds=node_stale_after_s())
    qs = (GPU.objects.select_related("node")
          .filter(drained=False, present=True, node__drained=False, node__last_seen__gte=cutoff)
          .order_by("node__name", "index"))
    return [g for g in qs if g.queue in (g.node.queues or [])]


def latest_samples(gpu_ids: list[int], *, since: dt.datetime) -> dict[int, GpuTelemetry]:
    out: dict[int, GpuTelemetry] = {}
    for s in GpuTelemetry.objects.filter(gpu_id__in=gpu_ids, ts__gte=since).order_by("gpu_id", "-ts"):
        out.setdefault(s.gpu_id, s)
    return out


def heartbeat_fanout_targets(*, exclude: str) -> list[tuple[str, str]]:
    """``(node, queue)`` for every other live node: a queue only that node's workers consume."""
    out = []
    for node in Node.objects.exclude(name=exclude).order_by("name"):
        if not is_node_fresh(node):
            continue
        own = [q for q in (node.queues or []) if f".{node.name}." in q or q.endswith(f".{node.name}")]
        preferred = [q for q in own if q.startswith("telemetry.")] + [q for q in own if q.endswith(".cpu")] + own
        if preferred:
            out.append((node.name, preferred[0]))
    return out


def active_placements_on(gpu_ids: list[int]) -> QuerySet[Placement]:
    """Unreleased placements holding any of these GPUs (a gang's GPUs are all on its lead GPU's node) with
    their jobs, oldest first (the order they were placed)."""
    nodes = GPU.objects.filter(pk__in=gpu_ids).values("node_id")
    return (Placement.objects.filter(released_at__isnull=True, gpu__node_id__in=nodes)
            .select_related("job", "job__model").order_by("placed_at", "pk"))


#: the binding TTLs bind accepts: a finite number of seconds, a minute to a leap year (0 is no "never": it
#: would make every pod free and invisible the moment it is bound; past a few thousand years dates overflow)
EXTENDER_BINDING_TTL_RANGE_S = (60.0, 366 * 86400.0)


def extender_binding_ttl_s() -> float:
    """SCHEDULER_EXTENDER_BINDING_TTL_S, how long a new binding counts unreleased (ImproperlyConfigured
    when it is out of :data:`EXTENDER_BINDING_TTL_RANGE_S`)."""
    ttl = float(settings.SCHEDULER_EXTENDER_BINDING_TTL_S)
    low, high = EXTENDER_BINDING_TTL_RANGE_S
    if not low <= ttl <= high:  # also NaN
        raise ImproperlyConfigured(
            f"SCHEDULER_EXTENDER_BINDING_TTL_S must be a number of seconds from {low:g} to {high:g} (how long "
            f"a bound pod counts as load and cost unless released); it is {ttl!r}.")
    return ttl


def active_pod_bindings_on(gpu_ids: list[int], now: dt.datetime | None = None) -> QuerySet[PodBinding]:
    """Unreleased pod bindings on these GPUs not yet expired, oldest first."""
    now = now or timezone.now()
    return (PodBinding.objects.filter(released_at__isnull=True, gpu_id__in=gpu_ids, expires_at__gte=now)
            .order_by("bound_at", "pk"))


def expired_pod_bindings(now: dt.datetime, pod_uid: str | None = None) -> QuerySet[PodBinding]:
    """Unreleased pod bindings past their expiry (they count as load no more), oldest first; of one pod
    when ``pod_uid`` is given."""
    rows = PodBinding.objects.filter(released_at__isnull=True, expires_at__lt=now)
    if pod_uid is not None:
        rows = rows.filter(pod_uid=pod_uid)
    return rows.order_by("bound_at", "pk")


def active_pod_bindings(pod_uid: str, now: dt.datetime | None = None) -> list[PodBinding]:
    now = now or timezone.now()
    return list(PodBinding.objects.filter(pod_uid=pod_uid, released_at__isnull=True, expires_at__gte=now)
                .select_related("gpu").order_by("gpu__index"))


def placements_on_silent_nodes(cutoff: dt.datetime) -> list[tuple[int, str]]:
    """``(job id, node name)`` of placed or running jobs whose node has sent no heartbeat since ``cutoff``."""
    return list(Placement.objects.filter(released_at__isnull=True,
                                         job__state__in=[GpuJob.State.PLACED, GpuJob.State.RUNNING])
                .filter(Q(gpu__node__last_seen__lt=cutoff) | Q(gpu__node__last_seen__isnull=True))
                .values_list("job_id", "gpu__node__name"))


def active_placements_on_queues(queues: list[str]) -> list[tuple]:
    """``(placement id, job id, job state, started_at, placed_at, queue)`` of unreleased placements there."""
    return list(Placement.objects.filter(released_at__isnull=True, queue__in=list(queues))
                .values_list("pk", "job_id", "job__state", "job__started_at", "job__placed_at", "queue"))


def has_pending_jobs() -> bool:
    return GpuJob.objects.filter(state=GpuJob.State.PENDING).exists()


def is_job_cancelled(job_id: int) -> bool:
    return GpuJob.objects.filter(pk=job_id, state=GpuJob.State.CANCELLED).exists()


def fleet_gpu_model() -> str | None:
    """The most common GPU model of the registered, present GPUs (predictions are made for it)."""
    row = (GPU.objects.filter(present=True).values("gpu_model").annotate(n=Count("pk")).order_by("-n", "gpu_model")
           .first())
    return row["gpu_model"] if row else None


# --- profiles and predictors ------------------------------------------------------------------

def profiles() -> QuerySet[GpuProfile]:
    return GpuProfile.objects.all().order_by("model_name", "gpu_model", "batch_size", "source")


def profiles_for_user(user: AbstractBaseUser) -> QuerySet[GpuProfile]:
    """The profiles a user may read: the shared ones (seed set, `profile_gpu` of the zoo: no registered
    model) and those of their teams' models; staff, all. A profile of a team's model (a finished job's
    ``measured:job`` figures) names the team, its model, batch size and job: the other teams' stay hidden,
    also once the model is deleted (its profiles keep the figures with no model)."""
    qs = profiles()
    if getattr(user, "is_staff", False):
        return qs
    shared = Q(dl_model__isnull=True) & ~Q(source=GpuProfile.MEASURED_JOB_SOURCE)
    return qs.filter(shared | Q(dl_model__team__in=teams_for_user(user)))


def predictor_versions() -> QuerySet[PredictorVersion]:
    return PredictorVersion.objects.all().order_by("-version")


def active_predictor_version() -> PredictorVersion | None:
    return PredictorVersion.objects.filter(active=True).first()


def latest_predictor_version() -> PredictorVersion | None:
    return PredictorVersion.objects.order_by("-version").first()


TRAIN_PREDICTOR_TASK = "scheduling.train_predictor"
# Celery's states (django-celery-results rows) -> what the API says.
_TRAINING_STATES = {"PENDING": "queued", "RECEIVED": "queued", "STARTED": "running", "RETRY": "running",
                    "SUCCESS": "succeeded", "FAILURE": "failed", "REVOKED": "failed"}


@dataclass(frozen=True)
class PredictorTraining:
    """A requested predictor training, as its Celery task's result row tells it."""

    task_id: str
    state: str  # queued, running, succeeded, failed
    version: int | None  # the trained version, once succeeded
    error: str
    requested_at: dt.datetime
    finished_at: dt.datetime | None


def _training(row: TaskResult) -> PredictorTraining:
    state = _TRAINING_STATES.get(row.status, "queued")
    try:
        result = json.loads(row.result) if row.result else None
    except ValueError:
        result = None
    version = result if state == "succeeded" and isinstance(result, int) else None
    error = ""
    if state == "failed":
        message = result.get("exc_message") if isinstance(result, dict) else None
        error = " ".join(map(str, message)) if isinstance(message, (list, tuple)) else str(message or row.status)
        if isinstance(result, dict) and result.get("exc_type"):
            error = f"{result['exc_type']}: {error}"
    return PredictorTraining(task_id=row.task_id, state=state, version=version, error=error,
                             requested_at=row.date_created, finished_at=row.date_done if state in
                             ("succeeded", "failed") else None)


def predictor_training(task_id: str) -> PredictorTraining | None:
    row = TaskResult.objects.filter(task_id=task_id, task_name=TRAIN_PREDICTOR_TASK).first()
    return _training(row) if row is not None else None


def predictor_training_in_flight(*, within_s: float) -> bool:
    """Whether a training requested in the last ``within_s`` seconds is still queued or running."""
    since = timezone.now() - dt.timedelta(seconds=within_s)
    return TaskResult.objects.filter(task_name=TRAIN_PREDICTOR_TASK, date_created__gte=since,
                                     status__in=["PENDING", "RECEIVED", "STARTED", "RETRY"]).exists()


def profile_records(qs: QuerySet[GpuProfile] | None = None) -> list[adapters.ProfileRecord]:
    """Stored profiles (all, or ``qs``) as the predictor's records, in insertion order."""
    qs = qs if qs is not None else GpuProfile.objects.all()
    return adapters.profile_records_from_rows(qs.order_by("pk"))


def has_profiles() -> bool:
    return GpuProfile.objects.exists()


# --- team-scoped ------------------------------------------------------------------------------

def jobs_for_user(user: AbstractBaseUser) -> QuerySet[GpuJob]:
    return GpuJob.objects.filter(team__in=teams_for_user(user)).select_related("model", "team", "predictor_version")


def placements_for_user(user: AbstractBaseUser) -> QuerySet[Placement]:
    return (Placement.objects.filter(job__team__in=teams_for_user(user))
            .select_related("job", "gpu", "gpu__node").order_by("-placed_at", "-id"))


def active_placement(job: GpuJob) -> Placement | None:
    return Placement.objects.filter(job=job, released_at__isnull=True).select_related("gpu", "gpu__node").first()


def simulations_for_user(user: AbstractBaseUser) -> QuerySet[SimulationRun]:
    return SimulationRun.objects.filter(team__in=teams_for_user(user)).select_related("team", "trace_upload")


def traces_for_user(user: AbstractBaseUser) -> QuerySet[TraceUpload]:
    return TraceUpload.objects.filter(team__in=teams_for_user(user)).select_related("team")


# --- GPU-hours ---------------------------------------------------------------------------------

def gpu_hours_used(team_id: int, since: dt.datetime, now: dt.datetime | None = None) -> float:
    """GPU-hours held by the team's placements and extender-bound pods since ``since``: released ones from
    the usage ledger (charged in full when released; deleted jobs included), active ones so far, and a
    released one no charge covers (written some other way, or a pod binding expired and not yet settled)
    from its row."""
    now = now or timezone.now()
    charged = UsageCharge.objects.filter(team_id=team_id, kind=UsageCharge.Kind.GPU_SECONDS, created_at__gte=since)
    total = charged.aggregate(s=Sum("amount"))["s"] or 0.0
    charge_of_placement = UsageCharge.objects.filter(idempotency_key=Concat(
        Value(PLACEMENT_CHARGE_PREFIX), Cast(OuterRef("pk"), output_field=CharField()), output_field=CharField()))
    rows = (Placement.objects.filter(job__team_id=team_id)
            .filter(Q(released_at__isnull=True) | Q(released_at__gte=since))
            .filter(~Exists(charge_of_placement))
            .values_list("placed_at", "released_at", "gang_gpu_ids"))
    for placed_at, released_at, gang in rows:
        start = max(placed_at, since)
        end = released_at or now
        if end > start:
            total += (end - start).total_seconds() * max(1, len(gang or []))
    # the pods the extender bound for the team's models: active ones so far (one row per GPU), and a
    # released or expired one no charge covers yet
    charge_of_binding = UsageCharge.objects.filter(idempotency_key=Concat(
        Value(POD_BINDING_CHARGE_PREFIX), Cast(OuterRef("pk"), output_field=CharField()), output_field=CharField()))
    bindings = (PodBinding.objects.filter(model__team_id=team_id, expires_at__gte=since)
                .filter(Q(released_at__isnull=True) | Q(released_at__gte=since))
                .filter(~Exists(charge_of_binding)).values_list("bound_at", "released_at", "expires_at"))
    for bound_at, released_at, expires_at in bindings:
        end = min(released_at or now, expires_at)
        start = max(bound_at, since)
        if end > start:
            total += (end - start).total_seconds()
    return total / 3600.0


def pod_binding_held_s(binding: PodBinding) -> float:
    """Seconds a released pod binding held its GPU: bind to release, at most to its expiry (never negative)."""
    end = min(binding.released_at or binding.expires_at, binding.expires_at)
    return max(0.0, (end - binding.bound_at).total_seconds())


def pod_gpu_hours_reserved(team_id: int, now: dt.datetime) -> float:
    """GPU-hours the team's active pod bindings may still hold: each counts as load until released or until
    its expiry, and kube-scheduler never says when a pod ends, so it reserves the rest of it."""
    reserved = 0.0
    for bound_at, expires_at in (PodBinding.objects.filter(model__team_id=team_id, released_at__isnull=True,
                                                           expires_at__gte=now)
                                 .values_list("bound_at", "expires_at")):
        reserved += max(0.0, (expires_at - max(now, bound_at)).total_seconds())
    return reserved / 3600.0


def gpu_hours_reserved(team_id: int, now: dt.datetime, states=GpuJob.ACTIVE) -> float:
    """GPU-hours the team's jobs in ``states`` have declared and not used yet (a running job is stopped
    at its declared duration counted from its start, so it reserves what is left of it; others all of it),
    plus what its bound pods may still hold (:func:`pod_gpu_hours_reserved`)."""
    reserved = pod_gpu_hours_reserved(team_id, now) * 3600.0
    for estimate, started_at, num_gpus in GpuJob.objects.filter(team_id=team_id, state__in=states).values_list(
            "duration_estimate_s", "started_at", "num_gpus"):
        elapsed = (now - started_at).total_seconds() if started_at else 0.0
        reserved += max(0.0, estimate - elapsed) * num_gpus
    return reserved / 3600.0


def gpu_hours_committed(team_id: int, now: dt.datetime | None = None) -> float:
    """GPU-hours used this month (running placements so far, finished ones in full) plus what the team's
    active jobs have reserved and not yet used."""
    now = now or timezone.now()
    return gpu_hours_used(team_id, month_start(now), now) + gpu_hours_reserved(team_id, now)


def active_simulations(team_id: int) -> int:
    return SimulationRun.objects.filter(team_id=team_id, status__in=SimulationRun.ACTIVE).count()


def quota_usage(team_id: int, since: dt.datetime) -> dict:
    """The scheduling app's part of core.selectors.quota_usage (registered in apps.py)."""
    return {"gpu_hours_this_month": gpu_hours_used(team_id, since),
            "concurrent_simulations": active_simulations(team_id)}


# --- energy saved by co-location ---------------------------------------------------------------

@dataclass(frozen=True)
class ColocationSaving:
    gpu_seconds: float  # GPU-seconds exclusive placement would have kept other GPUs busy
    joules: float  # modeled: gpu_seconds x the GPU's power limit (else the platform's board watts)


COLOCATION_BASIS = ("modeled: while k jobs share a GPU, exclusive placement would keep k GPUs busy, so each "
                    "sharer saves (k-1)/k of that time x the GPU's power limit (else the platform's GPU board "
                    "watts); interference slowdown is not subtracted")


def colocation_savings_by_team_month(team_ids: list[int], *, now: dt.datetime | None = None
                                     ) -> dict[tuple[int, dt.date], ColocationSaving]:
    """Energy co-location saved on the real cluster, per team and calendar month of the job's placement."""
    now = now or timezone.now()
    gpu_ids = set(Placement.objects.filter(job__team_id__in=team_ids).values_list("gpu_id", flat=True))
    if not gpu_ids:
        return {}
    board_watts = energy_model().gpu_board_watts
    watts = {pk: (limit or board_watts) for pk, limit in GPU.objects.filter(pk__in=gpu_ids)
             .values_list("pk", "power_limit_w")}
    # Every placement on those GPUs counts, other teams' too: sharing with them saves as much.
    placements = (Placement.objects.filter(gpu_id__in=gpu_ids)
                  .values_list("pk", "gpu_id", "job__team_id", "placed_at", "released_at"))
    by_gpu: dict[int, list[tuple]] = {}
    for pk, gpu_id, team_id, placed_at, released_at in placements:
        end = released_at or now
        if end > placed_at:
            by_gpu.setdefault(gpu_id, []).append((pk, team_id, placed_at, end))
    saved_s: dict[int, float] = {}
    for rows in by_gpu.values():
        events = sorted([(start, 1, pk) for pk, _, start, _ in rows] + [(end, -1, pk) for pk, _, _, end in rows],
                        key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
        active: set[int] = set()
        last = None
        for at, kind, pk in events:
            if last is not None and len(active) > 1 and at > last:
                share = (at - last).total_seconds() * (len(active) - 1) / len(active)
                for p in active:
                    saved_s[p] = saved_s.get(p, 0.0) + share
            last = at
            (active.add if kind == 1 else active.discard)(pk)
    wanted = set(team_ids)
    out: dict[tuple[int, dt.date], list[float]] = {}
    for gpu_id, rows in by_gpu.items():
        for pk, team_id, placed_at, _ in rows:
            seconds = saved_s.get(pk, 0.0)
            if team_id not in wanted or seconds <= 0:
                continue
            local = timezone.localtime(placed_at) if timezone.is_aware(placed_at) else placed_at
            key = (team_id, local.date().replace(day=1))
            acc = out.setdefault(key, [0.0, 0.0])
            acc[0] += seconds
            acc[1] += seconds * watts[gpu_id]
    return {k: ColocationSaving(gpu_seconds=v[0], joules=v[1]) for k, v in out.items()}
