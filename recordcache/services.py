"""Writes of the tuning-record cache: seeding a run from it, filling it from a successful run, the team
setting, purge, staff import.

Trust: entries are written from the platform's own serial re-measures of a successful run whose tuned
outputs matched the untuned build (``publish_run``), never from a user import or a parallel measurement.
A staff import (``import_entries``) is checked like a run's import and lands ``pending``: no time, never a
verified hit; it becomes trusted only when a run it seeded re-measures it serially and publishes.
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.files.base import ContentFile
from django.db import transaction
from django.db.models import F

from core.exceptions import PermissionDenied, ServiceError
from core.fieldtext import fit_to_field
from core.models import Team
from core.permissions import require_team_owner
from tuning import services as tuning_services
from tuning.models import TuningRun, TuningTask

from . import adapters, selectors
from .models import CacheEntry, CacheLookup, CostModelFile, TeamCacheSettings

log = logging.getLogger(__name__)

MAX_IMPORT_RECORDS = 10_000
# runs in a row in which an entry must fail to verify before it is stale: one run on a busy host (whose seeds
# were each timed twice already) is not enough to retire a good record for good
STALE_STRIKES = 2


# --------------------------------------------------------------------------- team setting
def update_team_settings(*, actor: AbstractBaseUser, team: Team, publish: bool | None = None,
                         read: bool | None = None) -> TeamCacheSettings:
    """Owners only. Publishing is opt-in; turning it off withdraws the team's records at once (entries are
    served only while their team publishes: ``selectors.PUBLISHED``) and drops the cost models trained on
    them (retrained without them at the key's next publish)."""
    require_team_owner(actor, team.pk, "change the team's record-cache setting")
    with transaction.atomic():
        row, _ = TeamCacheSettings.objects.select_for_update().get_or_create(team=team)
        withdrawn = row.publish and publish is not None and not publish
        row.publish = row.publish if publish is None else bool(publish)
        row.read = row.read if read is None else bool(read)
        row.save()
        if withdrawn:
            _drop_cost_models_trained_on(team)
    return row


def _drop_cost_models_trained_on(team: Team) -> None:
    keys = CacheEntry.objects.filter(source_team=team).values("target_key", "hardware", "tvm_version").distinct()
    for key in keys:
        for model in CostModelFile.objects.filter(**key):
            model.file.delete(save=False)
            model.delete()


def _require_staff(actor: AbstractBaseUser, what: str) -> None:
    if not getattr(actor, "is_staff", False):
        raise PermissionDenied(f"Only staff can {what}.")


# --------------------------------------------------------------------------- seeding
def _seedable(run: TuningRun) -> bool:
    """A fresh run on this host's cores: not resumed, no user import, measured locally (a remote
    worker's hardware is not this host's)."""
    work_dir = adapters.run_work_dir(run.pk)
    opts = run.options or {}
    return (run.attempts <= 1 and not opts.get("imported_records") and not opts.get("measure_queues")
            and not (work_dir / "database_tuning_record.json").exists())


def seed_before_engine(*, run: TuningRun, model_proto) -> int:
    """``seed_run`` for the executor: a cache that fails (a crashed lookup) costs the run its seeds only."""
    try:
        return seed_run(run=run, model_proto=model_proto)
    except Exception:  # noqa: BLE001 - the run tunes cold instead
        log.exception("run %s: record cache lookup failed; tuning without seeds", run.pk)
        return 0


def seed_run(*, run: TuningRun, model_proto, top_k: int = adapters.DEFAULT_TOP_K,
             tolerance: float = adapters.DEFAULT_TOLERANCE) -> int:
    """Before the engine starts: look every task of ``run`` up in the cache and make the hits the run's
    seeds (built and re-timed serially on this host before the search); record hit/miss per task; put the
    cache's cost model where the run loads one. Returns the number of seeds (0: team opted out, nothing
    cached, or the run is not fresh)."""
    if not settings.RECORD_CACHE_ENABLED or not selectors.team_settings(run.team_id).read or not _seedable(run):
        return 0
    key = adapters.cache_key_of(run)
    if not selectors.has_usable_entries(key):
        return 0  # nothing cached for this target and machine: no task extraction spent on a lookup
    tasks = adapters.task_workloads(model_proto, run)
    found = selectors.lookup(key, [t["workload_hash"] for t in tasks], top_k)
    budget = max(0, run.max_trials - run.trials_done)
    hits: dict[int, list[dict]] = {}
    for t in tasks:
        take = found.get(t["workload_hash"], [])[:max(0, budget - sum(len(v) for v in hits.values()))]
        if take:
            hits[t["index"]] = take
    _record_lookups(run, tasks, hits)
    n = adapters.write_seeds(run, hits, tolerance) if hits else 0
    model = selectors.cost_model_for(key)
    if model is not None:
        adapters.place_cost_model(str(adapters.run_work_dir(run.pk)), model.file.path)
    return n


def _record_lookups(run: TuningRun, tasks: list[dict], hits: dict[int, list[dict]]) -> None:
    with transaction.atomic():
        CacheLookup.objects.filter(run=run).delete()
        CacheLookup.objects.bulk_create([CacheLookup(
            run=run, task_index=t["index"], task_name=fit_to_field(CacheLookup, "task_name", t["name"]),
            workload_hash=t["workload_hash"], hit=t["index"] in hits, n_seeds=len(hits.get(t["index"], [])),
            source_run_id=(hits[t["index"]][0]["source_run"] if t["index"] in hits else None),
            verification=CacheLookup.Verification.PENDING if t["index"] in hits else "") for t in tasks])
        ids = [e["id"] for entries in hits.values() for e in entries]
        CacheEntry.objects.filter(id__in=ids).update(hits=F("hits") + 1)


# --------------------------------------------------------------------------- after a run
def record_run_outcome(*, run_id: int, model_proto) -> None:
    """After a run succeeded: store how its cache hits verified (stale entries marked), publish its trusted
    records, retrain the key's cost model. Never fails the run: errors are logged."""
    try:
        run = TuningRun.objects.get(pk=run_id)
        apply_verification(run)
        publish_run(run=run, model_proto=model_proto)
    except Exception:  # noqa: BLE001 - the cache is an optimisation; the run has succeeded
        log.exception("run %s: record cache update failed", run_id)


def apply_verification(run: TuningRun) -> None:
    """The engine's verdicts (``records.seeds.verify_seeds``) onto the run's lookups and the entries."""
    result = adapters.load_verification(str(adapters.run_work_dir(run.pk)))
    if not result:
        return
    with transaction.atomic():
        for v in result["tasks"]:
            verdict = (CacheLookup.Verification.VERIFIED if v["verified"] else
                       CacheLookup.Verification.UNTRUSTED if v["cache_best_s"] is None and v["measured_best_s"]
                       else CacheLookup.Verification.STALE)
            CacheLookup.objects.filter(run=run, task_index=v["task_index"]).update(
                verification=verdict, cache_best_s=v["cache_best_s"], measured_best_s=v["measured_best_s"],
                reason=fit_to_field(CacheLookup, "reason", v["reason"]),
                trials_saved=_trials_saved(v) if v.get("settled", v["verified"]) else 0)  # searched on: none
            _strike(v["stale_entry_ids"])
            CacheEntry.objects.filter(id__in=v.get("confirmed_entry_ids") or [], status=CacheEntry.Status.TRUSTED
                                      ).update(strikes=0)


def _strike(entry_ids: list[int]) -> None:
    """One more run in which these entries did not verify; stale from ``STALE_STRIKES`` in a row on (a
    failed or slow re-time on a busy host costs a strike, not the entry)."""
    rows = CacheEntry.objects.select_for_update().filter(id__in=entry_ids).exclude(status=CacheEntry.Status.STALE)
    for row in rows:
        row.strikes += 1
        if row.strikes >= STALE_STRIKES:
            row.status = CacheEntry.Status.STALE
        row.save(update_fields=["strikes", "status", "updated_at"])


def _trials_saved(verdict: dict) -> int:
    """Estimated: what the source run spent tuning that workload, less the verification measurements."""
    spent = (TuningTask.objects.filter(run_id=verdict.get("source_run"), name=verdict["task_name"])
             .values_list("trials", flat=True).first()) if verdict.get("source_run") else None
    return max(0, int(spent or 0) - int(verdict["n_seeds"]))


def _publishable(run: TuningRun) -> bool:
    """A successful run whose tuned outputs matched, measured on this host, with no user-imported records,
    by a team that opted in to publishing (``TeamCacheSettings.publish``, off by default)."""
    opts = run.options or {}
    final = adapters.run_work_dir(run.pk) / "final" / "database_tuning_record.json"
    return (settings.RECORD_CACHE_ENABLED and final.exists() and final.stat().st_size > 0  # serial re-measures
            and run.status == TuningRun.Status.SUCCEEDED and run.outputs_match is True and bool(run.target_key)
            and not opts.get("measure_queues") and not opts.get("imported_records")  # never from imports
            and selectors.team_settings(run.team_id).publish)


def publish_run(*, run: TuningRun, model_proto) -> int:
    """Store the run's serially re-measured records (its ``final`` database) as trusted entries (a schedule
    already cached under the same key takes the new platform measurement) and save the key's cost model,
    retrained on them and the key's other trusted entries (one sandboxed child). Returns how many entries."""
    if not _publishable(run):
        return 0
    key = adapters.cache_key_of(run)
    tmp = adapters.run_work_dir(run.pk) / "cache_cost_model.xgb"
    out = adapters.publish_from_run(model_proto, run, selectors.trusted_entries(key), tmp)
    with transaction.atomic():
        for e in out["entries"]:
            effort = _source_effort(key, e)
            CacheEntry.objects.update_or_create(
                **key, workload_hash=e["workload_hash"], trace_digest=e["trace_digest"],
                defaults={"task_name": fit_to_field(CacheEntry, "task_name", e["task_name"]),
                          "workload_json": e["workload_json"], "record_json": e["record_json"],
                          "args_info": e["args_info"], "run_secs": e["run_secs"], "latency_s": e["latency_s"],
                          "status": CacheEntry.Status.TRUSTED, "strikes": 0, "source_run": run,
                          "source_team_id": run.team_id, **effort})
    if out.get("cost_model_records") and tmp.exists():
        _save_cost_model(key, tmp, out["cost_model_records"], run.pk)
    return len(out["entries"])


def _source_effort(key: dict, entry: dict) -> dict:
    """How far the entry's workload was tuned (``records.publish.source_effort``); a schedule already cached
    keeps the larger of its two histories: another run that found it again does not make it less tuned."""
    trials, converged = entry.get("source_trials"), bool(entry.get("source_converged"))
    old = (CacheEntry.objects.filter(**key, workload_hash=entry["workload_hash"], trace_digest=entry["trace_digest"])
           .values("source_trials", "source_converged").first())
    if old:
        known = [int(x) for x in (trials, old["source_trials"]) if x is not None]
        trials, converged = (max(known) if known else None), converged or old["source_converged"]
    return {"source_trials": trials, "source_converged": converged}


def _save_cost_model(key: dict, path, n_records: int, run_id: int) -> None:
    """Store the key's retrained cost model, only in the platform's data-only format (other teams' runs
    load it): the sandboxed child that wrote it handled a team's model, so it is checked, not trusted."""
    try:
        adapters.check_cost_model_file(str(path))
    except adapters.CostModelFileError as exc:
        log.error("run %s: retrained cost model refused, the key keeps its old one: %s", run_id, exc)
        return
    row = selectors.cost_model_for(key) or CostModelFile(**key)
    old = row.file.name if row.file else None
    row.file.save(f"cost-model-{run_id}.xgb", ContentFile(path.read_bytes()), save=False)
    row.n_records = n_records
    row.save()
    if old and old != row.file.name:
        row.file.storage.delete(old)


# --------------------------------------------------------------------------- staff
def purge(*, actor: AbstractBaseUser, target_key: str = "", tvm_version: str = "") -> int:
    """Delete the entries (and cost models) of a target and/or a TVM version; staff only."""
    _require_staff(actor, "purge the record cache")
    if not target_key and not tvm_version:
        raise ServiceError("Name a target key or a TVM version to purge.", field="target_key")
    filters = {k: v for k, v in (("target_key", target_key), ("tvm_version", tvm_version)) if v}
    with transaction.atomic():
        n, _ = CacheEntry.objects.filter(**filters).delete()
        for model in CostModelFile.objects.filter(**filters):
            model.file.delete(save=False)
            model.delete()
    return n


def import_entries(*, actor: AbstractBaseUser, workloads: bytes, records: bytes, target: dict, hardware: str,
                   tvm_version: str) -> int:
    """Staff import of a TVM JSON database into the cache: checked like a run's import (bounds, then TVM in
    a sandbox: MetaSchedule's own instructions and annotations, plain names, replay), stored ``pending``
    without times. Nothing is written on refusal. Returns the number of entries."""
    _require_staff(actor, "import records into the record cache")
    tuning_services.validate_target(target)  # the closed schema a run's target has (ServiceError naming the key)
    try:
        adapters.precheck(workloads, records, max_records=MAX_IMPORT_RECORDS)
    except adapters.RecordError as exc:
        raise ServiceError(f"{exc}.", field="records") from None
    try:
        checked = adapters.check_cache_import(workloads, records, target, MAX_IMPORT_RECORDS)
    except (adapters.WorkerError, adapters.WorkerTimeout):
        raise ServiceError("The records could not be parsed by TVM; nothing was imported.", field="records") from None
    if not isinstance(checked, dict):
        checked = {"errors": ["the checker returned no answer"]}
    if checked.get("errors"):
        errs = checked["errors"] if isinstance(checked["errors"], list) else ["refused"]
        raise ServiceError("Records refused, nothing was imported: " + "; ".join(str(e)[:400] for e in errs[:5]),
                           field="records")
    try:
        # the checker parsed hostile bytes in C++: what it returns is checked again, as a run import's is
        adapters.recheck_cache_entries(checked.get("entries") or [])
        if not (isinstance(checked.get("target_key"), str) and len(checked["target_key"]) <= 800):
            raise adapters.RecordError("Checked import", "the checker returned no target key")
    except adapters.RecordError as exc:
        log.error("record-cache import: the checker returned a refused entry: %s", exc)
        raise ServiceError(f"Records refused, nothing was imported: {exc}.", field="records") from None
    key = {"target_key": checked["target_key"], "hardware": hardware, "tvm_version": tvm_version}
    with transaction.atomic():
        for e in checked["entries"]:
            CacheEntry.objects.get_or_create(
                **key, workload_hash=e["workload_hash"], trace_digest=e["trace_digest"],
                defaults={"task_name": fit_to_field(CacheEntry, "task_name", e["task_name"]),
                          "workload_json": e["workload_json"], "record_json": e["record_json"],
                          "args_info": e["args_info"], "run_secs": [], "latency_s": None,
                          "status": CacheEntry.Status.PENDING})
    return len(checked["entries"])

