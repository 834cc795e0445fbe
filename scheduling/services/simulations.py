"""Trace uploads and trace-driven simulations: validate and store a trace, queue a simulation within
the team's limits, run it (the ``scheduling.run_simulation`` task) and store its results."""
from __future__ import annotations

import hashlib
import logging
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from core.exceptions import ConflictError, QuotaExceeded, ServiceError
from core.filestore import delete_stored_on_commit, save_with_file
from core.models import Team
from core.permissions import require_team_writer
from core.services import lock_team_quota

from .. import adapters, selectors
from ..adapters import TraceRejected
from ..models import ERROR_TEXT_MAX_CHARS, SimulationRun, TraceUpload
from .messages import RUN_SIMULATION, send_after_commit
from .predictors import ensure_active_predictor
from .staff import acting_user

log = logging.getLogger(__name__)


def max_trace_bytes() -> int:
    return settings.SCHEDULING_MAX_TRACE_BYTES


__all__ = ["max_trace_bytes", "TraceRejected", "delete_trace", "execute_simulation", "resolve_policies",
           "simulate_trace", "simulation_inputs", "start_simulation", "upload_trace"]


def _gunzip_bounded(data: bytes, *, limit: int, filename: str) -> bytes:
    """Inflate gzip data (all members), refusing it as soon as it passes `limit` bytes or is corrupt."""
    out, rest = bytearray(), data
    while rest:
        d = zlib.decompressobj(wbits=31)
        try:
            while not d.eof:  # 1 MB of output at a time
                chunk = d.decompress(rest, 2**20)
                rest = d.unconsumed_tail
                if not chunk and not rest:
                    break  # input exhausted before the end of the stream
                out += chunk
                if len(out) > limit:
                    raise ServiceError(f"{filename} inflates to more than {limit / 2**20:.0f} MB, the trace size "
                                       "limit.", code="too_large", field="file")
        except zlib.error as exc:
            raise TraceRejected(f"{filename}: corrupt gzip data ({exc}).") from None
        if not d.eof:
            raise TraceRejected(f"{filename}: the gzip data is cut short (incomplete upload or copy).")
        rest = d.unused_data.lstrip(b"\0")
    return bytes(out)


def _trace_name(name: str, filename: str) -> str:
    name = (name or "").strip() or Path(filename).stem
    limit = TraceUpload._meta.get_field("name").max_length
    if len(name) > limit:
        raise ServiceError(f"Trace names are at most {limit} characters.", field="name")
    return name


def upload_trace(*, actor: AbstractBaseUser, team: Team, name: str, data: bytes, filename: str) -> TraceUpload:
    """Validate a trace row by row (horus's parser) and store it. A malformed row raises
    TraceRejected naming the line and column, and nothing is stored."""
    require_team_writer(actor, team.pk, "upload traces")
    name = _trace_name(name, filename)
    if len(data) > max_trace_bytes():
        raise ServiceError(f"The file is over the {max_trace_bytes() // 2**20} MB limit.", code="too_large",
                           field="file")
    if TraceUpload.objects.filter(team=team, name=name).exists():
        raise ConflictError(f"Team {team} already has a trace named '{name}'.", field="name")
    # A .gz upload is inflated here, bounded: a gzip bomb (or a corrupt stream) never reaches the parser.
    text = _gunzip_bounded(data, limit=max_trace_bytes(), filename=filename) if data[:2] == b"\x1f\x8b" else data
    kind, jobs = adapters.parse_trace_upload(text, filename)
    trace = TraceUpload(team=team, name=name, kind=kind, file_size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                        n_jobs=len(jobs), summary=adapters.trace_summary(jobs), created_by=acting_user(actor))
    return save_with_file(trace, "file", Path(filename).name or "trace.csv", data,
                          conflict=f"Team {team} already has a trace named '{name}'.")


@transaction.atomic
def delete_trace(*, actor: AbstractBaseUser, trace: TraceUpload) -> None:
    require_team_writer(actor, trace.team_id, "delete traces")
    name = trace.file.name
    trace.delete()
    delete_stored_on_commit(name)


def _resolve_trace(team: Team, trace: str | int) -> tuple[str, TraceUpload | None, str]:
    """``(trace label, upload or None, kind)``."""
    ref = str(trace).strip()
    if ref in adapters.SHIPPED_TRACES:
        return ref, None, "alibaba_pods" if ref == "alibaba" else "philly"
    if ref.isdigit():
        upload = TraceUpload.objects.filter(pk=int(ref), team=team).first()
        if upload is not None:
            return "upload", upload, upload.kind
    raise ServiceError(f"Unknown trace '{ref}': use {', '.join(adapters.SHIPPED_TRACES)} or the id of a trace your "
                       "team uploaded.", field="trace")


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


