"""The executor side of a run: claim it under a lease, run the engine (idempotent, resumable), record
how the attempt ended, and recover runs whose executor died.

The Celery task is a thin wrapper over `execute_run`. Everything the run needs to continue after a
crash is in the database (run, tasks, measurements) and in TVM's JSON tuning database under the run's
work dir.
"""
from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import F, Q
from django.utils import timezone

from core.fieldtext import fit_to_field
from recordcache import services as record_cache
from tuning import adapters
from tuning.adapters import Abort, DatabaseSink, LeaseLost, WorkDirBusy
from tuning.adapters.reconnect import (
    TRANSIENT_DB_ERRORS,
    heartbeat_interval_s,
    lease_margin_s,
    reset_connection,
    wait_for_database,
)
from tuning.models import Measurement, TuningRun

from .finish import announce_run_end, finish_succeeded
from .runs import dispatch_run, remote_cpu_for
from .settle import settle_tvm_database, settle_when_ended_without_executor

log = logging.getLogger(__name__)

MAX_RUN_ERROR_CHARS = 10_000  # of a failed run's error (a TextField: a cap, not a column width)


def claim_run(run_id: int, *, worker: str) -> str | None:
    """Take the run for this executor; None when it is not runnable or another live executor has it.

    A `running` run with a stale heartbeat (a re-delivered task of a dead worker) counts as an executor
    loss first, like in `recover_stale_runs`."""
    lease = secrets.token_hex(16)
    now = timezone.now()
    cutoff = now - timedelta(seconds=settings.TUNING_STALE_AFTER_S)
    with transaction.atomic():
        run = TuningRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            log.warning("run %s does not exist (deleted?); nothing to do", run_id)
            return None
        if run.status == TuningRun.Status.RUNNING and not (run.heartbeat_at and run.heartbeat_at >= cutoff):
            _executor_lost(run)
        if run.status != TuningRun.Status.QUEUED:
            log.info("run %s is %s; not executing it again", run_id, run.status)
            return None
        if run.waiting_since is not None:  # the team's queue sends it when a slot frees
            log.info("run %s waits for a concurrent-run slot; not executing it yet", run_id)
            return None
        run.status, run.lease, run.heartbeat_at = TuningRun.Status.RUNNING, lease, now
        run.worker = fit_to_field(TuningRun, "worker", worker)
        run.attempts += 1
        run.started_at = run.started_at or now
        run.save(update_fields=["status", "lease", "heartbeat_at", "worker", "attempts", "started_at"])
    return lease


def _stale(cutoff) -> Q:
    return Q(status=TuningRun.Status.RUNNING) & (Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True))


def _executor_lost(run: TuningRun) -> None:
    """The run's executor died (no heartbeat): honour a requested cancel or pause, fail a run that has
    now killed its executor TUNING_MAX_EXECUTOR_LOSSES times (it would crash the next one too), else
    queue it again. `run` is locked by the caller; saved here."""
    run.executor_losses += 1
    run.lease, run.worker_lost_at = "", timezone.now()
    limit = settings.TUNING_MAX_EXECUTOR_LOSSES
    if run.requested_action == TuningRun.Action.CANCEL:
        run.status, run.finished_at = TuningRun.Status.CANCELLED, timezone.now()
    elif run.requested_action == TuningRun.Action.PAUSE:
        run.status = TuningRun.Status.PAUSED
    elif run.executor_losses >= limit:
        run.status, run.finished_at = TuningRun.Status.FAILED, timezone.now()
        run.error = (f"The run's executor died {run.executor_losses} times (worker killed or crashed while "
                     f"running it, last on {run.worker or 'an unknown worker'}); it is not retried again.")
    else:
        run.status = TuningRun.Status.QUEUED
    if run.status != TuningRun.Status.QUEUED:
        run.requested_action = TuningRun.Action.NONE
    run.save(update_fields=["status", "lease", "executor_losses", "worker_lost_at", "finished_at",
                            "requested_action", "error"])
    announce_run_end(run.pk)  # cancelled or failed (a no-op otherwise)
    settle_when_ended_without_executor(run)  # its dead engine's last streamed results (a no-op otherwise)


