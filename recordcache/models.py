"""Rows of the tuning-record cache: entries (one trusted record each), per-run lookups (what a run got
from the cache, per task), the transferable cost models and each team's publish/read setting."""
from __future__ import annotations

from django.db import models

from core.models import Team
from tuning.models import TuningRun


class CacheEntry(models.Model):
    """One tuning record the platform measured serially itself (a run's final re-measure), or a staff
    import waiting to be measured (``pending``: never a time, never a verified hit)."""

    class Status(models.TextChoices):
        TRUSTED = "trusted", "trusted (platform-measured)"
        STALE = "stale", "stale (did not verify)"
        PENDING = "pending", "pending (imported, not yet measured)"

    workload_hash = models.CharField(max_length=32, help_text="structural hash (MetaSchedule module equality)")
    target_key = models.CharField(max_length=800, help_text="canonical target key (+ graph-pass pipeline)")
    hardware = models.CharField(max_length=300, help_text="CPU model and core layout, or GPU name/memory/driver")
    tvm_version = models.CharField(max_length=100)
    trace_digest = models.CharField(max_length=40)
    task_name = models.CharField(max_length=300, blank=True)
    workload_json = models.TextField()
    record_json = models.TextField(help_text="TVM tuning record without run times (a seed)")
    args_info = models.JSONField(default=list)
    run_secs = models.JSONField(default=list, help_text="the platform's serial re-measure, seconds")
    latency_s = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.TRUSTED, db_index=True)
    source_run = models.ForeignKey(TuningRun, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="published_cache_entries")
    source_team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    source_trials = models.PositiveIntegerField(
        null=True, blank=True, help_text="trials the source run(s) spent on the workload (null: not recorded)")
    source_converged = models.BooleanField(
        default=False, help_text="the source's search had plateaued (Trimmer's rule) or run out of candidates")
    hits = models.PositiveIntegerField(default=0)
    strikes = models.PositiveSmallIntegerField(
        default=0, help_text="runs in a row in which it did not verify (twice re-timed); stale at STALE_STRIKES")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["workload_hash", "target_key", "hardware", "tvm_version", "trace_digest"],
            name="recordcache_entry_unique_key")]
        indexes = [models.Index(fields=["target_key", "hardware", "tvm_version", "workload_hash"],
                                name="recordcache_lookup")]
        verbose_name_plural = "cache entries"

    def __str__(self) -> str:
        return f"{self.task_name or self.workload_hash} ({self.status})"


class CacheLookup(models.Model):
    """What one task of a run got from the cache: hit or miss, where the record came from, whether it
    verified on this host, and the trials that saved (estimated)."""

    class Verification(models.TextChoices):
        NONE = "", "not seeded"
        PENDING = "pending", "seeded, not yet measured"
        VERIFIED = "verified", "verified"
        STALE = "stale", "did not verify (stale)"
        UNTRUSTED = "untrusted", "imported records only"

    run = models.ForeignKey(TuningRun, on_delete=models.CASCADE, related_name="cache_lookups")
    task_index = models.PositiveIntegerField()
    task_name = models.CharField(max_length=300)
    workload_hash = models.CharField(max_length=32)
    hit = models.BooleanField(default=False)
    n_seeds = models.PositiveIntegerField(default=0)
    source_run = models.ForeignKey(TuningRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    verification = models.CharField(max_length=10, choices=Verification.choices, blank=True, default="")
    cache_best_s = models.FloatField(null=True, blank=True)
    measured_best_s = models.FloatField(null=True, blank=True)
    reason = models.CharField(max_length=300, blank=True)
    trials_saved = models.PositiveIntegerField(default=0, help_text="estimated: the source run's trials on this "
                                                                    "workload, less the verification measurements")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "task_index"], name="recordcache_lookup_unique")]
        ordering = ["run", "task_index"]


class CostModelFile(models.Model):
    """The XGBoost cost model trained on every trusted entry of one (target, hardware, TVM version)."""

    target_key = models.CharField(max_length=800)
    hardware = models.CharField(max_length=300)
    tvm_version = models.CharField(max_length=100)
    file = models.FileField(upload_to="recordcache/cost_models/", max_length=255)
    n_records = models.PositiveIntegerField(default=0)
    trained_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["target_key", "hardware", "tvm_version"],
                                               name="recordcache_cost_model_unique")]


class TeamCacheSettings(models.Model):
    """Whether a team's runs publish their records to the shared cache and read from it (records reveal
    the tensor shapes of a team's model). Publishing is opt-in: no row = the defaults (do not publish,
    read). Only the team's owners change it (``services.update_team_settings``)."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="record_cache_settings")
    publish = models.BooleanField(
        default=False, help_text="opt-in: the team's runs add their records to the cache other teams' runs read "
                                 "(its entries are served only while this is on)")
    read = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "team cache settings"