def _check_simulation_quota(*, team_id: int, jobs: int, gpus: int) -> None:
    """Per-team limits: simulations queued or running at once, and jobs x GPUs of one simulation."""
    quota = lock_team_quota(team_id)
    if jobs * gpus > quota.max_simulation_job_gpus:
        raise QuotaExceeded(
            f"Quota 'simulation size' would be exceeded: {jobs} jobs x {gpus} GPUs = {jobs * gpus} job-GPUs, the "
            f"limit is {quota.max_simulation_job_gpus} per simulation. Simulate fewer jobs or a smaller cluster.",
            quota="max_simulation_job_gpus")
    active = selectors.active_simulations(team_id)
    if active >= quota.max_concurrent_simulations:
        raise QuotaExceeded(
            f"Quota 'concurrent simulations' reached: {active} of {quota.max_concurrent_simulations} simulations "
            "are queued or running; start this one when one of them has finished.",
            quota="max_concurrent_simulations")


def _enqueue_simulation(run: SimulationRun) -> None:
    """``scheduling.run_simulation`` after commit; a broker outage fails the run, saying so."""
    def failed(exc):
        run.status, run.finished_at = SimulationRun.Status.FAILED, timezone.now()
        run.error = f"Could not be queued: the task broker is unreachable ({exc}). Start it again."
        SimulationRun.objects.filter(pk=run.pk, status=SimulationRun.Status.QUEUED).update(
            status=run.status, finished_at=run.finished_at, error=run.error)

    send_after_commit(RUN_SIMULATION, args=[run.pk], what=f"simulation {run.pk}", on_error=failed)


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
    queue). Refused (QuotaExceeded) past the team's concurrency or size limits."""
    require_team_writer(actor, team.pk, "start simulations")
    label, upload, kind = _resolve_trace(team, trace)
    names = resolve_policies(policies)
    params = adapters.experiment_params(parameters, kind)
    jobs, gpus = adapters.simulation_size(label, upload, kind, params, int(seed))
    with transaction.atomic():
        _check_simulation_quota(team_id=team.pk, jobs=jobs, gpus=gpus)
        run = SimulationRun.objects.create(
            team=team, created_by=acting_user(actor), trace=label, trace_upload=upload, policies=names,
            seed=int(seed), parameters=params.to_dict())
        if enqueue:
            _enqueue_simulation(run)
    return run


def simulation_inputs(params: dict[str, Any]
                      ) -> tuple[list[adapters.ProfileRecord], adapters.TrainedPredictor | None]:
    """Profiles (stored, else the shipped seed file) and the predictor a simulation uses."""
    records = selectors.profile_records() if selectors.has_profiles() else adapters.seed_profile_records()
    predictor = None
    if params.get("predictions", "predictor") == "predictor":
        _, predictor = ensure_active_predictor()
    return records, predictor


def simulate_trace(*, label: str, upload: TraceUpload | None, policies: list[str] | str, seed: int,
                   params: dict[str, Any], progress: Callable[[str], None] | None = None
                   ) -> tuple[dict[str, Any], bool]:
    """Run a simulation now, storing nothing: ``(results, whether the predictor made the predictions)``.
    ``label`` names a shipped trace; with ``upload`` its stored file is replayed."""
    name, kind, jobs = adapters.trace_jobs(label, upload)
    names = resolve_policies(policies)
    adapters.experiment_params(params, kind)  # before a predictor is trained for nothing
    records, predictor = simulation_inputs(params)
    results = adapters.run_simulation(trace=name, kind=kind, jobs=jobs, policies=names, seed=seed, params=params,
                                      profiles=records, predictor=predictor, progress=progress)
    return results, predictor is not None


def execute_simulation(*, run_id: int) -> SimulationRun | None:
    """Run a queued simulation and store its results (idempotent: a run already taken is left alone)."""
    n = SimulationRun.objects.filter(pk=run_id, status=SimulationRun.Status.QUEUED).update(
        status=SimulationRun.Status.RUNNING, started_at=timezone.now())
    if not n:
        log.info("simulation %s is not queued; not running it again", run_id)
        return None
    run = SimulationRun.objects.select_related("trace_upload").get(pk=run_id)
    try:
        if run.trace_upload is None and run.trace == "upload":
            raise ServiceError("The uploaded trace of this simulation was deleted.")
        results, used_predictor = simulate_trace(label=run.trace, upload=run.trace_upload, policies=run.policies,
                                                 seed=run.seed, params=run.parameters)
    except adapters.SIMULATION_INPUT_ERRORS as exc:
        run.status, run.error = SimulationRun.Status.FAILED, str(exc)[:ERROR_TEXT_MAX_CHARS]
    except Exception as exc:  # keep the run's state truthful; the task logs the traceback
        log.exception("simulation %s failed", run_id)
        run.status, run.error = SimulationRun.Status.FAILED, f"{type(exc).__name__}: {exc}"[:ERROR_TEXT_MAX_CHARS]
    else:
        run.status = SimulationRun.Status.SUCCEEDED
        run.results = adapters.simulation_results(results, predictor_used=used_predictor,
                                                  predictor_version=selectors.active_predictor_version())
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "error", "results", "finished_at"])
    return run
