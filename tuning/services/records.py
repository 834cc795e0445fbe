"""A run's tuning records and files: import of an existing TVM database, and removal of the run's files
once its row is deleted."""
from __future__ import annotations

import logging

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from core.exceptions import ConflictError, ServiceError
from core.permissions import require_team_writer
from tuning import adapters
from tuning.models import TuningRun

from .runs import CONTROL_RUNS, locked

log = logging.getLogger(__name__)

MAX_LISTED_ERRORS = 5
# every refusal starts so (the dashboard lists the reasons after it, one a line)
IMPORT_REFUSED_PREFIX = "Records refused, nothing was imported: "


def import_database(*, actor: AbstractBaseUser, run: TuningRun, workloads: bytes, records: bytes) -> int:
    """Import an existing TVM JSON tuning database into a run that has not measured anything yet.

    Records are parsed by TVM in a sandboxed subprocess and refused unless their workload is one of
    the run's tasks and their trace holds only MetaSchedule's own instructions and annotations
    (tuning.engine.records.check, check_replay). At most the run's remaining trials; nothing is written on refusal.
    Accepted records are seeds only: their latencies are dropped, and the engine builds and measures
    each one itself as a trial of this run (a Measurement, charged to the trial quota) before it
    counts or seeds the search.
    """
    require_team_writer(actor, run.team_id, CONTROL_RUNS)
    _check_importable(run)
    budget = max(0, run.max_trials - run.trials_done)
    try:
        adapters.precheck(workloads, records, max_records=budget)  # cheap bounds before TVM sees anything
    except adapters.RecordError as exc:
        raise ServiceError(f"{IMPORT_REFUSED_PREFIX}{exc}.", field="records") from None
    checked = _checked_by_tvm(run, workloads, records, budget)
    with transaction.atomic():
        run = locked(run)
        _check_importable(run)
        adapters.write_imported(str(adapters.run_work_dir(run.pk)), checked)
        run.options = {**run.options, "imported_records": len(checked)}
        run.save(update_fields=["options"])
    return len(checked)


def _checked_by_tvm(run: TuningRun, workloads: bytes, records: bytes, budget: int) -> list[str]:
    """The record lines to write: what TVM's checker accepts, re-checked here (``recheck_output``: task
    index and trace only); ServiceError (nothing imported) otherwise."""
    with run.model.file.open("rb") as f:
        model_bytes = f.read()
    try:
        checked = adapters.check_import(model_bytes, run, workloads, records, budget)
    except (adapters.WorkerError, adapters.WorkerTimeout) as exc:
        log.warning("run %s: record import check failed: %s", run.pk, str(exc)[-500:])
        raise ServiceError("The tuning records could not be parsed by TVM (the checker failed on them); "
                           "nothing was imported.", field="records") from None
    if not isinstance(checked, dict):
        checked = {"errors": ["the checker returned no answer"]}
    if checked.get("errors"):
        errs = [str(e)[:400] for e in checked["errors"]] if isinstance(checked["errors"], list) else ["refused"]
        more = f" (and {len(errs) - MAX_LISTED_ERRORS} more)" if len(errs) > MAX_LISTED_ERRORS else ""
        raise ServiceError(IMPORT_REFUSED_PREFIX + "; ".join(errs[:MAX_LISTED_ERRORS]) + more,
                           field="records")
    try:
        # the checker parsed hostile bytes in C++: trust nothing it returns
        lines = adapters.recheck_output(checked.get("records"))
        if len(lines) > budget:
            raise adapters.RecordError("Checked import", "the checker returned more records than the budget")
    except adapters.RecordError as exc:
        log.error("run %s: the record checker returned a refused record: %s", run.pk, exc)
        raise ServiceError(f"{IMPORT_REFUSED_PREFIX}{exc}.", field="records") from None
    return lines


def _check_importable(run: TuningRun) -> None:
    if run.status not in (TuningRun.Status.QUEUED, TuningRun.Status.PAUSED):
        raise ConflictError("Records can be imported only into a queued or paused run.")
    work_dir = adapters.run_work_dir(run.pk)
    records_path = work_dir / "database_tuning_record.json"
    if (records_path.exists() and records_path.stat().st_size) or adapters.has_imported(str(work_dir)):
        raise ConflictError("This run already has tuning records; import into a new run.")


def delete_run_files_on_commit(run: TuningRun) -> None:
    """Remove the run's files (work dir with TVM's database, records zip, tuned module) once the deletion
    of its row commits; a rolled-back deletion keeps them, so no run loses its files while it exists."""
    artifacts = [f for f in (run.records_file, run.module_file) if f]
    run_id = run.pk

    def delete():
        adapters.delete_run_files(run_id)
        for f in artifacts:
            f.storage.delete(f.name)

    transaction.on_commit(delete)


def run_deleting(sender, instance: TuningRun, **kwargs) -> None:
    """pre_delete receiver (connected in TuningConfig.ready): what the run recorded beyond its charges
    (the energy its heartbeats wrote since the sink last charged) is charged before the row goes, so
    deleting a running run's model or team (staff) never lowers the month's usage."""
    adapters.charge_run_usage(instance.pk)


def run_deleted(sender, instance: TuningRun, **kwargs) -> None:
    """post_delete receiver (connected in TuningConfig.ready): every path that deletes a run (its model,
    its team, the admin) removes its files on commit."""
    delete_run_files_on_commit(instance)
