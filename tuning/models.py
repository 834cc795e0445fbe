"""Tuning runs, their tasks, every measured candidate, and DOP rounds.

State lives here and in TVM's tuning database under the run's work dir, never
only in a worker's memory, so a killed worker's run resumes where it stopped.
"""
from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.functions import Coalesce, Greatest, Now
from django.utils import timezone

from common.units import joules_to_kwh
from core.models import DLModel, Team, UsageCharge
from tuning.engine.compile.passes import describe_pipeline
from tuning.engine.compile.targets import identity_of
from tuning.engine import checkpoint as compiled_checkpoint
from tuning.engine import verdict as verdict_rule

# (min, max) of each bound of a run: the model, the service, the API serializer, the dashboard form and
# `manage.py tune` all read these, so no entry point accepts what another refuses.
RUN_LIMITS = {
    "max_trials": (1, 100_000),
    "max_minutes": (1, 7 * 24 * 60),
    "trials_per_round": (1, 1024),
    "threads": (1, 1024),
    "num_cores": (1, 1024),
    "dop": (1, 256),
    "search_population": (8, 4096),
    "seed": (0, 2**31 - 1),
}

# Fewest trials a budget must give each of the model's tuning tasks: MetaSchedule's first generation of a
# task is a handful of candidates, some of which fail to build or run, so below this many a task may end
# with no valid measurement (its untuned kernel then stays in the "tuned" module). A budget below
# tasks x this is refused when the run starts (tuning.services.runs.validate_budget).
MIN_TRIALS_PER_TASK = 8


def min_trials_for(n_tasks: int | None) -> int:
    """The smallest budget that can measure each of `n_tasks` tasks (1 when the count is unknown)."""
    return max(1, int(n_tasks or 0) * MIN_TRIALS_PER_TASK)


# What the start form suggests: enough for a few search generations of every task
SUGGESTED_TRIALS_PER_TASK = 64


def suggested_trials_for(n_tasks: int | None) -> int | None:
    """A budget that lets every task converge somewhat (None when the task count is unknown)."""
    return min(RUN_LIMITS["max_trials"][1], int(n_tasks) * SUGGESTED_TRIALS_PER_TASK) if n_tasks else None


def run_bound_validators(name: str) -> list:
    low, high = RUN_LIMITS[name]
    return [MinValueValidator(low), MaxValueValidator(high)]


def run_bound_error(name: str, value) -> str | None:
    """Why `value` is not a valid `name` of a run (an integer within RUN_LIMITS), or None when it is."""
    low, high = RUN_LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"{name} must be an integer between {low} and {high}."
    return None


def parse_dop(value) -> int | None:
    """The one reading of a requested degree of parallelism: 'auto' (or empty) -> None (DOPpler picks it),
    else an integer within RUN_LIMITS["dop"] (an int or its decimal text). ValueError otherwise."""
    if value in ("auto", None, ""):
        return None
    low, high = RUN_LIMITS["dop"]
    text = str(value).strip()
    if isinstance(value, bool) or not (isinstance(value, int) or text.isdigit()) or not low <= int(text) <= high:
        raise ValueError(f"dop must be 'auto' or an integer between {low} and {high}.")
    return int(text)


def charged_to_run(kind: str):
    """The usage ledger's total of ``kind`` charged to the outer run (0 when none)."""
    charges = (UsageCharge.objects.filter(run_id=models.OuterRef("pk"), kind=kind).order_by()
               .values("run_id").annotate(total=models.Sum("amount")).values("total"))
    return Coalesce(models.Subquery(charges, output_field=models.FloatField()), models.Value(0.0))


def _measurements_of_run():
    rows = (Measurement.objects.filter(run_id=models.OuterRef("pk")).order_by()
            .values("run_id").annotate(n=models.Count("id")).values("n"))
    return Coalesce(models.Subquery(rows, output_field=models.IntegerField()), models.Value(0))


