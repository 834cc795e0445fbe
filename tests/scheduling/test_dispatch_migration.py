"""Upgrading does not send a simulation twice: the migration that came with the fair queue marks the runs
already queued or running as dispatched (the worker had them), and leaves finished ones alone."""
from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from scheduling.models import SimulationRun

pytestmark = pytest.mark.django_db(transaction=True)  # the executor migrates back and forth

BEFORE = [("scheduling", "0001_initial")]


def test_the_migration_marks_queued_and_running_simulations_dispatched(team_a):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old_run = executor.loader.project_state(BEFORE).apps.get_model("scheduling", "SimulationRun")
        ids = {status: old_run.objects.create(team_id=team_a.pk, trace="philly", policies=["horus"],
                                              status=status).pk
               for status in ("queued", "running", "succeeded")}
        assert not old_run.objects.filter(dispatched_at__isnull=False).exists()
    finally:  # forward through 0002_mark_active_simulations_dispatched to today's schema
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    runs = {run.pk: run for run in SimulationRun.objects.filter(pk__in=ids.values())}
    for status in ("queued", "running"):
        assert runs[ids[status]].dispatched_at == runs[ids[status]].created_at
    assert runs[ids["succeeded"]].dispatched_at is None
