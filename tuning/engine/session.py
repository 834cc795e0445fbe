"""One tuning run: tasks -> MetaSchedule with our builder/runner/callback ->
TVM's JSONDatabase in ``work_dir`` -> (DOPpler) final serial re-measure.

``run_tuning`` is resumable: the state is TVM's JSONDatabase (and the XGBoost
cost model saved next to it), never only memory. Called again on a
``work_dir`` that holds records, it tunes the remaining budget
(``max_trials`` minus records already stored for these tasks) and does not
report stored candidates again (``candidate_key`` de-dup).

Builders and runners come from ``plugins`` by name (``TuningConfig.builder`` / ``.runner``).
This module stays cheap to import (web processes import it for ``TuningConfig``): the steps that
need TVM's compiler (``plugins``, ``search``, ``remeasure``, ``callbacks``) are imported when a
run starts, in :func:`_tune`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import record_cache, sandbox, yardstick
from . import verdict as verdict_rule
from .lifeline import WorkDirBusy, lock_work_dir
from .database import (
    DB_RECORDS,
    DB_WORKLOAD,
    FINAL_DIR,
    IMPORTED_DIR,
    IMPORTED_DONE_DIR,
    StreamJournal,
    commit_streamed,
    database_paths,
    has_imported,
    load_trimmer_preempted,
    next_round_offset,
    open_database,
    open_json_db,
    record_latency,
    records_by_task,
    save_round_offset,
    write_imported,
)
from .doppler import DOP_BACK_OFFS, DOP_NOISES, DOP_OUTLIERS, DOP_PROBES, DOP_SAMPLES, DOP_STARTS, DOPController
from .events import MeasurementRecord, NullSink, TaskInfo, TuningSink, candidate_key
from .procpool import available_cpus, unpin_current_thread
from .targets import TargetMismatch, check_measurable_here
from .relax_pipeline import (compile_model, make_target, random_inputs, run_and_time, run_and_time_samples,
                             target_device_type)
from .rounds import serial_totals
from .timer import EvaluatorConfig
from .trimmer import TrimmerConfig
from .trimmer_hooks import TrimmerRuntime
from .workloads import Task, collect_tasks, round_size

logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
log = logging.getLogger(__name__)

__all__ = [
    "TuningConfig",
    "TaskResult",
    "TuningSummary",
    "run_tuning",
    "collect_tasks",
    "open_database",
    "compile_and_compare",
    "count_records",
    "database_records",
    "write_imported",
    "has_imported",
    # the run's file layout, from .database
    "DB_WORKLOAD", "DB_RECORDS", "FINAL_DIR", "IMPORTED_DIR", "IMPORTED_DONE_DIR",
    "FINAL_ROWS", "WorkDirBusy",
]

FINAL_ROWS = "final_remeasure.json"  # the final serial re-measure's rows, and whether they were charged

LOCAL_RUNNERS = ("pooled", "local")  # runners that time candidates on this host


@dataclasses.dataclass
class TuningConfig:
    """How to tune. ``mode``: "stock" = TVM's LocalBuilder + LocalRunner (the
    baseline the platform offers), "doppler" = persistent builder + pooled
    asynchronous runner with DOPpler's DOP control (or the distributed runner
    when ``distributed_submit`` is given)."""

    target: dict | str
    max_trials: int
    trials_per_round: int = 32  # MetaSchedule's num_trials_per_iter
    mode: str = "doppler"
    dop: str | int = "auto"
    dop_start: str = "probe"  # DOP "auto": "probe" (first round probes a parallel DOP) or "serial" (DOPpler's DOP 1)
    # DOP "auto": "pooled" (once recent rounds hold enough pairs, a round re-times its fastest and decides on
    # the pooled pairs), "adaptive" (calm rounds sample half as much) or "fixed" (DOPpler's 20 % every round)
    dop_sample: str = "pooled"
    # DOP "auto": "measured" (the error threshold counts above the host's measured serial noise) or
    # "none" (DOPpler's rule: one serial timing taken as exact)
    dop_noise: str = "measured"
    # DOP "auto": "rankable" (slow outliers past DOP x the round's median are not re-timed serially) or
    # "all" (DOPpler's rule: every outlier is)
    dop_outliers: str = "rankable"
    # DOP "auto": "confirmed" (a round about to back off for its error times its sample serially once more
    # and decides on both timings) or "immediate" (DOPpler's rule: it decides on the first)
    dop_back_off: str = "confirmed"
    # DOP "auto" with dop_sample "pooled": "pairs" (a probe times the pairs the pooled rule decides on, 4 at
    # DOP 2) or "share" (DOPpler's 20 % of the round)
    dop_probe: str = "pairs"
    threads: int | None = None  # deployment/measurement thread count (default: all cores)
    work_dir: str = "tuning_work"
    seed: int | None = None
    evaluator: EvaluatorConfig = dataclasses.field(default_factory=EvaluatorConfig)
    search_population: int | None = None  # EvolutionarySearch population (TVM default 512)
    genetic_num_iters: int | None = None  # TVM default 4
    distributed_submit: Callable[[dict], Any] | None = None
    device_queue: str | list[str] | None = None
    # finer switches (ablation / platform knobs)
    builder: str | None = None  # "persistent" | "local" (default from mode)
    runner: str | None = None  # "pooled" | "local" | "distributed" (default from mode)
    builder_workers: int | None = None
    # the evolutionary search's threads: TVM hands sampling work to threads in arrival order, so only a
    # one-thread search proposes the same candidates from the same seed (bench/tuning_time.py pairs sides so)
    search_threads: int | str = "physical"
    cpu_ids: list[int] | None = None  # cores to measure on
    # None: pooled runner -> builds (and, on CPUs, searches) wait for it (shared cores); distributed -> overlap
    overlap_measurement: bool | None = None
    final_remeasure: bool | None = None  # default: True in doppler mode
    final_share: float = 0.1
    timeout_sec: float = 30.0
    max_trials_per_task: int | None = None
    controller: DOPController | None = None
    light_intrinsics: bool | None = None  # default: True in doppler mode (see tvm_compat)
    deferred_cost_model: bool | None = None  # default: True in doppler mode (search.train_when_needed)
    # Trimmer (per-task pre-emption, whole-model stop, ML candidate filter): a
    # TrimmerConfig or its dict; None or enabled=False = off
    trimmer: Any = None
    # trials the caller already stored for this run (a resumed run): the budget left is counted from the
    # larger of this and the records in TVM's database, so a store ahead of the database is not re-spent
    trials_spent: int = 0
    # how long a run waits for another engine to leave its work dir (a dying one lets go in a second or two)
    work_dir_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if self.mode not in ("stock", "doppler"):
            raise ValueError("mode must be 'stock' or 'doppler'")
        for name, allowed in (("dop_start", DOP_STARTS), ("dop_sample", DOP_SAMPLES), ("dop_noise", DOP_NOISES),
                              ("dop_outliers", DOP_OUTLIERS), ("dop_back_off", DOP_BACK_OFFS),
                              ("dop_probe", DOP_PROBES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}")
        self.evaluator = EvaluatorConfig.from_any(self.evaluator)
        if isinstance(self.trimmer, dict):
            self.trimmer = TrimmerConfig.from_dict(self.trimmer)
        if self.builder is None:
            self.builder = "local" if self.mode == "stock" else "persistent"
        if self.runner is None:
            if self.mode == "stock":
                self.runner = "local"
            else:
                self.runner = "distributed" if self.distributed_submit is not None else "pooled"
        if self.final_remeasure is None:
            self.final_remeasure = self.mode == "doppler"
        if self.light_intrinsics is None:
            self.light_intrinsics = self.mode == "doppler"
        if self.deferred_cost_model is None:
            self.deferred_cost_model = self.mode == "doppler"

    @property
    def dop_rule(self) -> dict[str, str]:
        """The DOP "auto" rule's choices, as ``DOPController.for_dop`` takes them."""
        return {"start": self.dop_start, "sample": self.dop_sample, "noise": self.dop_noise,
                "outliers": self.dop_outliers, "back_off": self.dop_back_off, "probe": self.dop_probe}


