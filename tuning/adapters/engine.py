"""Where a run row becomes an engine input, and where the platform calls the engine.

`build_engine_config(run)` turns a `TuningRun` into the engine's `TuningConfig`; `trimmer_options`
reads Trimmer's options the way the engine will; every call that runs TVM on a team's model
(`run_engine`, `compile_and_compare`, `database_records`, `check_import`) goes through `call_engine`,
a sandboxed child process (`tuning.engine.process.isolate`), so a model that crashes TVM fails its run and
not the worker."""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
from collections.abc import Callable
from typing import Any
from pathlib import Path

from django.conf import settings
from django.db.models import Count

from tuning.distributed import celery_submit
from tuning.engine.process.isolate import Abort, EngineCrashed, EngineError, EngineStopped, call_isolated
from tuning.engine.process.lifeline import WorkDirBusy
from tuning.engine import compare, session
from tuning.engine.compile import passes as engine_passes
from tuning.engine.compile import targets as engine_targets
from tuning.engine.process import procpool
from tuning.engine.records import check_replay
from tuning.engine.process.procpool import WorkerError, WorkerTimeout
from tuning.engine.records.check import RecordError, precheck, recheck_output
from tuning.engine.config import TuningConfig
from tuning.engine.workdir import (
    has_imported,
    has_journal,
    journal_settled,
    journal_size,
    save_journal_settled,
    write_imported,
)
from tuning.engine.compile.targets import TargetRefused, check_target
from tuning.engine.measuring.timer import EvaluatorConfig, choose_evaluator
from tuning.engine.trimmer.rules import TrimmerConfig
from tuning.models import Measurement, TuningRun

from .reconnect import FencedSink
from .sink import LeaseLost

IMPORT_CHECK_TIMEOUT_S = 600

__all__ = ["IMPORT_CHECK_TIMEOUT_S", "Abort", "RecordError", "TargetRefused", "WorkDirBusy", "WorkerError",
           "WorkerTimeout", "build_engine_config", "call_engine", "check_import", "checked_target",
           "commit_stored_journal", "compile_and_compare", "current_pipeline_key", "database_records",
           "engine_error_text", "engine_target", "fenced",
           "has_imported", "precheck", "recheck_output", "resolve_target", "run_engine", "run_evaluator",
           "stored_journal_settled",
           "trimmer_options", "write_imported"]

# the executor's fence over the engine calls it makes (its Abort, how long a failing sink is borne)
_fence: contextvars.ContextVar[tuple[Abort, float] | None] = contextvars.ContextVar("engine_fence", default=None)


@contextlib.contextmanager
def fenced(abort: Abort, *, sink_give_up_after_s: float):
    """Engine calls made inside the block are killed when ``abort`` triggers (a lost lease, a sink that
    keeps failing) and raise LeaseLost: the engine lives only as long as its executor holds the run."""
    token = _fence.set((abort, sink_give_up_after_s))
    try:
        yield abort
    finally:
        _fence.reset(token)


def trimmer_options(options: dict | None) -> dict:
    """Trimmer's options as the engine reads them (defaults filled in); ValueError/TypeError when invalid."""
    return TrimmerConfig.from_dict(options).to_dict()


def checked_target(target) -> dict:
    """The closed target schema (`tuning.engine.compile.targets.check_target`), re-applied in the worker right before
    a target reaches TVM: a row stored before the schema was closed, or written around the API, fails its
    run here with the refused key named, and TVM never parses it."""
    try:
        return check_target(target)
    except TargetRefused as exc:
        raise TargetRefused(exc.key, f"refused before it reached TVM: {exc.reason}") from None


def engine_target(run: TuningRun) -> dict:
    """`run.engine_target` (the resolved target once a worker resolved it), checked (`checked_target`)."""
    return checked_target(run.engine_target)


