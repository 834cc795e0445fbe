"""The run state machine as users drive it: start (bounds, target, queues, quota: a run over the
concurrent-run quota waits in its team's queue), cancel, pause, resume (one transition table,
`TRANSITIONS`), and the one on-commit send of a run to the `tuning` queue."""
from __future__ import annotations

import os
import re
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from core.exceptions import ConflictError, QuotaExceeded, ServiceError
from core.models import DLModel
from core.permissions import require_team_writer
from core.selectors import energy_model
from core.services import require_ready
from scheduling import selectors as scheduling_selectors
from tuning import adapters
from tuning.engine.compile.targets import TARGET_KINDS, TargetRefused, build_target
from tuning.models import MIN_TRIALS_PER_TASK, RUN_LIMITS, TuningRun, min_trials_for, parse_dop, run_bound_error

from .finish import announce_run_end
from .quota import check_run_quota
from .run_queue import dispatch_run, enqueue_run, wait_for_slot  # noqa: F401 - enqueue_run re-exported
from .settle import settle_when_ended_without_executor

SUPPORTED_TARGET_KINDS = TARGET_KINDS
CONTROL_RUNS = "start or control tuning runs"  # what viewers may not do (PermissionDenied's message)
GPU_QUEUE = re.compile(r"measure\.[A-Za-z0-9_-]+\.gpu\d+")


def target_core_limit() -> int:
    """The most cores a target may name: the most a registered node or this host has (or the operator's
    default target names), at most RUN_LIMITS' ceiling."""
    configured = settings.DEFAULT_TUNING_TARGET.get("num-cores")
    candidates = [os.cpu_count() or 1, scheduling_selectors.most_registered_cores()]
    if type(configured) is int:
        candidates.append(configured)
    return max(1, min(RUN_LIMITS["num_cores"][1], max(candidates)))


def validate_target(target) -> dict:
    """The run's target, built by the engine's one builder (`tuning.engine.compile.targets.build_target`) from the
    fields a user may set: kind llvm or cuda, `num-cores` (1 to `target_core_limit()`), `mcpu` only as a
    registered node reports it (its triple added from the registration), `arch` sm_XY for cuda. Any other
    key (TVM's cl-opt, mattr, libs, host, ...) is refused naming it; nothing is stored."""
    try:
        return build_target(target, cpus=scheduling_selectors.registered_cpus(), max_cores=target_core_limit(),
                            default_cores=os.cpu_count() or 1)
    except TargetRefused as exc:
        raise ServiceError(f"Invalid target: {exc}", field="target") from None


def validate_measure_queues(queues, *, target: dict) -> list[str]:
    """The remote measurement queues a run may use: each must be the CPU queue (`measure.<node>.cpu`) of a
    registered, live, undrained node that serves it. Nodes are shared by every team (there is no per-team
    node list), so any team may use any live node's CPU queue. GPU queues are refused: GPU work goes
    through placement and the GPU-hour quota (GPU jobs), which a tuning run's measurements would bypass."""
    if queues in (None, ""):
        return []
    if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues):
        raise ServiceError("measure_queues must be a list of queue names.", field="measure_queues")
    if target.get("kind") != "llvm":
        raise ServiceError("Remote measurement (measure_queues) is available for CPU (llvm) targets only.",
                           field="measure_queues")
    cutoff = timezone.now() - timedelta(seconds=scheduling_selectors.node_stale_after_s())
    served = {q for node in scheduling_selectors.nodes().filter(drained=False, last_seen__gte=cutoff)
              for q in (node.queues or []) if q == node.cpu_queue}
    for q in queues:
        if GPU_QUEUE.fullmatch(q):
            raise ServiceError(f"measure_queues: '{q}' is a GPU queue; GPU work is placed as GPU jobs (under the "
                               "GPU-hour quota), never sent by a tuning run.", field="measure_queues")
        if q not in served:
            raise ServiceError(f"measure_queues: '{q}' is not the CPU queue of a registered, live node "
                               "(see /api/nodes/).", field="measure_queues")
    return list(dict.fromkeys(queues))


