"""Trace uploads and trace-driven simulations: validate and store a trace, queue a simulation within
the team's limits, run it (the ``scheduling.run_simulation`` task) and store its results.

ONE path from a trace to a result: :func:`simulate` (a trace input, policies, seed, parameters ->
the engine's result). The ``simulate`` command calls it directly (shipped, uploaded or local trace
files, :func:`read_trace_file`), the API and the dashboard through :func:`start_simulation` (validate,
check the team's limits, queue) and the task's :func:`execute_simulation` (run, store); the bench calls
the same engine function (``horus.experiments.run_experiment``) with the inputs :func:`simulate` uses on
a database without profiles of its own (``experiments.default_inputs``)."""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.exceptions import ConflictError, QuotaExceeded, ServiceError
from core.filestore import delete_stored_on_commit, save_with_file
from core.models import Quota, Team
from core.permissions import require_team_writer
from common.jsonsafe import json_safe
from core.services import lock_team_quota
from core.upload_sandbox import SandboxFailure, parse_in_sandbox

from .. import adapters, selectors
from ..adapters import TraceRejected
from ..models import ERROR_TEXT_MAX_CHARS, SimulationRun, TraceUpload
from .predictors import ensure_active_predictor
from .simulation_queue import cancel_check, dispatch_simulations
from .staff import acting_user
from .usage import charge_simulation

log = logging.getLogger(__name__)


def max_trace_bytes() -> int:
    return settings.SCHEDULING_MAX_TRACE_BYTES


__all__ = ["max_trace_bytes", "TraceRejected", "delete_trace", "estimate_simulation", "execute_simulation",
           "read_trace_file", "resolve_policies", "resolve_trace", "simulate", "simulation_choices", "simulation_inputs",
           "start_simulation", "upload_trace"]


def _trace_name(name: str, filename: str) -> str:
    name = (name or "").strip() or Path(filename).stem
    limit = TraceUpload._meta.get_field("name").max_length
    if len(name) > limit:
        raise ServiceError(f"Trace names are at most {limit} characters.", field="name")
    return name


def upload_trace(*, actor: AbstractBaseUser, team: Team, name: str, data: bytes, filename: str) -> TraceUpload:
    """Validate a trace row by row (horus's parser, in the upload sandbox) and store it. A malformed row
    raises TraceRejected naming the line and column, a parser stopped at its limits a TraceRejected saying
    so, and nothing is stored."""
    require_team_writer(actor, team.pk, "upload traces")
    name = _trace_name(name, filename)
    if len(data) > max_trace_bytes():
        raise ServiceError(f"The file is over the {max_trace_bytes() // 2**20} MB limit.", code="too_large",
                           field="file")
    if TraceUpload.objects.filter(team=team, name=name).exists():
        raise ConflictError(f"Team {team} already has a trace named '{name}'.", field="name")
    # Parsed in a sandboxed child (gzip undone once, bounded; nested compression and binary refused): a
    # hostile trace costs this process nothing, and only its kind, job count and summary come back.
    try:
        answer = parse_in_sandbox("scheduling.horus.traces:check_upload", data=data, what="reading the trace",
                                  kwargs={"filename": Path(filename).name or "trace.csv",
                                          "max_bytes": max_trace_bytes()})
    except SandboxFailure as exc:
        what = f"failed with an internal error ({exc.error_type or exc.reason})" \
            if exc.reason in ("raised", "bad_answer") else f"was stopped: it {exc}"
        raise TraceRejected(f"{filename}: the trace parser {what}. The trace was refused and nothing was "
                            "stored.") from None
    kind, n_jobs, summary = adapters.trace_upload_verdict(answer, filename)
    trace = TraceUpload(team=team, name=name, kind=kind, file_size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                        n_jobs=n_jobs, summary=json_safe(summary), created_by=acting_user(actor))
    return save_with_file(trace, "file", Path(filename).name or "trace.csv", data,
                          conflict=f"Team {team} already has a trace named '{name}'.")


@transaction.atomic
def delete_trace(*, actor: AbstractBaseUser, trace: TraceUpload) -> None:
    require_team_writer(actor, trace.team_id, "delete traces")
    name = trace.file.name
    trace.delete()
    delete_stored_on_commit(name)


