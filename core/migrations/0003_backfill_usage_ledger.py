"""Charge the usage ledger with what existing rows already record (carried over from the pre-squash chain).

On a fresh database there is nothing to charge; it matters for a database that held runs, placements
and simulations before the ledger existed, and tests/core/test_usage_backfill.py drives it that way.
Runs before the append-only trigger (0004): it dates each charge with an UPDATE the trigger refuses.
"""
from django.db import migrations
from django.db.models import Count
from django.db.models.functions import TruncMonth

PLACEMENT_CHARGE_PREFIX = "gpu_seconds:placement:"  # scheduling.models.PLACEMENT_CHARGE_PREFIX
MEASURED_METERS = ("rapl", "nvml")


def _source(meter):
    parts = [p for p in (meter or "").split("+") if p]
    return "measured" if parts and all(p in MEASURED_METERS for p in parts) else "modeled"


def backfill_ledger(apps, schema_editor):
    """Charge what existing rows already record, dated when it was spent, so upgrading keeps each team's
    usage, energy and carbon history (the month a charge lands in is the month the old reads used)."""
    UsageCharge = apps.get_model("core", "UsageCharge")
    TuningRun = apps.get_model("tuning", "TuningRun")
    Measurement = apps.get_model("tuning", "Measurement")
    Placement = apps.get_model("scheduling", "Placement")
    SimulationRun = apps.get_model("scheduling", "SimulationRun")
    dated = []  # (charge, when): auto_now_add stamps now on insert, so the date is written after

    def charge(when, **fields):
        if fields["amount"] > 0:
            dated.append((UsageCharge(**fields), when))

    for run in TuningRun.objects.select_related("model").iterator():
        label = f"tuning run {run.pk} of model {run.model.name}"
        refs = {"team_id": run.team_id, "model_id": run.model_id, "run_id": run.pk, "label": label[:300]}
        months = (Measurement.objects.filter(run_id=run.pk).annotate(month=TruncMonth("created_at"))
                  .values("month").annotate(n=Count("id")).order_by("month"))
        for row in months:
            charge(row["month"], kind="trials", amount=row["n"],
                   idempotency_key=f"backfill:tuning_run:{run.pk}:trials:{row['month']:%Y-%m}", **refs)
        charge(run.created_at, kind="trials", amount=run.serial_remeasures,
               idempotency_key=f"backfill:tuning_run:{run.pk}:serial_remeasures", **refs)
        charge(run.created_at, kind="energy_joules", amount=run.energy_joules or 0.0, meter=run.energy_source[:40],
               source=_source(run.energy_source), grid_intensity_g_per_kwh=run.grid_intensity_g_per_kwh,
               idempotency_key=f"backfill:tuning_run:{run.pk}:energy_joules", **refs)
    for p in Placement.objects.filter(released_at__isnull=False).select_related("job", "job__model").iterator():
        charge(p.released_at, kind="gpu_seconds", amount=(p.released_at - p.placed_at).total_seconds(),
               team_id=p.job.team_id, job_id=p.job_id, model_id=p.job.model_id,
               label=f"GPU job {p.job_id} of model {p.job.model.name} on GPU {p.gpu_id}"[:300],
               idempotency_key=f"{PLACEMENT_CHARGE_PREFIX}{p.pk}")
    for sim in SimulationRun.objects.filter(started_at__isnull=False).iterator():
        # simulations started before cost estimates existed are charged a unit per policy
        charge(sim.started_at, kind="simulation_units", amount=sim.cost_units or len(sim.policies or []) or 1,
               team_id=sim.team_id, simulation_id=sim.pk, idempotency_key=f"simulation:{sim.pk}",
               label=f"simulation {sim.pk} of the {sim.trace} trace"[:300])
    for row, when in dated:
        row.save()
        UsageCharge.objects.filter(pk=row.pk).update(created_at=when)


class Migration(migrations.Migration):

    dependencies = [
        ('core', '0002_initial'),
        ('scheduling', '0001_initial'),
        ('tuning', '0001_initial'),
    ]

    operations = [
        migrations.RunPython(backfill_ledger, migrations.RunPython.noop),
    ]