@dataclasses.dataclass
class TaskResult:
    index: int
    name: str
    weight: float
    flops: float
    n_records: int
    best_latency_s: float | None
    final_latency_s: float | None = None
    n_final_remeasured: int = 0


@dataclasses.dataclass
class TuningSummary:
    status: str  # "succeeded" | "cancelled" | "paused"
    wall_secs: float
    tasks: list[TaskResult]
    n_measurements: int  # records reported by this call
    n_total_records: int  # records in the database for these tasks
    trials_requested: int  # budget this call tried to spend
    final_dop: int | None
    dop_history: list[dict]
    mean_parallel_error: float | None
    database_path: str
    database_paths: dict[str, str]
    final_remeasure: list[dict] = dataclasses.field(default_factory=list)
    mode: str = "doppler"
    n_duplicates: int = 0  # measured again by TVM but already stored: not re-reported
    phase_secs: dict[str, float] = dataclasses.field(default_factory=dict)
    # of phase_secs["measure_serial"]: {reason: {"n": timings, "secs": wall}} (rounds.SERIAL_REASONS)
    serial_by_reason: dict[str, dict] = dataclasses.field(default_factory=dict)
    sink_errors: list[str] = dataclasses.field(default_factory=list)
    # Trimmer's report (TrimmerRuntime.to_dict(): pre-empted tasks with their trial
    # count at pre-emption, model_stop_reason, generated/filtered/measured totals,
    # reallocations); None when Trimmer was off
    trimmer: dict | None = None
    stop_reason: str | None = None  # why a "succeeded" run ended before its budget (Trimmer)

    @property
    def best_latency_s(self) -> float | None:
        """Weighted sum of the per-task best latencies (final when re-measured)."""
        vals = []
        for t in self.tasks:
            v = t.final_latency_s if t.final_latency_s is not None else t.best_latency_s
            if v is None:
                return None
            vals.append(v * t.weight)
        return sum(vals) if vals else None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["best_latency_s"] = self.best_latency_s
        return d