def remote_cpu_for(run: TuningRun) -> dict:
    """The CPU a run measured on remote queues builds for: the one CPU (LLVM name, triple) its queues'
    nodes registered; {} (portable "generic" code) when they name none, or several different ones."""
    queues = (run.options or {}).get("measure_queues") or []
    cpus = scheduling_selectors.cpus_serving(queues) if queues else set()
    if len(cpus) != 1:
        return {}
    (mcpu, triple), = cpus
    return {"mcpu": mcpu, "mtriple": triple} if mcpu and triple else {}


def validate_run_bounds(*, max_trials, trials_per_round, threads, options: dict, max_minutes=None) -> None:
    """RUN_LIMITS, checked here for every entry point (API, dashboard, `manage.py tune`)."""
    bounded = {"max_trials": max_trials, "trials_per_round": trials_per_round}
    if threads is not None:
        bounded["threads"] = threads
    if max_minutes is not None:
        bounded["max_minutes"] = max_minutes
    bounded.update({k: options[k] for k in ("search_population", "seed") if options.get(k) is not None})
    for name, value in bounded.items():
        error = run_bound_error(name, value)
        if error:
            raise ServiceError(error, field=name)


def validate_budget(*, max_trials: int, model: DLModel) -> None:
    """Refuse a budget that cannot give each of the model's tuning tasks MIN_TRIALS_PER_TASK trials (the
    count the upload found; a model without one is not checked)."""
    n_tasks = model.num_tuning_tasks
    if n_tasks and max_trials < min_trials_for(n_tasks):
        raise ServiceError(
            f"max_trials {max_trials} is below the minimum for this model: it has {n_tasks} tuning tasks and "
            f"each needs at least {MIN_TRIALS_PER_TASK} trials, so use at least {min_trials_for(n_tasks)} "
            f"trials (fewer would leave tasks with no valid measurement).", field="max_trials")


