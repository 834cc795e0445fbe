"""One tuning run: tasks -> MetaSchedule with our builder/runner/callback ->
TVM's JSONDatabase in ``work_dir`` -> (DOPpler) final serial re-measure.

``run_tuning`` is resumable: the state is TVM's JSONDatabase (and the XGBoost
cost model saved next to it), never only memory. Called again on a
``work_dir`` that holds records, it tunes the remaining budget
(``max_trials`` minus records already stored for these tasks) and does not
report stored candidates again (``candidate_key`` de-dup).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import sandbox
from .doppler import DOPController
from .events import NullSink, TaskInfo, TuningSink, candidate_key
from .relax_pipeline import make_target, target_device_type
from .timer import EvaluatorConfig

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
    "best_module",
    "count_records",
]

DB_WORKLOAD = "database_workload.json"
DB_RECORDS = "database_tuning_record.json"
FINAL_DIR = "final"
IMPORTED_DIR = "imported"  # checked, imported records: seeds the platform builds and measures first
IMPORTED_DONE_DIR = "imported_measured"
COST_MODEL_FILE = "cost_model.xgb"


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
    search_threads: int | str = "physical"
    cpu_ids: list[int] | None = None  # cores to measure on
    overlap_measurement: bool | None = None  # None: pooled runner -> builds wait for it (shared cores); distributed -> overlap
    final_remeasure: bool | None = None  # default: True in doppler mode
    final_share: float = 0.1
    timeout_sec: float = 30.0
    max_trials_per_task: int | None = None
    controller: DOPController | None = None
    light_intrinsics: bool | None = None  # default: True in doppler mode (see tvm_compat)
    # Trimmer (per-task pre-emption, whole-model stop, ML candidate filter): a
    # TrimmerConfig or its dict; None or enabled=False = off
    trimmer: Any = None

    def __post_init__(self) -> None:
        if self.mode not in ("stock", "doppler"):
            raise ValueError("mode must be 'stock' or 'doppler'")
        self.evaluator = EvaluatorConfig.from_any(self.evaluator)
        if isinstance(self.trimmer, dict):
            from .trimmer import TrimmerConfig

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


# --------------------------------------------------------------------------- tasks
@dataclasses.dataclass
class _Task:
    name: str
    mod: Any  # IRModule with one PrimFunc "main" (normalized)
    weight: float
    flops: float


def _flops(mod) -> float:
    try:
        from tvm.s_tir.analysis import estimate_tir_flops

        return float(estimate_tir_flops(mod))
    except Exception:  # noqa: BLE001
        return 0.0


def collect_tasks(model, target) -> list[_Task]:
    """Tuning tasks of an ONNX model, a Relax IRModule, a TIR PrimFunc or an
    IRModule of PrimFuncs (sorted by name, like ``tune_tir``)."""
    import tvm
    from tvm import relax, tirx
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    from .relax_pipeline import extract_tasks

    if isinstance(model, tirx.PrimFunc):
        mod = _normalize_mod(model)
        return [_Task("main", mod, 1.0, _flops(mod))]
    if isinstance(model, tvm.IRModule) and not any(
        isinstance(f, relax.Function) for _, f in model.functions_items()
    ):
        out = []
        for gv, func in sorted(model.functions_items(), key=lambda kv: kv[0].name_hint):
            if isinstance(func, tirx.PrimFunc):
                mod = _normalize_mod(func)
                out.append(_Task(gv.name_hint, mod, 1.0, _flops(mod)))
        return out
    out = []
    for t in extract_tasks(model, target):
        mod = t.dispatched[0]
        if mod.attrs is not None and mod.attrs.get("tirx.is_scheduled", False):
            continue
        out.append(_Task(t.task_name, mod, float(t.weight), _flops(mod)))
    return out


# --------------------------------------------------------------------------- database
def _db_paths(work_dir: str, final: bool = False) -> tuple[str, str]:
    d = os.path.join(work_dir, FINAL_DIR) if final else work_dir
    return os.path.join(d, DB_WORKLOAD), os.path.join(d, DB_RECORDS)


def _open_json_db(work_dir: str, final: bool = False):
    from tvm.s_tir import meta_schedule as ms

    pw, pr = _db_paths(work_dir, final)
    os.makedirs(os.path.dirname(pw), exist_ok=True)
    return ms.database.JSONDatabase(path_workload=pw, path_tuning_record=pr, allow_missing=True)


def open_database(work_dir: str, prefer_final: bool = True):
    """The database to compile with: ``work_dir/final`` (the serially
    re-measured top candidates) when present, else the full record database."""
    pw, pr = _db_paths(work_dir, final=True)
    if prefer_final and os.path.exists(pr) and os.path.getsize(pr) > 0:
        return _open_json_db(work_dir, final=True)
    return _open_json_db(work_dir)


def _shash(mod) -> int:
    import tvm_ffi

    return int(tvm_ffi.structural_hash(mod))


def _records_by_task(db, tasks: list[_Task]) -> dict[int, list]:

    hashes = {_shash(t.mod): i for i, t in enumerate(tasks)}
    out: dict[int, list] = {i: [] for i in range(len(tasks))}
    cache: dict[int, int | None] = {}
    for rec in db.get_all_tuning_records():
        wl = rec.workload
        h = cache.get(id(wl))
        if h is None:
            h = _shash(wl.mod)
        i = hashes.get(h)
        if i is not None:
            out[i].append(rec)
    return out


def write_imported(work_dir: str, workload_lines: list[str], record_lines: list[str]) -> None:
    """Store checked imported records (see record_check) apart from the run's database: they
    count and seed the search only once the platform has built and measured them itself."""
    d = os.path.join(work_dir, IMPORTED_DIR)
    os.makedirs(d, exist_ok=True)
    for name, lines in ((DB_WORKLOAD, workload_lines), (DB_RECORDS, record_lines)):
        tmp = os.path.join(d, name + ".tmp")
        Path(tmp).write_text("".join(line + "\n" for line in lines))
        os.replace(tmp, os.path.join(d, name))


def has_imported(work_dir: str) -> bool:
    p = os.path.join(work_dir, IMPORTED_DIR, DB_RECORDS)
    return os.path.exists(p) and os.path.getsize(p) > 0


def _imported_db(work_dir: str):
    from tvm.s_tir import meta_schedule as ms

    d = os.path.join(work_dir, IMPORTED_DIR)
    return ms.database.JSONDatabase(path_workload=os.path.join(d, DB_WORKLOAD),
                                    path_tuning_record=os.path.join(d, DB_RECORDS), allow_missing=True)


def count_records(work_dir: str, model, target) -> int:
    tasks = collect_tasks(model, make_target(target))
    return sum(len(v) for v in _records_by_task(_open_json_db(work_dir), tasks).values())


def _rec_latency(rec) -> float | None:
    if rec.run_secs is None or len(rec.run_secs) == 0:
        return None
    vals = [float(x) for x in rec.run_secs]
    v = sum(vals) / len(vals)
    return v if v < 1e9 else None


def best_module(work_dir_or_db, workload_mod, target):
    """The best scheduled IRModule for a workload (or None)."""
    from tvm.s_tir import meta_schedule as ms  # noqa: F401

    db = open_database(work_dir_or_db) if isinstance(work_dir_or_db, (str, Path)) else work_dir_or_db
    return db.query_ir_module(workload_mod, make_target(target), "main")


# --------------------------------------------------------------------------- run
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


def _search_kwargs(cfg: TuningConfig) -> dict:
    kwargs = {}
    if cfg.search_population:
        kwargs["population_size"] = int(cfg.search_population)
        kwargs["init_min_unmeasured"] = min(50, int(cfg.search_population))
    if cfg.genetic_num_iters:
        kwargs["genetic_num_iters"] = int(cfg.genetic_num_iters)
    return kwargs


def _search_strategy(cfg: TuningConfig, task_index: int = 0, trimmer=None):
    """TVM's evolutionary search; with Trimmer's filter on, wrapped in FilteredSearch."""
    from tvm.s_tir import meta_schedule as ms

    kwargs = _search_kwargs(cfg)
    if trimmer is not None and trimmer.config.filter_enabled and trimmer.config.filter_oversample > 1:
        from .trimmer_hooks import make_filtered_search

        return make_filtered_search(task_index=task_index, runtime=trimmer, config=trimmer.config,
                                    inner_kwargs=kwargs, seed=cfg.seed)
    return ms.search_strategy.EvolutionarySearch(**kwargs) if kwargs else "evolutionary"


TRIMMER_STATE = "trimmer_state.json"


def _load_trimmer_preempted(work_dir: str) -> dict[int, int]:
    import json

    try:
        data = json.loads(Path(os.path.join(work_dir, TRIMMER_STATE)).read_text())
        return {int(k): int(v) for k, v in (data.get("preempted_tasks") or {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _save_trimmer_state(work_dir: str, report: dict) -> None:
    import json

    with contextlib.suppress(OSError, TypeError, ValueError):
        Path(os.path.join(work_dir, TRIMMER_STATE)).write_text(json.dumps(report, default=str))


def run_tuning(model, config: TuningConfig, sink: TuningSink | None = None) -> TuningSummary:
    """Tune ``model`` (ONNX ModelProto, Relax IRModule, TIR PrimFunc or
    IRModule of PrimFuncs) under ``config``; stream to ``sink``."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.utils import fork_seed

    from .callbacks import EngineState, StreamingMeasureCallback
    from .procpool import available_cpus, unpin_current_thread
    from .scheduler import ControlledScheduler

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    t_start = time.perf_counter()
    phases: dict[str, float] = {}
    sink = sink or NullSink()
    cfg = config
    work_dir = os.path.abspath(cfg.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    target = make_target(cfg.target)
    device_type = target_device_type(target)
    # TVM's thread pool may have pinned this thread to one core (e.g. after a
    # FoldConstant or a 1-thread run): the search threads it spawns would inherit that
    unpin_current_thread()
    cores = list(cfg.cpu_ids) if cfg.cpu_ids else available_cpus()
    threads = max(1, min(int(cfg.threads or len(cores)), len(cores)))

    # -- tasks and what the database already holds (resume)
    t0 = time.perf_counter()
    tasks = collect_tasks(model, target)
    if not tasks:
        raise ValueError("the model has no tunable tasks")
    infos = [TaskInfo(i, t.name, t.flops, t.weight) for i, t in enumerate(tasks)]
    database = _open_json_db(work_dir)
    existing = _records_by_task(database, tasks)
    n_existing = sum(len(v) for v in existing.values())
    known = {candidate_key(tasks[i].name, r.trace) for i, recs in existing.items() for r in recs}
    best0 = {}
    for i, recs in existing.items():
        lats = [x for x in (_rec_latency(r) for r in recs) if x is not None]
        if lats:
            best0[i] = min(lats)
    remaining = max(0, int(cfg.max_trials) - n_existing)
    trimmer = None
    if cfg.trimmer is not None and getattr(cfg.trimmer, "enabled", False):
        from .trimmer_hooks import TrimmerRuntime

        trimmer = TrimmerRuntime(
            cfg.trimmer,
            infos,
            max_trials=int(cfg.max_trials),
            initial_best=best0,
            initial_trials={i: len(recs) for i, recs in existing.items() if recs},
            preempted=_load_trimmer_preempted(work_dir) if n_existing else None,
            seed=cfg.seed,
        )
        trimmer.per_round = max(1, min(int(cfg.trials_per_round), remaining or 1))
    phases["prepare"] = time.perf_counter() - t0
    try:
        sink.on_tasks(infos)
    except Exception:  # noqa: BLE001
        log.exception("sink.on_tasks failed")

    builder = runner = None
    controller = None
    state = None
    status = "succeeded"
    final_rows: list[dict] = []
    try:
        # -- builder / runner
        from .runner import DistributedRunner, MeasureLedger, PooledAsyncRunner

        ledger = MeasureLedger()
        env_ctx = _env(TVM_NUM_THREADS=threads) if cfg.runner == "local" else contextlib.nullcontext()
        # TVM's own Popen workers (stock mode) copy os.environ when they start: keep secrets out
        scrub = sandbox.scrubbed_environ() if cfg.mode == "stock" else contextlib.nullcontext()
        with env_ctx, scrub:
            if cfg.builder == "persistent":
                from .builder import PersistentBuilder

                builder = PersistentBuilder(
                    max_workers=cfg.builder_workers or len(available_cpus()),
                    timeout_sec=max(cfg.timeout_sec, 60.0),
                    artifact_dir=os.path.join(work_dir, "artifacts"),
                )
            else:
                # TVM's default timeout (30 s) also covers each fresh worker's ~11 s
                # `import tvm.s_tir.tensor_intrin`; on a loaded host that import alone
                # times out, so the stock baseline gets a generous build timeout.
                builder = ms.builder.LocalBuilder(
                    max_workers=cfg.builder_workers or len(available_cpus()),
                    timeout_sec=max(cfg.timeout_sec, 120.0),
                    initializer=sandbox.stock_worker_init,
                )
            if cfg.runner == "pooled":
                controller = cfg.controller
                runner = PooledAsyncRunner(
                    evaluator=cfg.evaluator,
                    threads=threads,
                    cpu_ids=cores,
                    dop=cfg.dop,
                    controller=controller,
                    timeout_sec=cfg.timeout_sec,
                    ledger=ledger,
                    worker_limits=sandbox.default_limits(gpu=device_type != "cpu"),
                )
                controller = runner.controller
            elif cfg.runner == "distributed":
                if cfg.distributed_submit is None or not cfg.device_queue:
                    raise ValueError("distributed runner needs distributed_submit and device_queue")
                runner = DistributedRunner(
                    cfg.distributed_submit,
                    cfg.device_queue,
                    evaluator=cfg.evaluator,
                    threads=cfg.threads,
                    ledger=ledger,
                )
            else:
                runner = ms.runner.LocalRunner(
                    evaluator_config=cfg.evaluator.to_tvm(), timeout_sec=cfg.timeout_sec,
                    initializer=functools.partial(sandbox.stock_worker_init, gpu=device_type != "cpu"))

            overlap = cfg.overlap_measurement
            if overlap is None:
                # the local pool measures on the cores that search and build use:
                # let builds wait for it (quiet measurements) unless told otherwise
                overlap = cfg.runner == "distributed"
            if cfg.runner == "pooled" and not overlap and cfg.builder == "persistent":
                builder.before_build = runner.wait_idle  # type: ignore[union-attr]

            state = EngineState(
                sink,
                infos,
                known_keys=known,
                ledger=ledger if cfg.runner in ("pooled", "distributed") else None,
                build_secs=builder.build_secs if cfg.builder == "persistent" else None,  # type: ignore[union-attr]
                initial_best=best0,
                round_offset=_next_round_offset(work_dir),
                trimmer=trimmer,
            )
            for i, b in best0.items():
                state.best_history[i].append(b)

            if remaining > 0 and has_imported(work_dir):
                t0 = time.perf_counter()
                n_imported = _measure_imported(work_dir, tasks, target, builder, runner, state, database,
                                               device_type, remaining)
                remaining = max(0, remaining - n_imported)
                phases["imported"] = time.perf_counter() - t0
            if remaining > 0:
                t0 = time.perf_counter()
                if cfg.light_intrinsics:
                    from .tvm_compat import ensure_tensor_intrin

                    ensure_tensor_intrin(target)
                per_iter = max(1, min(int(cfg.trials_per_round), remaining))
                per_task = min(int(cfg.max_trials_per_task or remaining), remaining)
                contexts = []
                seeds = fork_seed(cfg.seed, n=len(tasks))
                # not TVM's get_loggers_from_work_dir: it calls logging.config.dictConfig,
                # which rewires the host's (Django's) logging and breaks on unnamed handlers
                loggers = [_task_logger(i, t.name) for i, t in enumerate(tasks)]
                for ti, (t, lg, rs) in enumerate(zip(tasks, loggers, seeds)):
                    contexts.append(
                        ms.TuneContext(
                            mod=t.mod,
                            target=target,
                            space_generator="post-order-apply",
                            search_strategy=_search_strategy(cfg, ti, trimmer),
                            task_name=t.name,
                            logger=lg,
                            rand_state=rs,
                            num_threads=cfg.search_threads,
                        ).clone()
                    )
                logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
                num_cores = contexts[0].num_threads
                cost_model = _skip_infrastructure_failures(
                    ms.cost_model.XGBModel(num_tuning_cores=num_cores, tree_method="auto"))
                cm_path = os.path.join(work_dir, COST_MODEL_FILE)
                if n_existing and os.path.exists(cm_path):
                    with contextlib.suppress(Exception), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        cost_model.load(cm_path)
                if trimmer is not None:
                    trimmer.cost_model = cost_model  # the filter scores with the tuner's own model
                callbacks = list(ms.MeasureCallback.create("default")) + [StreamingMeasureCallback(state)]
                scheduler = ControlledScheduler(state, seed=cfg.seed, max_trials=remaining)
                phases["setup"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                scheduler.tune(
                    tasks=contexts,
                    task_weights=[t.weight for t in tasks],
                    max_trials_global=remaining,
                    max_trials_per_task=per_task,
                    num_trials_per_iter=per_iter,
                    builder=builder,
                    runner=runner,
                    measure_callbacks=callbacks,
                    database=database,
                    cost_model=cost_model,
                )
                phases["tune"] = time.perf_counter() - t0
                with contextlib.suppress(Exception), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cost_model.save(cm_path)
                if state.stop_reason == "cancel":
                    status = "cancelled"
                elif state.stop_reason == "pause":
                    status = "paused"
                if trimmer is not None:
                    trimmer.cost_model = None
                    _save_trimmer_state(work_dir, trimmer.to_dict())
            _save_round_offset(work_dir, state.round_offset + len(ledger.rounds) + state._own_round)

            # -- DOPpler final stage: serial re-measure of the top share per task
            if status == "succeeded" and cfg.final_remeasure and cfg.runner in ("pooled", "distributed"):
                t0 = time.perf_counter()
                final_rows = _final_remeasure(
                    database, tasks, target, builder, runner, cfg, work_dir, device_type, cfg.final_share
                )
                phases["final_remeasure"] = time.perf_counter() - t0
                # every build+measure done on the owner's behalf is charged (one trial each)
                if final_rows and hasattr(sink, "on_serial_remeasure"):
                    state._safe("on_serial_remeasure", [
                        (r["task_index"], r["candidate_key"], r["serial_latency_s"]) for r in final_rows])
    finally:
        for obj in (runner, builder):
            if obj is not None and hasattr(obj, "shutdown"):
                with contextlib.suppress(Exception):
                    obj.shutdown()

    # -- summary
    database = _open_json_db(work_dir)
    by_task = _records_by_task(database, tasks)
    finals: dict[int, list[dict]] = {}
    for row in final_rows:
        finals.setdefault(row["task_index"], []).append(row)
    results = []
    for i, t in enumerate(tasks):
        lats = [x for x in (_rec_latency(r) for r in by_task[i]) if x is not None]
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
    pw, pr = _db_paths(work_dir)
    fpw, fpr = _db_paths(work_dir, final=True)
    paths = {"workload": pw, "tuning_record": pr}
    if os.path.exists(fpr):
        paths.update({"final_workload": fpw, "final_tuning_record": fpr})
    return TuningSummary(
        status=status,
        wall_secs=time.perf_counter() - t_start,
        tasks=results,
        n_measurements=state.n_reported if state else 0,
        n_total_records=sum(r.n_records for r in results),
        trials_requested=remaining,
        final_dop=controller.dop if controller is not None else (1 if cfg.runner != "distributed" else None),
        dop_history=controller.history_dicts() if controller is not None else [],
        mean_parallel_error=controller.mean_parallel_error() if controller is not None else None,
        database_path=work_dir,
        database_paths=paths,
        final_remeasure=final_rows,
        mode=cfg.mode,
        n_duplicates=state.n_duplicates if state else 0,
        phase_secs=phases,
        sink_errors=list(state.sink_errors) if state else [],
        trimmer=trimmer.to_dict() if trimmer is not None else None,
        stop_reason=trimmer.stop_reason if (trimmer is not None and status == "succeeded") else None,
    )


def _measure_imported(work_dir, tasks, target, builder, runner, state, database, device_type, budget) -> int:
    """Build and measure the imported records (at most ``budget``) on this platform, as trials of
    the run: only then do they enter the run's database (seeding the search and its cost model)
    and the sink. Imported latencies never do. Returns how many were measured."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule

    from .events import MeasurementRecord
    from .measure import _jsonable
    from .runner import _Job

    plan = []  # (task index, trace, key, scheduled module)
    for i, recs in _records_by_task(_imported_db(work_dir), tasks).items():
        for rec in recs:
            key = candidate_key(tasks[i].name, rec.trace)
            if key in state.known_keys or len(plan) >= budget:
                continue  # measured before a crash, or over the budget
            try:
                sch = Schedule(tasks[i].mod)
                rec.trace.apply_to_schedule(sch, remove_postproc=False)
                plan.append((i, rec.trace, key, sch.mod))
            except Exception as exc:  # noqa: BLE001
                log.warning("imported record of %s does not replay: %s", tasks[i].name, exc)
    paths = _build_all(builder, [m for *_, m in plan], target)
    args = {i: ms.arg_info.ArgInfo.from_prim_func(t.mod["main"]) for i, t in enumerate(tasks)}
    built = [(p, path) for p, path in zip(plan, paths) if path]
    jobs = [_Job(path=path, device_type=device_type, args_info=_jsonable([a.as_json() for a in args[p[0]]]),
                 future=None) for p, path in built]  # type: ignore[arg-type]
    outcomes = dict(zip((p[2] for p, _ in built), _measure_serially(runner, jobs)))
    round_index = state.round_offset  # a round of its own, before the search's rounds
    state.round_offset += 1
    records = []
    for i, trace, key, _ in plan:
        out = outcomes.get(key)
        secs = [float(x) for x in out.run_secs] if out is not None and not out.error else []
        error = None if secs else ("build failed" if out is None else f"run: {out.error or 'no result'}")
        database.commit_tuning_record(ms.database.TuningRecord(
            trace, database.commit_workload(tasks[i].mod), secs or [1e10], target, args[i]))
        if secs:
            state.best[i] = min(state.best.get(i, math.inf), sum(secs) / len(secs))
        state.known_keys.add(key)
        records.append(MeasurementRecord(task_index=i, task_name=tasks[i].name, round_index=round_index,
                                         candidate_key=key, run_secs=secs, error=error,
                                         worker=out.worker if out is not None else None, dop=1))
    for _, path in built:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    state.n_reported += len(records)
    if records:
        state._safe("on_measurements", records)
    done = os.path.join(work_dir, IMPORTED_DONE_DIR)
    shutil.rmtree(done, ignore_errors=True)
    os.replace(os.path.join(work_dir, IMPORTED_DIR), done)
    return len(records)


def _task_logger(index: int, name: str) -> logging.Logger:
    lg = logging.getLogger(f"tuning.engine.task.{index}")
    if lg.level == logging.NOTSET:
        lg.setLevel(logging.WARNING)
    return lg


def _next_round_offset(work_dir: str) -> int:
    p = os.path.join(work_dir, "rounds.txt")
    try:
        return int(Path(p).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _save_round_offset(work_dir: str, value: int) -> None:
    with contextlib.suppress(OSError):
        Path(os.path.join(work_dir, "rounds.txt")).write_text(str(int(value)))


def _final_remeasure(database, tasks, target, builder, runner, cfg, work_dir, device_type, share) -> list[dict]:
    """Re-measure the top ``share`` of each task's candidates serially and
    write them, with their serial times, to ``work_dir/final``."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.schedule import Schedule

    from .runner import _Job

    final_dir = os.path.join(work_dir, FINAL_DIR)
    shutil.rmtree(final_dir, ignore_errors=True)
    final_db = _open_json_db(work_dir, final=True)
    by_task = _records_by_task(database, tasks)
    rows: list[dict] = []
    from .measure import _jsonable

    plan: list[tuple[int, Any, Any]] = []  # (task index, record, scheduled module)
    for i, t in enumerate(tasks):
        valid = [r for r in by_task[i] if _rec_latency(r) is not None]
        if not valid:
            continue
        k = max(1, math.ceil(share * len(valid)))
        for rec in sorted(valid, key=_rec_latency)[:k]:
            try:
                sch = Schedule(t.mod)
                rec.trace.apply_to_schedule(sch, remove_postproc=False)
                plan.append((i, rec, sch.mod))
            except Exception as exc:  # noqa: BLE001
                log.warning("final re-measure: cannot replay a trace of %s: %s", t.name, exc)
    paths = _build_all(builder, [m for _, _, m in plan], target)
    for (i, rec, _), path in zip(plan, paths):
        if not path:  # built and failed: charged all the same
            rows.append({"task_index": i, "task_name": tasks[i].name,
                         "candidate_key": candidate_key(tasks[i].name, rec.trace),
                         "recorded_latency_s": _rec_latency(rec), "serial_latency_s": None, "error": "build failed"})
    for i, t in enumerate(tasks):
        items = [(rec, path) for (ti, rec, _), path in zip(plan, paths) if ti == i and path]
        if not items:
            continue
        wl = final_db.commit_workload(t.mod)
        jobs, recs = [], []
        for rec, path in items:
            args = [a.as_json() for a in rec.args_info] if rec.args_info is not None else [
                a.as_json() for a in ms.arg_info.ArgInfo.from_prim_func(t.mod["main"])
            ]
            jobs.append(_Job(path=path, device_type=device_type, args_info=_jsonable(args), future=None))  # type: ignore[arg-type]
            recs.append(rec)
        if not jobs:
            continue
        outcomes = _measure_serially(runner, jobs)
        for rec, job, out in zip(recs, jobs, outcomes):
            serial = None if out.error else (sum(out.run_secs) / len(out.run_secs) if out.run_secs else None)
            rows.append(
                {
                    "task_index": i,
                    "task_name": t.name,
                    "candidate_key": candidate_key(t.name, rec.trace),
                    "recorded_latency_s": _rec_latency(rec),
                    "serial_latency_s": serial,
                    "error": out.error,
                }
            )
            if serial is not None:
                final_db.commit_tuning_record(
                    ms.database.TuningRecord(
                        rec.trace,
                        wl,
                        [float(x) for x in out.run_secs],
                        target,
                        rec.args_info,
                    )
                )
            with contextlib.suppress(OSError):
                shutil.rmtree(os.path.dirname(job.path), ignore_errors=True)
    return rows


def _skip_infrastructure_failures(cost_model):
    """Keep results that say nothing about their candidate (a lost measurement message, a dead measuring
    worker: `runner.is_infrastructure_failure`) out of the cost model, which would learn them as 1e10 s
    latencies (XGBModel.update prices every result without run_secs at 1e10)."""
    from .runner import is_infrastructure_failure

    update = cost_model._inst.update

    def filtered(context, candidates, results):
        keep = [i for i, r in enumerate(results) if not is_infrastructure_failure(r.error_msg)]
        if len(keep) == len(results):
            return update(context, candidates, results)
        if keep:
            update(context, [candidates[i] for i in keep], [results[i] for i in keep])
        return None

    cost_model.update = filtered  # the derived object forwards to its Python instance, which C++ calls
    return cost_model


def _build_all(builder, mods: list, target) -> list[str | None]:
    """Artifact path of each module (None where its build failed)."""
    from tvm.s_tir import meta_schedule as ms

    if hasattr(builder, "build_many"):
        return builder.build_many(mods, target)  # all at once on the pool
    paths = []
    for m in mods:
        res = builder.build([ms.builder.BuilderInput(m, target)])[0]
        paths.append(None if res.error_msg else str(res.artifact_path))
    return paths


def _measure_serially(runner, jobs) -> list:
    """MeasureOutcome of each job, one at a time, with whichever runner the run uses."""
    from tvm.s_tir import meta_schedule as ms

    from .measure import MeasureOutcome
    from .runner import DistributedRunner

    if isinstance(runner, DistributedRunner):
        return _distributed_serial(runner, jobs)
    if hasattr(runner, "measure_serial"):
        return runner.measure_serial(jobs)
    out = []
    for job in jobs:  # TVM's LocalRunner (stock mode)
        args = [ms.arg_info.ArgInfo.from_json(a) for a in job.args_info]
        res = runner.run([ms.runner.RunnerInput(job.path, job.device_type, args)])[0].result()
        secs = [float(x) for x in res.run_secs] if res.run_secs is not None else []
        out.append(MeasureOutcome(secs, str(res.error_msg) if res.error_msg else None, "local"))
    return out


def _distributed_serial(runner, jobs) -> list:
    """Serial re-measure through the distributed queue: one candidate at a time."""
    from .measure import MeasureOutcome, make_payload
    from .runner import device_index_from_queue

    out = []
    q = runner.queues[0]
    for job in jobs:
        with open(job.path, "rb") as fh:
            data = fh.read()
        payload = make_payload(
            data,
            device_type=job.device_type,
            args_info_json=job.args_info,
            evaluator=runner.evaluator,
            threads=runner.threads,
            device_index=device_index_from_queue(q),
            queue=q,
        )
        try:
            # no timeout here: the submit future has one, from when a worker starts measuring
            out.append(MeasureOutcome.from_any(runner.submit(payload).result()))
        except Exception as exc:  # noqa: BLE001
            out.append(MeasureOutcome([], f"final re-measure failed: {exc!r}", q))
    return out


# --------------------------------------------------------------------------- compare
def compile_and_compare(
    model,
    database_dir: str,
    target,
    threads: int | None = None,
    *,
    number: int = 20,
    repeat: int = 5,
    rtol: float = 1e-4,
    atol: float = 1e-4,
    seed: int = 0,
    export_path: str | None = None,
) -> dict[str, Any]:
    """Compile ``model`` tuned (database in ``database_dir``) and untuned, run
    both on the same random inputs: latencies, max |diff|, outputs match.
    ``export_path``: also export the tuned executable there (a ``.so``)."""
    import numpy as np

    from .relax_pipeline import compile_model, random_inputs, run_and_time

    inputs = random_inputs(model, seed=seed)
    tuned = compile_model(model, target, database=open_database(database_dir))
    untuned = compile_model(model, target, database=None)
    if export_path:
        tuned.export_library(export_path)
    out_t, lat_t = run_and_time(tuned, inputs, target, number=number, repeat=repeat, threads=threads)
    out_u, lat_u = run_and_time(untuned, inputs, target, number=number, repeat=repeat, threads=threads)
    diffs = [float(np.max(np.abs(a.astype("float64") - b.astype("float64")))) if a.size else 0.0 for a, b in zip(out_t, out_u)]
    match = len(out_t) == len(out_u) and all(
        np.allclose(a, b, rtol=rtol, atol=atol * max(1.0, float(np.max(np.abs(b))) if b.size else 1.0))
        for a, b in zip(out_t, out_u)
    )
    return {
        "tuned_latency_s": lat_t,
        "untuned_latency_s": lat_u,
        "speedup": (lat_u / lat_t) if lat_t else None,
        "max_abs_diff": max(diffs) if diffs else 0.0,
        "outputs_match": bool(match),
        "threads": threads,
    }


def database_records(work_dir: str, model, target) -> list:
    """Every record of the run's TVM database as a MeasurementRecord (round -1: not
    known). The platform reconciles its store with these after a crash, so a
    candidate committed to TVM's database just before the worker died is not lost."""
    from .events import MeasurementRecord

    tasks = collect_tasks(model, make_target(target))
    out = []
    for i, recs in _records_by_task(_open_json_db(work_dir), tasks).items():
        for rec in recs:
            secs = [float(x) for x in (rec.run_secs or [])]
            out.append(MeasurementRecord(
                task_index=i, task_name=tasks[i].name, round_index=-1,
                candidate_key=candidate_key(tasks[i].name, rec.trace), run_secs=secs,
                error=None if secs else "no latency recorded", worker="tvm-database"))
    return out
