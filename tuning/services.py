"""Tuning runs: start, execute (idempotent, resumable), cancel, pause, resume, recover.

The Celery task is a thin wrapper over `execute_run`. Everything the run needs
to continue after a crash is in the database (run, tasks, measurements) and in
TVM's JSON tuning database under the run's work dir.
"""
from __future__ import annotations

import io
import logging
import os
import re
import secrets
import shutil
import sys
import sysconfig
import time
import zipfile
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import Count, Min, Q, Sum
from django.utils import timezone

from core.exceptions import ConflictError, PermissionDenied, QuotaExceeded, ServiceError
from core.models import DLModel, Membership
from core.selectors import energy_model, month_start
from core.services import lock_team_quota, require_ready

from .models import DopRound, Measurement, TuningRun, TuningTask

log = logging.getLogger(__name__)

SUPPORTED_TARGET_KINDS = ("llvm", "cuda")
JOULES_PER_KWH = 3.6e6


class LeaseLost(Exception):
    """Another executor took the run over (this one was presumed dead); stop quietly."""


def run_work_dir(run_id: int) -> Path:
    path = Path(settings.MEDIA_ROOT) / "runs" / str(run_id) / "work"
    path.mkdir(parents=True, exist_ok=True)
    return path


_ABS_PATH = re.compile(r"(?<![\w.:/<>-])/(?:[\w.@+~-]+/)+([\w.@+~-]*)")


def _path_prefixes(work_dir: Path | None) -> list[tuple[str, str]]:
    """(absolute prefix, what users see instead), longest first, each with its symlink-free twin."""
    pairs = [(work_dir, ".")] if work_dir is not None else []
    pairs += [(Path(settings.MEDIA_ROOT), "<media>"), (Path(settings.VAR_DIR), "<var>"),
              (Path(settings.BASE_DIR), "<app>")]
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        pairs.append((Path(sysconfig.get_paths()[key]), "<python>"))
    pairs += [(Path(sys.prefix), "<python>"), (Path(sys.base_prefix), "<python>")]
    out = {}
    for path, label in pairs:
        for variant in {str(path), os.path.realpath(path)}:
            if variant and variant != "/":
                out.setdefault(variant.rstrip("/"), label)
    return sorted(out.items(), key=lambda kv: -len(kv[0]))


def public_text(text: str, work_dir: Path | None = None) -> str:
    """`text` (an error, a traceback) as users may see it: no absolute server path. Paths under the run's
    work dir become relative to it (`./database_workload.json`), the media/var/project dirs and the
    Python installation become `<media>/`, `<var>/`, `<app>/`, `<python>/`, and any other absolute path
    keeps only its file name (`<path>/name`)."""
    if not text:
        return text
    for prefix, label in _path_prefixes(work_dir):
        text = text.replace(prefix + "/", label + "/").replace(prefix, label)
    return _ABS_PATH.sub(lambda m: "<path>/" + m.group(1), text)


def public_json(value, work_dir: Path | None = None):
    """`public_text` applied to every string of a JSON value (a run summary)."""
    if isinstance(value, str):
        return public_text(value, work_dir)
    if isinstance(value, list):
        return [public_json(v, work_dir) for v in value]
    if isinstance(value, dict):
        return {k: public_json(v, work_dir) for k, v in value.items()}
    return value


def _require_writer(actor: AbstractBaseUser, team_id: int) -> None:
    if actor.is_staff:
        return
    if not Membership.objects.filter(user=actor, team_id=team_id,
                                     role__in=[Membership.Role.OWNER, Membership.Role.MEMBER]).exists():
        raise PermissionDenied("Viewers cannot start or control tuning runs.")


def validate_target(target) -> dict:
    if isinstance(target, str):
        target = {"kind": target}
    if not isinstance(target, dict) or "kind" not in target:
        raise ServiceError('The target must be a TVM target dict such as {"kind": "llvm", "num-cores": 2}.',
                           field="target")
    if target["kind"] not in SUPPORTED_TARGET_KINDS:
        raise ServiceError(f"Unsupported target kind '{target['kind']}'; use one of "
                           f"{', '.join(SUPPORTED_TARGET_KINDS)}.", field="target")
    for key in ("num-cores", "max-threads-per-block"):
        if key in target and (not isinstance(target[key], int) or target[key] < 1):
            raise ServiceError(f"target['{key}'] must be a positive integer.", field="target")
    if target["kind"] == "llvm":
        target = {"num-cores": os.cpu_count() or 1, **target}
    return target