def rounds_that_reach_every_task(*, trials_per_round: int, max_trials: int, model: DLModel) -> int:
    """MetaSchedule gives every task one round before any task gets a second: a round larger than
    max_trials / tasks would spend the budget before the last tasks' turn (64 trials at 32 a round left
    3 of 6 tasks untuned). Such a round is lowered to max_trials // tasks (>= MIN_TRIALS_PER_TASK, which
    validate_budget guarantees); a model without a task count keeps the requested round."""
    n_tasks = model.num_tuning_tasks
    if n_tasks and trials_per_round * n_tasks > max_trials:
        return max(MIN_TRIALS_PER_TASK, max_trials // n_tasks)
    return trials_per_round


def start_run(
    *,
    actor: AbstractBaseUser,
    model: DLModel,
    max_trials: int,
    max_minutes: int | None = None,
    target: dict | str | None = None,
    trials_per_round: int = 32,
    measurement_mode: str = TuningRun.Mode.DOPPLER,
    dop: str | int = "auto",
    threads: int | None = None,
    options: dict | None = None,
    trimmer: bool = False,
    trimmer_options: dict | None = None,
    enqueue: bool = True,
    queue_when_busy: bool = True,
) -> TuningRun:
    """Validate and store a run, and send it to a worker (`enqueue`) when one of the team's concurrent-run
    slots is free; otherwise it waits in the team's queue, or, with `queue_when_busy=False` (a caller that
    executes the run itself), it is refused with 429. `max_minutes`: a wall-time budget beside the trial
    budget (tuning finishes at whichever is spent first)."""
    require_team_writer(actor, model.team_id, CONTROL_RUNS)
    require_ready(model)
    target = validate_target(target or settings.DEFAULT_TUNING_TARGET)
    options = dict(options or {})
    validate_run_bounds(max_trials=max_trials, trials_per_round=trials_per_round, threads=threads, options=options,
                        max_minutes=max_minutes)
    validate_budget(max_trials=max_trials, model=model)
    trials_per_round = rounds_that_reach_every_task(trials_per_round=trials_per_round, max_trials=max_trials,
                                                    model=model)
    if measurement_mode not in TuningRun.Mode.values:
        raise ServiceError(f"measurement_mode must be one of {', '.join(TuningRun.Mode.values)}.",
                           field="measurement_mode")
    try:
        dop_fixed = parse_dop(dop)
    except ValueError as exc:
        raise ServiceError(str(exc), field="dop") from None
    try:
        trimmer_cfg = adapters.trimmer_options(trimmer_options)
    except (TypeError, ValueError) as exc:
        raise ServiceError(f"Invalid Trimmer options: {exc}", field="trimmer_options") from None
    if "measure_queues" in options:
        options["measure_queues"] = validate_measure_queues(options["measure_queues"], target=target)
    grid = model.team.grid_intensity_g_per_kwh
    platform_energy = energy_model()
    with transaction.atomic():
        slot_free = check_run_quota(team_id=model.team_id, max_trials=max_trials)
        if not slot_free and not queue_when_busy:
            raise QuotaExceeded("Quota 'max concurrent tuning runs' reached: every run slot of the team is taken. "
                                "Wait for a run to finish, cancel one, or send the run to a worker, where it "
                                "waits for a slot.", quota="max_concurrent_runs")
        run = TuningRun.objects.create(
            team_id=model.team_id, model=model, created_by=actor, target=target, target_kind=target["kind"],
            max_trials=max_trials, max_minutes=max_minutes, trials_per_round=trials_per_round,
            measurement_mode=measurement_mode,
            dop_fixed=dop_fixed, threads=threads, options=options,
            trimmer_enabled=bool(trimmer), trimmer_options=trimmer_cfg if trimmer else {},
            grid_intensity_g_per_kwh=grid if grid is not None else platform_energy.grid_intensity_g_per_kwh,
            energy_model=adapters.energy_model_snapshot(platform_energy),
            waiting_since=None if slot_free else timezone.now(),
        )
        if enqueue and slot_free:
            dispatch_run(run)
    return run


def locked(run: TuningRun) -> TuningRun:
    return TuningRun.objects.select_for_update().get(pk=run.pk)


class Control:
    """What a user asks of a run."""

    CANCEL, PAUSE, RESUME = "cancel", "pause", "resume"


S, A = TuningRun.Status, TuningRun.Action


class Outcome:
    """The kinds of answer the transition table gives (see TRANSITIONS)."""

    STOP_NOW = "stop_now"  # status set now, nothing is running
    REQUEST = "request"  # a running run: ask the engine, which stops at its next control poll (once a round)
    CLEAR_REQUEST = "clear_request"  # a pending pause withdrawn: the run goes on
    REQUEUE = "requeue"  # a paused run sent again (or queued for a slot)
    UNCHANGED = "unchanged"  # asked again what is already asked or true: answered as is
    REFUSED = "refused"  # 409


# (status, pending request) x control -> (outcome, new status, new pending request). One table, so every
# transition is visible and tested (tests/tuning/test_run_control.py walks it): cancel wins over a pending
# pause (a later pause does not undo it), a pending pause can be withdrawn by resume, a paused or waiting run
# is stopped at once.
TRANSITIONS: dict[tuple[str, str, str], tuple[str, str | None, str | None]] = {
    (S.QUEUED, A.NONE, Control.CANCEL): (Outcome.STOP_NOW, S.CANCELLED, A.NONE),
    (S.QUEUED, A.NONE, Control.PAUSE): (Outcome.STOP_NOW, S.PAUSED, A.NONE),
    (S.QUEUED, A.NONE, Control.RESUME): (Outcome.UNCHANGED, None, None),
    (S.RUNNING, A.NONE, Control.CANCEL): (Outcome.REQUEST, None, A.CANCEL),
    (S.RUNNING, A.NONE, Control.PAUSE): (Outcome.REQUEST, None, A.PAUSE),
    (S.RUNNING, A.NONE, Control.RESUME): (Outcome.UNCHANGED, None, None),
    (S.RUNNING, A.PAUSE, Control.CANCEL): (Outcome.REQUEST, None, A.CANCEL),
    (S.RUNNING, A.PAUSE, Control.PAUSE): (Outcome.UNCHANGED, None, None),
    (S.RUNNING, A.PAUSE, Control.RESUME): (Outcome.CLEAR_REQUEST, None, A.NONE),
    (S.RUNNING, A.CANCEL, Control.CANCEL): (Outcome.UNCHANGED, None, None),
    (S.RUNNING, A.CANCEL, Control.PAUSE): (Outcome.REFUSED, None, None),
    (S.RUNNING, A.CANCEL, Control.RESUME): (Outcome.REFUSED, None, None),
    (S.PAUSED, A.NONE, Control.CANCEL): (Outcome.STOP_NOW, S.CANCELLED, A.NONE),
    (S.PAUSED, A.NONE, Control.PAUSE): (Outcome.UNCHANGED, None, None),
    (S.PAUSED, A.NONE, Control.RESUME): (Outcome.REQUEUE, S.QUEUED, A.NONE),
}


def transition(status: str, requested_action: str, control: str) -> tuple[str, str | None, str | None]:
    """The table's answer; a finished run, and any pair the table lacks, refuses every control."""
    return TRANSITIONS.get((status, requested_action or A.NONE, control), (Outcome.REFUSED, None, None))


_DONE = {Control.CANCEL: "cancelled", Control.PAUSE: "paused", Control.RESUME: "resumed"}


def _refusal(run: TuningRun, control: str) -> ConflictError:
    if run.status in TuningRun.TERMINAL:
        return ConflictError(f"Run {run.pk} is already {run.status}.")
    if run.requested_action == A.CANCEL:
        return ConflictError(f"Run {run.pk} is being cancelled (cancel requested); it cannot be {_DONE[control]}.")
    return ConflictError(f"Run {run.pk} is {run.status}; it cannot be {_DONE[control]}.")


@transaction.atomic
def control_run(*, actor: AbstractBaseUser, run: TuningRun, control: str) -> TuningRun:
    """Apply a user's cancel, pause or resume to the run by the transition table."""
    run = locked(run)
    require_team_writer(actor, run.team_id, CONTROL_RUNS)
    outcome, new_status, new_request = transition(run.status, run.requested_action, control)
    if outcome == Outcome.REFUSED:
        raise _refusal(run, control)
    if outcome == Outcome.UNCHANGED:
        return run
    fields = ["requested_action"]
    run.requested_action = new_request
    if outcome == Outcome.REQUEUE:
        slot_free = check_run_quota(team_id=run.team_id, max_trials=0)
        run.status, run.error = new_status, ""
        if not slot_free:
            wait_for_slot(run)
        fields += ["status", "error", "waiting_since"]
    elif outcome == Outcome.STOP_NOW:
        run.status, run.waiting_since = new_status, None
        if new_status == S.CANCELLED:
            run.finished_at = timezone.now()
        fields += ["status", "finished_at", "waiting_since"]
    run.save(update_fields=fields)
    if outcome == Outcome.REQUEUE and run.waiting_since is None:
        dispatch_run(run)
    if outcome == Outcome.STOP_NOW:
        announce_run_end(run.pk)  # a cancel's webhook; the slot it held goes to the team's next waiting run
        # a queued or paused run has no executor: one killed earlier may have left results TVM lacks
        settle_when_ended_without_executor(run)
    return run


def cancel_run(*, actor: AbstractBaseUser, run: TuningRun) -> TuningRun:
    return control_run(actor=actor, run=run, control=Control.CANCEL)


def pause_run(*, actor: AbstractBaseUser, run: TuningRun) -> TuningRun:
    return control_run(actor=actor, run=run, control=Control.PAUSE)


def resume_run(*, actor: AbstractBaseUser, run: TuningRun) -> TuningRun:
    return control_run(actor=actor, run=run, control=Control.RESUME)


@transaction.atomic
def archive_run(*, actor: AbstractBaseUser, run: TuningRun) -> TuningRun:
    """Hide a finished run from lists; its measurements, files and the team's usage are kept. A queued,
    running or paused run is refused (409): cancel it first."""
    run = locked(run)
    require_team_writer(actor, run.team_id, CONTROL_RUNS)
    if run.status not in TuningRun.TERMINAL:
        raise ConflictError(f"Run {run.pk} is {run.status}: cancel it before archiving it.", code="run_not_finished")
    if run.archived_at is None:
        run.archived_at = timezone.now()
        run.save(update_fields=["archived_at"])
    return run


@transaction.atomic
def restore_run(*, actor: AbstractBaseUser, run: TuningRun) -> TuningRun:
    """Bring an archived run back into the lists."""
    run = locked(run)
    require_team_writer(actor, run.team_id, CONTROL_RUNS)
    if run.archived_at is None:
        raise ConflictError(f"Run {run.pk} is not archived.", code="not_archived")
    run.archived_at = None
    run.save(update_fields=["archived_at"])
    return run