# --------------------------------------------------------------------------- run
@dataclasses.dataclass
class _Run:
    """One ``run_tuning`` call, filled in step by step."""

    cfg: TuningConfig
    sink: TuningSink
    work_dir: str
    target: Any
    device_type: str
    cores: list[int]
    threads: int
    tasks: list[Task]
    infos: list[TaskInfo]
    database: Any  # the run's JSONDatabase
    n_existing: int  # records stored by earlier calls (resume)
    known: set[str]  # their candidate keys
    best0: dict[int, float]  # their best latency per task
    remaining: int  # budget this call may spend
    trimmer: TrimmerRuntime | None = None
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    serial_by_reason: dict[str, dict] = dataclasses.field(default_factory=dict)
    state: Any = None  # callbacks.EngineState, once the builder and runner exist
    controller: DOPController | None = None
    status: str = "succeeded"
    final_rows: list[dict] = dataclasses.field(default_factory=list)


def _prepare(model, cfg: TuningConfig, sink: TuningSink) -> _Run:
    """Tasks, and what the database already holds (resume)."""
    work_dir = os.path.abspath(cfg.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    if cfg.runner in LOCAL_RUNNERS:
        # timings of code built for another CPU/GPU describe neither machine; remote workers check their own
        check_measurable_here(cfg.target, check_cores=False)
    target = make_target(cfg.target)
    # TVM's thread pool may have pinned this thread to one core (e.g. after a
    # FoldConstant or a 1-thread run): the search threads it spawns would inherit that
    unpin_current_thread()
    cores = list(cfg.cpu_ids) if cfg.cpu_ids else available_cpus()
    t0 = time.perf_counter()
    tasks = collect_tasks(model, target)
    if not tasks:
        raise ValueError("the model has no tunable tasks")
    database = open_json_db(work_dir)
    commit_streamed(work_dir, database, tasks, target)  # what a killed call reported before its join
    existing = records_by_task(database, tasks)
    n_existing = sum(len(v) for v in existing.values())
    best0 = {}
    for i, recs in existing.items():
        lats = [x for x in (record_latency(r) for r in recs) if x is not None]
        if lats:
            best0[i] = min(lats)
    run = _Run(
        cfg=cfg, sink=sink, work_dir=work_dir, target=target, device_type=target_device_type(target),
        cores=cores, threads=max(1, min(int(cfg.threads or len(cores)), len(cores))), tasks=tasks,
        infos=[TaskInfo(i, t.name, t.flops, t.weight) for i, t in enumerate(tasks)], database=database,
        n_existing=n_existing, known={candidate_key(tasks[i].name, r.trace) for i, recs in existing.items() for r in recs},
        best0=best0, remaining=max(0, int(cfg.max_trials) - max(n_existing, int(cfg.trials_spent or 0))))
    run.trimmer = _trimmer_runtime(run, existing)
    run.phases["prepare"] = time.perf_counter() - t0
    return run


def _trimmer_runtime(run: _Run, existing: dict[int, list]) -> TrimmerRuntime | None:
    cfg = run.cfg
    if cfg.trimmer is None or not getattr(cfg.trimmer, "enabled", False):
        return None
    trimmer = TrimmerRuntime(
        cfg.trimmer,
        run.infos,
        max_trials=int(cfg.max_trials),
        initial_best=run.best0,
        initial_trials={i: len(recs) for i, recs in existing.items() if recs},
        preempted=load_trimmer_preempted(run.work_dir) if run.n_existing else None,
        seed=cfg.seed,
    )
    trimmer.per_round = round_size(cfg.trials_per_round, run.remaining, len(run.tasks))
    return trimmer


@contextlib.contextmanager
def _env(**values):
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_environment(run: _Run) -> contextlib.ExitStack:
    """The process environment while the run's builder and runner live."""
    stack = contextlib.ExitStack()
    if run.cfg.runner == "local":  # TVM's LocalRunner measures with this process's thread count
        stack.enter_context(_env(TVM_NUM_THREADS=run.threads))
    if run.cfg.mode == "stock":  # TVM's own Popen workers copy os.environ when they start: keep secrets out
        stack.enter_context(sandbox.scrubbed_environ())
    return stack


def _pace(run: _Run, builder, runner, state) -> None:
    """The local pool measures on the cores that search and build use: unless told otherwise (a
    distributed runner overlaps by default), builds wait for it (quiet measurements), and on CPUs so
    do searches and join callbacks. TVM searches a task while the tasks sent before it are measured; a
    search thread next to a slot that spans all cores put both of a 2-thread candidate's threads on one
    core (Linux placed the woken worker thread beside its waker) and multi-task runs recorded those
    rounds 1.5-2.8x slow on 2 cores (small_cnn; its rounds measured alone mostly within 5 %), so a task's
    first round lost to its later ones and the cost model learned the slowdown. A GPU's timings are
    taken on the device: its searches overlap."""
    overlap = run.cfg.overlap_measurement
    if overlap is None:
        overlap = run.cfg.runner == "distributed"
    if overlap or not hasattr(runner, "wait_idle"):
        return
    if hasattr(builder, "before_build"):
        builder.before_build = runner.wait_idle
    if run.device_type == "cpu":
        state.wait_measured = runner.wait_idle


def _cache_retimer(run: _Run, builder, runner):
    """The record cache's second re-time of a seed that timed slow (``record_cache.verify_seeds``): built
    and timed serially with the run's builder and runner, charged to the run's budget."""
    from . import remeasure

    def retime(items):
        t0 = time.perf_counter()
        out = remeasure.retime_traces(run.tasks, run.target, builder, runner, run.device_type, items)
        run.remaining = max(0, run.remaining - len(items))
        run.phases["cache_retime"] = run.phases.get("cache_retime", 0.0) + time.perf_counter() - t0
        return out

    return retime


def _tune(run: _Run) -> None:
    """Make the builder and runner, measure the imported seeds, search, re-measure the best."""
    # TVM's compiler, imported when a run starts, not when a web process imports this module
    from . import plugins, remeasure, search
    from .callbacks import EngineState, ObservedBuilder, ProgressStreamer, StreamingRunner
    from .runner import MeasureLedger

    cfg, builder, runner = run.cfg, None, None
    ledger = MeasureLedger()
    try:
        with _run_environment(run):
            ctx = plugins.PlugContext(config=cfg, work_dir=run.work_dir, device_type=run.device_type,
                                      threads=run.threads, cores=run.cores, ledger=ledger)
            builder = plugins.make_builder(cfg.builder, ctx)
            runner = plugins.make_runner(cfg.runner, ctx)
            run.controller = getattr(runner, "controller", None)
            parallel = plugins.is_parallel_runner(cfg.runner)
            state = run.state = EngineState(
                run.sink, run.infos, known_keys=run.known, ledger=ledger if parallel else None,
                build_secs=getattr(builder, "build_secs", None), initial_best=run.best0,
                round_offset=next_round_offset(run.work_dir), trimmer=run.trimmer,
                journal=StreamJournal(run.work_dir, [t.mod for t in run.tasks]))
            _pace(run, builder, runner, state)
            for i, b in run.best0.items():
                state.best_history[i].append(b)
            if run.remaining > 0 and has_imported(run.work_dir):
                t0 = time.perf_counter()
                n_imported = remeasure.measure_imported(run.work_dir, run.tasks, run.target, builder, runner, state,
                                                        run.database, run.device_type, run.remaining)
                run.remaining = max(0, run.remaining - n_imported)
                run.phases["imported"] = time.perf_counter() - t0
            # verified cache hits need no search; a seed that timed slow is timed once more first
            record_cache.apply_seed_verification(run, retime=_cache_retimer(run, builder, runner))
            if run.remaining > 0:
                # results reach the sink as each measurement lands, not at TVM's joins (see callbacks)
                streamer = ProgressStreamer(state)
                try:
                    run.status = search.search(
                        run.tasks, run.target, cfg, state=state, builder=ObservedBuilder(builder, state),
                        runner=StreamingRunner(runner, streamer), database=run.database, work_dir=run.work_dir,
                        budget=run.remaining, resumed=bool(run.n_existing), phases=run.phases)
                finally:
                    streamer.close()
                    state.scheduler = None
            save_round_offset(run.work_dir, state.round_offset + ledger.rounds_numbered + state.own_rounds)
            run.phases["measure_rounds"] = sum(r.wall_secs for r in ledger.rounds.values())  # DOPpler rounds' wall time
            # of which: measuring at the rounds' DOP, and DOPpler's serial re-measures
            run.phases["measure_parallel"] = sum(r.parallel_wall_secs or 0.0 for r in ledger.rounds.values())
            run.phases["measure_serial"] = sum(r.serial_wall_secs or 0.0 for r in ledger.rounds.values())
            run.serial_by_reason = serial_totals(ledger.rounds.values())
            # DOPpler's final stage: serial re-measure of the top share per task
            if run.status == "succeeded" and cfg.final_remeasure and parallel:
                t0 = time.perf_counter()
                n_records = sum(len(v) for v in records_by_task(run.database, run.tasks).values())
                saved = load_final_rows(run.work_dir)
                # done once: a call that resumes a finished search (its executor died in the final stage
                # or after it) reuses what an earlier call measured; a budget raised since measures again
                if saved is None or saved["n_records"] != n_records:
                    saved = {"rows": remeasure.final_remeasure(run.database, run.tasks, run.target, builder,
                                                               runner, run.work_dir, run.device_type,
                                                               cfg.final_share),
                             "charged": False, "n_records": n_records}
                    save_final_rows(run.work_dir, saved)
                run.final_rows = saved["rows"]
                run.phases["final_remeasure"] = time.perf_counter() - t0
                # every build+measure done on the owner's behalf is charged (one trial each), once
                if run.final_rows and not saved["charged"] and hasattr(run.sink, "on_serial_remeasure"):
                    if state.notify_sink("on_serial_remeasure", remeasure.serial_updates(run.final_rows)):
                        save_final_rows(run.work_dir, {**saved, "charged": True})
    finally:
        for obj in (runner, builder):
            if obj is not None and hasattr(obj, "shutdown"):
                with contextlib.suppress(Exception):
                    obj.shutdown()


def load_final_rows(work_dir: str) -> dict | None:
    """The final re-measure an earlier call of this run did (``{"rows", "charged", "n_records"}``: the
    rows, whether the sink took their charge, the database's record count they were chosen from), or None."""
    try:
        with open(os.path.join(work_dir, FINAL_ROWS)) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or not isinstance(saved.get("rows"), list):
        return None
    return {"rows": saved["rows"], "charged": bool(saved.get("charged")), "n_records": saved.get("n_records")}


def save_final_rows(work_dir: str, saved: dict) -> None:
    """Written whole or not at all (a rename): a killed call leaves the previous state."""
    path = os.path.join(work_dir, FINAL_ROWS)
    try:
        with open(path + ".tmp", "w") as f:
            json.dump(saved, f)
        os.replace(path + ".tmp", path)
    except (OSError, TypeError, ValueError):  # a full disk: the next call re-measures (and charges) again
        log.exception("could not save the final re-measure")


def _task_results(run: _Run) -> list[TaskResult]:
    by_task = records_by_task(open_json_db(run.work_dir), run.tasks)
    finals: dict[int, list[dict]] = {}
    for row in run.final_rows:
        finals.setdefault(row["task_index"], []).append(row)
    results = []
    for i, t in enumerate(run.tasks):
        lats = [x for x in (record_latency(r) for r in by_task[i]) if x is not None]
        fin = [r["serial_latency_s"] for r in finals.get(i, []) if r["serial_latency_s"] is not None]
        results.append(TaskResult(
            index=i, name=t.name, weight=t.weight, flops=t.flops, n_records=len(by_task[i]),
            best_latency_s=min(lats) if lats else None, final_latency_s=min(fin) if fin else None,
            n_final_remeasured=len(finals.get(i, []))))
    return results


def _summary(run: _Run, wall_secs: float) -> TuningSummary:
    cfg, state, controller, trimmer = run.cfg, run.state, run.controller, run.trimmer
    results = _task_results(run)
    return TuningSummary(
        status=run.status,
        wall_secs=wall_secs,
        tasks=results,
        n_measurements=state.n_reported if state else 0,
        n_total_records=sum(r.n_records for r in results),
        trials_requested=run.remaining,
        final_dop=controller.dop if controller is not None else (1 if cfg.runner != "distributed" else None),
        dop_history=controller.history_dicts() if controller is not None else [],
        mean_parallel_error=controller.mean_parallel_error() if controller is not None else None,
        database_path=run.work_dir,
        database_paths=database_paths(run.work_dir),
        final_remeasure=run.final_rows,
        mode=cfg.mode,
        n_duplicates=state.n_duplicates if state else 0,
        phase_secs=run.phases,
        serial_by_reason=run.serial_by_reason,
        sink_errors=list(state.sink_errors) if state else [],
        trimmer=trimmer.to_dict() if trimmer is not None else None,
        stop_reason=trimmer.stop_reason if (trimmer is not None and run.status == "succeeded") else None,
    )


def run_tuning(model, config: TuningConfig, sink: TuningSink | None = None) -> TuningSummary:
    """Tune ``model`` (ONNX ModelProto, Relax IRModule, TIR PrimFunc or
    IRModule of PrimFuncs) under ``config``; stream to ``sink``."""
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    t_start = time.perf_counter()
    # one engine per work dir: a second one (a recovered run whose old engine still lives) waits for the
    # first to go, or refuses (WorkDirBusy), so two never write one TVM database
    with lock_work_dir(os.path.abspath(config.work_dir), wait_s=config.work_dir_wait_s):
        run = _prepare(model, config, sink or NullSink())
        try:
            run.sink.on_tasks(run.infos)
        except Exception:  # noqa: BLE001
            log.exception("sink.on_tasks failed")
        _tune(run)
        return _summary(run, time.perf_counter() - t_start)


def count_records(work_dir: str, model, target) -> int:
    tasks = collect_tasks(model, make_target(target))
    return sum(len(v) for v in records_by_task(open_json_db(work_dir), tasks).values())


def database_records(work_dir: str, model, target) -> list:
    """Every record of the run's TVM database as a MeasurementRecord (round -1: not
    known). The platform reconciles its store with these after a crash, so a
    candidate committed to TVM's database just before the worker died is not lost."""
    tasks = collect_tasks(model, make_target(target))
    out = []
    for i, recs in records_by_task(open_json_db(work_dir), tasks).items():
        for rec in recs:
            secs = [float(x) for x in (rec.run_secs or [])]
            out.append(MeasurementRecord(
                task_index=i, task_name=tasks[i].name, round_index=-1,
                candidate_key=candidate_key(tasks[i].name, rec.trace), run_secs=secs,
                error=None if secs else "no latency recorded", worker="tvm-database"))
    return out


# --------------------------------------------------------------------------- compare
# Final timings: like onnxruntime's (yardstick), repeats of at least FINAL_MIN_REPEAT_MS each, the median and
# IQR over FINAL_REPEATS of them.
FINAL_REPEATS = 15
FINAL_MIN_REPEAT_MS = 50


def _load_now() -> float | None:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # pragma: no cover - not Unix
        return None


def build_host_facts(target) -> dict:
    """What the package needs to check a host without TVM's compiler: the build host's CPU flags, and of
    them the instruction sets code built for ``target`` may use (none for a portable mcpu)."""
    from .package import runtime_versions
    from .targets import PORTABLE_CPUS, canonical_target, host_cpu_flags, isa_flags

    spec = canonical_target(target)
    cpu = dict(spec.get("host") or {}) if spec.get("kind") != "llvm" else spec
    flags = host_cpu_flags()
    portable = str(cpu.get("mcpu") or "") in PORTABLE_CPUS
    return {"cpu_flags": flags, "required_cpu_flags": [] if portable else isa_flags(flags, cpu.get("mtriple", "")),
            "versions": runtime_versions()}


def compile_and_compare(
    model,
    database_dir: str,
    target,
    threads: int | None = None,
    *,
    number: int = 1,
    repeat: int = FINAL_REPEATS,
    min_repeat_ms: int = FINAL_MIN_REPEAT_MS,
    rtol: float = 1e-4,
    atol: float = 1e-4,
    seed: int = 0,
    export_path: str | None = None,
) -> dict[str, Any]:
    """Compile ``model`` tuned (database in ``database_dir``) and untuned, run
    both on the same random inputs: latencies, max |diff|, outputs match.
    ``export_path``: also export the tuned executable there (a ``.so``).

    The tuned module and onnxruntime are timed back to back, each as ``repeat`` repeats (median and IQR),
    with the host's load sampled before, between and after; the verdict is :func:`verdict.verdict`'s. A
    timing on an overloaded host is repeated once; if the host is still overloaded the result is flagged.

    A target this host cannot run (another CPU's ``mcpu``, another GPU: a run measured on a remote host)
    is still compiled, tuned and untuned, and exported, so the tuning is kept; nothing is timed or
    compared here, and ``not_measured_here`` says why (timings of code built for another machine would
    describe neither)."""
    try:
        check_measurable_here(target, check_cores=False)
        why = None
    except TargetMismatch as exc:
        why = f"compiled, not timed or compared on this host: {exc}"
    tuned = compile_model(model, target, database=open_database(database_dir))
    untuned = compile_model(model, target, database=None)
    if export_path:
        tuned.export_library(export_path)
    build_host = build_host_facts(target)
    if why is not None:
        return {"tuned_latency_s": None, "untuned_latency_s": None, "speedup": None, "max_abs_diff": None,
                "outputs_match": None, "threads": threads, "onnxruntime": None,
                "not_measured_here": why, "onnxruntime_error": why, "build_host": build_host}
    inputs = random_inputs(model, seed=seed)
    timing = dict(number=number, repeat=repeat, threads=threads, min_repeat_ms=min_repeat_ms)
    out_u, samples_u = run_and_time_samples(untuned, inputs, target, **timing)
    cores = int(threads or (target.get("num-cores") if isinstance(target, dict) else None) or 1)
    attempts = []
    for _ in range(2):  # an overloaded host gets one more try
        loads = [_load_now()]
        out_t, samples_t = run_and_time_samples(tuned, inputs, target, **timing)
        loads.append(_load_now())
        ort = onnxruntime_comparison(model, inputs, out_t, target, threads, seed=seed)
        loads.append(_load_now())
        known = [x for x in loads if x is not None]
        load = verdict_rule.HostLoad(max(known), cores) if known else None
        outcome = verdict_rule.verdict(samples_t, ort.pop("samples_s", None), load)
        attempts.append({"load": load.load if load else None, "cores": cores, "label": outcome.label})
        if outcome.label != verdict_rule.FLAGGED:
            break
    diffs = [float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) if a.size else 0.0 for a, b in zip(out_t, out_u)]
    match = len(out_t) == len(out_u) and all(
        np.allclose(a, b, rtol=rtol, atol=atol * max(1.0, float(np.max(np.abs(b))) if b.size else 1.0))
        for a, b in zip(out_t, out_u)
    )
    lat_t, lat_u = outcome.tuned_median, float(statistics.median(samples_u))
    ort_s = outcome.ort_median
    return {
        "tuned_latency_s": lat_t,
        "tuned_latency_iqr_s": outcome.tuned_iqr,
        "tuned_samples_s": samples_t,
        "untuned_latency_s": lat_u,
        "speedup": (lat_u / lat_t) if lat_t else None,
        "max_abs_diff": max(diffs) if diffs else 0.0,
        "outputs_match": bool(match),
        "threads": threads,
        **ort,
        "onnxruntime_latency_s": ort_s,
        "onnxruntime_latency_iqr_s": outcome.ort_iqr,
        "ratio_to_onnxruntime": outcome.ratio,
        "untuned_ratio_to_onnxruntime": (lat_u / ort_s) if ort_s else None,
        "faster_engine": outcome.faster_engine,
        "verdict": outcome.to_dict(),
        "timing_attempts": attempts,
        "build_host": build_host,
    }