def validate_measure_queues(queues, *, target: dict) -> list[str]:
    """The remote measurement queues a run may use: each must be the CPU queue (`measure.<node>.cpu`) of a
    registered, live, undrained node that serves it. Nodes are shared by every team (there is no per-team
    node list), so any team may use any live node's CPU queue. GPU queues are refused: GPU work goes
    through placement and the GPU-hour quota (GPU jobs), which a tuning run's measurements would bypass."""
    from scheduling import selectors as sched

    if queues in (None, ""):
        return []
    if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues):
        raise ServiceError("measure_queues must be a list of queue names.", field="measure_queues")
    if target.get("kind") != "llvm":
        raise ServiceError("Remote measurement (measure_queues) is available for CPU (llvm) targets only.",
                           field="measure_queues")
    cutoff = timezone.now() - timedelta(seconds=sched.node_stale_after_s())
    served = {q for node in sched.nodes().filter(drained=False, last_seen__gte=cutoff)
              for q in (node.queues or []) if q == node.cpu_queue}
    for q in queues:
        if re.fullmatch(r"measure\.[A-Za-z0-9_-]+\.gpu\d+", q):
            raise ServiceError(f"measure_queues: '{q}' is a GPU queue; GPU work is placed as GPU jobs (under the "
                               "GPU-hour quota), never sent by a tuning run.", field="measure_queues")
        if q not in served:
            raise ServiceError(f"measure_queues: '{q}' is not the CPU queue of a registered, live node "
                               "(see /api/nodes/).", field="measure_queues")
    return list(dict.fromkeys(queues))


# --- quota -------------------------------------------------------------------------

def trials_used_this_month(team_id: int) -> int:
    """Every build+measure done for the team this month: trials (Measurement rows, imported records
    included: the platform measures them) plus the final serial re-measures of its runs."""
    return _trials_used(team_id, month_start())


def _trials_used(team_id: int, since) -> int:
    measured = Measurement.objects.filter(run__team_id=team_id, created_at__gte=since).count()
    remeasured = TuningRun.objects.filter(team_id=team_id, created_at__gte=since).aggregate(
        n=Sum("serial_remeasures"))["n"] or 0
    return measured + remeasured


def trials_reserved(team_id: int) -> int:
    """Trials still to come from runs that are queued, running or paused."""
    active = TuningRun.objects.filter(team_id=team_id, status__in=[*TuningRun.ACTIVE, TuningRun.Status.PAUSED])
    total = active.aggregate(budget=Sum("max_trials"), done=Sum("trials_done"))
    return max(0, (total["budget"] or 0) - (total["done"] or 0))


def _check_quota(*, team_id: int, max_trials: int) -> None:
    """Called with the team's quota row locked, so concurrent starts serialize here."""
    quota = lock_team_quota(team_id)
    running = TuningRun.objects.filter(team_id=team_id, status__in=TuningRun.ACTIVE).count()
    if running >= quota.max_concurrent_runs:
        raise QuotaExceeded(
            f"Quota 'max concurrent tuning runs' reached: {running} of {quota.max_concurrent_runs} runs are queued "
            "or running. Wait for one to finish or cancel one.", quota="max_concurrent_runs")
    _check_energy_quota(team_id=team_id, quota=quota, max_trials=max_trials)
    committed = trials_used_this_month(team_id) + trials_reserved(team_id)
    if committed + max_trials > quota.tuning_trials_per_month:
        left = max(0, quota.tuning_trials_per_month - committed)
        raise QuotaExceeded(
            f"Quota 'tuning trials per month' would be exceeded: {max_trials} requested, {left} left of "
            f"{quota.tuning_trials_per_month} this month.", quota="tuning_trials_per_month")


def energy_joules_this_month(team_id: int, *, exclude_run: int | None = None) -> float:
    qs = TuningRun.objects.filter(team_id=team_id, created_at__gte=month_start())
    if exclude_run is not None:
        qs = qs.exclude(pk=exclude_run)
    return qs.aggregate(j=Sum("energy_joules"))["j"] or 0.0


def joules_per_trial_estimate(team_id: int) -> tuple[float, str]:
    """Energy one trial costs, from the team's finished runs, else the platform default."""
    done = TuningRun.objects.filter(team_id=team_id, status=TuningRun.Status.SUCCEEDED, trials_done__gt=0,
                                    energy_joules__gt=0).aggregate(j=Sum("energy_joules"), n=Sum("trials_done"))
    if done["n"]:
        return done["j"] / done["n"], f"the team's past runs ({done['n']} trials)"
    return energy_model().joules_per_trial_estimate, "the platform default per-trial estimate"


def _check_energy_quota(*, team_id: int, quota, max_trials: int) -> None:
    budget_j = quota.energy_kwh_per_month * JOULES_PER_KWH
    used_j = energy_joules_this_month(team_id)
    if used_j >= budget_j:
        raise QuotaExceeded(
            f"Quota 'energy per month' reached: {used_j / JOULES_PER_KWH:.4f} kWh used of "
            f"{quota.energy_kwh_per_month:g} kWh this month.", quota="energy_kwh_per_month")
    per_trial, basis = joules_per_trial_estimate(team_id)
    needed_j = per_trial * max_trials
    if used_j + needed_j > budget_j:
        raise QuotaExceeded(
            f"Quota 'energy per month' would be exceeded: this run needs about {needed_j / JOULES_PER_KWH:.4f} kWh "
            f"({per_trial:.1f} J per trial, from {basis}) and {(budget_j - used_j) / JOULES_PER_KWH:.4f} kWh are left "
            f"of {quota.energy_kwh_per_month:g} kWh. Lower max_trials or enable Trimmer.",
            quota="energy_kwh_per_month")


