"""Stopping a running job and placing it again: when it outgrew its memory share (``oom``) or when its
measured utilization, above its prediction, pushed its GPU past the interference bound (``interference``),
and feeding what was measured back to the predictor.

Re-placement is a RESTART, not a live migration: the job's child is stopped between two steps, its
placement is released (the GPU time it held is charged), and it goes back to pending with its measured
figures as its new prediction, so the next placement pass (the configured policy) places it where they
fit. The work done before the stop is lost (the platform keeps no checkpoint of a job's state); the job
runs its iterations again from the start. Each re-placement is appended to ``GpuJob.replacements`` with
its reason and figures; after :data:`MAX_REPLACEMENTS` the job fails instead, saying so.

Who pays: a restart is only ever of the job that caused it (its own memory, or, for interference, the job
measured furthest over its prediction: ``horus.live_rule``; its partners are never restarted for it), so
the GPU time its placement held, the lost work and the time to run again are all charged to its own team.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.fieldtext import fit_to_field

from .. import adapters, selectors
from ..models import ERROR_TEXT_MAX_CHARS, GpuJob, GpuProfile
from .placement import release_active_placement, request_placement_pass

log = logging.getLogger(__name__)

MAX_REPLACEMENTS = 3
#: A job that ran out of GPU memory before any per-process figure exceeded its share (the runtime's own
#: allocation failed first) is re-placed asking this multiple of the share it had.
OOM_GROWTH = 1.5
#: GpuProfile.source of the profiles finished jobs measured (labelled ``measured``: the predictor's
#: training data takes every stored profile, these included).
MEASURED_JOB_SOURCE = GpuProfile.MEASURED_JOB_SOURCE
REQUESTED = "requested"
#: ops whose bodies graph features do not count (how often a Loop runs, which If branch, is data): a
#: model with them may do far more, or less, than its features say, so its figures are no profile
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


def _done(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries or [] if e.get("status") != REQUESTED]


def replace_job(*, job_id: int, reason: str, detail: dict[str, Any], finish: Callable[..., GpuJob | None],
                predicted_util_pct: float | None = None, predicted_mem_mb: float | None = None) -> GpuJob | None:
    """Stop-and-re-place bookkeeping for a job its worker has stopped: back to pending with the new
    prediction, the reason recorded; or, cancelled meanwhile or past MAX_REPLACEMENTS, settled by
    ``finish`` (``execution.finish_job``) with an error. None if the job is gone."""
    finish_job = finish
    with transaction.atomic():
        job = GpuJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            return None
        if job.state != GpuJob.State.RUNNING:  # cancelled meanwhile: settle as a stop
            return finish_job(job_id=job_id, error="cancelled while running")
        done = _done(job.replacements)
        now = timezone.now()
        if len(done) >= MAX_REPLACEMENTS:
            return finish_job(job_id=job_id, error=fit_to_field(GpuJob, "error", (
                f"Stopped ({reason}: {detail}) after being re-placed {len(done)} times already "
                f"(at most {MAX_REPLACEMENTS}); not placed again.")[:ERROR_TEXT_MAX_CHARS]))
        placement = release_active_placement(job, now)
        entry = {"status": "done", "at": now.isoformat(), "reason": reason, **detail,
                 "from_gpu": placement.gpu_id if placement else None,
                 "gang_gpu_ids": list(placement.gang_gpu_ids) if placement else [],
                 "predicted_util_pct_before": job.predicted_util_pct,
                 "predicted_mem_mb_before": job.predicted_mem_mb}
        if predicted_util_pct is not None:
            job.predicted_util_pct = round(float(predicted_util_pct), 3)
        if predicted_mem_mb is not None:
            job.predicted_mem_mb = round(float(predicted_mem_mb), 1)
        entry.update(predicted_util_pct_after=job.predicted_util_pct, predicted_mem_mb_after=job.predicted_mem_mb)
        job.replacements = [*done, entry]
        job.state, job.placed_at, job.started_at, job.policy, job.worker = GpuJob.State.PENDING, None, None, "", ""
        job.live_util_pct = job.live_mem_mb = job.live_sampled_at = None
        job.save()
        request_placement_pass()
    log.warning("GPU job %s stopped and re-placed (%s): %s", job_id, reason, detail)
    return job


#: A runtime failure is a GPU out-of-memory only when the worker's own NVML figures at failure say memory
#: ran out: the job's process holding at least this fraction of its memory share, or its GPU at least this
#: fraction of its capacity with less free than the job's share still allowed it to take. The failure's text
#: is never evidence: it carries the team's words (an ONNX node's name, an op's message), and "out of
#: memory" there must not buy a re-placement with more memory.
OOM_MEASURED_FRACTION = 0.9


def measured_gpu_oom(*, process_mem_mb: float | None, share_mb: float | None, gpu_mem_used_mb: float | None,
                     gpu_memory_total_mb: float | None) -> dict[str, Any] | None:
    """The worker's evidence that a job's failure was its GPU's memory running out (the figures, for the
    re-placement's record), or None when its last samples show memory to spare (or there are none)."""
    if process_mem_mb is not None and share_mb and process_mem_mb >= OOM_MEASURED_FRACTION * share_mb:
        return {"measured_by": "nvml-process", "measured_mem_mb": round(float(process_mem_mb), 1),
                "mem_share_mb": round(float(share_mb), 1)}
    if gpu_mem_used_mb is not None and gpu_memory_total_mb \
            and gpu_mem_used_mb >= OOM_MEASURED_FRACTION * gpu_memory_total_mb:
        free_mb = float(gpu_memory_total_mb) - float(gpu_mem_used_mb)
        # a GPU its partners filled is the job's out-of-memory only if it could not give the job its share
        room_mb = float(share_mb) - float(process_mem_mb or 0.0) if share_mb else None
        if room_mb is None or free_mb < room_mb:
            return {"measured_by": "nvml-device", "gpu_mem_used_mb": round(float(gpu_mem_used_mb), 1),
                    "gpu_memory_total_mb": round(float(gpu_memory_total_mb), 1)}
    return None