def onnxruntime_comparison(model, inputs, tvm_outputs, target, threads, *, seed=0) -> dict:
    """The same ONNX model under onnxruntime (same inputs, thread count and device kind): its timing
    samples (seconds, one per repeat; ``samples_s``) and whether its outputs agree with the tuned module's.
    A model that is not ONNX, or an onnxruntime that cannot run it here, gives the reason instead: the
    yardstick must not fail a run whose tuned module is fine."""
    if not hasattr(model, "graph"):
        return {"onnxruntime": None, "onnxruntime_error": "not an ONNX model: no onnxruntime comparison"}
    device = "cuda" if target_device_type(target) == "cuda" else "cpu"
    try:
        ort = yardstick.measure_onnxruntime(model, inputs, threads=int(threads or 1), device=device,
                                            tvm_outputs=tvm_outputs, seed=seed, repeat=FINAL_REPEATS,
                                            min_repeat_ms=FINAL_MIN_REPEAT_MS)
    except Exception as exc:  # noqa: BLE001 - ProviderUnavailable, or an op onnxruntime lacks
        return {"onnxruntime": None, "onnxruntime_error": f"{type(exc).__name__}: {exc}"}
    return {
        "onnxruntime": ort.to_dict(),
        "samples_s": [ms / 1e3 for ms in ort.samples_ms],
        "onnxruntime_outputs_agree": ort.outputs_agree,
        "onnxruntime_error": "",
    }