def _usage_provider(team_id: int, since) -> dict:
    return {
        "concurrent_runs": TuningRun.objects.filter(team_id=team_id, status__in=TuningRun.ACTIVE).count(),
        "tuning_trials_this_month": _trials_used(team_id, since),
        "energy_kwh_this_month": (TuningRun.objects.filter(team_id=team_id, created_at__gte=since)
                                  .aggregate(j=Sum("energy_joules"))["j"] or 0.0) / JOULES_PER_KWH,
    }


# --- start / control -----------------------------------------------------------------

def start_run(
    *,
    actor: AbstractBaseUser,
    model: DLModel,
    max_trials: int,
    target: dict | str | None = None,
    trials_per_round: int = 32,
    measurement_mode: str = TuningRun.Mode.DOPPLER,
    dop: str | int = "auto",
    threads: int | None = None,
    options: dict | None = None,
    trimmer: bool = False,
    trimmer_options: dict | None = None,
    enqueue: bool = True,
) -> TuningRun:
    _require_writer(actor, model.team_id)
    require_ready(model)
    target = validate_target(target or settings.DEFAULT_TUNING_TARGET)
    if not isinstance(max_trials, int) or max_trials < 1:
        raise ServiceError("max_trials must be a positive integer.", field="max_trials")
    if not isinstance(trials_per_round, int) or not 1 <= trials_per_round <= 1024:
        raise ServiceError("trials_per_round must be between 1 and 1024.", field="trials_per_round")
    if measurement_mode not in TuningRun.Mode.values:
        raise ServiceError(f"measurement_mode must be one of {', '.join(TuningRun.Mode.values)}.",
                           field="measurement_mode")
    dop_fixed = None
    if dop not in ("auto", None, ""):
        try:
            dop_fixed = int(dop)
        except (TypeError, ValueError):
            raise ServiceError("dop must be 'auto' or a positive integer.", field="dop") from None
        if dop_fixed < 1:
            raise ServiceError("dop must be 'auto' or a positive integer.", field="dop")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ServiceError("threads must be a positive integer.", field="threads")
    from tuning.engine.trimmer import TrimmerConfig

    try:
        trimmer_cfg = TrimmerConfig.from_dict(trimmer_options)
    except (TypeError, ValueError) as exc:
        raise ServiceError(f"Invalid Trimmer options: {exc}", field="trimmer_options") from None
    options = dict(options or {})
    if "measure_queues" in options:
        options["measure_queues"] = validate_measure_queues(options["measure_queues"], target=target)
    team = model.team
    grid = team.grid_intensity_g_per_kwh
    platform_energy = energy_model()
    with transaction.atomic():
        _check_quota(team_id=model.team_id, max_trials=max_trials)
        run = TuningRun.objects.create(
            team_id=model.team_id, model=model, created_by=actor, target=target, target_kind=target["kind"],
            max_trials=max_trials, trials_per_round=trials_per_round, measurement_mode=measurement_mode,
            dop_fixed=dop_fixed, threads=threads, options=options,
            trimmer_enabled=bool(trimmer), trimmer_options=trimmer_cfg.to_dict() if trimmer else {},
            grid_intensity_g_per_kwh=grid if grid is not None else platform_energy.grid_intensity_g_per_kwh,
            energy_model={"cpu_watts_per_core": platform_energy.cpu_watts_per_core,
                          "gpu_board_watts": platform_energy.gpu_board_watts},
        )
        if enqueue:
            _enqueue(run)
    return run


def _enqueue(run: TuningRun) -> None:
    """Send the run to the `tuning` queue once the transaction commits.

    The run is committed by then, so a broker outage must not turn the request into a 500: the run is
    paused instead (nothing it did is lost; resume it once the broker is back), with the reason in
    `error`, in the database and on `run`, which the caller answers with."""
    from kombu.exceptions import OperationalError as BrokerError

    from .tasks import execute_run

    def send():
        try:
            execute_run.delay(run.pk)
        except (BrokerError, OSError) as exc:
            log.error("run %s could not be queued: %s", run.pk, exc)
            run.status = TuningRun.Status.PAUSED
            run.error = (f"Could not be queued: the task broker is unreachable ({exc}). The run is paused; "
                         "resume it when the broker is back.")
            TuningRun.objects.filter(pk=run.pk, status=TuningRun.Status.QUEUED).update(
                status=run.status, error=run.error, lease="")

    transaction.on_commit(send)


def _locked(run: TuningRun) -> TuningRun:
    return TuningRun.objects.select_for_update().get(pk=run.pk)


@transaction.atomic
def cancel_run(*, actor: AbstractBaseUser, run: TuningRun) -> TuningRun:
    run = _locked(run)
    _require_writer(actor, run.team_id)
    if run.status in TuningRun.TERMINAL:
        raise ConflictError(f"Run {run.pk} is already {run.status}.")
    if run.status in (TuningRun.Status.QUEUED, TuningRun.Status.PAUSED):
        run.status, run.finished_at = TuningRun.Status.CANCELLED, timezone.now()
        run.requested_action = TuningRun.Action.NONE
    else:  # running: the engine stops between rounds and the executor records it
        run.requested_action = TuningRun.Action.CANCEL
    run.save(update_fields=["status", "finished_at", "requested_action"])
    return run