class TuningRunQuerySet(models.QuerySet):
    def update(self, **kwargs):
        """Every queryset write to a run bumps its `version` (see TuningRun.version)."""
        kwargs.setdefault("version", models.F("version") + 1)
        kwargs.setdefault("changed_at", Now())
        return super().update(**kwargs)

    def touch(self) -> int:
        """Bump the runs' version after a write to their tasks or rounds only (the run row is unchanged)."""
        return self.update()

    def of_team_since(self, team_id: int, since) -> TuningRunQuerySet:
        return self.filter(team_id=team_id, created_at__gte=since)

    def energy_joules(self) -> float:
        return self.aggregate(j=models.Sum("energy_joules"))["j"] or 0.0

    # The usage ledger (core.models.UsageCharge) is what a team spent; the sink charges a run's trials
    # and energy as it records them. What a run row holds beyond its charges (energy or trials written
    # some other way, or a heartbeat's energy not charged yet) still counts: usage is the ledger plus
    # these gaps, so it never drops below either.
    def unbilled(self) -> tuple[int, float]:
        """(trials, joules) these runs recorded beyond their charges."""
        live_trials = models.ExpressionWrapper(_measurements_of_run() + models.F("serial_remeasures"),
                                               output_field=models.FloatField())
        gaps = self.annotate(
            trials_gap=Greatest(live_trials - charged_to_run(UsageCharge.Kind.TRIALS), models.Value(0.0)),
            energy_gap=Greatest(models.F("energy_joules") - charged_to_run(UsageCharge.Kind.ENERGY_JOULES),
                                models.Value(0.0)))
        totals = gaps.aggregate(n=models.Sum("trials_gap"), j=models.Sum("energy_gap"))
        return round(totals["n"] or 0), totals["j"] or 0.0


def team_usage_since(team_id: int, since, *, exclude_run: int | None = None) -> tuple[int, float]:
    """The team's (trials, joules) since ``since``: its ledger charges (deleted and archived runs included),
    plus what its runs recorded beyond them. ``exclude_run`` leaves one run out of both."""
    charged = UsageCharge.objects.filter(team_id=team_id, created_at__gte=since)
    runs = TuningRun.objects.of_team_since(team_id, since)
    if exclude_run is not None:
        charged, runs = charged.exclude(run_id=exclude_run), runs.exclude(pk=exclude_run)
    sums = charged.aggregate(n=models.Sum("amount", filter=models.Q(kind=UsageCharge.Kind.TRIALS)),
                             j=models.Sum("amount", filter=models.Q(kind=UsageCharge.Kind.ENERGY_JOULES)))
    gap_trials, gap_joules = runs.unbilled()
    return round(sums["n"] or 0) + gap_trials, (sums["j"] or 0.0) + gap_joules


