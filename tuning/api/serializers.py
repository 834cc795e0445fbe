from __future__ import annotations

import json

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core import selectors as core_selectors
from core.api.fast import FastRepresentationMixin
from core.api.strict import RejectUnknownFieldsMixin
from core.exceptions import ServiceError
from core.models import DLModel
from tuning import services
from tuning.models import RUN_LIMITS, DopRound, Measurement, TuningRun, TuningTask, parse_dop


def bounded_integer(name: str, **kwargs) -> serializers.IntegerField:
    """An integer field within RUN_LIMITS[name] (the service checks the same table)."""
    low, high = RUN_LIMITS[name]
    return serializers.IntegerField(min_value=low, max_value=high, **kwargs)


@extend_schema_field(OpenApiTypes.INT)
class TeamModelField(serializers.PrimaryKeyRelatedField):
    def get_queryset(self):
        request = self.context.get("request")
        if request is None:
            return DLModel.objects.none()
        return core_selectors.models_for_user(request.user)


@extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True,
                       "description": "The resolved target as TVM normalizes it; null until a worker starts the run."})
class TargetKeyField(serializers.Field):
    """The run's canonical target key (stored as compact JSON text) as a JSON object."""

    def to_representation(self, value):
        return json.loads(value) if value else None


@extend_schema_field({"type": "object", "properties": {
    "target": {"type": "object", "nullable": True, "additionalProperties": True},
    "pipeline": {"type": "string"}}, "required": ["target", "pipeline"]})
class ResultIdentityField(serializers.Field):
    """What identifies a run's tuning results: its resolved target (an object) and its pipeline key."""

    def __init__(self, **kwargs):
        super().__init__(source="*", **kwargs)

    def to_representation(self, run):
        return {"target": json.loads(run.target_key) if run.target_key else None, "pipeline": run.pipeline_key}


class TuningRunSerializer(FastRepresentationMixin, serializers.ModelSerializer):
    model_name = serializers.CharField(source="model.name", read_only=True)
    progress = serializers.FloatField(read_only=True)
    dop = serializers.CharField(source="dop_mode", read_only=True,
                                help_text="'auto' (DOPpler chooses) or the fixed degree of parallelism.")
    trimmer = serializers.BooleanField(source="trimmer_enabled", read_only=True, help_text="Trimmer is on.")
    queue_position = serializers.IntegerField(read_only=True, allow_null=True, help_text=(
        "While the run waits for one of its team's concurrent-run slots (max_concurrent_runs): 1 for the next "
        "to start; null when it is not waiting."))
    target_key = TargetKeyField(read_only=True)
    speedup = serializers.FloatField(read_only=True, allow_null=True)
    energy_kwh = serializers.FloatField(read_only=True)
    carbon_g = serializers.FloatField(read_only=True, allow_null=True,
                                      help_text="Energy x the team's grid intensity (gCO2e).")
    deploy_verdict = serializers.CharField(read_only=True, help_text=(
        "Which engine to deploy on this target, in words, from the compiled timings only (see verdict): "
        "'Tuned TVM is slower than onnxruntime on this target: deploy onnxruntime', '... within noise ...' "
        "when the two IQRs overlap, 'No verdict: host load ...' on an overloaded host. Empty before the comparison."))
    estimate_gap = serializers.JSONField(read_only=True, allow_null=True, help_text=(
        "When the per-task estimate (estimated_latency_s) is more than 15 % away from the compiled latency: "
        "{ratio: compiled / estimate, gap, note: why}. null otherwise. The verdict never uses the estimate."))
    compiled_checkpoint = serializers.JSONField(read_only=True, allow_null=True, help_text=(
        "The model compiled and timed once every task had a record, while the search waited (long runs): "
        "{at, trials, estimate_s (the per-task estimate then), compiled_s, compiled_iqr_s, compile_s, timing_s, "
        "wall_s}, or {at, trials, estimate_s, error} when it failed; null when none was taken. A measurement "
        "of the model as it stood then: the run's result is the final compiled latency."))
    checkpoint_note = serializers.CharField(read_only=True, help_text=(
        "The compiled checkpoint in words, as the run page and the CLIs print it; empty when none was taken."))
    result_identity = ResultIdentityField(read_only=True, help_text=(
        "What identifies this run's tuning results: the resolved target and the pipeline key."))
    energy_saved_kind = serializers.CharField(read_only=True, allow_null=True,
        help_text='"estimated" (trials Trimmer did not spend x this run\'s energy per trial; see savings_basis), '
                  "null when nothing was estimated. A saving is never measured within a run.")

    class Meta:
        model = TuningRun
        fields = [
            "id", "team", "model", "model_name", "target", "target_kind", "max_trials", "max_minutes", "trials_per_round",
            "measurement_mode", "dop", "threads", "options", "status", "requested_action", "queue_position",
            "waiting_since",
            "error", "created_at", "started_at", "finished_at", "archived_at", "attempts", "worker", "trials_done",
            "progress",
            "wall_seconds", "estimated_latency_s", "compiled_checkpoint", "checkpoint_note",
            "final_dop", "mean_parallel_error", "tuned_latency_s",
            "tuned_latency_iqr_s", "untuned_latency_s", "speedup", "outputs_match", "max_abs_diff",
            "resolved_target", "target_key", "ort_latency_s", "ort_latency_iqr_s", "ratio_to_ort", "faster_engine",
            "ort_outputs_agree", "verdict", "verdict_flag", "timing_load", "estimate_gap", "deploy_verdict",
            "parity_trials",
            "parity_wall_s", "pipeline_key", "evaluator", "result_identity", "summary", "stop_reason",
            "trimmer", "trimmer_options", "candidates_generated", "candidates_filtered", "candidates_not_sent",
            "energy_joules", "energy_kwh", "energy_source", "energy_build_joules", "energy_measure_joules",
            "energy_saved_joules", "energy_saved_kind", "trials_saved", "savings_basis", "grid_intensity_g_per_kwh",
            "carbon_g", "builds_in_flight", "measurements_in_flight",
        ]
        read_only_fields = fields


class TuningRunCreateSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    model = TeamModelField(help_text="A model of one of your teams.")
    max_trials = bounded_integer("max_trials")
    max_minutes = bounded_integer("max_minutes", required=False, allow_null=True, help_text=(
        "Wall-time budget in minutes beside max_trials: once spent (earlier attempts included), tuning finishes "
        "between rounds and the best schedules found are compiled. Omitted: the trial budget alone."))
    target = serializers.JSONField(required=False, help_text=(
        'The target, from a closed set of fields: {"kind": "llvm", "num-cores": N, "mcpu": NAME} (mcpu only as a '
        'registered node reports it, see /api/nodes/; default: the executing host\'s CPU) or {"kind": "cuda", '
        '"arch": "sm_XY"}. Any other key is refused. Default {"kind": "llvm", "num-cores": <cores>}.'))
    trials_per_round = bounded_integer("trials_per_round", default=32)
    measurement_mode = serializers.ChoiceField(choices=TuningRun.Mode.choices, default=TuningRun.Mode.DOPPLER)
    dop = serializers.CharField(default="auto", help_text="'auto' or a fixed degree of parallelism.")
    threads = bounded_integer("threads", required=False, allow_null=True)
    search_population = bounded_integer("search_population", required=False,
                                        help_text="Evolutionary search population (smaller = faster).")
    seed = bounded_integer("seed", required=False)
    measure_queues = serializers.ListField(
        child=serializers.RegexField(r"^measure\.[A-Za-z0-9_-]+\.(cpu|gpu\d+)$", max_length=200),
        required=False, max_length=64,
        help_text="Measure on remote devices: Celery queues such as measure.<host>.cpu or measure.<host>.gpu0 "
                  "(see /api/nodes/). Empty = measure on the tuning host.")
    trimmer = serializers.BooleanField(default=False, help_text="Enable Trimmer (plateau pre-emption, model "
                                       "stop, ML candidate filter).")
    trimmer_options = serializers.DictField(required=False, default=dict, help_text=(
        "Overrides of TrimmerConfig: plateau_rounds, min_improvement, model_window, model_patience, "
        "model_min_improvement, target_latency_s, min_trials_per_task, filter_enabled, filter_oversample, "
        "filter_keep_explore, filter_min_samples, filter_veto_margin, min_trial_share (no pre-emption before this "
        "share of an equal split of the budget), max_resumes (probes a pre-empted task gets when budget is left), "
        "audit_sample, judge_after_trials (plateaus count after this many trials; null = once the cost model is "
        "warm)."))

    def validate_target(self, value):
        """The closed target schema, checked here so a refused key is a 400 naming it before anything else
        (`tuning.services.validate_target`, which `start_run` applies again for every entry point)."""
        try:
            services.validate_target(value)
        except ServiceError as exc:
            raise serializers.ValidationError(exc.message) from None
        return value

    def validate_dop(self, value) -> int | None:
        """None for 'auto', else the fixed degree of parallelism (`tuning.models.parse_dop`)."""
        try:
            return parse_dop(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class TuningTaskSerializer(FastRepresentationMixin, serializers.ModelSerializer):
    gflops_per_s = serializers.FloatField(read_only=True, allow_null=True)

    class Meta:
        model = TuningTask
        fields = ["id", "index", "name", "flops", "weight", "trials", "best_latency_s", "gflops_per_s", "status"]
        read_only_fields = fields


class MeasurementSerializer(FastRepresentationMixin, serializers.ModelSerializer):
    task_index = serializers.IntegerField(source="task.index", read_only=True)

    class Meta:
        model = Measurement
        fields = ["id", "task", "task_index", "round_index", "candidate_key", "run_secs", "latency_s", "build_secs",
                  "run_wall_secs", "error", "worker", "dop", "remeasured_serially", "serial_secs", "created_at"]
        read_only_fields = fields


class DopRoundSerializer(FastRepresentationMixin, serializers.ModelSerializer):
    class Meta:
        model = DopRound
        fields = ["round_index", "task_index", "dop", "mean_error", "n_candidates", "n_remeasured", "n_failures",
                  "wall_secs", "parallel_wall_secs", "serial_wall_secs", "created_at"]
        read_only_fields = fields


class ImportRecordsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    workloads = serializers.FileField(help_text="TVM JSONDatabase database_workload.json")
    records = serializers.FileField(help_text="TVM JSONDatabase database_tuning_record.json")