def resolve_trace(team: Team | None, trace: str | int) -> tuple[str, TraceUpload | None, str]:
    """``(trace label, upload or None, kind)`` of a shipped trace name or an uploaded trace's id (of
    ``team``; ``team=None``, for the operator's command line: any team's)."""
    ref = str(trace).strip()
    if ref in adapters.SHIPPED_TRACES:
        return ref, None, "alibaba_pods" if ref == "alibaba" else "philly"
    if ref.isdigit():
        uploads = TraceUpload.objects.filter(pk=int(ref))
        upload = (uploads if team is None else uploads.filter(team=team)).first()
        if upload is not None:
            return "upload", upload, upload.kind
        raise ServiceError(f"No uploaded trace {ref}" + (f" in team {team}." if team is not None else "."),
                           field="trace")
    raise ServiceError(f"Unknown trace '{ref}': use {', '.join(adapters.SHIPPED_TRACES)} or the id of a trace your "
                       "team uploaded.", field="trace")


def _size_words(n: int) -> str:
    return f"{n / 2**20:.0f} MB" if n >= 2**20 else f"{n:,} bytes"


def _read_bounded(path: Path, what: str) -> bytes:
    """A local file's bytes, at most the trace size limit (also once inflated, for gzip); a missing,
    unreadable or oversized file is a ServiceError saying so."""
    limit = max_trace_bytes()
    try:
        with open(path, "rb") as f:  # read at most limit + 1 bytes: a device or FIFO never ends
            data = f.read(limit + 1)
    except IsADirectoryError:
        raise ServiceError(f"{what} {path} is a directory, not a trace file.", field="trace") from None
    except OSError as exc:
        raise ServiceError(f"Cannot read {what} {path}: {exc.strerror or exc}.", field="trace") from None
    if len(data) > limit:
        raise ServiceError(f"{what} {path} is over the {_size_words(limit)} trace size limit "
                           "(SCHEDULING_MAX_TRACE_BYTES).", code="too_large", field="trace")
    return adapters.decode_trace_file(data, path.name, max_bytes=limit).encode()


def read_trace_file(path: str | Path, *, nodes: str | Path | None = None) -> adapters.TraceInput:
    """A local trace file - a Philly CSV (``timestamp,duration,num_gpus[,gpu_time,cluster,gpu_util]``) or
    an Alibaba pod list, with ``nodes`` an Alibaba node list for its cluster - as a trace input for
    :func:`simulate`. Size-capped (SCHEDULING_MAX_TRACE_BYTES, gzip included) and parsed row by row: a
    malformed file is a TraceRejected naming the file, line and column."""
    trace_path, nodes_path = Path(path), None if nodes is None else Path(nodes)
    data = _read_bounded(trace_path, "trace")
    nodes_data = None if nodes_path is None else _read_bounded(nodes_path, "node list")
    return adapters.file_trace_input(trace_path.name, data, nodes_name=None if nodes_path is None else nodes_path.name,
                                     nodes_data=nodes_data)


def simulation_choices() -> dict[str, Any]:
    """What a simulation form offers: shipped traces, policies, and every parameter with its default and,
    where closed, its allowed values (``horus.experiments.parameter_choices``)."""
    return {"shipped_traces": list(adapters.SHIPPED_TRACES), "policies": list(adapters.POLICY_NAMES),
            "parameters": adapters.experiment_parameter_choices()}


def resolve_policies(policies: list[str] | str) -> list[str]:
    """Policy names, in order, without repeats; ``"all"`` (or none) is every policy."""
    names = [policies] if isinstance(policies, str) else list(policies or [])
    if names == ["all"] or not names:
        return list(adapters.POLICY_NAMES)
    bad = [n for n in names if n not in adapters.POLICY_NAMES]
    if bad:
        raise ServiceError(f"Unknown policy '{bad[0]}'; use 'all' or some of {', '.join(adapters.POLICY_NAMES)}.",
                           field="policies")
    return list(dict.fromkeys(names))


def _cost_words(cost: adapters.SimulationCost) -> str:
    policies = len(cost.per_policy)
    return (f"{cost.units:,} simulation units (about {cost.seconds / 60:.1f} min of the simulation worker: "
            f"{cost.decisions:,} placement decisions x {policies} polic{'y' if policies == 1 else 'ies'} on "
            f"{cost.gpus:,} GPUs, with the queue window" + (f", x {cost.seeds} seeds" if cost.seeds > 1 else "") + ")")


def _cost_refusal(cost: adapters.SimulationCost, limit: int) -> QuotaExceeded:
    return QuotaExceeded(
        f"Quota 'simulation cost' would be exceeded: this simulation is estimated at {_cost_words(cost)}, the "
        f"limit is {limit:,} units per simulation. Simulate fewer jobs or policies, a smaller cluster, or a "
        "smaller backfill / horus_lookahead window.", quota="max_simulation_units")


