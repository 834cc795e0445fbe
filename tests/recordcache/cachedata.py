"""Cache entries made the way the platform makes them: a TVM database written as a run's ``final`` (serially
re-measured) database, read back by ``publish.entries_from_run``."""
from __future__ import annotations

import os
from pathlib import Path

from tuning.engine.records import publish
from tuning.engine.workdir import DB_RECORDS, DB_WORKLOAD, FINAL_DIR
from tuning.engine.testing import tuning_database


def opt_in(team) -> None:
    """The team's owners opted in to publishing (off by default)."""
    from recordcache.models import TeamCacheSettings

    TeamCacheSettings.objects.update_or_create(team=team, defaults={"publish": True})


def give_final_database(run) -> None:
    """A run's work dir with a (non-empty) final database: it had a serial re-measure to publish."""
    from recordcache.adapters import run_work_dir

    d = run_work_dir(run.pk) / FINAL_DIR
    d.mkdir(parents=True, exist_ok=True)
    (d / DB_RECORDS).write_text("[0, []]\n")


def final_entries(work_dir: str, model, target, *, run_secs=(1e-3,), task_index: int = 0, n_records: int = 1,
                  first_id: int = 1, source_run=7) -> list[dict]:
    """Entries of a fake run whose final re-measure timed ``n_records`` schedules of one task at ``run_secs``."""
    wl, rec = tuning_database(model, target, run_secs=run_secs, task_index=task_index, n_records=n_records)
    d = os.path.join(work_dir, FINAL_DIR)
    os.makedirs(d, exist_ok=True)
    Path(d, DB_WORKLOAD).write_bytes(wl)
    Path(d, DB_RECORDS).write_bytes(rec)
    entries = publish.entries_from_run(work_dir, model, target)
    for i, e in enumerate(entries):
        e["id"], e["source_run"] = first_id + i, source_run
    return entries
