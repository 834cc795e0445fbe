from rest_framework import serializers

from core.api.strict import RejectUnknownFieldsMixin
from recordcache.models import CacheLookup, TeamCacheSettings


class TeamCacheSettingsSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    class Meta:
        model = TeamCacheSettings
        fields = ["team", "publish", "read", "updated_at"]
        read_only_fields = ["team", "updated_at"]


class CacheLookupSerializer(serializers.ModelSerializer):
    """A task's cache use, from ``selectors.lookups_of_run``: the source run only when it is the viewing
    run's own team's; a record from another team (or a staff import) says only ``from_shared_cache``."""

    source_run = serializers.IntegerField(source="own_source_run_id", allow_null=True, read_only=True,
                                          help_text="the same team's run the record came from; null otherwise")
    from_shared_cache = serializers.BooleanField(read_only=True,
                                                 help_text="a hit on another team's (anonymous) or imported record")

    class Meta:
        model = CacheLookup
        fields = ["task_index", "task_name", "workload_hash", "hit", "n_seeds", "source_run", "from_shared_cache",
                  "verification", "cache_best_s", "measured_best_s", "reason", "trials_saved"]


class CacheImportSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    workloads = serializers.FileField(help_text="TVM JSONDatabase database_workload.json")
    records = serializers.FileField(help_text="TVM JSONDatabase database_tuning_record.json")
    target = serializers.JSONField(help_text='The target, from the closed set of fields a run\'s target has, e.g. '
                                   '{"kind": "llvm", "mcpu": "znver3"} (mcpu as a registered node reports it)')
    hardware = serializers.CharField(max_length=300)
    tvm_version = serializers.CharField(max_length=100)

    def validate_target(self, value):
        if not isinstance(value, dict) or value.get("kind") not in ("llvm", "cuda"):
            raise serializers.ValidationError('A target dict whose "kind" is "llvm" or "cuda".')
        return value


class PurgeSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    target_key = serializers.CharField(max_length=800, required=False, allow_blank=True, default="")
    tvm_version = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