class TuningRun(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        PAUSED = "paused", "Paused"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    objects = TuningRunQuerySet.as_manager()

    ACTIVE = (Status.QUEUED, Status.RUNNING)
    TERMINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)

    class Mode(models.TextChoices):
        STOCK = "stock", "Stock MetaSchedule (LocalBuilder + LocalRunner)"
        DOPPLER = "doppler", "DOPpler (persistent builder, pooled async runner, auto DOP)"

    class Action(models.TextChoices):
        NONE = "", "None"
        CANCEL = "cancel", "Cancel"
        PAUSE = "pause", "Pause"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="tuning_runs")
    model = models.ForeignKey(DLModel, on_delete=models.CASCADE, related_name="tuning_runs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    target = models.JSONField(help_text='TVM target dict, e.g. {"kind": "llvm", "num-cores": 2}')
    target_kind = models.CharField(max_length=20, db_index=True, editable=False)
    # What the executing worker resolved `target` to (its CPU as LLVM names it, triple, thread count):
    # the target every build, measurement and record of the run uses (tuning.engine.compile.targets).
    resolved_target = models.JSONField(null=True, blank=True, editable=False,
                                       help_text="The target as resolved on the executing host (mcpu, mtriple, "
                                                 "num-cores); empty until a worker starts the run.")
    target_key = models.CharField(max_length=500, blank=True, editable=False,
                                  help_text="Canonical key of the resolved target (part of result keys).")
    pipeline_key = models.CharField(max_length=200, blank=True, editable=False,
                                    help_text="Name, version and graph passes of the Relax pipeline the run's tasks "
                                              "were extracted and its modules compiled with (part of result keys).")
    evaluator = models.JSONField(default=dict, blank=True, editable=False,
                                 help_text="How the run's candidates are timed, chosen with the target on the executing "
                                           "host (cold on CPUs: caches flushed, one call a sample), and why; empty: "
                                           "TVM's default.")
    max_trials = models.PositiveIntegerField(validators=run_bound_validators("max_trials"))
    max_minutes = models.PositiveIntegerField(
        null=True, blank=True, validators=run_bound_validators("max_minutes"),
        help_text="Tuning wall-time budget in minutes, over all attempts: once spent, tuning finishes between "
                  "rounds and the best schedules found are compiled. Empty: the trial budget alone.")
    trials_per_round = models.PositiveIntegerField(default=32, validators=run_bound_validators("trials_per_round"))
    measurement_mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.DOPPLER)
    dop_fixed = models.PositiveIntegerField(null=True, blank=True, validators=run_bound_validators("dop"),
                                            help_text="Fixed degree of parallelism; empty = automatic (DOPpler).")
    threads = models.PositiveIntegerField(null=True, blank=True, validators=run_bound_validators("threads"),
                                          help_text="Threads per measurement; empty = the target's cores.")
    options = models.JSONField(default=dict, blank=True, help_text="Engine options (search population, seed...).")

    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED, db_index=True)
    requested_action = models.CharField(max_length=10, choices=Action.choices, default=Action.NONE, blank=True)
    # Set while a queued run waits for one of its team's concurrent-run slots (not yet sent to a worker);
    # the team's waiting runs are sent in this order as slots free (tuning.services.run_queue).
    waiting_since = models.DateTimeField(null=True, blank=True, editable=False)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Liveness of the executing worker; a stale heartbeat on a running run means
    # its worker died and the run is re-enqueued (see services.recover_stale_runs).
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    lease = models.CharField(max_length=64, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # Times the run's executor died under it (stale heartbeat); at TUNING_MAX_EXECUTOR_LOSSES it fails.
    executor_losses = models.PositiveIntegerField(default=0)
    worker_lost_at = models.DateTimeField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)

    # Progress and results (filled as the run goes).
    trials_done = models.PositiveIntegerField(default=0)
    # What the engine has in flight right now (streamed as it changes; 0 when no attempt runs).
    builds_in_flight = models.PositiveIntegerField(default=0, help_text="Candidates being built now.")
    measurements_in_flight = models.PositiveIntegerField(
        default=0, help_text="Candidates built and waiting for (or in) measurement now.")
    serial_remeasures = models.PositiveIntegerField(
        default=0, help_text="Final serial re-measures (a build and a measurement each, beyond the trials); "
                             "charged to the team's trial quota like trials.")
    wall_seconds = models.FloatField(default=0.0, help_text="Tuning wall time summed over attempts.")
    estimated_latency_s = models.FloatField(null=True, blank=True,
                                            help_text="Sum over tasks of weight x best latency.")
    final_dop = models.PositiveIntegerField(null=True, blank=True)
    mean_parallel_error = models.FloatField(
        null=True, blank=True,
        help_text="DOPpler's parallel-vs-serial timing error as a fraction (0.05 = 5 %): the median over parallel "
                  "rounds of each round's mean |parallel - serial| / parallel, each round's value capped at 1.0.")
    tuned_latency_s = models.FloatField(null=True, blank=True,
                                        help_text="Compiled tuned model's latency: median over the final repeats.")
    tuned_latency_iqr_s = models.FloatField(null=True, blank=True,
                                            help_text="Inter-quartile range of those repeats (s).")
    untuned_latency_s = models.FloatField(null=True, blank=True)
    outputs_match = models.BooleanField(null=True, blank=True)
    max_abs_diff = models.FloatField(null=True, blank=True)
    # onnxruntime on the same model, inputs, thread count and device kind, measured at the end of the run
    ort_latency_s = models.FloatField(null=True, blank=True,
                                      help_text="onnxruntime latency (median of repeats) on the same inputs.")
    ratio_to_ort = models.FloatField(null=True, blank=True,
                                     help_text="Tuned TVM latency / onnxruntime latency (< 1: TVM is faster).")
    faster_engine = models.CharField(max_length=20, blank=True,
                                     help_text='"tvm" or "onnxruntime": the one to deploy on this target.')
    ort_latency_iqr_s = models.FloatField(null=True, blank=True,
                                          help_text="Inter-quartile range of onnxruntime's repeats (s).")
    ort_outputs_agree = models.BooleanField(null=True, blank=True)
    # tuning.engine.verdict's answer over the compiled timings (empty: a run finished before it existed)
    verdict = models.CharField(max_length=20, blank=True,
                               choices=[(label, label) for label in verdict_rule.LABELS],
                               help_text="faster / slower / within noise / overloaded / no comparison.")
    verdict_flag = models.CharField(max_length=300, blank=True,
                                    help_text="Why the final timing gives no clean verdict (an overloaded host).")
    timing_load = models.FloatField(null=True, blank=True,
                                    help_text="Highest 1-minute load average sampled around the final timing.")
    # Time to parity: the first stored measurement at which the best-so-far end-to-end estimate (sum over tasks
    # of weight x best latency) reached ort_latency_s; computed from the stored curve when the run finishes
    parity_trials = models.PositiveIntegerField(
        null=True, blank=True, help_text="Trials measured when the end-to-end estimate first reached onnxruntime's "
                                         "latency; empty if it never did.")
    parity_wall_s = models.FloatField(
        null=True, blank=True, help_text="Seconds from the run's start to that measurement (a resumed run's pauses "
                                         "included); empty if the estimate never reached onnxruntime's latency.")
    summary = models.JSONField(default=dict, blank=True)
    stop_reason = models.CharField(max_length=300, blank=True,
                                   help_text="Why the run ended before its budget (Trimmer model stop, quota...).")

    # Trimmer (cost cutting). Options: see tuning.engine.trimmer.rules.TrimmerConfig.
    trimmer_enabled = models.BooleanField(default=False)
    trimmer_options = models.JSONField(default=dict, blank=True)
    candidates_generated = models.PositiveIntegerField(default=0)
    candidates_filtered = models.PositiveIntegerField(default=0)
    # kept by the filter but not measured (measured earlier in the run, or past the trial budget):
    # generated = filtered + not sent + measured
    candidates_not_sent = models.PositiveIntegerField(default=0)

    # Energy: `energy_source` says how it was obtained ("rapl", "nvml", "modeled", or a
    # combination such as "rapl+nvml"); figures are never shown without it.
    energy_joules = models.FloatField(default=0.0)
    energy_source = models.CharField(max_length=40, blank=True)
    energy_build_joules = models.FloatField(default=0.0)
    energy_measure_joules = models.FloatField(default=0.0)
    energy_saved_joules = models.FloatField(null=True, blank=True)
    trials_saved = models.PositiveIntegerField(null=True, blank=True)
    savings_basis = models.CharField(max_length=300, blank=True)
    grid_intensity_g_per_kwh = models.FloatField(null=True, blank=True)
    # The watts model in force when the run started (admin energy settings), used if energy is modeled.
    energy_model = models.JSONField(default=dict, blank=True)
    records_file = models.FileField(upload_to="runs/records/", blank=True, max_length=255)
    module_file = models.FileField(upload_to="runs/modules/", blank=True, max_length=255)
    # Bumped by every write to the run (save, queryset update, the sink's task/round writes): the live and
    # chart JSON endpoints answer an unchanged poll with 304 from it, and cache figures per version.
    version = models.PositiveBigIntegerField(default=1, editable=False)
    changed_at = models.DateTimeField(default=timezone.now, editable=False)
    # Archived: hidden from lists, restorable; its measurements and usage charges are kept.
    archived_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["team", "status"]), models.Index(fields=["team", "-created_at"])]
        constraints = [
            models.CheckConstraint(condition=models.Q(max_trials__gte=1), name="run_max_trials_positive"),
        ]

    def __str__(self) -> str:
        return f"Run {self.pk} of {self.model.name} ({self.status})"

    def save(self, *args, **kwargs):
        adding = self._state.adding
        self.version = 1 if adding else models.F("version") + 1  # atomic: two writers never share a version
        self.changed_at = timezone.now()
        if kwargs.get("update_fields") is not None:
            kwargs["update_fields"] = {*kwargs["update_fields"], "version", "changed_at"}
        super().save(*args, **kwargs)
        if not adding:
            del self.version  # read back (deferred) on next access instead of keeping the expression

    @property
    def energy_saved_kind(self) -> str | None:
        """Trimmer's savings are estimated (trials not spent x this run's energy per trial), never measured."""
        return "estimated" if self.energy_saved_joules is not None else None

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    @property
    def progress(self) -> float:
        return min(1.0, self.trials_done / self.max_trials) if self.max_trials else 0.0

    @property
    def dop_mode(self) -> str:
        return str(self.dop_fixed) if self.dop_fixed else "auto"

    @property
    def energy_kwh(self) -> float:
        return joules_to_kwh(self.energy_joules)

    @property
    def carbon_g(self) -> float | None:
        if self.grid_intensity_g_per_kwh is None:
            return None
        return self.energy_kwh * self.grid_intensity_g_per_kwh

    @property
    def engine_target(self) -> dict:
        """The target the engine builds and measures for: the resolved one once a worker resolved it."""
        return self.resolved_target or self.target

    @property
    def result_verdict(self) -> verdict_rule.Verdict | None:
        """The verdict over the compiled timings (None before them). A run stored before verdicts had
        spreads reads its faster engine as the label."""
        label = self.verdict or {"tvm": verdict_rule.FASTER, "onnxruntime": verdict_rule.SLOWER}.get(
            self.faster_engine, verdict_rule.NO_COMPARISON if self.tuned_latency_s is not None else "")
        if not label:
            return None
        return verdict_rule.Verdict(label, self.ratio_to_ort, self.tuned_latency_s, self.tuned_latency_iqr_s,
                                    self.ort_latency_s, self.ort_latency_iqr_s, self.verdict_flag)

    @property
    def slower_than_ort(self) -> bool:
        v = self.result_verdict
        return v is not None and v.label == verdict_rule.SLOWER

    @property
    def deploy_verdict(self) -> str:
        """Which engine to deploy on this target, in words ("" before the onnxruntime comparison)."""
        v = self.result_verdict
        return v.sentence if v is not None else ""

    @property
    def estimate_gap(self) -> dict | None:
        """The per-task estimate's distance from the compiled latency, with why, when above 15 %."""
        return verdict_rule.estimate_gap(self.estimated_latency_s, self.tuned_latency_s)

    @property
    def compiled_checkpoint(self) -> dict | None:
        """The model compiled and timed once every task had a record (the engine's checkpoint), or None."""
        return compiled_checkpoint.as_reported((self.summary or {}).get("compiled_checkpoint"))

    @property
    def checkpoint_note(self) -> str:
        """The compiled checkpoint in words ("" when none was taken), as the page and the CLI show it."""
        return verdict_rule.checkpoint_note(self.compiled_checkpoint)

    @property
    def result_identity(self) -> str:
        """What identifies this run's tuning results: its resolved target and its pipeline."""
        return identity_of(self.target_key, self.pipeline_key)

    @property
    def pipeline_words(self) -> str:
        """The graph passes this run was tuned and compiled with, in words ("" until a worker resolved it)."""
        return describe_pipeline(self.pipeline_key) if self.pipeline_key else ""

    @property
    def time_budget_left_s(self) -> float | None:
        """Seconds of the run's time budget its earlier attempts left (None: no time budget)."""
        return None if self.max_minutes is None else self.max_minutes * 60.0 - self.wall_seconds

    @property
    def timing_words(self) -> str:
        """How the run's candidates are timed, and why, in words ("" until a worker resolved the run)."""
        if (self.options or {}).get("evaluator"):
            return "as the run's options set it"
        if self.evaluator:
            return f"{self.evaluator.get('regime', '')}: {self.evaluator.get('why', '')}"
        return "warm: timed back to back (TVM's default)" if self.resolved_target else ""

    @property
    def queue_position(self) -> int | None:
        """1 for the next of its team's runs waiting for a concurrent-run slot; None when not waiting."""
        if self.status != self.Status.QUEUED or self.waiting_since is None:
            return None
        ahead = TuningRun.objects.filter(
            team_id=self.team_id, status=self.Status.QUEUED, waiting_since__isnull=False).filter(
            models.Q(waiting_since__lt=self.waiting_since) | models.Q(waiting_since=self.waiting_since, pk__lt=self.pk))
        return ahead.count() + 1

    @property
    def speedup(self) -> float | None:
        if self.tuned_latency_s and self.untuned_latency_s:
            return self.untuned_latency_s / self.tuned_latency_s
        return None


