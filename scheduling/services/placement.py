"""Placement passes: pending GPU jobs onto schedulable GPUs by a policy, and the one way to ask for a pass.

Every service that frees or adds capacity (a job submitted, cancelled or finished, a node or GPU
undrained) and the heartbeat ask for a pass through :func:`request_placement_pass`; the pass itself
(:func:`place_pending_jobs`) runs in the ``scheduling.place_pending`` task or the staff API.
"""
from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.models import DLModel, Quota
from core.selectors import month_start

from .. import adapters, selectors
from ..models import GPU, GpuJob, Placement
from .messages import PLACE_PENDING, RUN_JOB, announce_job_end, send_after_commit
from .usage import charge_placement

log = logging.getLogger(__name__)


def default_policy() -> str:
    return settings.SCHEDULING_POLICY


def request_placement_pass(*, only_if_pending: bool = False) -> None:
    """Queue one placement pass after the current transaction commits (the only way to start one
    asynchronously). On a broker outage pending jobs wait for the heartbeat's next request."""
    if only_if_pending and not selectors.has_pending_jobs():
        return
    send_after_commit(PLACE_PENDING, what="a placement pass")


def release_active_placement(job: GpuJob, now: dt.datetime) -> Placement | None:
    """Free the job's GPU (its unreleased placement, locked); the released placement or None."""
    placement = Placement.objects.select_for_update().filter(job=job, released_at__isnull=True).first()
    if placement is not None:
        placement.released_at = now
        placement.save(update_fields=["released_at"])
        charge_placement(placement, job)  # the GPU time it held, in the team's usage ledger
    return placement


def unplace(job_id: int) -> None:
    """A placed job nobody will run: back to pending, its GPU freed (the next pass places it again)."""
    with transaction.atomic():
        job = GpuJob.objects.select_for_update().filter(pk=job_id, state=GpuJob.State.PLACED).first()
        if job is not None:
            release_active_placement(job, timezone.now())
            job.state, job.placed_at, job.policy = GpuJob.State.PENDING, None, ""
            job.save(update_fields=["state", "placed_at", "policy"])


def dispatch_placement(*, job_id: int, placement_id: int, queue: str) -> None:
    """Send ``scheduling.run_job`` to the placement's GPU queue after commit; if the broker refuses it
    the job goes back to pending (the next placement pass retries)."""
    send_after_commit(RUN_JOB, args=[job_id, placement_id], queue=queue, what=f"GPU job {job_id} to {queue}",
                      on_error=lambda exc: unplace(job_id))


def build_cluster_state(gpus: list[GPU], *, now: dt.datetime) -> adapters.LiveCluster:
    """The live cluster as the policies see it: its GPUs, their active placements, the Kubernetes pods the
    scheduler extender bound to them, and fresh samples."""
    ids = [g.pk for g in gpus]
    fresh = selectors.latest_samples(ids, since=now - dt.timedelta(seconds=selectors.telemetry_fresh_s()))
    return adapters.cluster_state(gpus, active=selectors.active_placements_on(ids), samples=fresh,
                                  bound=selectors.active_pod_bindings_on(ids, now))


class GpuHourBudget:
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
                "reserved": selectors.gpu_hours_reserved(team_id, self.now,
                                                         states=(GpuJob.State.PLACED, GpuJob.State.RUNNING)),
            }
        return self.teams[team_id]

    def verdict(self, job: GpuJob) -> str:
        """``"place"``, ``"wait"`` or ``"refuse"``."""
        t, hours = self._team(job.team_id), job.duration_estimate_s * job.num_gpus / 3600.0
        if t["used"] + t["reserved"] + hours <= t["limit"] + 1e-9:
            return "place"
        return "wait" if t["used"] + hours <= t["limit"] + 1e-9 else "refuse"

    def charge(self, job: GpuJob) -> None:
        self._team(job.team_id)["reserved"] += job.duration_estimate_s * job.num_gpus / 3600.0

    def refusal(self, job: GpuJob) -> str:
        t = self._team(job.team_id)
        return (f"Quota 'GPU hours per month' exhausted when the job was due to be placed: "
                f"{t['used']:.3f} h of {t['limit']:g} h already used this month, "
                f"{job.duration_estimate_s * job.num_gpus / 3600:.3f} h declared. It was not run.")


