"""The boundary between the tuning app's rows and its engine: the only tuning modules that import both
Django models and `tuning.engine`.

- a row becomes an engine input in `engine.build_engine_config` (and `energy.make_energy_meter`);
- an engine event becomes a row in `sink.DatabaseSink`, and its cost a usage charge (`ledger`);
- `engine.call_engine` runs every engine call on a team's model in a sandboxed child.
"""
from .energy import energy_model_snapshot, make_energy_meter, run_energy_model
from .engine import (
    IMPORT_CHECK_TIMEOUT_S,
    Abort,
    RecordError,
    TargetRefused,
    WorkerError,
    WorkDirBusy,
    WorkerTimeout,
    build_engine_config,
    call_engine,
    check_import,
    checked_target,
    commit_stored_journal,
    compile_and_compare,
    current_pipeline_key,
    database_records,
    engine_error_text,
    engine_target,
    fenced,
    has_imported,
    precheck,
    recheck_output,
    resolve_target,
    run_engine,
    run_evaluator,
    stored_journal_settled,
    trimmer_options,
    write_imported,
)
from .ledger import charge_run_usage
from .sink import DatabaseSink, LeaseLost
from .workdir import delete_run_files, public_json, public_text, run_files_dir, run_work_dir, zip_database

__all__ = [
    "IMPORT_CHECK_TIMEOUT_S", "Abort", "DatabaseSink", "LeaseLost", "RecordError", "TargetRefused", "WorkDirBusy",
    "WorkerError", "WorkerTimeout", "build_engine_config", "call_engine", "charge_run_usage", "check_import",
    "checked_target", "commit_stored_journal", "compile_and_compare", "current_pipeline_key", "database_records",
    "delete_run_files", "energy_model_snapshot",
    "engine_error_text", "engine_target", "fenced", "has_imported", "make_energy_meter",
    "precheck", "public_json", "public_text", "recheck_output", "resolve_target", "run_energy_model", "run_engine",
    "run_evaluator",
    "run_files_dir", "run_work_dir", "stored_journal_settled", "trimmer_options", "write_imported", "zip_database",
]