class TuningTask(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        TUNING = "tuning", "Tuning"
        DONE = "done", "Done"
        PREEMPTED = "preempted", "Pre-empted (plateau)"
        UNTUNED = "untuned", "Not tuned (no valid measurement)"

    run = models.ForeignKey(TuningRun, on_delete=models.CASCADE, related_name="tasks")
    index = models.PositiveIntegerField()
    name = models.CharField(max_length=300)
    flops = models.FloatField(default=0.0)
    weight = models.FloatField(default=1.0)
    trials = models.PositiveIntegerField(default=0)
    best_latency_s = models.FloatField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    preempted_at_trial = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "index"], name="unique_task_index_per_run")]

    def __str__(self) -> str:
        return f"{self.name} (run {self.run_id})"

    @property
    def gflops_per_s(self) -> float | None:
        if self.best_latency_s and self.flops:
            return self.flops / self.best_latency_s / 1e9
        return None


class Measurement(models.Model):
    """One measured candidate. (run, task, candidate_key) is unique: a resumed run never stores one twice."""

    run = models.ForeignKey(TuningRun, on_delete=models.CASCADE, related_name="measurements")
    task = models.ForeignKey(TuningTask, on_delete=models.CASCADE, related_name="measurements")
    round_index = models.PositiveIntegerField()
    candidate_key = models.CharField(max_length=64)
    run_secs = models.JSONField(default=list, help_text="Latency samples in seconds.")
    latency_s = models.FloatField(null=True, blank=True, help_text="Median of the samples (corrected if DOP>1).")
    build_secs = models.FloatField(null=True, blank=True)
    run_wall_secs = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True)
    dop = models.PositiveIntegerField(default=1)
    remeasured_serially = models.BooleanField(default=False)
    serial_secs = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "task", "candidate_key"], name="unique_candidate_per_task"),
        ]
        indexes = [models.Index(fields=["run", "task", "round_index"])]


