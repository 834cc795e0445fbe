"""Admin (staff only): the cache's entries with its size and hit rate, purged by target or TVM version
(filter the list, select all, delete), the team settings and the cost models."""
from django.contrib import admin

from . import selectors
from .models import CacheEntry, CacheLookup, CostModelFile, TeamCacheSettings


@admin.register(CacheEntry)
class CacheEntryAdmin(admin.ModelAdmin):
    list_display = ("task_name", "workload_hash", "status", "latency_s", "hits", "source_run", "tvm_version",
                    "updated_at")
    list_filter = ("status", "target_key", "tvm_version", "hardware")
    search_fields = ("task_name", "workload_hash", "target_key")
    readonly_fields = [f.name for f in CacheEntry._meta.fields]
    actions = ["delete_selected"]

    def has_add_permission(self, request):
        return False  # entries come from runs (trusted) or the staff import (pending), never typed in

    def changelist_view(self, request, extra_context=None):
        stats = selectors.cache_stats()
        rate = "-" if stats["hit_rate"] is None else f"{stats['hit_rate']:.0%}"
        extra = {"title": (f"Record cache: {stats['entries']} entries {stats['by_status']}, hit rate {rate} "
                           f"({stats['hits']}/{stats['lookups']} task lookups, {stats['verified']} verified). "
                           "Purge: filter by target or TVM version, select all, delete.")}
        return super().changelist_view(request, extra_context={**(extra_context or {}), **extra})


@admin.register(CacheLookup)
class CacheLookupAdmin(admin.ModelAdmin):
    list_display = ("run", "task_index", "task_name", "hit", "verification", "source_run", "trials_saved")
    list_filter = ("hit", "verification")
    readonly_fields = [f.name for f in CacheLookup._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(TeamCacheSettings)
class TeamCacheSettingsAdmin(admin.ModelAdmin):
    list_display = ("team", "publish", "read", "updated_at")
    # publishing is the team's consent: only its owners give it (dashboard team page, API), not staff
    readonly_fields = ("team", "publish", "updated_at")

    def has_add_permission(self, request):
        return False


@admin.register(CostModelFile)
class CostModelFileAdmin(admin.ModelAdmin):
    list_display = ("target_key", "hardware", "tvm_version", "n_records", "trained_at")
    readonly_fields = [f.name for f in CostModelFile._meta.fields]
