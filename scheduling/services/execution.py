"""Running a placed job on its GPU's worker, and settling the jobs of workers that died or went silent."""
from __future__ import annotations

import datetime as dt
import logging
import math
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.fieldtext import fit_to_field

from .. import gpu_isolation, job_process, selectors
from ..gpu_runtime import DurationReached, GpuRuntimeError, JobStopped, NoGpuError
from ..models import ERROR_TEXT_MAX_CHARS, GPU, GpuJob, Placement, placement_gpu_ids
from ..telemetry import job_measurement
from .jobs import gpu_job_limits
from .messages import announce_job_end
from .placement import (
    dispatch_placement,
    release_active_placement,
    request_placement_pass,
    unplace,
)
from .replacement import (
    measured_gpu_oom,
    oom_replacement_mem_mb,
    record_measured_profile,
    replace_job,
    replacement_request,
)

log = logging.getLogger(__name__)


def claim_job(*, job_id: int, placement_id: int, worker: str) -> GpuJob | None:
    """Mark a placed job running on this worker; None when it was cancelled, re-placed or already taken."""
    with transaction.atomic():
        job = GpuJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.state != GpuJob.State.PLACED:
            return None
        if not Placement.objects.filter(pk=placement_id, job=job, released_at__isnull=True).exists():
            return None
        job.state, job.started_at = GpuJob.State.RUNNING, timezone.now()
        job.worker = fit_to_field(GpuJob, "worker", worker)
        job.save(update_fields=["state", "started_at", "worker"])
    return job


@transaction.atomic
def finish_job(*, job_id: int, result: dict[str, Any] | None = None, error: str = "",
               observed: dict[str, Any] | None = None) -> GpuJob | None:
    """Record a job's outcome (finished, or failed with ``error``) and free its GPU. ``observed``: what the
    worker itself sampled of the job's process and the GPU it ran on (:meth:`JobWatch.observed`), the
    only figures a measured profile is made of (``result`` is the job child's own account)."""
    job = GpuJob.objects.select_for_update().filter(pk=job_id).first()
    if job is None:
        return None
    now = timezone.now()
    release_active_placement(job, now)
    if job.state in GpuJob.TERMINAL:  # cancelled while it ran: keep the cancellation
        return job
    job.finished_at = now
    job.result = result or {}
    if error:
        job.state, job.error = GpuJob.State.FAILED, error[:ERROR_TEXT_MAX_CHARS]
    else:
        job.state = GpuJob.State.FINISHED
        job.measured_util_pct, job.measured_mem_mb, job.measured_source = job_measurement(result or {})
    job.save()
    if job.state == GpuJob.State.FINISHED:
        try:
            with transaction.atomic():
                record_measured_profile(job, observed=observed)
        except Exception:  # a profile the predictor misses is no reason to lose the job's outcome
            log.exception("GPU job %s: its measured profile was not stored", job.pk)
    announce_job_end(job)
    request_placement_pass()
    return job


