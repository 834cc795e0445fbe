"""GPU jobs: the request's bounds, the monthly GPU-hour quota, submitting and cancelling."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from core.exceptions import ConflictError, QuotaExceeded, ServiceError
from core.models import DLModel
from core.permissions import require_team_writer
from core.services import lock_team_quota, require_ready

from .. import selectors
from ..models import GPU_JOB_LIMITS, GpuJob
from .messages import announce_job_end
from .placement import release_active_placement, request_placement_pass
from .predictors import predict_job


def default_job_estimate_s() -> float:
    return float(settings.SCHEDULING_DEFAULT_JOB_ESTIMATE_S)


def gpu_job_limits() -> dict[str, tuple[float, float]]:
    """GPU_JOB_LIMITS with the declared duration capped by SCHEDULING_MAX_JOB_DURATION_S."""
    low, high = GPU_JOB_LIMITS["duration_estimate_s"]
    cap = float(settings.SCHEDULING_MAX_JOB_DURATION_S)
    return {**GPU_JOB_LIMITS, "duration_estimate_s": (low, max(low, min(high, cap)))}


#: A training step keeps the forward pass's activations for the backward pass and holds gradients and the
#: optimizer's state beside the weights: its memory is modeled as this multiple of the inference
#: prediction (the predictor is trained on inference profiles) until measured figures replace it.
TRAIN_MEMORY_FACTOR = 3.0


def _check_job_request(*, batch_size, iterations, duration_estimate_s: float, runtime: str, num_gpus=1,
                       kind: str = GpuJob.Kind.INFERENCE, optimizer: str = GpuJob.Optimizer.ADAM,
                       learning_rate: float | None = None) -> None:
    limits = gpu_job_limits()
    for name, value in (("batch_size", batch_size), ("iterations", iterations),
                        ("duration_estimate_s", duration_estimate_s), ("num_gpus", num_gpus)):
        low, high = limits[name]
        integral = name != "duration_estimate_s"
        if isinstance(value, bool) or not isinstance(value, int if integral else (int, float)) \
                or not low <= value <= high:
            unit = "" if integral else " s"
            raise ServiceError(f"{name} must be {'an integer' if integral else 'a number'} from {low:g}{unit} "
                               f"to {high:g}{unit}.", field=name)
    if runtime not in GpuJob.Runtime.values:
        raise ServiceError(f"runtime must be one of {', '.join(GpuJob.Runtime.values)}.", field="runtime")
    if kind not in GpuJob.Kind.values:
        raise ServiceError(f"kind must be one of {', '.join(GpuJob.Kind.values)}.", field="kind")
    if optimizer not in GpuJob.Optimizer.values:
        raise ServiceError(f"optimizer must be one of {', '.join(GpuJob.Optimizer.values)}.", field="optimizer")
    if learning_rate is not None:
        low, high = limits["learning_rate"]
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) \
                or not low <= learning_rate <= high:
            raise ServiceError(f"learning_rate must be a number from {low:g} to {high:g}.", field="learning_rate")
    if kind == GpuJob.Kind.TRAIN and runtime == GpuJob.Runtime.ONNXRUNTIME:
        raise ServiceError("a training job runs on TVM (Relax training); onnxruntime-training is not installed. "
                           "Use runtime auto or tvm.", field="runtime")


def check_gpu_quota(*, team_id: int, hours: float, what: str = "") -> None:
    """QuotaExceeded when ``hours`` more GPU time would take the team past its monthly GPU-hour quota
    (used this month plus what its active jobs and bound pods reserve). Call inside a transaction: the
    team's quota row stays locked until it commits. ``what`` says, for the message, what asked."""
    quota = lock_team_quota(team_id)
    committed = selectors.gpu_hours_committed(team_id)
    if committed + hours > quota.gpu_hours_per_month + 1e-9:
        left = max(0.0, quota.gpu_hours_per_month - committed)
        raise QuotaExceeded(
            f"Quota 'GPU hours per month' would be exceeded: {hours:.3f} h requested{what}, {left:.3f} h left of "
            f"{quota.gpu_hours_per_month:g} h this month.", quota="gpu_hours_per_month")


def submit_job(
    *,
    actor: AbstractBaseUser,
    model: DLModel,
    batch_size: int,
    iterations: int = 100,
    duration_estimate_s: float | None = None,
    runtime: str = GpuJob.Runtime.AUTO,
    num_gpus: int = 1,
    kind: str = GpuJob.Kind.INFERENCE,
    optimizer: str = GpuJob.Optimizer.ADAM,
    learning_rate: float | None = None,
    place: bool = True,
) -> GpuJob:
    """Queue a GPU job with its predicted utilization and memory. Refused (QuotaExceeded) when its
    declared GPU time would exceed the team's monthly GPU-hour quota. The job is stopped (failed) when it
    reaches that duration, and the quota is checked again when it is placed. ``num_gpus`` > 1 is a gang:
    that many GPUs of one node, placed together or not at all, each running a replica of the model at
    ``batch_size`` (data-parallel); it reserves ``num_gpus`` x its duration in GPU hours. ``kind``
    ``train`` runs ``iterations`` training steps with ``optimizer`` (at ``learning_rate``, default its own) instead of inferences (TVM only); its
    memory is predicted as :data:`TRAIN_MEMORY_FACTOR` x the inference prediction (modeled)."""
    require_team_writer(actor, model.team_id, "submit GPU jobs")
    require_ready(model)
    estimate = duration_estimate_s if duration_estimate_s is not None else default_job_estimate_s()
    _check_job_request(batch_size=batch_size, iterations=iterations, duration_estimate_s=estimate,
                       runtime=runtime, num_gpus=num_gpus, kind=kind, optimizer=optimizer,
                       learning_rate=learning_rate)
    estimate = float(estimate)
    # Never trains: with no predictor yet it is the analytic estimate, and a training is queued.
    prediction = predict_job(model=model, batch_size=batch_size)
    if kind == GpuJob.Kind.TRAIN:
        prediction["mem_mb"] = round(prediction["mem_mb"] * TRAIN_MEMORY_FACTOR, 1)
    with transaction.atomic():
        check_gpu_quota(team_id=model.team_id, hours=estimate * num_gpus / 3600.0)
        job = GpuJob.objects.create(
            team_id=model.team_id, model=model, created_by=actor, batch_size=batch_size, runtime=runtime,
            iterations=iterations, duration_estimate_s=estimate, num_gpus=num_gpus, kind=kind, optimizer=optimizer,
            learning_rate=learning_rate, predicted_util_pct=prediction["util_pct"],
            predicted_mem_mb=prediction["mem_mb"], predicted_for_gpu_model=prediction["gpu_model"],
            predictor_version=prediction["predictor_version"],
        )
        if place:
            request_placement_pass()
    return job


@transaction.atomic
def cancel_job(*, actor: AbstractBaseUser, job: GpuJob) -> GpuJob:
    job = GpuJob.objects.select_for_update().get(pk=job.pk)
    require_team_writer(actor, job.team_id, "cancel GPU jobs")
    if job.state in GpuJob.TERMINAL:
        raise ConflictError(f"GPU job {job.pk} is already {job.state}.")
    now = timezone.now()
    freed = release_active_placement(job, now)
    job.state, job.finished_at = GpuJob.State.CANCELLED, now
    job.save(update_fields=["state", "finished_at"])
    announce_job_end(job)
    if freed is not None:
        request_placement_pass()
    return job