def build_engine_config(run: TuningRun, work_dir: Path) -> TuningConfig:
    """The engine's input for `run`: its bounds, mode, target and options, measuring on the run's remote
    CPU queues (through Celery) when it has any and measures DOPpler-style."""
    target = engine_target(run)
    opts = dict(run.options or {})
    distributed = {}
    if measures_remotely(run):
        # the measuring workers check the candidates were built for their CPU
        distributed = {"distributed_submit": functools.partial(celery_submit, target=target),
                       "device_queue": list(opts["measure_queues"])}
    return TuningConfig(
        target=target, max_trials=run.max_trials, trials_per_round=run.trials_per_round,
        mode=run.measurement_mode, dop=run.dop_fixed or "auto", threads=run.threads, work_dir=str(work_dir),
        seed=opts.get("seed"), evaluator=run_evaluator(run),
        search_population=opts.get("search_population"), genetic_num_iters=opts.get("genetic_num_iters"),
        trimmer=TrimmerConfig.from_dict(run.trimmer_options) if run.trimmer_enabled else None, **distributed,
        trials_spent=trials_stored(run),
        # the sink finishes the search at the time budget (`DatabaseSink._time_budget_spent`, counted from the
        # same attempt's start); the engine paces its first rounds by it so every task gets one
        time_budget_s=None if run.time_budget_left_s is None else max(1.0, run.time_budget_left_s),
        # a recovered run's old engine lets go of the work dir at its executor's next heartbeat at the latest
        work_dir_wait_s=settings.TUNING_STALE_AFTER_S / 2 + 10,
    )


def measures_remotely(run: TuningRun) -> bool:
    """Whether `run`'s candidates are measured on its remote CPU queues (DOPpler-style runs that name some)."""
    return bool((run.options or {}).get("measure_queues")) and run.measurement_mode == TuningRun.Mode.DOPPLER


def run_evaluator(run: TuningRun) -> EvaluatorConfig:
    """How `run`'s candidates are timed: an evaluator its options set (tests, benches), else the one chosen
    when its target was resolved (`resolve_target`), else TVM's default (a run resolved before the choice)."""
    return EvaluatorConfig.from_any((run.options or {}).get("evaluator") or run.evaluator or None)


def trials_stored(run: TuningRun) -> int:
    """Measurements the platform stored for ``run`` (what an earlier attempt spent of its budget)."""
    return Measurement.objects.filter(run_id=run.pk).aggregate(n=Count("id"))["n"]


def engine_error_text(exc: BaseException) -> str:
    if isinstance(exc, (EngineCrashed, EngineError)):
        return str(exc)  # already "the TVM compiler crashed ..." or "<remote type>: <message>"
    return f"{type(exc).__name__}: {exc}"


def call_engine(func: Callable[..., Any] | str, *args, what: str, sink=None, needs_django: bool = False,
                writable: tuple[Path, ...] | None = None, **kwargs):
    """`call_isolated` for the platform: the child sets up Django only when the call needs it
    (distributed measurement sends Celery tasks and reads their results). A sink that lost its lease
    stops the child's engine, and the call raises LeaseLost; so does the executor's fence (`fenced`),
    which kills the child. A second engine on a run's work dir raises WorkDirBusy. With `writable` (the
    folders it may write; empty: none), the child runs as the sandbox account; without, as the worker's
    user (the tuning session: it starts the candidates' sandboxes and owns TVM's database and the GPU
    locks)."""
    lease_lost: list[Exception] = []
    fence = _fence.get()
    abort = fence[0] if fence else None
    if sink is not None and fence is not None:
        sink = FencedSink(sink, abort, give_up_after_s=fence[1])

    def on_sink_error(name, exc):
        if isinstance(exc, LeaseLost):
            lease_lost.append(exc)
            return TuningRun.Action.CANCEL if name == "control" else None  # stop the child's engine
        return None

    # Without Django the child needs no secrets, so it gets the sandbox's scrubbed environment; a
    # distributed run's child sends Celery tasks and reads results, so it keeps the worker's.
    try:
        value = call_isolated(func, *args, what=what, sink=sink, on_sink_error=on_sink_error, abort=abort,
                              init="django:setup" if needs_django else None, scrub=not needs_django,
                              sandbox_user=writable is not None and not needs_django, writable=writable or (),
                              env={"DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE",
                                                                            "config.settings")},
                              **kwargs)
    except EngineStopped as exc:
        raise LeaseLost(f"the engine was stopped: {exc}") from None
    except EngineError as exc:
        if str(exc).startswith(f"{WorkDirBusy.__name__}:"):
            raise WorkDirBusy(str(exc).partition(": ")[2]) from None
        raise
    if lease_lost:
        raise LeaseLost(str(lease_lost[0]))
    return value


def run_engine(sink, model_proto, config: TuningConfig):
    """Tune: the engine's `run_tuning` in a child, its events answered by `sink` (a DatabaseSink)."""
    return call_engine(session.run_tuning, model_proto, config, sink=sink,
                       what="tuning the model (task extraction, search and measurement)",
                       needs_django=config.distributed_submit is not None)


