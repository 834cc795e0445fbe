"""Writes for the platform's energy model (one settings row, edited by staff)."""
from __future__ import annotations

import logging

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from core.exceptions import PermissionDenied, ServiceError
from core.models import ENERGY_LIMITS, EnergySettings
from core.selectors import energy_defaults

log = logging.getLogger(__name__)


def ensure_energy_settings() -> EnergySettings:
    """The settings row, created from the ENERGY_* defaults the first time (the admin edits it)."""
    row, _ = EnergySettings.objects.get_or_create(pk=EnergySettings.SINGLETON_PK, defaults=energy_defaults())
    return row


def check_energy_value(name: str, value) -> None:
    """``value`` is a number within ``ENERGY_LIMITS[name]`` (the one table of energy bounds)."""
    low, high = ENERGY_LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise ServiceError(f"{name} must be a number from {low:g} to {high:g}.", field=name)


@transaction.atomic
def update_energy_settings(*, actor: AbstractBaseUser, **values) -> EnergySettings:
    """Staff change the platform's energy model; new runs use it, finished runs keep theirs."""
    if not actor.is_staff:
        raise PermissionDenied("Only staff can change the energy settings.")
    unknown = set(values) - set(ENERGY_LIMITS)
    if unknown:
        raise ServiceError(f"Unknown energy setting(s): {', '.join(sorted(unknown))}.")
    row = ensure_energy_settings()
    row = EnergySettings.objects.select_for_update().get(pk=row.pk)
    for name, value in values.items():
        check_energy_value(name, value)
        setattr(row, name, float(value))
    row.updated_by = actor
    row.save()
    log.info("energy settings changed by %s: %s", actor, values)
    return row
