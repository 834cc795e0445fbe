"""Writes for team quotas: staff change the limits; every check of a limit locks the team's row first."""
from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from core.exceptions import PermissionDenied, ServiceError
from core.models import Quota

QUOTA_FIELDS = ("max_concurrent_runs", "tuning_trials_per_month", "gpu_hours_per_month", "energy_kwh_per_month",
                "max_concurrent_simulations", "max_simulation_job_gpus", "max_simulation_units")


@transaction.atomic
def update_quota(*, actor: AbstractBaseUser, quota: Quota, **limits) -> Quota:
    if not actor.is_staff:
        raise PermissionDenied("Only staff can change quotas.")
    unknown = set(limits) - set(QUOTA_FIELDS)
    if unknown:
        raise ServiceError(f"Unknown quota field(s): {', '.join(sorted(unknown))}.")
    for name, value in limits.items():
        if value is None or value < 0:
            raise ServiceError(f"{name} must be a non-negative number.", field=name)
        setattr(quota, name, value)
    quota.save()
    return quota


def lock_team_quota(team_id: int) -> Quota:
    """Serialize quota checks for one team until the caller's transaction ends.

    PostgreSQL: a row lock (SELECT ... FOR UPDATE). SQLite ignores FOR UPDATE,
    so we also write the row: that takes SQLite's database write lock, and a
    concurrent checker waits at its own write until we commit.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("lock_team_quota must be called inside transaction.atomic()")
    quota, _ = Quota.objects.get_or_create(team_id=team_id)
    quota = Quota.objects.select_for_update().get(pk=quota.pk)
    Quota.objects.filter(pk=quota.pk).update(updated_at=timezone.now())
    return quota
