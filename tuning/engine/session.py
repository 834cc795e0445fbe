"""One tuning run: tasks -> MetaSchedule with our builder/runner/callback -> TVM's JSONDatabase in ``work_dir``
-> (DOPpler) final serial re-measure.

``run_tuning`` is resumable: the state is TVM's JSONDatabase (and the XGBoost cost model saved next to it), never
only memory. Called again on a ``work_dir`` that holds records, it tunes the remaining budget (``max_trials``
minus records already stored for these tasks) and does not report stored candidates again (``candidate_key``).

Builders and runners come from ``plugins`` by name (``TuningConfig.builder`` / ``.runner``). This module stays
cheap to import (web processes import it for ``TuningConfig``): the steps that need TVM's compiler (``plugins``,
``search``, ``remeasure``, ``callbacks``) are imported when a run starts, in :func:`_tune`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Any

from tuning.engine import checkpoint as compiled_checkpoint
from tuning.engine.compile.pipeline import make_target, target_device_type
from tuning.engine.compile.targets import check_measurable_here
from tuning.engine.compile.workloads import Task, collect_tasks, round_size
from tuning.engine.config import LOCAL_RUNNERS, TaskResult, TuningConfig, TuningSummary
from tuning.engine.doppler.rounds import serial_totals
from tuning.engine.doppler.rule import DopRule
from tuning.engine.events import MeasurementRecord, NullSink, TaskInfo, TuningSink, candidate_key
from tuning.engine.process import sandbox
from tuning.engine.process.lifeline import lock_work_dir
from tuning.engine.process.procpool import available_cpus, unpin_current_thread
from tuning.engine.records import settle as cache_settle
from tuning.engine.trimmer.hooks import TrimmerRuntime
from tuning.engine.workdir import (
    StreamJournal,
    commit_streamed,
    database_paths,
    has_imported,
    has_journal,
    journal_size,
    load_final_rows,
    load_trimmer_preempted,
    next_round_offset,
    open_json_db,
    record_latency,
    records_by_task,
    save_final_rows,
    save_journal_settled,
    save_round_offset,
)

logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
log = logging.getLogger(__name__)

__all__ = ["run_tuning", "count_records", "database_records", "commit_journal"]


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
    state: Any = None  # search.engine_state.EngineState, once the builder and runner exist
    dop_rule: DopRule | None = None
    status: str = "succeeded"
    final_rows: list[dict] = dataclasses.field(default_factory=list)
    deadline: float | None = None  # when the caller's time budget ends (time.perf_counter), if it gave one
    model: Any = None  # what is tuned (the compiled checkpoint compiles it)


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
        cfg=cfg,
        sink=sink,
        work_dir=work_dir,
        target=target,
        device_type=target_device_type(target),
        cores=cores,
        threads=max(1, min(int(cfg.threads or len(cores)), len(cores))),
        tasks=tasks,
        infos=[TaskInfo(i, t.name, t.flops, t.weight) for i, t in enumerate(tasks)],
        database=database,
        n_existing=n_existing,
        known={candidate_key(tasks[i].name, r.trace) for i, recs in existing.items() for r in recs},
        best0=best0,
        remaining=max(0, int(cfg.max_trials) - max(n_existing, int(cfg.trials_spent or 0))),
    )
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
    """The record cache's second re-time of a seed that timed slow (``records.seeds.verify_seeds``): built
    and timed serially with the run's builder and runner, charged to the run's budget."""
    from tuning.engine import remeasure

    def retime(items):
        t0 = time.perf_counter()
        out = remeasure.retime_traces(run.tasks, run.target, builder, runner, run.device_type, items)
        run.remaining = max(0, run.remaining - len(items))
        run.phases["cache_retime"] = run.phases.get("cache_retime", 0.0) + time.perf_counter() - t0
        return out

    return retime


def _apply_cache_seeds(run: _Run, retime) -> None:
    """The record cache's verified seeds, through the run's trial budget: settled tasks leave the search,
    the others are searched on from their seeds (``records.settle``). The budget is Trimmer's; a run
    without Trimmer gets a passive runtime when the seeds need one (it feeds the budget from the measured
    batches and judges the searched seeds by the plateau rule)."""
    decisions = cache_settle.seed_decisions(
        run.work_dir,
        run.tasks,
        run.database,
        run.infos,
        int(run.cfg.max_trials),
        resumed=bool(run.n_existing),
        retime=retime,
    )
    state = run.state
    if decisions is None or state is None:
        return
    if state.trimmer is None:
        if not decisions.needs_budget:
            return
        state.trimmer = TrimmerRuntime.passive(
            run.infos,
            max_trials=int(run.cfg.max_trials),
            seed=run.cfg.seed,
            per_round=round_size(run.cfg.trials_per_round, run.remaining, len(run.tasks)),
        )
    cache_settle.apply_seed_decisions(state.trimmer.budget, decisions)


def _tune(run: _Run) -> None:
    """Make the builder and runner, measure the imported seeds, search, re-measure the best."""
    # TVM's compiler, imported when a run starts, not when a web process imports this module
    from tuning.engine import remeasure
    from tuning.engine.runners import plugins
    from tuning.engine.runners.measure_jobs import MeasureLedger
    from tuning.engine.search import loop as search
    from tuning.engine.search.callbacks import (
        ObservedBuilder,
        ProgressStreamer,
        StreamingRunner,
    )
    from tuning.engine.search.engine_state import EngineState

    cfg, builder, runner = run.cfg, None, None
    ledger = MeasureLedger()
    try:
        with _run_environment(run):
            ctx = plugins.PlugContext(
                config=cfg,
                work_dir=run.work_dir,
                device_type=run.device_type,
                threads=run.threads,
                cores=run.cores,
                ledger=ledger,
            )
            builder = plugins.make_builder(cfg.builder_kind, ctx)
            runner = plugins.make_runner(cfg.runner_kind, ctx)
            run.dop_rule = getattr(runner, "rule", None)
            parallel = plugins.is_parallel_runner(cfg.runner_kind)
            state = run.state = EngineState(
                run.sink,
                run.infos,
                known_keys=run.known,
                ledger=ledger if parallel else None,
                build_secs=getattr(builder, "build_secs", None),
                initial_best=run.best0,
                round_offset=next_round_offset(run.work_dir),
                trimmer=run.trimmer,
                journal=StreamJournal(run.work_dir, [t.mod for t in run.tasks]),
            )
            _pace(run, builder, runner, state)
            compiled_checkpoint.report_saved(run, state)
            for i, b in run.best0.items():
                state.best_history[i].append(b)
            if run.remaining > 0 and has_imported(run.work_dir):
                t0 = time.perf_counter()
                n_imported = remeasure.measure_imported(
                    run.work_dir,
                    run.tasks,
                    run.target,
                    builder,
                    runner,
                    state,
                    run.database,
                    run.device_type,
                    run.remaining,
                )
                run.remaining = max(0, run.remaining - n_imported)
                run.phases["imported"] = time.perf_counter() - t0
            # verified cache hits need no search; a seed that timed slow is timed once more first
            _apply_cache_seeds(run, retime=_cache_retimer(run, builder, runner))
            if run.remaining > 0:
                # results reach the sink as each measurement lands, not at TVM's joins (see callbacks)
                streamer = ProgressStreamer(state)
                state.after_first_round = compiled_checkpoint.hook(run, run.remaining)
                try:
                    run.status = search.search(
                        run.tasks,
                        run.target,
                        cfg,
                        state=state,
                        builder=ObservedBuilder(builder, state),
                        runner=StreamingRunner(runner, streamer),
                        database=run.database,
                        work_dir=run.work_dir,
                        budget=run.remaining,
                        resumed=bool(run.n_existing),
                        phases=run.phases,
                        deadline=run.deadline,
                    )
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
                    saved = {
                        "rows": remeasure.final_remeasure(
                            run.database,
                            run.tasks,
                            run.target,
                            builder,
                            runner,
                            run.work_dir,
                            run.device_type,
                            cfg.final_share,
                        ),
                        "charged": False,
                        "n_records": n_records,
                    }
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


def _task_results(run: _Run) -> list[TaskResult]:
    by_task = records_by_task(open_json_db(run.work_dir), run.tasks)
    finals: dict[int, list[dict]] = {}
    for row in run.final_rows:
        finals.setdefault(row["task_index"], []).append(row)
    results = []
    for i, t in enumerate(run.tasks):
        lats = [x for x in (record_latency(r) for r in by_task[i]) if x is not None]
        fin = [r["serial_latency_s"] for r in finals.get(i, []) if r["serial_latency_s"] is not None]
        results.append(
            TaskResult(
                index=i,
                name=t.name,
                weight=t.weight,
                flops=t.flops,
                n_records=len(by_task[i]),
                best_latency_s=min(lats) if lats else None,
                final_latency_s=min(fin) if fin else None,
                n_final_remeasured=len(finals.get(i, [])),
            )
        )
    return results


def _summary(run: _Run, wall_secs: float) -> TuningSummary:
    from tuning.engine.search.loop import run_stop_reason

    cfg, state, dop_rule, trimmer = run.cfg, run.state, run.dop_rule, run.trimmer
    results = _task_results(run)
    return TuningSummary(
        status=run.status,
        wall_secs=wall_secs,
        tasks=results,
        n_measurements=state.n_reported if state else 0,
        n_total_records=sum(r.n_records for r in results),
        trials_requested=run.remaining,
        final_dop=dop_rule.dop if dop_rule is not None else (1 if cfg.runner != "distributed" else None),
        dop_history=dop_rule.history_dicts() if dop_rule is not None else [],
        mean_parallel_error=dop_rule.mean_parallel_error() if dop_rule is not None else None,
        database_path=run.work_dir,
        database_paths=database_paths(run.work_dir),
        final_remeasure=run.final_rows,
        mode=cfg.mode,
        n_duplicates=state.n_duplicates if state else 0,
        phase_secs=run.phases,
        serial_by_reason=run.serial_by_reason,
        sink_errors=list(state.sink_errors) if state else [],
        trimmer=trimmer.to_dict() if trimmer is not None else None,
        stop_reason=run_stop_reason(run.status, trimmer, state),
        late_first_rounds=[run.tasks[i].name for i in state.pacer.late] if state and state.pacer else [],
        compiled_checkpoint=compiled_checkpoint.saved(run.work_dir),
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
        run.model = model
        if config.time_budget_s:
            run.deadline = t_start + float(config.time_budget_s)
        try:
            run.sink.on_tasks(run.infos)
        except Exception:  # noqa: BLE001
            log.exception("sink.on_tasks failed")
        try:
            _tune(run)
        finally:
            # TVM's joins commit what the search measured; what streamed out of a batch that was never
            # joined (the search raised) is committed here, so TVM's database never lags what was reported
            try:
                size = journal_size(run.work_dir)
                commit_streamed(run.work_dir, run.database, run.tasks, run.target)
                save_journal_settled(run.work_dir, size, None)  # a sweep of ended runs skips this one
            except Exception:  # noqa: BLE001 - the next call on the work dir commits them when it starts
                log.exception("could not commit the streamed results")
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
            out.append(
                MeasurementRecord(
                    task_index=i,
                    task_name=tasks[i].name,
                    round_index=-1,
                    candidate_key=candidate_key(tasks[i].name, rec.trace),
                    run_secs=secs,
                    error=None if secs else "no latency recorded",
                    worker="tvm-database",
                )
            )
    return out


def commit_journal(
    work_dir: str, model, target, only: set[tuple[int, str]] | None = None, *, wait_s: float = 10.0
) -> int:
    """Commit to the run's TVM database the streamed results it lacks; returns how many. An engine killed
    between reporting results (the journal, then the sink) and TVM's join leaves them out of TVM's
    database; the next call on the work dir commits them when it starts (``_prepare``), but a run that
    ends without one (cancelled while its engine was stopped, failed) would keep a TVM database that lags
    its store. ``only``: the (task index, candidate key) pairs to commit (what the platform stored under
    a valid lease), None: all. Under the work dir's engine lock: :class:`WorkDirBusy` when a live engine
    holds it past ``wait_s`` (that engine commits them itself)."""
    work_dir = os.path.abspath(work_dir)
    if not has_journal(work_dir):
        return 0
    with lock_work_dir(work_dir, wait_s=wait_s):
        tgt = make_target(target)
        return commit_streamed(work_dir, open_json_db(work_dir), collect_tasks(model, tgt), tgt, only=only)