def compile_and_compare(model_proto, work_dir: Path, run: TuningRun) -> dict:
    """Compile the tuned and untuned model, export the tuned one to `work_dir/tuned_module.so`, and
    compare latencies and outputs."""
    target = engine_target(run)
    threads = run.threads or target.get("num-cores")
    return call_engine(compare.compile_and_compare, model_proto, str(work_dir), target,
                       threads, export_path=str(work_dir / "tuned_module.so"), writable=(work_dir,),
                       what="compiling the tuned and untuned model and comparing their outputs")


def resolve_target(run: TuningRun, remote_cpu: dict | None = None) -> dict:
    """`run.target` resolved on this (the executing) host: `{"target": ..., "key": ..., "pipeline_key": ...,
    "evaluator": ...}`. A run measured on remote CPU queues builds for `remote_cpu` (`{"mcpu", "mtriple"}` their
    nodes registered), else portable code; its candidates are timed as `timer.choose_evaluator` says for the
    target's kind (cold on CPUs). In a child: resolving loads TVM, which a worker process must not do (it
    forks)."""
    target = checked_target(run.target)
    if (run.options or {}).get("measure_queues") and target.get("kind") == "llvm":
        for key, value in (remote_cpu or {"mcpu": "generic"}).items():
            target.setdefault(key, value)
        target = checked_target(target)  # the node registry's names too
    resolved = call_engine(engine_targets.resolve_run_target, target, run.threads, writable=(),
                           what="resolving the run's target on this host")
    return {**resolved, "evaluator": choose_evaluator(str(target.get("kind"))).to_dict()}


def current_pipeline_key(run: TuningRun) -> str:
    """The pipeline this platform's engine extracts and compiles `run`'s resolved target with now (no TVM
    needed): a resumed run's stored `pipeline_key` must still be it."""
    return engine_passes.pipeline_key(target=run.resolved_target or run.target)


def database_records(model_proto, work_dir: Path, run: TuningRun) -> list:
    """Every record of the run's TVM database, as the engine's MeasurementRecords."""
    return call_engine(session.database_records, str(work_dir), model_proto, engine_target(run),
                       writable=(work_dir,), what="reading the run's tuning database back")


def commit_stored_journal(model_proto, work_dir: Path, run: TuningRun, *, busy_wait_s: float = 10.0) -> int:
    """Commit to the run's TVM database the streamed results the platform stored but TVM's database lacks
    (the engine was killed between reporting them and TVM's join, and no later call committed them);
    only what the store holds, so TVM's database never gains a result stored under no lease. Runs as the
    worker's user (the engine's, who owns TVM's database and its lock); WorkDirBusy when a live engine
    holds the directory past ``busy_wait_s`` (it commits them when it starts). Then notes the journal
    settled (a marker next to it, against the count of stored results) so that `stored_journal_settled`
    needs no TVM."""
    if not has_journal(str(work_dir)):
        return 0
    rows = list(Measurement.objects.filter(run_id=run.pk).values_list("task__index", "candidate_key"))
    # measured before the commit: a journal that grows meanwhile (a live engine) stays unsettled
    size, stored = journal_size(str(work_dir)), set(rows)
    n = 0
    if stored:  # else nothing of the journal may reach TVM's database: settled as it is
        n = call_engine(session.commit_journal, str(work_dir), model_proto, engine_target(run), stored,
                        wait_s=busy_wait_s, what="committing the run's stored results to its tuning database")
    save_journal_settled(str(work_dir), size, len(rows))  # the sweep of ended runs skips it now
    return n


def stored_journal_settled(work_dir: Path, stored: int) -> bool:
    """Whether TVM's database already holds every stored result of the run's journal, as far as the
    marker ``commit_stored_journal`` (or the engine's clean end) left says; ``stored``: the run's count
    of Measurement rows. No TVM, no subprocess: a sweep asks it of every recently ended run."""
    return journal_settled(str(work_dir), stored)


def check_import(model_bytes: bytes, run: TuningRun, workloads: bytes, records: bytes, budget: int) -> dict:
    """TVM parses the uploaded database in a sandbox and says which records it accepts
    (`tuning.engine.records.check_replay.check_import`); raises WorkerError/WorkerTimeout when the checker fails."""
    # looked up on the module when called, so a test can stand in for a subverted checker
    return procpool.run_isolated(check_replay.check_import, model_bytes, engine_target(run), workloads,
                                 records, budget, timeout=IMPORT_CHECK_TIMEOUT_S)