def recover_stale_runs(*, stale_after_s: float | None = None) -> list[int]:
    """Deal with runs whose executor stopped sending heartbeats (its worker died): re-enqueue them, or
    cancel/pause/fail them (see `_executor_lost`). Returns the re-enqueued runs."""
    stale_after_s = stale_after_s if stale_after_s is not None else settings.TUNING_STALE_AFTER_S
    cutoff = timezone.now() - timedelta(seconds=stale_after_s)
    recovered = []
    for run_id in TuningRun.objects.filter(_stale(cutoff)).values_list("pk", flat=True):
        with transaction.atomic():
            run = TuningRun.objects.select_for_update().filter(_stale(cutoff), pk=run_id).first()
            if run is None:
                continue
            _executor_lost(run)
            log.warning("run %s: executor presumed dead (no heartbeat for %ss), now %s", run_id, stale_after_s,
                        run.status)
            if run.status == TuningRun.Status.QUEUED:
                dispatch_run(run)
                recovered.append(run_id)
    return recovered


@contextmanager
def heartbeat_while_executing(run_id: int, lease: str, abort: Abort | None = None):
    """Beat the run's heartbeat from a thread for as long as this executor works on it. The engine's own
    beats come with its events; between them (a long TVM compile, the final compile and compare) only this
    one says the executor is alive, so recovery never re-queues a run whose executor is just busy.

    A database blip is ridden out (the thread reconnects). ``abort`` is triggered, which stops the engine,
    when the lease is lost (the run is no longer this executor's) or when no beat has landed for
    `lease_margin_s` (another executor may take the run over soon)."""
    stop = threading.Event()
    margin = lease_margin_s()

    def fence(reason: str) -> None:
        log.warning("run %s: %s; stopping its engine", run_id, reason)
        if abort is not None:
            abort.trigger(reason)

    def beat() -> None:
        last_beat = time.monotonic()
        try:
            while not stop.wait(heartbeat_interval_s()):
                try:
                    if TuningRun.objects.filter(pk=run_id, lease=lease, status=TuningRun.Status.RUNNING).update(
                            heartbeat_at=timezone.now()):
                        last_beat = time.monotonic()
                        continue
                    # another lease or state: the run is no longer this executor's (a deleted run, or one
                    # this connection cannot see, is left to the sink, whose every call then fails)
                    if not stop.is_set() and TuningRun.objects.filter(pk=run_id).exists():
                        fence(f"run {run_id} is no longer this executor's (its lease was taken over or ended)")
                    return
                except (OperationalError, InterfaceError) as exc:
                    reset_connection()  # the next beat opens a new connection
                    log.warning("run %s: heartbeat failed, reconnecting: %s", run_id, exc)
                except Exception as exc:  # noqa: BLE001 - a beat that fails for another reason is retried too
                    log.warning("run %s: heartbeat failed: %s", run_id, exc)
                if time.monotonic() - last_beat > margin:
                    fence(f"no heartbeat reached the database for {margin:.0f} s")
                    return
        finally:
            reset_connection()  # this thread's own connection

    thread = threading.Thread(target=beat, name=f"run-{run_id}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5.0)


def execute_run(*, run_id: int, worker: str = "") -> str | None:
    """Run (or resume) a tuning run to completion. Idempotent: a finished or live run is left alone.

    Every TVM call on the user's model runs in a child process (`adapters.call_engine`): a model that
    crashes TVM fails its run with a clear error, and this worker goes on serving other runs."""
    import onnx  # loaded when a run executes, not when a worker imports its tasks

    lease = claim_run(run_id, worker=worker or f"pid{os.getpid()}")
    if lease is None:
        return None
    run = TuningRun.objects.select_related("model").get(pk=run_id)
    work_dir = adapters.run_work_dir(run.pk)
    sink = DatabaseSink(run.pk, lease, meter=adapters.make_energy_meter(run))
    started = time.perf_counter()
    abort = Abort()  # the engine lives only while this executor holds the run's lease
    model_proto = None
    try:
        with run.model.file.open("rb") as f:
            model_proto = onnx.load_model_from_string(f.read())
        with heartbeat_while_executing(run.pk, lease, abort), \
                adapters.fenced(abort, sink_give_up_after_s=lease_margin_s()):
            resolve_run_target(run, lease)
            record_cache.seed_before_engine(run=run, model_proto=model_proto)  # cache hits become verified seeds
            # measured under an earlier lease but not stored (its executor died between TVM's commit and
            # ours): stored now, before the engine counts the budget left, and again after it
            reconcile_with_database(sink, model_proto, run, work_dir)
            config = adapters.build_engine_config(run, work_dir)
            summary = adapters.run_engine(sink, model_proto, config)
            wait_for_database(within_s=lease_margin_s())  # its connection may have dropped meanwhile
            status = getattr(summary, "status", "succeeded")
            _add_wall(run.pk, lease, time.perf_counter() - started)
            sink.flush()
            reconcile_with_database(sink, model_proto, run, work_dir)  # on every attempt: nothing measured lost
            sink.flush()
            if status in ("cancelled", "paused"):
                return finish_interrupted(run.pk, lease, status, reason=sink.stop_reason)
            finish_succeeded(run.pk, lease, model_proto, summary, work_dir, stop_reason=sink.stop_reason)
        record_cache.record_run_outcome(run_id=run.pk, model_proto=model_proto)  # publish, verdicts
        return TuningRun.Status.SUCCEEDED
    except LeaseLost as exc:
        log.warning("run %s: lease lost, another executor continues it (%s)", run_id, exc)
        settle_tvm_database(run, model_proto, work_dir)  # the run may end here (cancelled while stopped)
        return None
    except WorkDirBusy as exc:
        # the previous executor's engine still works in the run's directory (its process tree stopped?):
        # this attempt steps back; the run is retried like after any executor loss, at most so many times
        log.warning("run %s: %s", run_id, exc)
        _step_back(run.pk, lease)
        return None
    except TRANSIENT_DB_ERRORS as exc:
        # the database went away for longer than this executor could wait: not the run's fault; it is
        # queued again (what it measured is in TVM's database and is reconciled) once the database is back
        log.warning("run %s: database unreachable (%s); handing the run back", run_id, exc)
        _hand_back(run.pk, lease)
        return None
    except Exception as exc:  # the run fails; the worker lives on
        log.exception("run %s failed", run_id)
        _add_wall(run.pk, lease, time.perf_counter() - started)
        sink.flush()
        if not isinstance(exc, PipelineChanged):  # its journal's records belong to the old pipeline's tasks
            settle_tvm_database(run, model_proto, work_dir)  # an engine that crashed left its stream uncommitted
        error = adapters.public_text(adapters.engine_error_text(exc), work_dir)[:MAX_RUN_ERROR_CHARS]
        if TuningRun.objects.filter(pk=run.pk, lease=lease).update(
                status=TuningRun.Status.FAILED, error=error, finished_at=timezone.now()):
            announce_run_end(run.pk)
        return TuningRun.Status.FAILED


def _hand_back(run_id: int, lease: str) -> None:
    """Queue the run again without counting an executor loss (this executor is alive; its database was
    not). Waits for the database first; if it does not come back, recovery re-queues the run later."""
    reset_connection()
    try:
        wait_for_database(within_s=settings.TUNING_STALE_AFTER_S)
        with transaction.atomic():
            run = TuningRun.objects.select_for_update().filter(pk=run_id, lease=lease).first()
            if run is None:
                return
            run.status, run.lease = TuningRun.Status.QUEUED, ""
            run.save(update_fields=["status", "lease"])
            dispatch_run(run)
    except TRANSIENT_DB_ERRORS as exc:
        log.warning("run %s: database still unreachable (%s); recovery will re-queue it", run_id, exc)


def _step_back(run_id: int, lease: str) -> None:
    """Give the run up as if this executor had died (`_executor_lost`), re-queueing it when it may go on."""
    with transaction.atomic():
        run = TuningRun.objects.select_for_update().filter(pk=run_id, lease=lease).first()
        if run is None:
            return
        _executor_lost(run)
        if run.status == TuningRun.Status.QUEUED:
            dispatch_run(run)


class PipelineChanged(Exception):
    """A resumed run's stored pipeline is not the one this engine compiles with."""


def resolve_run_target(run: TuningRun, lease: str) -> None:
    """Name the CPU (or GPU) the run tunes for, and how its candidates are timed, on the host that executes
    it, once: a resumed run keeps its first resolution (its records were timed that way), and the engine
    refuses to measure it on a host with another CPU, or with another pipeline than the one its records
    were tuned under (`PipelineChanged`)."""
    if run.resolved_target:
        now = adapters.current_pipeline_key(run)
        if run.pipeline_key and run.pipeline_key != now:
            raise PipelineChanged(
                f"This run was tuned under the pipeline {run.pipeline_key}; this platform now extracts and compiles "
                f"with {now} (it was upgraded while the run was unfinished), so the records measured so far do not "
                "match its tasks. Its measurements stay on the run; start a new run of the model to tune it under the "
                "new pipeline.")
        return
    resolved = adapters.resolve_target(run, remote_cpu=remote_cpu_for(run))
    run.resolved_target, run.target_key = resolved["target"], fit_to_field(TuningRun, "target_key", resolved["key"])
    run.pipeline_key = fit_to_field(TuningRun, "pipeline_key", resolved.get("pipeline_key", ""))
    run.evaluator = resolved.get("evaluator") or {}
    if not TuningRun.objects.filter(pk=run.pk, lease=lease).update(resolved_target=run.resolved_target,
                                                                   target_key=run.target_key,
                                                                   pipeline_key=run.pipeline_key,
                                                                   evaluator=run.evaluator):
        raise LeaseLost(f"run {run.pk} was taken over")


def reconcile_with_database(sink: DatabaseSink, model_proto, run: TuningRun, work_dir: Path) -> int:
    """Store the candidates TVM's database holds but the store lacks (the previous
    executor died between TVM's commit and ours). Returns how many were added."""
    if not (work_dir / "database_tuning_record.json").exists():
        return 0
    # a candidate is unique per task: the same schedule key can belong to two tasks of one model
    known = set(Measurement.objects.filter(run_id=run.pk).values_list("task__index", "candidate_key"))
    records = adapters.database_records(model_proto, work_dir, run)
    missing = [r for r in records if (r.task_index, r.candidate_key) not in known]
    for r in missing:
        r.round_index = 0
    if missing:
        log.warning("run %s: %d candidate(s) in TVM's database were missing from the store; added", run.pk,
                    len(missing))
        sink.on_measurements(missing)
    return len(missing)


def _add_wall(run_id: int, lease: str, seconds: float) -> None:
    TuningRun.objects.filter(pk=run_id, lease=lease).update(wall_seconds=F("wall_seconds") + seconds)


def finish_interrupted(run_id: int, lease: str, status: str, reason: str = "") -> str:
    """The engine stopped at a cancel or pause (requested, or the energy quota): record it, release the lease."""
    new = TuningRun.Status.CANCELLED if status == "cancelled" else TuningRun.Status.PAUSED
    if TuningRun.objects.filter(pk=run_id, lease=lease).update(
            status=new, requested_action="", lease="", stop_reason=fit_to_field(TuningRun, "stop_reason", reason),
            finished_at=timezone.now() if new == TuningRun.Status.CANCELLED else None):
        announce_run_end(run_id)  # a no-op for a pause
    return new
