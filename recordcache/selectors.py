"""Reads of the tuning-record cache."""
from __future__ import annotations

from django.db.models import BooleanField, Case, Count, F, IntegerField, Q, QuerySet, Sum, When

from tuning.models import TuningRun

from .models import CacheEntry, CacheLookup, CostModelFile, TeamCacheSettings

ENTRY_FIELDS = ("id", "workload_hash", "workload_json", "record_json", "trace_digest", "latency_s", "run_secs",
                "task_name", "status", "source_trials", "source_converged")


def team_settings(team_id: int) -> TeamCacheSettings:
    """The team's setting (unsaved defaults, no publishing and read, when it never chose)."""
    return TeamCacheSettings.objects.filter(team_id=team_id).first() or TeamCacheSettings(team_id=team_id)


def _key_filter(key: dict) -> Q:
    return Q(target_key=key["target_key"], hardware=key["hardware"], tvm_version=key["tvm_version"])


# An entry is served (seeds, cost-model training, export) only while the team that published it has publishing
# on: a team that turns it off takes its records back, and entries published before publishing became opt-in
# wait for their team's consent. A staff import (no team) is served while pending, until a run re-measures it
# and publishes it under its own team.
PUBLISHED = (Q(source_team__record_cache_settings__publish=True)
             | Q(source_team__isnull=True, status=CacheEntry.Status.PENDING))


def published_entries() -> QuerySet[CacheEntry]:
    return CacheEntry.objects.filter(PUBLISHED)


def has_usable_entries(key: dict) -> bool:
    return published_entries().filter(_key_filter(key)).exclude(status=CacheEntry.Status.STALE).exists()


def lookup(key: dict, workload_hashes: list[str], top_k: int) -> dict[str, list[dict]]:
    """Per workload hash, its best ``top_k`` usable entries under ``key`` (trusted by time, then pending
    imports); stale entries are never used."""
    rows = (published_entries().filter(_key_filter(key), workload_hash__in=set(workload_hashes))
            .exclude(status=CacheEntry.Status.STALE)
            .order_by("workload_hash", F("latency_s").asc(nulls_last=True), "id"))  # pending (no time) last
    out: dict[str, list[dict]] = {}
    for row in rows.values(*ENTRY_FIELDS, "source_run_id"):
        group = out.setdefault(row["workload_hash"], [])
        if len(group) < top_k:
            group.append({**row, "source_run": row.pop("source_run_id")})
    return out


def trusted_entries(key: dict, limit: int = 5000) -> list[dict]:
    """The trusted entries of one key (newest first), as the engine reads them (cost-model training)."""
    rows = (published_entries().filter(_key_filter(key), status=CacheEntry.Status.TRUSTED)
            .order_by("-updated_at")[:limit])
    return list(rows.values(*ENTRY_FIELDS, "args_info"))


def cost_model_for(key: dict) -> CostModelFile | None:
    return CostModelFile.objects.filter(_key_filter(key)).first()


def lookups_of_run(run: TuningRun) -> QuerySet[CacheLookup]:
    """The run's per-task cache use, as its team may see it: ``own_source_run_id`` is the run the record
    came from when that run is the same team's, else None (``from_shared_cache``: another team's, or a
    staff import). Another team's run id, model or name never reaches a page or the API."""
    own = Q(source_run__isnull=False, source_run__team_id=run.team_id)
    return (CacheLookup.objects.filter(run=run).order_by("task_index")
            .annotate(own_source_run_id=Case(When(own, then=F("source_run_id")), default=None,
                                             output_field=IntegerField()),
                      from_shared_cache=Case(When(Q(hit=True) & ~own, then=True), default=False,
                                             output_field=BooleanField())))


def entries_for_export(*, target_key: str = "", tvm_version: str = "", hardware: str = "") -> list[dict]:
    """Published trusted entries, optionally filtered, for a TVM JSON database export."""
    qs = published_entries().filter(status=CacheEntry.Status.TRUSTED)
    for field, value in (("target_key", target_key), ("tvm_version", tvm_version), ("hardware", hardware)):
        if value:
            qs = qs.filter(**{field: value})
    return list(qs.order_by("workload_hash", "latency_s").values("workload_hash", "workload_json", "record_json",
                                                                 "run_secs"))


def cache_stats() -> dict:
    """Size (entries by status) and hit rate (task lookups that found records / all task lookups)."""
    by_status = dict(CacheEntry.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    looked = CacheLookup.objects.aggregate(n=Count("id"), hits=Count("id", filter=Q(hit=True)),
                                           verified=Count("id", filter=Q(verification="verified")))
    n = looked["n"] or 0
    return {"entries": sum(by_status.values()), "by_status": by_status, "lookups": n, "hits": looked["hits"],
            "verified": looked["verified"], "hit_rate": (looked["hits"] / n) if n else None}


def run_cache_savings(run: TuningRun) -> dict:
    """Trials the cache saved this run (estimated) and their energy at the run's mean energy per trial,
    labelled estimated; counted apart from Trimmer's savings."""
    trials = CacheLookup.objects.filter(run=run).aggregate(t=Sum("trials_saved"))["t"] or 0
    per_trial = (run.energy_joules / run.trials_done) if run.trials_done and run.energy_joules else None
    return {"trials_saved": trials, "energy_saved_joules": trials * per_trial if per_trial is not None else None,
            "basis": "estimated: trials the source runs spent on the verified workloads, less the verification "
                     "measurements, at this run's mean energy per measured trial"}


def team_cache_savings(team_ids, since=None) -> dict:
    """The cache's estimated savings over a set of teams' runs (the energy page shows them apart)."""
    runs = TuningRun.objects.filter(team_id__in=team_ids, cache_lookups__trials_saved__gt=0).distinct()
    if since is not None:
        runs = runs.filter(created_at__gte=since)
    total_t, total_j = 0, 0.0
    for run in runs.only("id", "energy_joules", "trials_done"):
        s = run_cache_savings(run)
        total_t += s["trials_saved"]
        total_j += s["energy_saved_joules"] or 0.0
    return {"trials_saved": total_t, "energy_saved_joules": total_j, "source": "estimated"}