def recover_lost_jobs(*, now: dt.datetime | None = None) -> dict[str, list[int]]:
    """Jobs whose GPU's node stopped sending heartbeats: a placed job goes back to pending (it is placed
    again elsewhere), a running one fails naming the node. Their placements are released."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(seconds=selectors.node_stale_after_s())
    out: dict[str, list[int]] = {"requeued": [], "failed": []}
    for job_id, node_name in selectors.placements_on_silent_nodes(cutoff):
        with transaction.atomic():
            job = GpuJob.objects.select_for_update().filter(pk=job_id).first()
            if job is None or job.state not in (GpuJob.State.PLACED, GpuJob.State.RUNNING):
                continue
            release_active_placement(job, now)
            if job.state == GpuJob.State.PLACED:
                job.state, job.placed_at, job.policy = GpuJob.State.PENDING, None, ""
                job.save(update_fields=["state", "placed_at", "policy"])
                out["requeued"].append(job_id)
            else:
                job.state, job.finished_at = GpuJob.State.FAILED, now
                job.error = f"node {node_name} stopped sending heartbeats while the job ran (worker lost)"
                job.save(update_fields=["state", "finished_at", "error"])
                announce_job_end(job)
                out["failed"].append(job_id)
    if out["requeued"] or out["failed"]:
        log.warning("lost GPU jobs: %s", out)
    return out


RESTARTED_WORKER_ERROR = ("The GPU worker running this job restarted (it was killed or crashed mid-job); the job "
                          "did not finish. Resubmit it.")


def reconcile_restarted_gpu_worker(*, queues: list[str], started_before: dt.datetime) -> dict[str, list[int]]:
    """Settle the jobs a GPU worker's previous incarnation left behind when it died (SIGKILL, OOM, crash)
    and the worker came back on the same node, whose heartbeats never stopped (recover_lost_jobs only
    acts on silent nodes). Each GPU queue has one consumer, so a job still ``running`` on one of this
    worker's queues since before it started was being run by the dead incarnation: it fails, saying so,
    and frees its GPU. A job still ``placed`` there may have had its run_job message taken by the dead
    worker (it comes back only after the visibility timeout): it is dispatched again (after commit; a
    broker outage sends it back to pending); the claim makes a duplicate a no-op."""
    out: dict[str, list[int]] = {"failed": [], "redispatched": []}
    for placement_id, job_id, state, started_at, placed_at, queue in selectors.active_placements_on_queues(queues):
        if state == GpuJob.State.RUNNING and started_at is not None and started_at < started_before:
            with transaction.atomic():
                job = GpuJob.objects.select_for_update().filter(pk=job_id, state=GpuJob.State.RUNNING).first()
                if job is not None:
                    finish_job(job_id=job_id, error=RESTARTED_WORKER_ERROR)
                    out["failed"].append(job_id)
        elif state == GpuJob.State.PLACED and placed_at is not None and placed_at < started_before:
            dispatch_placement(job_id=job_id, placement_id=placement_id, queue=queue)
            out["redispatched"].append(job_id)
    if out["failed"] or out["redispatched"]:
        log.warning("GPU worker on %s restarted: %s", ", ".join(queues), out)
    return out


def _overran_message(job: GpuJob) -> str:
    high = gpu_job_limits()["duration_estimate_s"][1]
    return (f"Stopped: the job reached its declared duration (duration_estimate_s = {job.duration_estimate_s:g} s, "
            f"counted from its start, model loading included) before finishing its {job.iterations} "
            f"{'training steps' if job.kind == GpuJob.Kind.TRAIN else 'iterations'}. "
            f"Submit it again with a longer duration_estimate_s (at most {high:g} s) or fewer iterations.")


def execute_job(*, job_id: int, placement_id: int, worker: str, nvml: Any = None) -> GpuJob | None:
    """Run a placed job's model on its GPU (the Celery task `scheduling.run_job` calls this).

    With no GPU the job fails with "no NVIDIA GPU found (pynvml: ...)"; with no CUDA-capable
    runtime it fails naming what is missing.
    """
    placement = Placement.objects.select_related("gpu", "gpu__node").filter(pk=placement_id).first()
    if placement is None:
        return None
    gang = placement_gpu_ids(placement)
    index_of = dict(GPU.objects.filter(pk__in=gang).values_list("pk", "index"))
    devices = [index_of[g] for g in gang if g in index_of]
    slots = [gpu_isolation.GpuSlots(gpu_slots_dir(), d, slots=gpu_isolation.DEFAULT_SLOTS_PER_GPU) for d in devices]
    held: list[gpu_isolation.GpuSlots] = []
    try:
        for s in slots:  # a slot on every GPU of the job, or none
            s.acquire()
            held.append(s)
    except gpu_isolation.NoFreeSlot as exc:  # more jobs reached a GPU than it may run: place it again later
        for s in held:
            s.release()
        log.warning("GPU job %s: %s; back to pending", job_id, exc)
        unplace(job_id)
        return None
    try:
        return _execute_in_slot(job_id=job_id, placement=placement, worker=worker, nvml=nvml, devices=devices,
                                slot=held[0].slot)
    finally:
        for s in held:
            s.release()


def record_live_measurement(*, job_id: int, live: dict[str, float | None]) -> None:
    """Store a running job's latest per-process NVML figures (what the policies read as its load)."""
    if live.get("util_pct") is None and live.get("mem_mb") is None:
        return
    GpuJob.objects.filter(pk=job_id, state=GpuJob.State.RUNNING).update(
        live_util_pct=live.get("util_pct"), live_mem_mb=live.get("mem_mb"), live_sampled_at=timezone.now())