def oom_replacement_mem_mb(*, peak_mem_mb: float | None, share_mb: float | None,
                           predicted_mem_mb: float | None) -> float:
    """The memory a job that exceeded its share is placed again with: what it was measured using when
    that is over its share, else (the runtime failed first) its share (or prediction) x OOM_GROWTH."""
    base = share_mb if share_mb is not None else (predicted_mem_mb or 0.0)
    if peak_mem_mb is not None and peak_mem_mb > base:
        return float(peak_mem_mb)
    return float(base * OOM_GROWTH)


def request_interference_replacements(*, now: dt.datetime | None = None, tolerance_pct: float = 5.0,
                                      min_runtime_s: float = 60.0) -> list[int]:
    """Apply the live re-placement rule (``horus.live_rule``) to the running jobs' measured load: on a GPU
    over the bound whose predicted load was within it and whose every job was measured, the job measured
    furthest over what its prediction reads beside its partners (the cause) gets a re-placement request,
    which its worker acts on at its next stop check (about a second); a cause that cannot move leaves every
    job there running. Returns the job ids asked."""
    now = now or timezone.now()
    gpus = selectors.schedulable_gpus(now)
    if not gpus:
        return []
    # per-process figures only (a job without one counts at its prediction): a device sample is capped at
    # 100 % and says nothing of which job diverged
    active = list(selectors.active_placements_on([g.pk for g in gpus]))
    bound = list(selectors.active_pod_bindings_on([g.pk for g in gpus], now))
    cluster = adapters.cluster_state(gpus, active=active, samples={}, bound=bound)
    # counted at their prediction, what they really do unknown: their GPUs move nobody
    unmeasured = ({adapters.job_view(p.job).job_id for p in active if p.job.live_util_pct is None}
                  | {adapters.pod_view(b).job_id for b in bound})
    moves = adapters.interference_moves(cluster.state.view(), now.timestamp(), tolerance_pct=tolerance_pct,
                                        min_runtime_s=min_runtime_s, unmeasured=unmeasured)
    asked = []
    for move in moves:
        if move.job_id.startswith("pod:"):  # a Kubernetes pod: kube-scheduler's to move, not ours
            continue
        with transaction.atomic():
            job = GpuJob.objects.select_for_update().filter(pk=int(move.job_id), state=GpuJob.State.RUNNING).first()
            if job is None or any(e.get("status") == REQUESTED for e in job.replacements or []):
                continue
            job.replacements = [*(job.replacements or []), {
                "status": REQUESTED, "at": now.isoformat(), "reason": "interference", **move.why(),
                "to_gpu": cluster.gpus[move.to_gpu].pk}]
            job.save(update_fields=["replacements"])
            asked.append(job.pk)
    if asked:
        log.warning("interference: re-placement requested for GPU jobs %s", asked)
    return asked


def replacement_request(job: GpuJob) -> dict[str, Any] | None:
    """The job's pending re-placement request, if any."""
    return next((e for e in reversed(job.replacements or []) if e.get("status") == REQUESTED), None)


def _figure(value: Any, low: float, high: float | None) -> float | None:
    """``value`` as a float when it is a finite number within ``[low, high]``, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if value < low or (high is not None and value > high):
        return None
    return float(value)


def record_measured_profile(job: GpuJob, *, observed: dict[str, Any] | None = None) -> GpuProfile | None:
    """A finished one-GPU inference job's own per-process figures as a profile labelled measured
    (``MEASURED_JOB_SOURCE``), which the predictor's next training takes with the others. Training
    jobs and gangs are not recorded: the predictor's features describe one inference replica.

    The figures are the worker's own samples of the job's process (``observed``, from
    ``execution.JobWatch``) on the GPU it was placed on, never the job child's account of itself: the
    child runs the team's model, and what it answers is the team's word, not a measurement the
    predictor may learn from. No worker samples, figures out of physical bounds, or a model with control
    flow (:data:`CONTROL_FLOW_OPS`: its features do not say what ran): no profile."""
    if job.kind != GpuJob.Kind.INFERENCE or job.num_gpus != 1 or not observed:
        return None
    gpu_model = observed.get("gpu_model")
    total_mb = _figure(observed.get("gpu_memory_total_mb"), 0.0, None)
    util = _figure(observed.get("util_mean_pct"), 0.0, 100.0)
    mem = _figure(observed.get("mem_peak_mb"), 0.0, total_mb)
    if not gpu_model or util is None or mem is None or mem <= 0.0:
        return None
    features = adapters.model_features(job.model, job.batch_size)
    if CONTROL_FLOW_OPS & set(features.get("op_histogram") or {}):
        return None
    from .predictors import record_profiles

    record = adapters.measured_profile_record(
        model=f"team{job.team_id}/{job.model.name}", batch_size=job.batch_size, gpu_model=gpu_model,
        features=features, util_pct=util, peak_mem_mb=mem,
        power_w=None, source=MEASURED_JOB_SOURCE,
        meta={"job": job.pk, "measured": "nvml-process (the worker's samples of the job's process)",
              "samples": observed.get("samples"), "predicted_util_pct": job.predicted_util_pct,
              "predicted_mem_mb": job.predicted_mem_mb,
              "note": "the job's own process while it ran; partners on its GPU may have stretched it"})
    (row,) = record_profiles(records=[record], dl_model=job.model)
    return row
