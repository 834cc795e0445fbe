"""Tuning runs: writes, split along their seams.

- `runs`: start (bounds, target, queues, quota), cancel, pause, resume; the on-commit send to Celery.
- `quota`: the team quotas checked when a run starts or resumes.
- `executor`: claim, execute (idempotent, resumable), interrupted ends, recovery of dead executors.
- `finish`: the all-or-nothing last write of a successful run.
- `settle`: TVM databases of ended runs brought level with the store (on a cancel, by a sweep).
- `records`: import of an existing TVM database; a deleted run's files removed on commit.

Reads are in `tuning.selectors`; the engine is reached only through `tuning.adapters`. The names below
are re-exported so callers import `tuning.services.<name>`.
"""
from tuning.adapters import (
    DatabaseSink,
    LeaseLost,
    make_energy_meter,
    public_json,
    public_text,
    run_energy_model,
    run_work_dir,
)
from tuning.selectors import (
    energy_joules_this_month,
    joules_per_trial_estimate,
    seconds_until_next_stale,
    trials_reserved,
    trials_used_this_month,
)

from . import runs as runs  # the submodule, as tuning.services.runs
from .executor import claim_run, execute_run, finish_interrupted, reconcile_with_database, recover_stale_runs
from .finish import NoMeasurement, finish_succeeded
from .quota import check_run_quota
from .records import IMPORT_REFUSED_PREFIX, delete_run_files_on_commit, import_database, run_deleted, run_deleting
from .run_queue import dispatch_all_waiting_runs, dispatch_waiting_runs
from .settle import settle_ended_run, settle_tvm_database, sweep_unsettled_runs
from .runs import (
    SUPPORTED_TARGET_KINDS,
    archive_run,
    cancel_run,
    enqueue_run,
    pause_run,
    restore_run,
    resume_run,
    start_run,
    validate_measure_queues,
    validate_run_bounds,
    target_core_limit,
    validate_target,
)


__all__ = [
    "IMPORT_REFUSED_PREFIX", "SUPPORTED_TARGET_KINDS", "DatabaseSink", "LeaseLost", "NoMeasurement", "archive_run",
    "cancel_run",
    "check_run_quota", "claim_run", "delete_run_files_on_commit", "dispatch_all_waiting_runs",
    "dispatch_waiting_runs", "energy_joules_this_month", "enqueue_run",
    "execute_run", "finish_interrupted", "finish_succeeded", "import_database", "joules_per_trial_estimate",
    "make_energy_meter", "pause_run", "public_json", "public_text", "reconcile_with_database",
    "recover_stale_runs", "restore_run", "resume_run", "run_deleted", "run_deleting", "run_energy_model",
    "run_work_dir",
    "seconds_until_next_stale", "start_run", "trials_reserved", "trials_used_this_month",
    "target_core_limit", "validate_measure_queues", "validate_run_bounds", "validate_target",
    "settle_ended_run", "settle_tvm_database", "sweep_unsettled_runs",
]
