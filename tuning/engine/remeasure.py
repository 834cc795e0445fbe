"""Measurements outside the search, one candidate at a time, with the run's own builder and runner:
the imported seeds (before the search) and DOPpler's final serial re-measure (after it)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
from typing import Any

from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Schedule

from tuning.engine.compile.workloads import Task
from tuning.engine.events import MeasurementRecord, candidate_key
from tuning.engine.latency import TVM_FAILED_RUN_SECS
from tuning.engine.measuring.measure import MeasureOutcome, _jsonable
from tuning.engine.runners.measure_jobs import MeasureJob
from tuning.engine.runners.plugins import build_all, measure_serially
from tuning.engine.search.engine_state import EngineState
from tuning.engine.workdir import (
    FINAL_DIR,
    imported_records,
    open_json_db,
    record_latency,
    records_by_task,
    retire_imported,
)

__all__ = ["measure_imported", "retime_traces", "final_remeasure", "serial_updates"]

log = logging.getLogger(__name__)


def _replay(task: Task, trace):
    """The task's module scheduled by ``trace``."""
    sch = Schedule(task.mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def _remove_artifact(path: str) -> None:
    with contextlib.suppress(OSError):
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


# --------------------------------------------------------------------------- imported seeds
def _imported_plan(
    work_dir: str, tasks: list[Task], known_keys: set[str], budget: int
) -> list[tuple[int, Any, str, Any]]:
    """(task index, trace, candidate key, scheduled module) of the imported records to measure."""
    plan: list[tuple[int, Any, str, Any]] = []
    for i, recs in imported_records(work_dir, tasks).items():
        for rec in recs:
            key = candidate_key(tasks[i].name, rec.trace)
            if key in known_keys or len(plan) >= budget:
                continue  # measured before a crash, or over the budget
            try:
                plan.append((i, rec.trace, key, _replay(tasks[i], rec.trace)))
            except Exception as exc:  # noqa: BLE001
                log.warning("imported record of %s does not replay: %s", tasks[i].name, exc)
    return plan


def measure_imported(
    work_dir: str,
    tasks: list[Task],
    target,
    builder,
    runner,
    state: EngineState,
    database,
    device_type: str,
    budget: int,
) -> int:
    """Build and measure the imported records (at most ``budget``) on this platform, as trials of
    the run: only then do they enter the run's database (seeding the search and its cost model)
    and the sink. Imported latencies never do. Returns how many were measured."""
    plan = _imported_plan(work_dir, tasks, state.known_keys, budget)
    paths = build_all(builder, [m for *_, m in plan], target)
    args = {i: ms.arg_info.ArgInfo.from_prim_func(t.mod["main"]) for i, t in enumerate(tasks)}
    built = [(p, path) for p, path in zip(plan, paths) if path]
    jobs = [
        MeasureJob(path=path, device_type=device_type, args_info=_jsonable([a.as_json() for a in args[p[0]]]))
        for p, path in built
    ]
    outcomes = dict(zip((p[2] for p, _ in built), measure_serially(runner, jobs)))
    round_index = state.round_offset  # a round of its own, before the search's rounds
    state.round_offset += 1
    records = []
    for i, trace, key, _ in plan:
        out = outcomes.get(key)
        secs = [float(x) for x in out.run_secs] if out is not None and not out.error else []
        error = None if secs else ("build failed" if out is None else f"run: {out.error or 'no result'}")
        database.commit_tuning_record(
            ms.database.TuningRecord(
                trace, database.commit_workload(tasks[i].mod), secs or [TVM_FAILED_RUN_SECS], target, args[i]
            )
        )
        if secs:
            state.best[i] = min(state.best.get(i, math.inf), sum(secs) / len(secs))
        state.known_keys.add(key)
        records.append(
            MeasurementRecord(
                task_index=i,
                task_name=tasks[i].name,
                round_index=round_index,
                candidate_key=key,
                run_secs=secs,
                error=error,
                worker=out.worker if out is not None else None,
                dop=1,
            )
        )
    for _, path in built:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    state.n_reported += len(records)
    if records:
        state.notify_sink("on_measurements", records)
    retire_imported(work_dir)
    return len(records)


def retime_traces(
    tasks: list[Task], target, builder, runner, device_type: str, items: list[tuple[int, Any]]
) -> list[float | None]:
    """Build and time serially, once more, the (task index, trace) ``items`` (the record cache's second
    look at a seed that timed slow): one mean latency each, None when it did not build or run. Nothing is
    written to a database: the caller decides what the time means."""
    plan: list[tuple[int, Any]] = []
    for i, trace in items:
        try:
            plan.append((i, _replay(tasks[i], trace)))
        except Exception as exc:  # noqa: BLE001
            log.warning("re-time: cannot replay a trace of %s: %s", tasks[i].name, exc)
            plan.append((i, None))
    paths = iter(build_all(builder, [m for _, m in plan if m is not None], target))
    built = [(i, next(paths) if m is not None else None) for i, m in plan]
    args = {
        i: _jsonable([a.as_json() for a in ms.arg_info.ArgInfo.from_prim_func(tasks[i].mod["main"])]) for i, _ in built
    }
    jobs = [MeasureJob(path=path, device_type=device_type, args_info=args[i]) for i, path in built if path]
    outcomes = iter(measure_serially(runner, jobs)) if jobs else iter(())
    out: list[float | None] = []
    for _, path in built:
        if not path:
            out.append(None)
            continue
        o = next(outcomes)
        out.append(None if o.error or not o.run_secs else sum(o.run_secs) / len(o.run_secs))
        _remove_artifact(path)
    return out


# --------------------------------------------------------------------------- final re-measure
def _final_plan(database, tasks: list[Task], share: float) -> list[tuple[int, Any, Any]]:
    """(task index, record, scheduled module) of each task's top ``share`` of valid records."""
    by_task = records_by_task(database, tasks)
    plan: list[tuple[int, Any, Any]] = []
    for i, t in enumerate(tasks):
        valid = [(secs, r) for r in by_task[i] if (secs := record_latency(r)) is not None]
        if not valid:
            continue
        k = max(1, math.ceil(share * len(valid)))
        for _, rec in sorted(valid, key=lambda pair: pair[0])[:k]:
            try:
                plan.append((i, rec, _replay(t, rec.trace)))
            except Exception as exc:  # noqa: BLE001
                log.warning("final re-measure: cannot replay a trace of %s: %s", t.name, exc)
    return plan


def _final_row(task: Task, index: int, rec, serial: float | None, error: str | None) -> dict:
    return {
        "task_index": index,
        "task_name": task.name,
        "candidate_key": candidate_key(task.name, rec.trace),
        "recorded_latency_s": record_latency(rec),
        "serial_latency_s": serial,
        "error": error,
    }


def _remeasure_task(
    index: int, task: Task, items: list[tuple[Any, str]], final_db, target, runner, device_type: str
) -> list[dict]:
    """Measure one task's built top records serially; the good ones go to the final database."""
    wl = final_db.commit_workload(task.mod)
    jobs = []
    for rec, path in items:
        infos = rec.args_info if rec.args_info is not None else ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        jobs.append(MeasureJob(path=path, device_type=device_type, args_info=_jsonable([a.as_json() for a in infos])))
    rows = []
    outcomes: list[MeasureOutcome] = measure_serially(runner, jobs)
    for (rec, _), job, out in zip(items, jobs, outcomes):
        serial = None if out.error else (sum(out.run_secs) / len(out.run_secs) if out.run_secs else None)
        rows.append(_final_row(task, index, rec, serial, out.error))
        if serial is not None:
            final_db.commit_tuning_record(
                ms.database.TuningRecord(rec.trace, wl, [float(x) for x in out.run_secs], target, rec.args_info)
            )
        _remove_artifact(job.path)
    return rows


def final_remeasure(
    database, tasks: list[Task], target, builder, runner, work_dir: str, device_type: str, share: float
) -> list[dict]:
    """Re-measure the top ``share`` of each task's candidates serially and write them, with their
    serial times, to ``work_dir/final``. One row per candidate built (a failed build too: it was
    charged all the same): task_index, task_name, candidate_key, recorded_latency_s,
    serial_latency_s (None: failed), error."""
    shutil.rmtree(os.path.join(work_dir, FINAL_DIR), ignore_errors=True)
    final_db = open_json_db(work_dir, final=True)
    plan = _final_plan(database, tasks, share)
    paths = build_all(builder, [m for _, _, m in plan], target)
    rows = [_final_row(tasks[i], i, rec, None, "build failed") for (i, rec, _), path in zip(plan, paths) if not path]
    for i, t in enumerate(tasks):
        items = [(rec, path) for (ti, rec, _), path in zip(plan, paths) if ti == i and path]
        if items:
            rows.extend(_remeasure_task(i, t, items, final_db, target, runner, device_type))
    return rows


def serial_updates(rows: list[dict]) -> list[tuple[int, str, float | None]]:
    """The final re-measure as ``TuningSink.on_serial_remeasure`` takes it."""
    return [(r["task_index"], r["candidate_key"], r["serial_latency_s"]) for r in rows]