@transaction.atomic
def pause_run(*, actor: AbstractBaseUser, run: TuningRun) -> TuningRun:
    run = _locked(run)
    _require_writer(actor, run.team_id)
    if run.status == TuningRun.Status.QUEUED:
        run.status = TuningRun.Status.PAUSED
    elif run.status == TuningRun.Status.RUNNING:
        run.requested_action = TuningRun.Action.PAUSE
    else:
        raise ConflictError(f"Only queued or running runs can be paused; run {run.pk} is {run.status}.")
    run.save(update_fields=["status", "requested_action"])
    return run


@transaction.atomic
def resume_run(*, actor: AbstractBaseUser, run: TuningRun) -> TuningRun:
    run = _locked(run)
    _require_writer(actor, run.team_id)
    if run.status != TuningRun.Status.PAUSED:
        raise ConflictError(f"Only paused runs can be resumed; run {run.pk} is {run.status}.")
    _check_quota(team_id=run.team_id, max_trials=0)
    run.status, run.requested_action, run.error = TuningRun.Status.QUEUED, TuningRun.Action.NONE, ""
    run.save(update_fields=["status", "requested_action", "error"])
    _enqueue(run)
    return run


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
                _enqueue(run)
                recovered.append(run_id)
    return recovered


def seconds_until_next_stale() -> float | None:
    """When the first running run still holding a live lease goes stale if its executor sends no more
    heartbeats (None when there is none): a worker that starts while a dead worker's lease is still
    live checks again then."""
    beats = TuningRun.objects.filter(status=TuningRun.Status.RUNNING, heartbeat_at__isnull=False)
    first = beats.aggregate(m=Min("heartbeat_at"))["m"]
    if first is None:
        return None
    return max(0.0, (first - timezone.now()).total_seconds() + settings.TUNING_STALE_AFTER_S)


# --- execution ----------------------------------------------------------------------

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
        run.status, run.lease, run.heartbeat_at, run.worker = TuningRun.Status.RUNNING, lease, now, worker[:200]
        run.attempts += 1
        run.started_at = run.started_at or now
        run.save(update_fields=["status", "lease", "heartbeat_at", "worker", "attempts", "started_at"])
    return lease