class JobWatch:
    """What the worker learns about its running job about once a second, and whether to stop it.

    ``report`` stores the child's per-process NVML figures and notices memory above the job's share
    (``oom``: the job is stopped and placed again with its measured memory); ``should_stop`` also
    stops it when it was cancelled or the interference rule asked for its re-placement. Its latest
    figures also decide whether a job whose runtime failed ran out of GPU memory (:func:`_gpu_oom_evidence`)."""

    def __init__(self, job_id: int, mem_limit_mb: float | None):
        self.job_id, self.mem_limit_mb = job_id, mem_limit_mb
        self.peak_mem_mb: float | None = None
        #: the latest figures: the job's process's GPU memory and its GPU's memory in use (all processes)
        self.last_mem_mb: float | None = None
        self.last_gpu_mem_used_mb: float | None = None
        self.util_samples: list[float] = []
        self.stop_reason: str | None = None
        self.detail: dict[str, Any] = {}

    def report(self, live: dict[str, float | None]) -> None:
        record_live_measurement(job_id=self.job_id, live=live)
        util = live.get("util_pct")
        if util is not None and math.isfinite(util):
            self.util_samples.append(float(util))
        gpu_used = live.get("gpu_mem_used_mb")
        if gpu_used is not None and math.isfinite(gpu_used):
            self.last_gpu_mem_used_mb = float(gpu_used)
        mem = live.get("mem_mb")
        if mem is None:
            return
        self.last_mem_mb = float(mem)
        self.peak_mem_mb = max(self.peak_mem_mb or 0.0, float(mem))
        if self.stop_reason is None and self.mem_limit_mb is not None and mem > self.mem_limit_mb:
            self.stop_reason = "oom"
            self.detail = {"measured_mem_mb": round(float(mem), 1), "mem_share_mb": round(self.mem_limit_mb, 1),
                           "seen_by": "nvml-process"}

    def observed(self) -> dict[str, float | int | None]:
        """The job process's figures as this worker sampled them (NVML, by the child's pid): its mean
        utilization and peak memory, and how many samples they rest on."""
        n = len(self.util_samples)
        return {"util_mean_pct": sum(self.util_samples) / n if n else None, "mem_peak_mb": self.peak_mem_mb,
                "samples": n}

    def should_stop(self) -> bool:
        if self.stop_reason is not None:
            return True
        job = GpuJob.objects.filter(pk=self.job_id).only("state", "replacements").first()
        if job is None or job.state == GpuJob.State.CANCELLED:
            return True
        request = replacement_request(job)
        if request is not None:
            self.stop_reason, self.detail = "interference", {k: v for k, v in request.items()
                                                             if k not in ("status", "at", "reason")}
            return True
        return False


def _replace_after_oom(job: GpuJob, watch: JobWatch, error: str | None = None,
                       evidence: dict[str, Any] | None = None) -> GpuJob | None:
    if watch.stop_reason == "oom":
        detail = dict(watch.detail)
    else:
        detail = {"seen_by": "runtime", "error": error or "", **(evidence or {})}
    detail.setdefault("mem_share_mb", watch.mem_limit_mb)
    mem = oom_replacement_mem_mb(peak_mem_mb=watch.peak_mem_mb, share_mb=watch.mem_limit_mb,
                                 predicted_mem_mb=job.predicted_mem_mb)
    return replace_job(job_id=job.pk, reason="oom", detail=detail, predicted_mem_mb=mem, finish=finish_job)


def _gpu_oom_evidence(watch: JobWatch, gpu: GPU) -> dict[str, Any] | None:
    """Whether a failed job ran out of GPU memory, on the worker's own last NVML samples of its process and
    its GPU (``replacement.measured_gpu_oom``), never on the failure's text or type: both come from the
    job's child, which runs the team's model, and its words ("out of memory" in a node's name) are the team's."""
    return measured_gpu_oom(process_mem_mb=watch.last_mem_mb, share_mb=watch.mem_limit_mb,
                            gpu_mem_used_mb=watch.last_gpu_mem_used_mb, gpu_memory_total_mb=gpu.memory_total_mb)


def gpu_slots_dir() -> Path:
    return Path(settings.SCHEDULING_GPU_SLOTS_DIR)


