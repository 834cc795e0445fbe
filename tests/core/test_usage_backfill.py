"""Upgrading does not reset usage: the ledger's migration charges what existing rows already record."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from core.models import UsageCharge
from core.selectors import quota_usage

# dialect-sensitive (re-run on SQLite by scripts/test.sh): a data migration
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.dialect]

# Every table exists here; only the backfill (core 0003) and the append-only trigger after it (0004) are not
# applied, as on a database that held runs, placements and simulations before the ledger was charged.
BEFORE = [("core", "0002_initial"), ("tuning", "0001_initial"),
          ("scheduling", "0002_mark_active_simulations_dispatched")]


def test_the_ledger_migration_backfills_existing_usage():
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps
        team = old.get_model("core", "Team").objects.create(name="Old team", slug="old-team")
        model = old.get_model("core", "DLModel").objects.create(
            team=team, name="legacy", file_size=1, sha256="0" * 64, opset=17, ir_version=8, inputs=[],
            batch_size=1, total_flops=1, param_count=1, activation_bytes=1, conv_count=0, linear_count=0,
            activation_count=0, other_count=0)
        run = old.get_model("tuning", "TuningRun").objects.create(
            team=team, model=model, target={"kind": "llvm"}, target_kind="llvm", max_trials=8, status="succeeded",
            serial_remeasures=2, energy_joules=3600.0, energy_source="rapl", grid_intensity_g_per_kwh=500.0)
        task = old.get_model("tuning", "TuningTask").objects.create(run=run, index=0, name="t0")
        old.get_model("tuning", "Measurement").objects.bulk_create([
            old.get_model("tuning", "Measurement")(run=run, task=task, round_index=0, candidate_key=f"k{i}")
            for i in range(3)])
        assert not old.get_model("core", "UsageCharge").objects.filter(team_id=team.pk).exists()
    finally:  # forward to today's schema (the ledger's migration backfills on the way): later tests need it
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    charges = {c.kind: c for c in UsageCharge.objects.filter(team_id=team.pk)}
    assert UsageCharge.objects.filter(team_id=team.pk, kind="trials").count() == 2  # measured + re-measured
    assert sum(c.amount for c in UsageCharge.objects.filter(team_id=team.pk, kind="trials")) == 5
    energy = charges["energy_joules"]
    assert energy.amount == 3600.0 and energy.source == "measured" and energy.meter == "rapl"
    assert energy.grid_intensity_g_per_kwh == 500.0 and "legacy" in energy.label
    usage = quota_usage(team.pk)  # the ledger and the live rows agree: nothing counted twice
    assert usage.tuning_trials_this_month == 5 and usage.energy_kwh_this_month == pytest.approx(0.001)
