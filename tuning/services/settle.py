"""Ended runs whose TVM database lags the platform's store, settled.

The engine appends each result to its work dir's journal before the platform stores it; TVM's join
commits it to TVM's database later. An engine killed in between leaves stored results out of TVM's
database until an engine next opens the work dir, and a run that ends meanwhile (cancelled after its
executor was killed, or its executor killed just as it ended its attempt) gets no such engine. The
executor settles what it can at the end of an attempt (`settle_tvm_database`); what it cannot is
settled here: when the run ends with no executor (a cancel of a queued or paused run, recovery ending
a run whose executor died) and by a periodic sweep of recently ended runs.

A marker next to the journal says how much of it TVM's database holds (written when the journal was
committed, `adapters.commit_stored_journal`, or at the engine's clean end), so the sweep opens TVM
only for a run that needs it: checking a run costs a file's size and a count of its measurements.
"""
from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from core.dispatch import send_on_commit
from tuning import adapters
from tuning.adapters import WorkDirBusy
from tuning.models import Measurement, TuningRun

log = logging.getLogger(__name__)

SWEEP_SCAN_LIMIT = 500  # the most recently ended runs a sweep looks at (no TVM: a stat each)
# how long a settle of an ended run waits for an engine that holds its work dir (a stopped one may hold it
# for minutes): the next sweep tries again, so a worker is not kept waiting
SETTLE_BUSY_WAIT_S = 1.0


def settle_tvm_database(run: TuningRun, model_proto, work_dir: Path, *, busy_wait_s: float = 10.0) -> int:
    """At the end of an attempt whose engine may have been killed (its lease lost, a crash), or of a run
    that ended with no executor: commit to the run's TVM database what the platform stored from the
    engine's stream but TVM's join never committed, so the run's TVM database holds every stored result
    also when no later attempt comes (the run was cancelled or failed meanwhile). Only stored results:
    nothing reaches TVM's database without having been stored under a valid lease. Never raises: a live
    engine in the directory (WorkDirBusy) commits them itself when it starts, or the next sweep does;
    anything else is logged."""
    if model_proto is None:
        return 0
    try:
        n = adapters.commit_stored_journal(model_proto, work_dir, run, busy_wait_s=busy_wait_s)
    except WorkDirBusy:
        return 0
    except Exception:  # noqa: BLE001 - the attempt's outcome stands; the next attempt or sweep commits them
        log.exception("run %s: could not commit its stored results to TVM's database", run.pk)
        return 0
    if n:
        log.warning("run %s: %d stored result(s) committed to TVM's database after the engine ended", run.pk, n)
    return n


def _journal_dir(run_id: int) -> Path:
    """The run's work dir, not created (a deleted run's files stay deleted)."""
    return adapters.run_files_dir(run_id) / "work"


def journal_settled(run_id: int, stored: int | None = None) -> bool:
    """Whether the run's TVM database holds every stored result its journal has, by the marker (no
    TVM); ``stored``: the run's Measurement count when the caller has it."""
    if stored is None:
        stored = Measurement.objects.filter(run_id=run_id).count()
    return adapters.stored_journal_settled(_journal_dir(run_id), stored)


def settle_when_ended_without_executor(run: TuningRun) -> None:
    """`run` just ended (cancelled or failed) with no live executor to settle its TVM database: send
    `tuning.settle_run_database` once the transaction commits, if its journal is not settled. A broker
    that cannot take it is logged; the sweep settles the run then."""
    if run.status not in TuningRun.TERMINAL or journal_settled(run.pk):
        return
    send_on_commit(lambda: _tasks().settle_run_database.delay(run.pk),
                   what=f"settling tuning run {run.pk}'s TVM database")


def _tasks():
    from tuning import tasks  # services import tasks only when they send one (tasks import services)

    return tasks


def settle_ended_run(*, run_id: int) -> int | None:
    """Commit the stored results an ended run's TVM database lacks (`settle_tvm_database`); how many,
    or None when there was nothing to do without opening TVM (not ended, settled, no model)."""
    run = TuningRun.objects.select_related("model").filter(pk=run_id).first()
    if run is None or run.status not in TuningRun.TERMINAL or journal_settled(run.pk):
        return None
    import onnx  # loaded when a run is settled, not when a worker imports its tasks

    try:
        with run.model.file.open("rb") as f:
            model_proto = onnx.load_model_from_string(f.read())
    except Exception:  # noqa: BLE001 - a model whose file is gone has nothing to settle against
        log.exception("run %s: its model could not be read; its TVM database is left as it is", run_id)
        return None
    return settle_tvm_database(run, model_proto, _journal_dir(run.pk), busy_wait_s=SETTLE_BUSY_WAIT_S)


def sweep_unsettled_runs(*, window_s: float | None = None, limit: int | None = None) -> list[int]:
    """Settle the recently ended runs (within ``window_s``) whose journal holds stored results TVM's
    database may lack, at most ``limit`` of them, newest first; returns those it tried. A run whose
    work dir a live engine holds is skipped (the next sweep tries again); a settled run costs no TVM."""
    window_s = settings.TUNING_SETTLE_SWEEP_WINDOW_S if window_s is None else window_s
    limit = settings.TUNING_SETTLE_SWEEP_BATCH if limit is None else limit
    ended = (TuningRun.objects
             .filter(status__in=TuningRun.TERMINAL, finished_at__gte=timezone.now() - timedelta(seconds=window_s))
             .annotate(stored=Count("measurements"))
             .order_by("-finished_at")
             .values_list("pk", "stored")[:SWEEP_SCAN_LIMIT])
    unsettled = [pk for pk, stored in ended if not journal_settled(pk, stored)][:limit]
    for run_id in unsettled:
        settle_ended_run(run_id=run_id)
    return unsettled