def job_process_limits() -> job_process.JobProcessLimits:
    """The job child's limits from settings (``SCHEDULING_JOB_*``; defaults in JobProcessLimits)."""
    defaults = job_process.JobProcessLimits()
    return job_process.JobProcessLimits(
        grace_s=float(getattr(settings, "SCHEDULING_JOB_KILL_GRACE_S", defaults.grace_s)),
        cpu_per_wall=float(getattr(settings, "SCHEDULING_JOB_CPU_PER_WALL_S", defaults.cpu_per_wall)),
        nofile=int(getattr(settings, "SCHEDULING_JOB_MAX_OPEN_FILES", defaults.nofile)),
        host_memory_mb=float(getattr(settings, "SCHEDULING_JOB_MAX_HOST_MEMORY_MB", defaults.host_memory_mb)),
        preexec=getattr(settings, "SCHEDULING_JOB_PREEXEC", defaults.preexec) or None,
        runtimes=dict(getattr(settings, "SCHEDULING_JOB_RUNTIMES", None) or {}))


def _execute_in_slot(*, job_id: int, placement: Placement, worker: str, nvml: Any, devices: list[int],
                     slot: int) -> GpuJob | None:
    job = claim_job(job_id=job_id, placement_id=placement.pk, worker=worker)
    if job is None:
        log.info("GPU job %s: not placed (cancelled or already run); nothing to do", job_id)
        return None
    mem_limit_mb = gpu_isolation.job_memory_limit_mb(job.predicted_mem_mb, placement.gpu.memory_total_mb)
    watch = JobWatch(job_id, mem_limit_mb)
    try:
        with job.model.file.open("rb") as f:
            data = f.read()
        # the model is parsed, compiled and run in a child process, never in this worker
        result = job_process.run_job_in_child(
            data, device_indices=devices, batch_size=job.batch_size, iterations=job.iterations,
            runtime=job.runtime, kind=job.kind, optimizer=job.optimizer, learning_rate=job.learning_rate,
            max_seconds=job.duration_estimate_s, mem_limit_mb=mem_limit_mb,
            predicted_util_pct=job.predicted_util_pct, limits=job_process_limits(), nvml=nvml,
            should_stop=watch.should_stop, report=watch.report)
    except DurationReached as exc:
        log.info("GPU job %s stopped on %s at its declared duration (%g s)", job_id, worker, exc.limit_s)
        return finish_job(job_id=job_id, error=_overran_message(job))
    except JobStopped:
        if watch.stop_reason == "oom":
            return _replace_after_oom(job, watch)
        if watch.stop_reason == "interference":
            # the request's figures; the job's measured load becomes its prediction for the next pass
            live = GpuJob.objects.filter(pk=job_id).values("live_util_pct", "live_mem_mb").first() or {}
            return replace_job(job_id=job_id, reason="interference", detail=watch.detail, finish=finish_job,
                               predicted_util_pct=watch.detail.get("job_measured_util_pct"),
                               predicted_mem_mb=live.get("live_mem_mb"))
        # cancel_job already recorded the cancellation and freed the GPU; finish_job keeps both
        log.info("GPU job %s cancelled while running on %s: stopped", job_id, worker)
        return finish_job(job_id=job_id, error="cancelled while running")
    except (NoGpuError, GpuRuntimeError) as exc:
        evidence = None if isinstance(exc, NoGpuError) else _gpu_oom_evidence(watch, placement.gpu)
        if evidence is not None:
            return _replace_after_oom(job, watch, str(exc)[:500], evidence)
        log.warning("GPU job %s failed on %s: %s", job_id, worker, exc)
        return finish_job(job_id=job_id, error=str(exc))
    except Exception as exc:  # the model itself failed: record it, do not retry forever
        evidence = _gpu_oom_evidence(watch, placement.gpu)
        if evidence is not None:
            return _replace_after_oom(job, watch, str(exc)[:500], evidence)
        log.exception("GPU job %s failed", job_id)
        return finish_job(job_id=job_id, error=f"{type(exc).__name__}: {exc}")
    gpu = placement.gpu
    return finish_job(job_id=job_id, result={**result, "isolation": {
        "gpu_slot": slot, "gpu_slots": gpu_isolation.DEFAULT_SLOTS_PER_GPU, "gpu_mem_limit_mb": mem_limit_mb,
        "gpu_indices": devices}}, observed={**watch.observed(), "gpu_model": gpu.gpu_model,
                                            "gpu_memory_total_mb": gpu.memory_total_mb})
