"""The cluster's costs into the team's usage ledger (core.services.charge_usage), once per event."""
from __future__ import annotations

from django.utils import timezone

from core.models import UsageCharge
from core.services import charge_usage

from .. import selectors
from ..models import (PLACEMENT_CHARGE_PREFIX, POD_BINDING_CHARGE_PREFIX, GpuJob, Placement, PodBinding, SimulationRun,
                      placement_gpu_ids)


def charge_placement(placement: Placement, job: GpuJob) -> None:
    """The GPU-seconds a released placement held its GPUs (a gang: each of them), charged to the job's team."""
    if placement.released_at is None:
        return
    seconds = (placement.released_at - placement.placed_at).total_seconds() * len(placement_gpu_ids(placement))
    charge_usage(team_id=job.team_id, kind=UsageCharge.Kind.GPU_SECONDS, amount=max(0.0, seconds),
                 idempotency_key=f"{PLACEMENT_CHARGE_PREFIX}{placement.pk}", job_id=job.pk, model_id=job.model_id,
                 label=f"GPU job {job.pk} of model {job.model.name} on GPU {placement.gpu_id}")


def placement_deleted(sender, instance: Placement, **kwargs) -> None:
    """pre_delete receiver (connected in SchedulingConfig.ready): a placement deleted before it was released
    (its job, model or team deleted by staff while the job ran) is charged the GPU time it held until now;
    otherwise that time would leave the month's usage with the row."""
    if instance.released_at is not None:
        return  # charged when it was released
    job = GpuJob.objects.filter(pk=instance.job_id).select_related("model").first()
    if job is None:
        return
    seconds = (timezone.now() - instance.placed_at).total_seconds() * len(placement_gpu_ids(instance))
    charge_usage(team_id=job.team_id, kind=UsageCharge.Kind.GPU_SECONDS, amount=max(0.0, seconds),
                 idempotency_key=f"{PLACEMENT_CHARGE_PREFIX}{instance.pk}", job_id=job.pk, model_id=job.model_id,
                 label=f"GPU job {job.pk} of model {job.model.name} on GPU {instance.gpu_id} (deleted while placed)")


def charge_pod_binding(binding: PodBinding) -> None:
    """The GPU-seconds a released (or expired) pod binding held its GPU, charged to its model's team: from
    its bind to its release, at most to its expiry (past it the binding counted as load no more)."""
    if binding.released_at is None:
        return
    seconds = selectors.pod_binding_held_s(binding)
    charge_usage(team_id=binding.model.team_id, kind=UsageCharge.Kind.GPU_SECONDS, amount=seconds,
                 idempotency_key=f"{POD_BINDING_CHARGE_PREFIX}{binding.pk}", model_id=binding.model_id,
                 label=f"Kubernetes pod {binding.pod_namespace}/{binding.pod_name} of model {binding.model.name} "
                       f"on GPU {binding.gpu_id}")


def charge_simulation(run: SimulationRun) -> None:
    """A simulation that runs costs its estimate in simulation units (``horus.cost``), the unit its quota uses."""
    charge_usage(team_id=run.team_id, kind=UsageCharge.Kind.SIMULATION_UNITS, amount=run.cost_units,
                 idempotency_key=f"simulation:{run.pk}", simulation_id=run.pk,
                 label=f"simulation {run.pk} of the {run.trace} trace ({', '.join(run.policies or [])})")
