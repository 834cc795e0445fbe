"""Mark simulations already queued or running as dispatched (carried over from the pre-squash chain).

The fair queue (SimulationRun.dispatched_at) sends only undispatched runs; rows older than it were sent.
"""
from django.db import migrations, models


def mark_active_runs_dispatched(apps, schema_editor):
    """Runs queued or running before the fair queue existed were already sent to the worker."""
    SimulationRun = apps.get_model("scheduling", "SimulationRun")
    SimulationRun.objects.filter(status__in=["queued", "running"]).update(dispatched_at=models.F("created_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0001_initial'),
    ]

    operations = [
        migrations.RunPython(mark_active_runs_dispatched, migrations.RunPython.noop),
    ]
