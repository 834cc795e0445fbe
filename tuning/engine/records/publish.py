"""Publishing a finished run into the record cache, engine side.

- :func:`entries_from_run`: the trusted entries of a finished run, read from its ``final`` database only
  (never from the parallel-measured records, never from imports), with how far the run tuned each task
  (:func:`source_effort`);
- :func:`train_cost_model`: one XGBoost cost model (TVM's ``XGBModel``, MetaSchedule's program
  features) trained on entries, saved where ``search`` loads a run's cost model, in the platform's
  data-only format (``cost_model_file``: XGBoost JSON and plain numpy arrays; another team's runs load
  it, so never TVM's pickled one). :func:`place_cost_model` hands a run only a file in that format.

TVM is imported inside the functions that need it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from tuning.engine.events import ffi_to_py, record_json, trace_json
from tuning.engine.records.cache_key import structural_hash, trace_digest
from tuning.engine.records.cost_model_file import (
    CostModelFileError,
    check_cost_model_file,
    data_only,
)
from tuning.engine.records.seeds import load_manifest, load_verification
from tuning.engine.workdir import (
    COST_MODEL_FILE,
    DB_RECORDS,
    TRIMMER_STATE,
    load_exhausted,
    open_json_db,
    record_latency,
    records_by_task,
)

__all__ = [
    "task_workloads",
    "source_effort",
    "entries_from_run",
    "publish_from_run",
    "train_cost_model",
    "place_cost_model",
]

log = logging.getLogger(__name__)


def task_workloads(model, target) -> list[dict]:
    """The run's tasks as the cache looks them up: index, name, weight, workload hash (collect_tasks:
    the same extraction the run uses). Run in a sandboxed child (TVM on a team's model)."""
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.workloads import collect_tasks

    tasks = collect_tasks(model, make_target(target))
    return [
        {"index": i, "name": t.name, "weight": t.weight, "workload_hash": structural_hash(t.mod)}
        for i, t in enumerate(tasks)
    ]


def source_effort(work_dir: str, tasks) -> dict[int, tuple[int, bool]]:
    """task index -> (trials the run spent on it, whether its search had converged), what a published entry
    says of how far its record was tuned. Trials: the task's records in the run's database, plus, for a
    task the run was seeded on, the trials behind its seeds (a re-published seed keeps its history).
    Converged: Trimmer's plateau rule pre-empted it, its search space ran out (Trimmer on or off), or the record cache
    settled it as converged (saved Trimmer state and verification of the run)."""
    trials = {i: len(recs) for i, recs in records_by_task(open_json_db(work_dir), tasks).items()}
    converged: set[int] = set()
    state = _load_json(os.path.join(work_dir, TRIMMER_STATE)) or {}
    for key in ("preempted_tasks", "cache_parked_tasks"):
        converged |= {int(k) for k in (state.get(key) or {})}
    converged |= {int(k) for k in state.get("exhausted_tasks") or []} | load_exhausted(work_dir)
    manifest = load_manifest(work_dir) or {}
    for i, want in (manifest.get("tasks") or {}).items():
        if int(i) in trials:
            trials[int(i)] += int(want.get("source_trials") or 0)
    for v in (load_verification(work_dir) or {}).get("tasks") or []:
        if v.get("settled"):
            converged.add(int(v["task_index"]))
    return {i: (n, i in converged) for i, n in trials.items()}


def _entry(task, index: int, rec) -> dict | None:
    from tvm.s_tir import meta_schedule as ms

    secs = [float(x) for x in (rec.run_secs or [])]
    latency = record_latency(rec)
    if latency is None:
        return None
    text = trace_json(rec.trace)
    seed = ms.database.TuningRecord(rec.trace, ms.database.Workload(task.mod), None, rec.target, rec.args_info)
    return {
        "task_index": index,
        "task_name": task.name,
        "workload_hash": structural_hash(task.mod),
        "workload_json": json.dumps(ffi_to_py(ms.database.Workload(task.mod).as_json())),
        "record_json": json.dumps(record_json(seed)),
        "trace_digest": trace_digest(text),
        "args_info": ffi_to_py([a.as_json() for a in rec.args_info or []]),
        "run_secs": secs,
        "latency_s": latency,
    }


def entries_from_run(work_dir: str, model, target) -> list[dict]:
    """The run's trusted cache entries: every record of its ``final`` database (serial re-measures by
    this platform, DOPpler's last stage), with the workload, the record without its times (what a seed
    is made of), its args info, the serial run times, and how far the source tuned the task
    (``source_trials``, ``source_converged``: :func:`source_effort`). Empty when the run had no final
    re-measure."""
    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.workloads import collect_tasks

    final = os.path.join(work_dir, "final", DB_RECORDS)
    if not (os.path.exists(final) and os.path.getsize(final)):
        return []
    tasks = collect_tasks(model, make_target(target))
    effort = source_effort(work_dir, tasks)
    out = []
    for i, recs in records_by_task(open_json_db(work_dir, final=True), tasks).items():
        for rec in recs:
            e = _entry(tasks[i], i, rec)
            if e is not None:
                n, converged = effort.get(i, (0, False))
                out.append(e | {"source_trials": n, "source_converged": converged})
    return out


def publish_from_run(
    work_dir: str, model, target, cached: list[dict], cost_model_path: str, num_cores: int = 1
) -> dict:
    """One child's work after a successful run: its trusted entries (:func:`entries_from_run`) and the
    key's cost model retrained on them plus the ``cached`` trusted entries of the same key (the new ones
    win on a shared trace). Returns ``{"entries": [...], "cost_model_records": n}``."""
    entries = entries_from_run(work_dir, model, target)
    fresh = {e["trace_digest"] for e in entries}
    pool = entries + [e for e in cached if e["trace_digest"] not in fresh]
    n = train_cost_model(pool, target, cost_model_path, num_cores=num_cores) if entries else 0
    return {"entries": entries, "cost_model_records": n}


def train_cost_model(entries: list[dict], target, path: str, *, num_cores: int = 1) -> int:
    """One XGBoost cost model trained on ``entries`` (their serial times), saved at ``path`` in the
    format ``search`` loads; returns the number of records it learned from (0: nothing saved)."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule

    from tuning.engine.compile.pipeline import make_target
    from tuning.engine.compile.tvm_compat import ensure_tensor_intrin

    tgt = make_target(target)
    ensure_tensor_intrin(tgt)  # what the target needs, not all of tensor_intrin (TuneContext imports it: seconds)
    by_workload: dict[str, list[dict]] = {}
    for e in entries:
        by_workload.setdefault(e["workload_hash"], []).append(e)
    model = data_only(ms.cost_model.XGBModel(num_tuning_cores=num_cores, tree_method="auto"))
    n = 0
    for group in by_workload.values():
        mod = ms.database.Workload.from_json(json.loads(group[0]["workload_json"])).mod
        ctx = ms.TuneContext(mod=mod, target=tgt, space_generator="post-order-apply", num_threads=num_cores)
        cands, results = [], []
        for e in group:
            rec = ms.database.TuningRecord.from_json(json.loads(e["record_json"]), ms.database.Workload(mod))
            sch = Schedule(mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
            cands.append(ms.MeasureCandidate(sch, rec.args_info))
            results.append(ms.runner.RunnerResult([float(x) for x in e["run_secs"]], None))
        model.update(ctx, cands, results)
        n += len(cands)
    if n:
        model.save(path)
    return n


def place_cost_model(work_dir: str, cost_model_path: str | None) -> bool:
    """Put the cache's cost model where a run loads its own (``COST_MODEL_FILE``), for a fresh run. Only a
    file in the platform's data-only format (``cost_model_file.check_cost_model_file``): another format,
    TVM's pickled one included, is skipped unread, with a warning, and the run tunes without it."""
    dest = os.path.join(work_dir, COST_MODEL_FILE)
    if not cost_model_path or not os.path.exists(cost_model_path) or os.path.exists(dest):
        return False
    os.makedirs(work_dir, exist_ok=True)
    tmp = dest + ".checking"  # the bytes checked are the bytes placed: copied first, checked, then renamed
    shutil.copyfile(cost_model_path, tmp)
    try:
        check_cost_model_file(tmp)
    except CostModelFileError as exc:
        os.unlink(tmp)
        log.warning("record cache: cost model %s skipped: %s", os.path.basename(cost_model_path), exc)
        return False
    os.replace(tmp, dest)
    return True


def _load_json(path: str) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
