"""The usage ledger's only write: ``charge_usage`` inserts one charge, once per incurring event."""
from __future__ import annotations

import logging

from django.db import IntegrityError, transaction

from core.fieldtext import fit_to_field
from core.models import UsageCharge

log = logging.getLogger(__name__)

MEASURED_METERS = ("rapl", "nvml")


def energy_source_of(meter: str) -> str:
    """A meter name ("rapl", "rapl+nvml", "modeled", "") as the ledger's measured/modeled."""
    parts = [p for p in (meter or "").split("+") if p]
    return (UsageCharge.EnergySource.MEASURED if parts and all(p in MEASURED_METERS for p in parts)
            else UsageCharge.EnergySource.MODELED)


def charge_usage(*, team_id: int, kind: str, amount: float, idempotency_key: str, label: str,
                 meter: str = "", grid_intensity_g_per_kwh: float | None = None, model_id: int | None = None,
                 run_id: int | None = None, job_id: int | None = None, simulation_id: int | None = None
                 ) -> UsageCharge | None:
    """Record that the team spent ``amount`` of ``kind``; None when there is nothing to charge or this
    ``idempotency_key`` was charged already (a retried task charges nothing twice)."""
    if kind not in UsageCharge.Kind.values:
        raise ValueError(f"unknown usage kind {kind!r}")
    if not amount or amount <= 0:
        return None
    is_energy = kind == UsageCharge.Kind.ENERGY_JOULES
    charge = UsageCharge(
        team_id=team_id, kind=kind, amount=float(amount), idempotency_key=idempotency_key,
        label=fit_to_field(UsageCharge, "label", label),
        source=energy_source_of(meter) if is_energy else "", meter=fit_to_field(UsageCharge, "meter", meter or ""),
        grid_intensity_g_per_kwh=grid_intensity_g_per_kwh if is_energy else None,
        model_id=model_id, run_id=run_id, job_id=job_id, simulation_id=simulation_id)
    try:
        with transaction.atomic():  # a savepoint: a duplicate key leaves the caller's transaction usable
            charge.save()
    except IntegrityError:
        if UsageCharge.objects.filter(idempotency_key=idempotency_key).exists():
            log.info("usage %s already charged; not charging it again", idempotency_key)
            return None
        raise
    return charge