class DatabaseSink:
    """The engine's TuningSink: streams tasks, measurements and rounds into the database."""

    HEARTBEAT_EVERY_S = 2.0

    def __init__(self, run_id: int, lease: str, meter=None):
        self.run_id, self.lease = run_id, lease
        self.work_dir = run_work_dir(run_id)
        self._task_ids: dict[int, int] = dict(TuningTask.objects.filter(run_id=run_id).values_list("index", "pk"))
        self._last_beat = 0.0
        run = TuningRun.objects.only("team_id", "energy_joules", "energy_build_joules", "energy_measure_joules",
                                     "threads", "target", "energy_model").get(pk=run_id)
        self.team_id = run.team_id
        self.cpu_watts_per_core = run_energy_model(run)["cpu_watts_per_core"]
        self.threads = run.threads or run.target.get("num-cores") or 1
        # Energy of earlier attempts (a resumed run) plus what this attempt's meter reads.
        self.meter = meter
        self._base = (run.energy_joules, run.energy_build_joules, run.energy_measure_joules)
        self._build_cpu_s = 0.0
        self._measure_cpu_s = 0.0
        self.stop_reason = ""

    def energy(self) -> tuple[float, float, float]:
        """(total, build, measure) joules of the whole run so far."""
        if self.meter is None:
            return self._base
        total = self.meter.read().joules
        # Builds use one core each, measurements `threads` cores: split the metered
        # energy in proportion to those CPU-seconds; the rest is search and overhead.
        attributed = (self._build_cpu_s + self._measure_cpu_s) * self.cpu_watts_per_core
        scale = min(1.0, total / attributed) if attributed else 0.0
        build = self._build_cpu_s * self.cpu_watts_per_core * scale
        measure = self._measure_cpu_s * self.cpu_watts_per_core * scale
        return self._base[0] + total, self._base[1] + build, self._base[2] + measure

    def flush(self) -> None:
        """Write the run's energy so far (called when the attempt ends, however it ends)."""
        TuningRun.objects.filter(pk=self.run_id, lease=self.lease).update(**self._energy_fields())

    def _energy_fields(self) -> dict:
        total, build, measure = self.energy()
        fields = {"energy_joules": total, "energy_build_joules": build, "energy_measure_joules": measure}
        if self.meter is not None:
            fields["energy_source"] = self.meter.source
        return fields

    def _check_lease(self) -> TuningRun:
        run = TuningRun.objects.only("lease", "requested_action", "status").get(pk=self.run_id)
        if run.lease != self.lease:
            raise LeaseLost(f"run {self.run_id} was taken over by another executor")
        return run

    def on_tasks(self, tasks) -> None:
        ids = {}
        with transaction.atomic():
            for t in tasks:
                obj, _ = TuningTask.objects.update_or_create(
                    run_id=self.run_id, index=t.index,
                    defaults={"name": t.name[:300], "flops": float(t.flops or 0), "weight": float(t.weight or 1)})
                ids[t.index] = obj.pk
        self._task_ids.update(ids)  # only ids that were committed

    def on_measurements(self, records) -> None:
        if not records:
            return
        self._check_lease()
        rows, new_ids = [], {}
        counters = (self._build_cpu_s, self._measure_cpu_s)
        # One transaction: a database error leaves neither a task row nor a measurement of this batch,
        # and the task-id cache and CPU-second counters only keep what was committed.
        try:
            with transaction.atomic():
                for r in records:
                    task_id = self._task_ids.get(r.task_index) or new_ids.get(r.task_index)
                    if task_id is None:
                        task_id = TuningTask.objects.get_or_create(
                            run_id=self.run_id, index=r.task_index, defaults={"name": r.task_name[:300]})[0].pk
                        new_ids[r.task_index] = task_id
                    secs = [float(s) for s in (r.run_secs or [])]
                    latency = getattr(r, "latency_s", None)
                    if latency is None and secs and not r.error:
                        latency = sorted(secs)[len(secs) // 2]
                    self._build_cpu_s += r.build_secs or 0.0
                    # DOP workers share the cores: each measures with cores // DOP threads.
                    self._measure_cpu_s += (r.run_wall_secs or 0.0) * max(1, self.threads // max(1, r.dop or 1))
                    rows.append(Measurement(
                        run_id=self.run_id, task_id=task_id, round_index=r.round_index,
                        candidate_key=r.candidate_key, run_secs=secs, latency_s=latency, build_secs=r.build_secs,
                        run_wall_secs=r.run_wall_secs, error=public_text(r.error or "", self.work_dir)[:5000], worker=(r.worker or "")[:200],
                        dop=r.dop or 1, remeasured_serially=bool(r.remeasured_serially), serial_secs=r.serial_secs))
                Measurement.objects.bulk_create(rows, ignore_conflicts=True)
                touched = {row.task_id for row in rows}
                self._refresh_tasks(touched)
                self._refresh_run(heartbeat=True)
        except BaseException:
            self._build_cpu_s, self._measure_cpu_s = counters
            raise
        self._task_ids.update(new_ids)

    def on_serial_remeasure(self, updates) -> None:
        """Final top-10 % serial re-measure: (task_index, candidate_key, serial_secs | None) triples, one
        per candidate built and measured again. Each is charged to the trial quota (serial_remeasures)."""
        from django.db.models import F

        updates = list(updates)
        self._check_lease()
        with transaction.atomic():
            for task_index, key, serial in updates:
                if serial is not None:
                    Measurement.objects.filter(run_id=self.run_id, task_id=self._task_ids.get(task_index),
                                               candidate_key=key).update(remeasured_serially=True, serial_secs=serial)
            TuningRun.objects.filter(pk=self.run_id, lease=self.lease).update(
                serial_remeasures=F("serial_remeasures") + len(updates))

    def _refresh_tasks(self, task_ids) -> None:
        stats = (Measurement.objects.filter(task_id__in=task_ids)
                 .values("task_id").annotate(n=Count("id"), best=Min("latency_s", filter=Q(error=""))))
        for s in stats:
            TuningTask.objects.filter(pk=s["task_id"]).update(
                trials=s["n"], best_latency_s=s["best"], status=TuningTask.Status.TUNING)

    def _refresh_run(self, *, heartbeat: bool) -> None:
        tasks = TuningTask.objects.filter(run_id=self.run_id)
        estimate = None
        if tasks and all(t.best_latency_s for t in tasks):
            estimate = sum(t.weight * t.best_latency_s for t in tasks)
        fields = {"trials_done": Measurement.objects.filter(run_id=self.run_id).count(),
                  "estimated_latency_s": estimate, **self._energy_fields()}
        if heartbeat:
            fields["heartbeat_at"] = timezone.now()
        TuningRun.objects.filter(pk=self.run_id, lease=self.lease).update(**fields)

    def on_round(self, info) -> None:
        DopRound.objects.update_or_create(
            run_id=self.run_id, round_index=info.round_index,
            defaults={"task_index": info.task_index, "dop": info.dop, "mean_error": info.mean_error,
                      "n_candidates": info.n_candidates, "n_remeasured": info.n_remeasured,
                      "n_failures": info.n_failures, "n_generated": getattr(info, "n_generated", None),
                      "n_filtered": getattr(info, "n_filtered", None)})

    def control(self) -> str | None:
        now = time.monotonic()
        run = self._check_lease()
        if now - self._last_beat > self.HEARTBEAT_EVERY_S:
            TuningRun.objects.filter(pk=self.run_id, lease=self.lease).update(
                heartbeat_at=timezone.now(), **self._energy_fields())
            self._last_beat = now
        if run.requested_action:
            return run.requested_action
        if self._energy_quota_reached():
            return TuningRun.Action.CANCEL
        return None

    def _energy_quota_reached(self) -> bool:
        from core.models import Quota

        budget_kwh = Quota.objects.filter(team_id=self.team_id).values_list("energy_kwh_per_month", flat=True).first()
        if budget_kwh is None:
            return False
        used = energy_joules_this_month(self.team_id, exclude_run=self.run_id) + self.energy()[0]
        if used >= budget_kwh * JOULES_PER_KWH:
            self.stop_reason = (f"Stopped at the team's energy quota ({budget_kwh:g} kWh per month); "
                                f"results so far are kept.")
            return True
        return False


def build_engine_config(run: TuningRun, work_dir: Path):
    from tuning.engine.session import TuningConfig
    from tuning.engine.timer import EvaluatorConfig
    from tuning.engine.trimmer import TrimmerConfig

    opts = dict(run.options or {})
    evaluator = EvaluatorConfig.from_any(opts.get("evaluator"))
    queues = opts.get("measure_queues") or []
    distributed = {}
    if queues and run.measurement_mode == TuningRun.Mode.DOPPLER:
        from .distributed import celery_submit

        distributed = {"distributed_submit": celery_submit, "device_queue": list(queues)}
    return TuningConfig(
        target=run.target, max_trials=run.max_trials, trials_per_round=run.trials_per_round,
        mode=run.measurement_mode, dop=run.dop_fixed or "auto", threads=run.threads, work_dir=str(work_dir),
        seed=opts.get("seed"), evaluator=evaluator, search_population=opts.get("search_population"),
        genetic_num_iters=opts.get("genetic_num_iters"), **distributed,
        trimmer=TrimmerConfig.from_dict(run.trimmer_options) if run.trimmer_enabled else None,
    )


def execute_run(*, run_id: int, worker: str = "") -> str | None:
    """Run (or resume) a tuning run to completion. Idempotent: a finished or live run is left alone.

    Every TVM call on the user's model runs in a child process (`call_isolated`): a model that
    crashes TVM fails its run with a clear error, and this worker goes on serving other runs."""
    import onnx

    lease = claim_run(run_id, worker=worker or f"pid{os.getpid()}")
    if lease is None:
        return None
    run = TuningRun.objects.select_related("model").get(pk=run_id)
    work_dir = run_work_dir(run.pk)
    sink = DatabaseSink(run.pk, lease, meter=make_energy_meter(run))
    started = time.perf_counter()
    try:
        with run.model.file.open("rb") as f:
            model_proto = onnx.load_model_from_string(f.read())
        config = build_engine_config(run, work_dir)
        if run.attempts > 1:
            reconcile_with_database(sink, model_proto, run, work_dir)
        summary = _run_engine(sink, model_proto, config)
        status = getattr(summary, "status", "succeeded")
        _add_wall(run.pk, lease, time.perf_counter() - started)
        sink.flush()
        if status in ("cancelled", "paused"):
            return _finish_interrupted(run.pk, lease, status, reason=sink.stop_reason)
        _finish_succeeded(run.pk, lease, model_proto, summary, work_dir)
        return TuningRun.Status.SUCCEEDED
    except LeaseLost:
        log.warning("run %s: lease lost, another executor continues it", run_id)
        return None
    except Exception as exc:  # the run fails; the worker lives on
        log.exception("run %s failed", run_id)
        _add_wall(run.pk, lease, time.perf_counter() - started)
        sink.flush()
        TuningRun.objects.filter(pk=run.pk, lease=lease).update(
            status=TuningRun.Status.FAILED, error=public_text(_error_text(exc), work_dir)[:10000],
            finished_at=timezone.now())
        return TuningRun.Status.FAILED


def _error_text(exc: BaseException) -> str:
    from tuning.engine.isolate import EngineCrashed, EngineError

    if isinstance(exc, (EngineCrashed, EngineError)):
        return str(exc)  # already "the TVM compiler crashed ..." or "<remote type>: <message>"
    return f"{type(exc).__name__}: {exc}"


def _isolated(func: str, *args, what: str, sink=None, needs_django: bool = False, **kwargs):
    """`call_isolated` for the platform: the child sets up Django only when the call needs it
    (distributed measurement sends Celery tasks and reads their results)."""
    from tuning.engine.isolate import call_isolated

    lease_lost: list[Exception] = []

    def on_sink_error(name, exc):
        if isinstance(exc, LeaseLost):
            lease_lost.append(exc)
            return TuningRun.Action.CANCEL if name == "control" else None  # stop the child's engine
        return None

    # Without Django the child needs no secrets, so it gets the sandbox's scrubbed environment; a
    # distributed run's child sends Celery tasks and reads results, so it keeps the worker's.
    value = call_isolated(func, *args, what=what, sink=sink, on_sink_error=on_sink_error,
                          init="django:setup" if needs_django else None, scrub=not needs_django,
                          env={"DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings")},
                          **kwargs)
    if lease_lost:
        raise LeaseLost(str(lease_lost[0]))
    return value


def _run_engine(sink: "DatabaseSink", model_proto, config):
    return _isolated("tuning.engine.session:run_tuning", model_proto, config, sink=sink,
                     what="tuning the model (task extraction, search and measurement)",
                     needs_django=config.distributed_submit is not None)


def reconcile_with_database(sink: "DatabaseSink", model_proto, run: TuningRun, work_dir: Path) -> int:
    """Store the candidates TVM's database holds but the store lacks (the previous
    executor died between TVM's commit and ours). Returns how many were added."""
    if not (work_dir / "database_tuning_record.json").exists():
        return 0
    known = set(Measurement.objects.filter(run_id=run.pk).values_list("candidate_key", flat=True))
    records = _isolated("tuning.engine.session:database_records", str(work_dir), model_proto, run.target,
                        what="reading the run's tuning database back")
    missing = [r for r in records if r.candidate_key not in known]
    for r in missing:
        r.round_index = 0
    if missing:
        log.warning("run %s: %d candidate(s) in TVM's database were missing from the store; added", run.pk,
                    len(missing))
        sink.on_measurements(missing)
    return len(missing)


def _add_wall(run_id: int, lease: str, seconds: float) -> None:
    from django.db.models import F

    TuningRun.objects.filter(pk=run_id, lease=lease).update(wall_seconds=F("wall_seconds") + seconds)


def run_energy_model(run: TuningRun) -> dict[str, float]:
    """The watts model the run started with; the current platform model for runs from before snapshots."""
    keys = ("cpu_watts_per_core", "gpu_board_watts")
    snapshot = run.energy_model or {}
    if all(k in snapshot for k in keys):
        return {k: float(snapshot[k]) for k in keys}
    current = energy_model()
    return {k: float(snapshot.get(k, getattr(current, k))) for k in keys}


def make_energy_meter(run: TuningRun):
    """The best meter of this host for the run: RAPL or a CPU model, plus NVML for CUDA targets."""
    from tuning.engine.energy import available_meters

    watts = run_energy_model(run)
    return available_meters(cpu_watts_per_core=watts["cpu_watts_per_core"], gpu_board_watts=watts["gpu_board_watts"],
                            want_gpu=run.target.get("kind") == "cuda")


def _finish_interrupted(run_id: int, lease: str, status: str, reason: str = "") -> str:
    new = TuningRun.Status.CANCELLED if status == "cancelled" else TuningRun.Status.PAUSED
    TuningRun.objects.filter(pk=run_id, lease=lease).update(
        status=new, requested_action="", lease="", stop_reason=reason[:300],
        finished_at=timezone.now() if new == TuningRun.Status.CANCELLED else None)
    return new


def _finish_succeeded(run_id: int, lease: str, model_proto, summary, work_dir: Path) -> None:
    run = TuningRun.objects.get(pk=run_id)
    threads = run.threads or run.target.get("num-cores")
    comparison = _isolated("tuning.engine.session:compile_and_compare", model_proto, str(work_dir), run.target,
                           threads, export_path=str(work_dir / "tuned_module.so"),
                           what="compiling the tuned and untuned model and comparing their outputs")
    _require_a_measurement(run)
    records_zip = _zip_database(work_dir)
    tasks_best = {t.index: t for t in TuningTask.objects.filter(run_id=run_id)}
    trim = (summary.get("trimmer") if isinstance(summary, dict) else getattr(summary, "trimmer", None)) or {}
    preempted = {int(k): int(v) for k, v in (trim.get("preempted_tasks") or {}).items()}
    for t in getattr(summary, "tasks", []) or []:
        idx = t.get("index") if isinstance(t, dict) else getattr(t, "index", None)
        if idx in tasks_best and idx not in preempted:
            TuningTask.objects.filter(pk=tasks_best[idx].pk).update(status=TuningTask.Status.DONE)
    for idx, at_trial in preempted.items():
        TuningTask.objects.filter(run_id=run_id, index=idx).update(status=TuningTask.Status.PREEMPTED,
                                                                  preempted_at_trial=at_trial)
    TuningTask.objects.filter(run_id=run_id, status=TuningTask.Status.PENDING).update(status=TuningTask.Status.DONE)
    summary_dict = summary.to_dict() if hasattr(summary, "to_dict") else dict(getattr(summary, "__dict__", {}))
    with transaction.atomic():
        run = TuningRun.objects.select_for_update().get(pk=run_id)
        if run.lease != lease:
            raise LeaseLost(f"run {run_id} was taken over")
        run.records_file.save(f"run{run_id}-records.zip", ContentFile(records_zip), save=False)
        module_path = work_dir / "tuned_module.so"
        if module_path.exists():
            run.module_file.save(f"run{run_id}-tuned.so", ContentFile(module_path.read_bytes()), save=False)
        run.tuned_latency_s = comparison.get("tuned_latency_s")
        run.untuned_latency_s = comparison.get("untuned_latency_s")
        run.outputs_match = comparison.get("outputs_match")
        run.max_abs_diff = comparison.get("max_abs_diff")
        run.final_dop = getattr(summary, "final_dop", None)
        run.mean_parallel_error = getattr(summary, "mean_parallel_error", None)
        run.summary = public_json(_json_safe(summary_dict), work_dir)
        run.trials_done = Measurement.objects.filter(run_id=run_id).count()
        if run.trimmer_enabled:
            _store_trimmer_results(run, trim, getattr(summary, "stop_reason", None))
        run.status, run.finished_at, run.lease = TuningRun.Status.SUCCEEDED, timezone.now(), ""
        run.requested_action = ""
        run.save()


class NoMeasurement(ServiceError):
    pass


def _require_a_measurement(run: TuningRun) -> None:
    """A run whose every measurement failed has tuned nothing: it fails, saying why."""
    stored = Measurement.objects.filter(run_id=run.pk)
    if not stored.exists() or stored.filter(error="", latency_s__isnull=False).exists():
        return  # nothing to tune (all candidates were already in the database), or tuned
    common = (stored.values("error").annotate(n=Count("id")).order_by("-n").first() or {}).get("error", "")
    raise NoMeasurement(f"No measurement succeeded ({stored.count()} tried); the most common error: {common}")


def _store_trimmer_results(run: TuningRun, trim: dict, stop_reason: str | None) -> None:
    """Trimmer's counts and savings on the run (saved by the caller). Savings are counted only when
    Trimmer ended the run before its budget: the trials it did not measure, priced at this run's own
    mean energy per measured trial."""
    rounds = DopRound.objects.filter(run_id=run.pk).aggregate(g=Sum("n_generated"), f=Sum("n_filtered"))
    run.candidates_generated = rounds["g"] or int(trim.get("generated") or 0)
    run.candidates_filtered = rounds["f"] or int(trim.get("filtered") or 0)
    if stop_reason:
        run.stop_reason = stop_reason[:300]
    measured = run.trials_done
    run.trials_saved = max(0, run.max_trials - measured) if stop_reason else 0
    if measured and run.energy_joules:
        per_trial = run.energy_joules / measured
        run.energy_saved_joules = run.trials_saved * per_trial
        source = run.energy_source or "modeled"
        run.savings_basis = (
            f"Untrimmed policy would have measured the full budget ({run.max_trials} trials) at this run's mean "
            f"energy per measured trial ({per_trial:.1f} J = {run.energy_joules:.0f} J / {measured} trials, "
            f"{source})")[:300]
    else:
        run.energy_saved_joules = None
        run.savings_basis = "No energy reading for this run: savings not estimated"


def _json_safe(value):
    import json

    return json.loads(json.dumps(value, default=lambda o: getattr(o, "__dict__", str(o))))


def _zip_database(work_dir: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(work_dir.rglob("database_*.json")):
            zf.write(path, path.relative_to(work_dir).as_posix())
    return buf.getvalue()


# --- import of an existing TVM database --------------------------------------------

IMPORT_CHECK_TIMEOUT_S = 600


def import_database(*, actor: AbstractBaseUser, run: TuningRun, workloads: bytes, records: bytes) -> int:
    """Import an existing TVM JSON tuning database into a run that has not measured anything yet.

    Records are parsed by TVM in a sandboxed subprocess and refused unless their workload is one of
    the run's tasks and their trace holds only MetaSchedule's own instructions and annotations
    (tuning.engine.record_check). At most the run's remaining trials; nothing is written on refusal.
    Accepted records are seeds only: their latencies are dropped, and the engine builds and measures
    each one itself as a trial of this run (a Measurement, charged to the trial quota) before it
    counts or seeds the search.
    """
    from tuning.engine.procpool import WorkerError, WorkerTimeout, run_isolated
    from tuning.engine.record_check import RecordError, precheck, recheck_output

    _require_writer(actor, run.team_id)
    _check_importable(run)
    budget = max(0, run.max_trials - run.trials_done)
    try:
        precheck(workloads, records, max_records=budget)  # cheap bounds before TVM sees anything
    except RecordError as exc:
        raise ServiceError(f"{exc}.", field="records") from None
    with run.model.file.open("rb") as f:
        model_bytes = f.read()
    try:
        checked = run_isolated("tuning.engine.record_check:check_import", model_bytes, run.target, workloads,
                               records, budget, timeout=IMPORT_CHECK_TIMEOUT_S)
    except (WorkerError, WorkerTimeout) as exc:
        log.warning("run %s: record import check failed: %s", run.pk, str(exc)[-500:])
        raise ServiceError("The tuning records could not be parsed by TVM (the checker failed on them); "
                           "nothing was imported.", field="records") from None
    if checked.get("errors"):
        errs = checked["errors"]
        more = f" (and {len(errs) - 5} more)" if len(errs) > 5 else ""
        raise ServiceError("Records refused, nothing was imported: " + "; ".join(errs[:5]) + more,
                           field="records")
    try:
        recheck_output(checked["records"])  # the checker parsed hostile bytes in C++: trust nothing it returns
    except RecordError as exc:
        log.error("run %s: the record checker returned a refused record: %s", run.pk, exc)
        raise ServiceError(f"Records refused, nothing was imported: {exc}.", field="records") from None
    with transaction.atomic():
        run = _locked(run)
        _check_importable(run)
        from tuning.engine.session import write_imported

        write_imported(str(run_work_dir(run.pk)), checked["workloads"], checked["records"])
        run.options = {**run.options, "imported_records": len(checked["records"])}
        run.save(update_fields=["options"])
    return len(checked["records"])


def _check_importable(run: TuningRun) -> None:
    from tuning.engine.session import has_imported

    if run.status not in (TuningRun.Status.QUEUED, TuningRun.Status.PAUSED):
        raise ConflictError("Records can be imported only into a queued or paused run.")
    work_dir = run_work_dir(run.pk)
    records_path = work_dir / "database_tuning_record.json"
    if (records_path.exists() and records_path.stat().st_size) or has_imported(str(work_dir)):
        raise ConflictError("This run already has tuning records; import into a new run.")


def delete_run_files(run_id: int) -> None:
    shutil.rmtree(Path(settings.MEDIA_ROOT) / "runs" / str(run_id), ignore_errors=True)
