"""How to tune and what a run returns: the engine's light data classes (no TVM import).

The web, the adapters and the benches import :class:`TuningConfig` from here without loading the
engine; :mod:`tuning.engine.session` runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuning.engine.measuring.timer import EvaluatorConfig
from tuning.engine.trimmer.rules import TrimmerConfig

if TYPE_CHECKING:
    from tuning.engine.doppler.rule import DopRule

__all__ = ["TuningConfig", "TaskResult", "TuningSummary", "LOCAL_RUNNERS"]

LOCAL_RUNNERS = ("pooled", "local")  # runners that time candidates on this host


@dataclasses.dataclass
class TuningConfig:
    """How to tune. ``mode``: "stock" = TVM's LocalBuilder + LocalRunner (the
    baseline the platform offers), "doppler" = persistent builder + pooled
    asynchronous runner with DOPpler's DOP control (or the distributed runner
    when ``distributed_submit`` is given)."""

    target: dict | str
    max_trials: int
    trials_per_round: int = 32  # MetaSchedule's num_trials_per_iter
    mode: str = "doppler"
    dop: str | int = "auto"
    # DOP "auto"'s rule: a DopRule class or factory called with the measuring slots (None: the platform's,
    # doppler/platform_rule.py); benches pass DOPpler's published rule or an ablation (bench/dop_presets.py)
    dop_rule: Callable[[int], DopRule] | None = None
    threads: int | None = None  # deployment/measurement thread count (default: all cores)
    work_dir: str = "tuning_work"
    seed: int | None = None
    evaluator: EvaluatorConfig = dataclasses.field(default_factory=EvaluatorConfig)
    search_population: int | None = None  # EvolutionarySearch population (TVM default 512)
    genetic_num_iters: int | None = None  # TVM default 4
    distributed_submit: Callable[[dict], Any] | None = None
    device_queue: str | list[str] | None = None
    # finer switches (ablation / platform knobs)
    builder: str | None = None  # "persistent" | "local" (default from mode)
    runner: str | None = None  # "pooled" | "local" | "distributed" (default from mode)
    builder_workers: int | None = None
    # the evolutionary search's threads: TVM hands sampling work to threads in arrival order, so only a
    # one-thread search proposes the same candidates from the same seed (bench/tuning_time.py pairs sides so)
    search_threads: int | str = "physical"
    cpu_ids: list[int] | None = None  # cores to measure on
    # None: pooled runner -> builds (and, on CPUs, searches) wait for it (shared cores); distributed -> overlap
    overlap_measurement: bool | None = None
    final_remeasure: bool | None = None  # default: True in doppler mode
    final_share: float = 0.1
    timeout_sec: float = 30.0
    max_trials_per_task: int | None = None
    light_intrinsics: bool | None = None  # default: True in doppler mode (see tvm_compat)
    deferred_cost_model: bool | None = None  # default: True in doppler mode (search.train_when_needed)
    # Trimmer (per-task pre-emption, whole-model stop, ML candidate filter): a
    # TrimmerConfig or its dict; None or enabled=False = off
    trimmer: Any = None
    # the caller's wall-time budget for this call, in seconds from its start: the caller's sink still ends the
    # search ("finish"); the engine uses it to size first rounds so that it reaches every task (first_round)
    time_budget_s: float | None = None
    # trials the caller already stored for this run (a resumed run): the budget left is counted from the
    # larger of this and the records in TVM's database, so a store ahead of the database is not re-spent
    trials_spent: int = 0
    # compile and time the model once every task has a record (checkpoint): None: in doppler mode on CPUs
    # measured here, when the search has enough ahead of it (checkpoint.worth_taking); True: always there
    compiled_checkpoint: bool | None = None
    # how long a run waits for another engine to leave its work dir (a dying one lets go in a second or two)
    work_dir_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if self.mode not in ("stock", "doppler"):
            raise ValueError("mode must be 'stock' or 'doppler'")
        if self.dop != "auto" and (isinstance(self.dop, bool) or not isinstance(self.dop, int) or self.dop < 1):
            raise ValueError(f"dop must be 'auto' or a whole number of at least 1, not {self.dop!r}")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s must be a positive number of seconds or None, not {self.time_budget_s!r}")
        self.evaluator = EvaluatorConfig.from_any(self.evaluator)
        if isinstance(self.trimmer, dict):
            self.trimmer = TrimmerConfig.from_dict(self.trimmer)
        if self.builder is None:
            self.builder = "local" if self.mode == "stock" else "persistent"
        if self.runner is None:
            if self.mode == "stock":
                self.runner = "local"
            else:
                self.runner = "distributed" if self.distributed_submit is not None else "pooled"
        if self.final_remeasure is None:
            self.final_remeasure = self.mode == "doppler"
        if self.light_intrinsics is None:
            self.light_intrinsics = self.mode == "doppler"
        if self.deferred_cost_model is None:
            self.deferred_cost_model = self.mode == "doppler"

    @property
    def builder_kind(self) -> str:
        """The builder's registry name: ``builder`` as given, else the mode's (set by ``__post_init__``)."""
        if self.builder is None:
            raise AssertionError("TuningConfig.__post_init__ sets builder")
        return self.builder

    @property
    def runner_kind(self) -> str:
        """The runner's registry name: ``runner`` as given, else the mode's (set by ``__post_init__``)."""
        if self.runner is None:
            raise AssertionError("TuningConfig.__post_init__ sets runner")
        return self.runner


@dataclasses.dataclass
class TaskResult:
    index: int
    name: str
    weight: float
    flops: float
    n_records: int
    best_latency_s: float | None
    final_latency_s: float | None = None
    n_final_remeasured: int = 0


@dataclasses.dataclass
class TuningSummary:
    status: str  # "succeeded" | "cancelled" | "paused"
    wall_secs: float
    tasks: list[TaskResult]
    n_measurements: int  # records reported by this call
    n_total_records: int  # records in the database for these tasks
    trials_requested: int  # budget this call tried to spend
    final_dop: int | None
    dop_history: list[dict]
    mean_parallel_error: float | None
    database_path: str
    database_paths: dict[str, str]
    final_remeasure: list[dict] = dataclasses.field(default_factory=list)
    mode: str = "doppler"
    n_duplicates: int = 0  # measured again by TVM but already stored: not re-reported
    phase_secs: dict[str, float] = dataclasses.field(default_factory=dict)
    # of phase_secs["measure_serial"]: {reason: {"n": timings, "secs": wall}} (rounds.SERIAL_REASONS)
    serial_by_reason: dict[str, dict] = dataclasses.field(default_factory=dict)
    sink_errors: list[str] = dataclasses.field(default_factory=list)
    # Trimmer's report (TrimmerRuntime.to_dict(): pre-empted tasks with their trial
    # count at pre-emption, model_stop_reason, generated/filtered/measured totals,
    # reallocations); None when Trimmer was off
    trimmer: dict | None = None
    stop_reason: str | None = None  # why a "succeeded" run ended before its budget (Trimmer)
    # tasks that had no record when the caller asked to finish and got one short batch past it (first_round)
    late_first_rounds: list[str] = dataclasses.field(default_factory=list)
    # the model compiled and timed once every task had a record (checkpoint.take); None: not taken
    compiled_checkpoint: dict | None = None

    @property
    def best_latency_s(self) -> float | None:
        """Weighted sum of the per-task best latencies (final when re-measured)."""
        vals = []
        for t in self.tasks:
            v = t.final_latency_s if t.final_latency_s is not None else t.best_latency_s
            if v is None:
                return None
            vals.append(v * t.weight)
        return sum(vals) if vals else None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["best_latency_s"] = self.best_latency_s
        return d