class DopRound(models.Model):
    """The DOP in force and the parallel-vs-serial error measured in one round."""

    run = models.ForeignKey(TuningRun, on_delete=models.CASCADE, related_name="dop_rounds")
    round_index = models.PositiveIntegerField()
    task_index = models.IntegerField(default=-1)
    dop = models.PositiveIntegerField()
    mean_error = models.FloatField(
        null=True, blank=True,
        help_text="This round's mean |parallel - serial| / parallel over its re-measured sample, as a fraction "
                  "(0.05 = 5 %); uncapped, so a truncated parallel timing can make it exceed 1.")
    n_candidates = models.PositiveIntegerField(default=0)
    n_remeasured = models.PositiveIntegerField(default=0)
    n_failures = models.PositiveIntegerField(default=0)
    # where the round's measuring time went: wall_secs = measuring at its DOP + serial re-measures
    wall_secs = models.FloatField(null=True, blank=True, help_text="The round's measuring wall time (s).")
    parallel_wall_secs = models.FloatField(
        null=True, blank=True, help_text="Of wall_secs: the measure calls at the round's DOP (s).")
    serial_wall_secs = models.FloatField(
        null=True, blank=True, help_text="Of wall_secs: DOPpler's serial re-measures (sample, failures, "
                                         "serial-noise repeats) (s).")
    # Trimmer's candidate filter: generated by the search, dropped as predicted-poor, kept but not sent
    # (measured earlier in the run, or past its trial budget); n_candidates were measured.
    n_generated = models.PositiveIntegerField(null=True, blank=True)
    n_filtered = models.PositiveIntegerField(null=True, blank=True)
    n_not_sent = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "round_index"]
        constraints = [models.UniqueConstraint(fields=["run", "round_index"], name="unique_dop_round")]
