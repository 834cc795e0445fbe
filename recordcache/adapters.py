"""Where cache rows meet the engine (``tuning.engine.records``: cache_key, seeds, publish, exchange): every
TVM call on a team's model or on imported records runs in a sandboxed child (``tuning.adapters.call_engine``
/ ``procpool``)."""
from __future__ import annotations

from pathlib import Path

from tuning.adapters import call_engine, checked_target, engine_target, run_evaluator, run_work_dir
from tuning.engine.process import procpool
from tuning.engine.records import cache_key, exchange, publish, seeds
from tuning.engine.records.cost_model_file import CostModelFileError, check_cost_model_file
from tuning.engine.process.procpool import WorkerError, WorkerTimeout
from tuning.engine.records.check import RecordError, precheck
from tuning.models import TuningRun

IMPORT_CHECK_TIMEOUT_S = 600

__all__ = ["RecordError", "WorkerError", "WorkerTimeout", "precheck", "cache_key_of", "task_workloads",
           "publish_from_run", "write_seeds", "load_verification", "place_cost_model", "export_lines",
           "check_cache_import", "recheck_cache_entries", "run_work_dir", "DEFAULT_TOP_K", "DEFAULT_TOLERANCE",
           "CostModelFileError", "check_cost_model_file"]

DEFAULT_TOP_K, DEFAULT_TOLERANCE = seeds.DEFAULT_TOP_K, seeds.DEFAULT_TOLERANCE
load_verification = seeds.load_verification
recheck_cache_entries = exchange.recheck_cache_entries
place_cost_model = publish.place_cost_model
export_lines = exchange.export_lines


def cache_key_of(run: TuningRun) -> dict:
    """The cache key parts a run's records are stored under and looked up with, on the executing host:
    target (canonical key + graph-pass pipeline when the run has one + cold timing), hardware, TVM version."""
    pipeline = getattr(run, "pipeline_key", "") or (run.options or {}).get("pipeline_key")
    cold = run_evaluator(run).enable_cpu_cache_flush
    return {"target_key": cache_key.cache_target_key(run.target_key, pipeline, cold_timing=cold),
            "hardware": cache_key.hardware_fingerprint(run.engine_target), "tvm_version": cache_key.tvm_version()}


def task_workloads(model_proto, run: TuningRun) -> list[dict]:
    return call_engine(publish.task_workloads, model_proto, engine_target(run),
                       what="looking the run's tasks up in the record cache")


def publish_from_run(model_proto, run: TuningRun, cached: list[dict], cost_model_path: Path) -> dict:
    return call_engine(publish.publish_from_run, str(run_work_dir(run.pk)), model_proto,
                       engine_target(run), cached, str(cost_model_path), int(run.threads or 1),
                       what="reading the run's serially re-measured records for the cache and training its cost model")


def write_seeds(run: TuningRun, hits: dict[int, list[dict]], tolerance: float) -> int:
    return seeds.write_seeds(str(run_work_dir(run.pk)), hits, tolerance=tolerance)


def check_cache_import(workloads: bytes, records: bytes, target: dict, max_records: int) -> dict:
    return procpool.run_isolated(exchange.check_cache_import, workloads, records,
                                 checked_target(target), max_records, timeout=IMPORT_CHECK_TIMEOUT_S)