def _refuse_at_placement(job: GpuJob, budget: GpuHourBudget, now: dt.datetime) -> None:
    job.state, job.finished_at, job.error = GpuJob.State.FAILED, now, budget.refusal(job)
    job.save(update_fields=["state", "finished_at", "error"])
    announce_job_end(job)
    log.warning("GPU job %s refused at placement: %s", job.pk, job.error)


def _lock_gpus(gpus: list[GPU]) -> None:
    """Serialize placement passes: row locks on every schedulable GPU (PostgreSQL); on SQLite,
    which ignores FOR UPDATE, a write takes the database write lock for the transaction."""
    ids = sorted(g.pk for g in gpus)
    list(GPU.objects.select_for_update().filter(pk__in=ids).order_by("pk").values_list("pk", flat=True))
    if connection.vendor == "sqlite":
        GPU.objects.filter(pk__in=ids).update(present=True)


def _locked_gpus(now: dt.datetime) -> list[GPU]:
    """The schedulable GPUs, locked; re-read after the lock (another pass may have drained some)."""
    candidates = selectors.schedulable_gpus(now)
    if not candidates:
        return []
    _lock_gpus(candidates)
    wanted = {c.pk for c in candidates}
    return [g for g in selectors.schedulable_gpus(now) if g.pk in wanted]


def _locked_pending(limit: int | None) -> list[GpuJob]:
    """Pending jobs, oldest first, locked (a job another pass holds is skipped), with their models."""
    qs = (GpuJob.objects.select_for_update(skip_locked=True).filter(state=GpuJob.State.PENDING)
          .order_by("created_at", "pk"))
    pending = list(qs[:limit] if limit else qs)
    models = {m.pk: m for m in DLModel.objects.filter(pk__in={j.model_id for j in pending})}
    for j in pending:
        j.model = models[j.model_id]
    return pending


def place_pending_jobs(*, policy: str | None = None, limit: int | None = None,
                       now: dt.datetime | None = None) -> list[Placement]:
    """Place pending jobs (oldest first) with ``policy`` on the schedulable GPUs.

    Each placed job gets a Placement, state ``placed``, and a ``scheduling.run_job`` message on its
    GPU's queue (``measure.<node>.gpu<i>``), sent after commit. Concurrent passes serialize on the
    GPU rows, and the database refuses a second active placement of a job.
    """
    name = policy or default_policy()
    now = now or timezone.now()
    pol = adapters.make_live_policy(name, now)
    placed: list[Placement] = []
    with transaction.atomic():
        gpus = _locked_gpus(now)
        pending = _locked_pending(limit) if gpus else []
        if not pending:
            return []
        cluster = build_cluster_state(gpus, now=now)
        views = [adapters.job_view(j) for j in pending]
        cluster.expect_workload(views)
        budget = GpuHourBudget(now)
        for job, view in zip(pending, views):
            verdict = budget.verdict(job)
            if verdict == "refuse":
                _refuse_at_placement(job, budget, now)
            if verdict != "place":
                continue
            placement = _place_one(job, view, pol, cluster, name=name, now=now)
            if placement is not None:
                budget.charge(job)
                placed.append(placement)
    return placed


def _place_one(job: GpuJob, view, pol, cluster: adapters.LiveCluster, *, name: str,
               now: dt.datetime) -> Placement | None:
    """Ask the policy for a GPU for one job; record and dispatch the placement it chose."""
    chosen = cluster.choose(pol, view, now)
    if chosen is None:
        return None
    gpus, score = chosen
    gpu = gpus[0]  # the lead: its queue's worker runs the job on all of them
    try:
        with transaction.atomic():
            placement = Placement.objects.create(job=job, gpu=gpu, policy=name, score=score, queue=gpu.queue,
                                                 placed_at=now,
                                                 gang_gpu_ids=[g.pk for g in gpus] if len(gpus) > 1 else [])
    except IntegrityError:  # already actively placed: never twice
        log.warning("job %s already has an active placement; skipped", job.pk)
        return None
    job.state, job.policy, job.placed_at = GpuJob.State.PLACED, name, now
    job.save(update_fields=["state", "policy", "placed_at"])
    dispatch_placement(job_id=job.pk, placement_id=placement.pk, queue=placement.queue)
    return placement