def _check_simulation_quota(*, team_id: int, jobs: int, gpus: int, cost: adapters.SimulationCost) -> None:
    """Per-team limits: simulations queued or running at once, jobs x GPUs of one simulation and its
    estimated cost (simulation units, ``horus.cost``)."""
    quota = lock_team_quota(team_id)
    if jobs * gpus > quota.max_simulation_job_gpus:
        raise QuotaExceeded(
            f"Quota 'simulation size' would be exceeded: {jobs} jobs x {gpus} GPUs = {jobs * gpus} job-GPUs, the "
            f"limit is {quota.max_simulation_job_gpus} per simulation. Simulate fewer jobs or a smaller cluster.",
            quota="max_simulation_job_gpus")
    if cost.units > quota.max_simulation_units:
        raise _cost_refusal(cost, quota.max_simulation_units)
    active = selectors.active_simulations(team_id)
    if active >= quota.max_concurrent_simulations:
        raise QuotaExceeded(
            f"Quota 'concurrent simulations' reached: {active} of {quota.max_concurrent_simulations} simulations "
            "are queued or running; start this one when one of them has finished.",
            quota="max_concurrent_simulations")


def _request_cost(team: Team, trace: str | int, policies: list[str] | str, seed: int,
                  parameters: dict[str, Any] | None, seeds: int = 1):
    """``(label, upload, policy names, params, jobs, GPUs, cost)`` of a simulation request, validated."""
    label, upload, kind = resolve_trace(team, trace)
    names = resolve_policies(policies)
    params = adapters.experiment_params(parameters, kind)
    jobs, gpus = adapters.simulation_size(label, upload, kind, params, int(seed))
    cost = adapters.simulation_cost(params, label=label, upload=upload, policies=names, jobs=jobs, gpus=gpus,
                                    seeds=seeds)
    return label, upload, names, params, jobs, gpus, cost


def estimate_simulation(*, actor: AbstractBaseUser, team: Team, trace: str | int, policies: list[str] | str = "all",
                        seed: int = 0, parameters: dict[str, Any] | None = None, seeds: int = 1) -> dict[str, Any]:
    """What a simulation request (``seeds`` of them, one per seed) would cost, against the team's limit;
    stores nothing."""
    require_team_writer(actor, team.pk, "start simulations")
    *_, jobs, gpus, cost = _request_cost(team, trace, policies, seed, parameters, seeds)
    quota, _ = Quota.objects.get_or_create(team_id=team.pk)
    per_simulation = cost.units // cost.seeds
    return {**cost.as_dict(), "units_per_simulation": per_simulation, "limit_units": quota.max_simulation_units,
            "within_limit": per_simulation <= quota.max_simulation_units and jobs * gpus <= quota.max_simulation_job_gpus,
            "job_gpus": jobs * gpus, "limit_job_gpus": quota.max_simulation_job_gpus}


def start_simulation(
    *,
    actor: AbstractBaseUser,
    team: Team,
    trace: str | int,
    policies: list[str] | str = "all",
    seed: int = 0,
    parameters: dict[str, Any] | None = None,
    enqueue: bool = True,
) -> SimulationRun:
    """Validate and queue a simulation (the `scheduling.run_simulation` task runs it, on the `simulations`
    queue, when the fair queue lets it go: ``simulation_queue``). Refused (QuotaExceeded) past the team's
    concurrency, size or cost limits, with nothing stored."""
    require_team_writer(actor, team.pk, "start simulations")
    label, upload, names, params, jobs, gpus, cost = _request_cost(team, trace, policies, seed, parameters)
    with transaction.atomic():
        _check_simulation_quota(team_id=team.pk, jobs=jobs, gpus=gpus, cost=cost)
        run = SimulationRun.objects.create(
            team=team, created_by=acting_user(actor), trace=label, trace_upload=upload, policies=names,
            seed=int(seed), parameters=params.to_dict(), cost_units=cost.units)
        if enqueue:
            dispatch_simulations(team_id=team.pk)
    run.refresh_from_db()  # the dispatch may have sent it, or failed it (broker down): answer what it is now
    return run


