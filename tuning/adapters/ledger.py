"""A run's costs into the team's usage ledger, charged where the sink records them."""
from __future__ import annotations

from django.db import transaction
from django.db.models import Sum

from core.models import UsageCharge
from core.services import charge_usage
from tuning.models import Measurement, TuningRun

# Energy growth below this is left for the next charge (a heartbeat's rounding is not a charge).
MIN_ENERGY_CHARGE_J = 1e-6


def charge_run_usage(run_id: int) -> None:
    """Charge what the run has recorded beyond its earlier charges: trials (stored measurements plus
    final serial re-measures) and energy (the run's total so far).

    The run's row is locked while the totals are compared, and each charge's key names the total it
    brings the run to, so a retried or concurrent call never charges the same trials or joules twice."""
    with transaction.atomic():
        run = (TuningRun.objects.select_for_update(of=("self",)).filter(pk=run_id)
               .values("team_id", "model_id", "model__name", "energy_joules", "energy_source", "serial_remeasures",
                       "grid_intensity_g_per_kwh").first())
        if run is None:
            return
        charged = dict(UsageCharge.objects.filter(run_id=run_id).values("kind").order_by()
                       .annotate(total=Sum("amount")).values_list("kind", "total"))
        label = f"tuning run {run_id} of model {run['model__name']}"
        refs = {"team_id": run["team_id"], "model_id": run["model_id"], "run_id": run_id}
        trials = Measurement.objects.filter(run_id=run_id).count() + run["serial_remeasures"]
        new_trials = trials - round(charged.get(UsageCharge.Kind.TRIALS, 0.0))
        if new_trials > 0:
            charge_usage(kind=UsageCharge.Kind.TRIALS, amount=new_trials, label=label,
                         idempotency_key=f"tuning_run:{run_id}:trials:{trials}", **refs)
        energy = run["energy_joules"] or 0.0
        new_joules = energy - charged.get(UsageCharge.Kind.ENERGY_JOULES, 0.0)
        if new_joules > MIN_ENERGY_CHARGE_J:
            charge_usage(kind=UsageCharge.Kind.ENERGY_JOULES, amount=new_joules, label=label,
                         meter=run["energy_source"], grid_intensity_g_per_kwh=run["grid_intensity_g_per_kwh"],
                         idempotency_key=f"tuning_run:{run_id}:energy_joules:{energy:.6f}", **refs)