def simulation_inputs(params: dict[str, Any]
                      ) -> tuple[list[adapters.ProfileRecord], adapters.TrainedPredictor | None]:
    """Profiles (stored, else the shipped seed file) and the predictor a simulation uses."""
    records = selectors.profile_records() if selectors.has_profiles() else adapters.seed_profile_records()
    predictor = None
    if params.get("predictions", "predictor") == "predictor":
        _, predictor = ensure_active_predictor()
    return records, predictor


def simulate(*, trace: adapters.TraceInput, policies: list[str] | str = "all", seed: int = 0,
             parameters: dict[str, Any] | None = None, progress: Callable[[str], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> tuple[dict[str, Any], bool]:
    """THE path from a trace to a result; runs now and stores nothing: ``(results, whether the predictor
    made the predictions)``. ``trace`` comes from :func:`read_trace_file` or ``adapters.trace_input``;
    ``parameters`` are ``horus.experiments.ExperimentParams`` fields (``adapters.EXPERIMENT_PARAMETERS``);
    ``should_stop()`` True abandons it (``adapters.SimulationStopped``)."""
    params = dict(parameters or {})
    names = resolve_policies(policies)
    adapters.experiment_params(params, trace.kind)  # before a predictor is trained for nothing
    records, predictor = simulation_inputs(params)
    results = adapters.run_simulation(trace=trace, policies=names, seed=int(seed), params=params, profiles=records,
                                      predictor=predictor, progress=progress, should_stop=should_stop)
    return results, predictor is not None


def _charge_simulation(run: SimulationRun) -> None:
    """Where the cost is incurred: the run's estimate is checked again against the team's limit as it
    starts (staff may have lowered it while the run waited); QuotaExceeded names both. Allowed, it is charged
    to the team's usage ledger."""
    with transaction.atomic():
        quota = lock_team_quota(run.team_id)
        if run.cost_units > quota.max_simulation_units:
            raise QuotaExceeded(
                f"Quota 'simulation cost' exceeded when it started: estimated at {run.cost_units:,} simulation "
                f"units, the limit is now {quota.max_simulation_units:,} units per simulation.",
                quota="max_simulation_units")
        charge_simulation(run)


def execute_simulation(*, run_id: int, should_stop: Callable[[], bool] | None = None) -> SimulationRun | None:
    """Run a queued simulation and store its results (idempotent: a run already taken, or cancelled, is left
    alone), then let the fair queue send the next one. ``should_stop`` (default: the run's cancel flag,
    ``simulation_queue.cancel_check``) is what the engine asks between events."""
    n = SimulationRun.objects.filter(pk=run_id, status=SimulationRun.Status.QUEUED).update(
        status=SimulationRun.Status.RUNNING, started_at=timezone.now())
    if not n:
        log.info("simulation %s is not queued (taken or cancelled); not running it", run_id)
        return None
    SimulationRun.objects.filter(pk=run_id, dispatched_at__isnull=True).update(dispatched_at=timezone.now())
    run = SimulationRun.objects.select_related("trace_upload").get(pk=run_id)
    try:
        _finish_simulation(run, should_stop or cancel_check(run.pk))
    finally:
        dispatch_simulations()
    return run


def _finish_simulation(run: SimulationRun, should_stop: Callable[[], bool]) -> None:
    try:
        _charge_simulation(run)
        if run.trace_upload is None and run.trace == "upload":
            raise ServiceError("The uploaded trace of this simulation was deleted.")
        results, used_predictor = simulate(trace=adapters.trace_input(run.trace, run.trace_upload),
                                           policies=run.policies, seed=run.seed, parameters=run.parameters,
                                           should_stop=should_stop)
    except adapters.SimulationStopped as exc:
        run.status = SimulationRun.Status.CANCELLED
        run.error = (f"Cancelled while running ({exc}); the results of the "
                     f"{len(exc.completed)} finished polic{'y' if len(exc.completed) == 1 else 'ies'} were discarded.")
    except adapters.SIMULATION_INPUT_ERRORS as exc:
        run.status, run.error = SimulationRun.Status.FAILED, str(exc)[:ERROR_TEXT_MAX_CHARS]
    except Exception as exc:  # keep the run's state truthful; the task logs the traceback
        log.exception("simulation %s failed", run.pk)
        run.status, run.error = SimulationRun.Status.FAILED, f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_MAX_CHARS]
    else:
        run.status = SimulationRun.Status.SUCCEEDED
        run.results = adapters.simulation_results(results, predictor_used=used_predictor,
                                                  predictor_version=selectors.active_predictor_version())
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "results", "finished_at"])
