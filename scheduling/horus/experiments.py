"""Trace-driven experiments: ONE path from (trace, policies, seed, parameters) to a JSON-serialisable
result, used by ``bench/scheduling.py``, the ``simulate`` command and the Django layer (through
``scheduling.adapters``). No Django here.

:func:`run_experiment` loads the trace (or takes pre-parsed jobs), shapes the job slice and the
cluster (:func:`prepare_experiment`, the scale always stated in plain words), gives each job a zoo
model and batch size whose TRUE utilization and memory come from the profile table of
``params.gpu_model`` and whose PREDICTED ones come from the predictor's out-of-fold output (a
model it was not trained on) or the truth (``predictions="oracle"``), then runs
:func:`~.simulator.simulate` (replay) or :func:`~.simulator.simulate_fill` (the ATC'23 fill
method) per policy on the same jobs and cluster.

A trace is a :class:`TraceInput` (:func:`load_trace`: a shipped name, or a file with an optional
Alibaba node list); ``run_experiment(trace=TraceInput | name, policies, seed, params, profiles,
predictor)`` is the call every caller makes. Django callers go through
``scheduling.services.simulations.simulate`` (stored profiles and the active predictor); the bench
calls it with :func:`default_inputs` (the shipped profiles and the reference predictor), which is what
that service uses on a database with no profiles of its own.

Shapes: Philly-style traces run on a uniform cluster of ``gpus`` GPUs; Alibaba pods on a
stratified ``scale`` fraction of the trace's own 1,213 GPU nodes (or of the node list given with
the pods). A replay takes the slice
``[start, start + jobs)`` of the jobs in submit order (from trace day ``from_day`` on), durations
capped at ``max_duration_s``, arrivals compressed by ``compress`` or to a ``target_load``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import IO, Any

import numpy as np

from common.jsonsafe import json_safe

from . import cluster as hcluster
from . import policies as hpolicies
from . import simulator as hsim
from . import traces as htraces
from .predictor import TrainedPredictor, UtilizationPredictor, rmsle
from .profiles import ProfileRecord, ProfileTable, gpu_spec, load_profiles
from .sim_inputs import SimulationStopped, StopCheck, noisy_predictions

__all__ = [
    "ExperimentParams",
    "ExperimentError",
    "Prepared",
    "SHIPPED_TRACES",
    "METHODS",
    "POLICY_NAMES",
    "REFERENCE_GPU",
    "TraceInput",
    "load_trace",
    "default_inputs",
    "parameter_choices",
    "reference_predictor",
    "util_distribution",
    "load_jobs",
    "build_cluster",
    "simulation_size",
    "prepare_experiment",
    "run_experiment",
    "summary_table",
    "format_table",
    "SimulationStopped",
]

SHIPPED_TRACES = ("philly", *htraces.ALIBABA_POD_LISTS)  # philly, alibaba, alibaba_gpushare40, ...
METHODS = ("replay", "fill")
POLICY_NAMES: tuple[str, ...] = tuple(hpolicies.POLICIES)
REFERENCE_GPU = "V100"
KIND_WORDS = {
    "philly": "a Philly job trace",
    "alibaba_pods": "an Alibaba pod list",
    "alibaba_nodes": "an Alibaba node list (a cluster)",
}


class ExperimentError(ValueError):
    """Parameters that cannot make an experiment (the message names the parameter)."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass
class ExperimentParams:
    """What shapes an experiment. Everything is recorded with the results."""

    method: str = ""  # "replay" or "fill"; "" = replay for Philly, fill for Alibaba pods
    jobs: int = 1000  # replay: size of the job slice
    start: int = 0  # replay: index of the slice's first job (jobs in submit order)
    gpus: int = 64  # Philly-style traces: a uniform cluster of this many GPUs
    gpus_per_node: int = 8
    gpu_model: str = "V100"  # of the uniform cluster, and the profile table that gives TRUE util/memory
    scale: float = 0.05  # Alibaba: stratified fraction of the trace's own 1,213 GPU nodes
    compress: float = 1.0  # divide inter-arrival times (a higher arrival rate on the same jobs)
    max_duration_s: float = 0.0  # cap durations (0 = no cap)
    backfill: int = 1  # 1 = strict FIFO queue
    predictor_error: float = 0.0  # extra log-normal sigma on predictions, on top of the predictor's own
    predictions: str = "predictor"  # "predictor" (out-of-fold) or "oracle" (prediction = truth)
    until: float = 1.0  # fill: stop when the submitted request reaches this share of capacity
    from_day: float = 0.0  # replay: only jobs submitted from this day of the trace on
    target_load: float = 0.0  # replay: compress arrivals to this whole-GPU demand / GPUs (0 = use compress)
    min_batch: int = 1  # only profile configurations with at least this batch size
    interference: str = "fitted"  # a name in simulator.INTERFERENCE_MODELS (share_penalty/capped: sensitivities)
    timeseries_points: int = 200  # replay: points of the downsampled time series
    horus_lookahead: int = 5  # waiting jobs horus/horus_migrate consider per pass (authors: 5; 1 = strict FIFO)
    telemetry_delay_s: float = (
        60.0  # replay: how long after a job starts (or its speed changes) policies see it in telemetry
    )
    usage_fgd_gang_moves: bool = (
        True  # usage_fgd moves a gang off another gang's GPU to idle GPUs (False: the ablation)
    )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ExperimentParams:
        data = dict(data or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ExperimentError(
                f"unknown parameter(s): {', '.join(unknown)}; known: {', '.join(known)}", field=unknown[0]
            )
        out = cls()
        for name, value in data.items():
            default = getattr(out, name)
            try:
                setattr(
                    out,
                    name,
                    default
                    if value is None
                    else _as_bool(value)
                    if isinstance(default, bool)
                    else _as_int(value)
                    if isinstance(default, int)
                    else type(default)(value),
                )
            except (TypeError, ValueError):
                kind = (
                    "whole number"
                    if isinstance(default, int) and not isinstance(default, bool)
                    else type(default).__name__
                )
                raise ExperimentError(f"{name} must be a {kind}, got {value!r}", field=name) from None
        return out

    def validate(self, kind: str) -> ExperimentParams:
        if self.method == "":
            self.method = "fill" if kind == "alibaba_pods" else "replay"
        for ok, name, message in self._checks(kind):
            if not ok:
                raise ExperimentError(message, field=name)
        return self

    def _checks(self, kind: str) -> list[tuple[bool, str, str]]:
        return [
            (self.method in METHODS, "method", f"method must be one of {', '.join(METHODS)}"),
            (
                self.method != "fill" or kind == "alibaba_pods",
                "method",
                "the fill method needs an Alibaba pod list (fractional GPU requests)",
            ),
            (1 <= self.jobs <= 100_000, "jobs", "jobs must be between 1 and 100000"),
            (self.start >= 0, "start", "start must be >= 0"),
            (1 <= self.gpus <= 20_000, "gpus", "gpus must be between 1 and 20000"),
            (1 <= self.gpus_per_node <= 64, "gpus_per_node", "gpus_per_node must be between 1 and 64"),
            (0 < self.scale <= 1, "scale", "scale must be in (0, 1]"),
            (self.compress > 0, "compress", "compress must be > 0"),
            (self.max_duration_s >= 0, "max_duration_s", "max_duration_s must be >= 0"),
            (1 <= self.backfill <= 10_000, "backfill", "backfill must be between 1 and 10000"),
            (0 <= self.predictor_error <= 3, "predictor_error", "predictor_error must be between 0 and 3"),
            (self.predictions in ("predictor", "oracle"), "predictions", "predictions must be 'predictor' or 'oracle'"),
            (0 < self.until <= 2, "until", "until must be in (0, 2]"),
            (self.from_day >= 0, "from_day", "from_day must be >= 0"),
            (0 <= self.target_load <= 100, "target_load", "target_load must be between 0 and 100"),
            (1 <= self.min_batch <= 4096, "min_batch", "min_batch must be between 1 and 4096"),
            (
                self.interference in hsim.INTERFERENCE_MODELS,
                "interference",
                f"interference must be one of {', '.join(hsim.INTERFERENCE_MODELS)}",
            ),
            (2 <= self.timeseries_points <= 2000, "timeseries_points", "timeseries_points must be between 2 and 2000"),
            (
                0 <= self.telemetry_delay_s <= 86_400,
                "telemetry_delay_s",
                "telemetry_delay_s must be between 0 and 86400",
            ),
            (1 <= self.horus_lookahead <= 1000, "horus_lookahead", "horus_lookahead must be between 1 and 1000"),
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _as_int(value: Any) -> int:
    """A whole number from JSON or a form: 3, 3.0, "3" or "3.0"; 2.9 is refused (``int`` would make it 2)."""
    if isinstance(value, bool):
        raise ValueError(value)
    if isinstance(value, int):
        return value
    number = float(str(value).strip()) if isinstance(value, str) else float(value)
    if not number.is_integer():
        raise ValueError(value)
    return int(number)


def _as_bool(value: Any) -> bool:
    """A flag from JSON or a form: true/false, 1/0 or their strings; anything else is refused (``bool("false")``
    would be True)."""
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1", "on", "yes"):
        return True
    if text in ("false", "0", "off", "no"):
        return False
    raise ValueError(value)


def parameter_choices() -> dict[str, dict[str, Any]]:
    """Every experiment parameter with its default and, where the set is closed, its allowed values: what a
    form offers (bounds are enforced, with a message naming the parameter, by ``ExperimentParams.validate``)."""
    closed = {
        "method": list(METHODS),
        "predictions": ["predictor", "oracle"],
        "interference": list(hsim.INTERFERENCE_MODELS),
    }  # gpu_model: any with profile records
    out = {}
    for f in fields(ExperimentParams):
        default = getattr(ExperimentParams(), f.name)
        out[f.name] = {
            "default": default,
            "type": type(default).__name__,
            **({"choices": closed[f.name]} if f.name in closed else {}),
        }
    return out


# ------------------------------------------------------------------------------------------ inputs
_PREDICTORS: dict[tuple[int, int], TrainedPredictor] = {}


def reference_predictor(*, seed: int = 0, k_folds: int = 5) -> TrainedPredictor:
    """The predictor trained on the shipped seed profiles (cached per process), with its k-fold error."""
    key = (seed, k_folds)
    if key not in _PREDICTORS:
        _PREDICTORS[key] = UtilizationPredictor().train(load_profiles(), k_folds=k_folds, seed=seed)
    return _PREDICTORS[key]


def default_inputs(*, seed: int = 0) -> dict[str, Any]:
    """``profiles`` and ``predictor`` for :func:`run_experiment` without a database: the shipped
    (synthetic) seed profiles and the predictor trained on them."""
    return {"profiles": load_profiles(), "predictor": reference_predictor(seed=seed)}


@dataclass
class TraceInput:
    """A trace ready to simulate: its name, kind (``philly`` or ``alibaba_pods``), jobs, and for pods
    optionally the node list of their cluster (None: the shipped Alibaba-2023 nodes)."""

    name: str
    kind: str
    jobs: list[htraces.Job]
    nodes: list[hcluster.NodeSpec] | None = None


def load_trace(
    name: str, source: str | IO[Any] | None = None, *, nodes_source: str | IO[Any] | None = None
) -> TraceInput:
    """A shipped trace by name (``source`` None) or a trace file (path or file object) of any supported
    kind, with ``nodes_source`` an Alibaba node list for a pod list. Malformed input raises
    :class:`~.traces.TraceFormatError` (file, line, column) or :class:`ExperimentError`."""
    kind, jobs = load_jobs(name, source)
    nodes = None
    if nodes_source is not None:
        if kind != "alibaba_pods":
            raise ExperimentError("a node list goes with an Alibaba pod list, not with a Philly trace", field="nodes")
        data = htraces.parse_trace(nodes_source)
        if data.kind != "alibaba_nodes":
            raise ExperimentError(
                f"the node list is {KIND_WORDS.get(data.kind, data.kind)}, not an Alibaba node list "
                "(sn,cpu_milli,memory_mib,gpu,model)",
                field="nodes",
            )
        nodes = data.nodes
    return TraceInput(name, kind, jobs, nodes)


def load_jobs(trace: str, source: str | IO[Any] | None = None) -> tuple[str, list[htraces.Job]]:
    """``(kind, jobs)`` of a shipped trace ('philly', 'alibaba') or of an uploaded file (``source``)."""
    if source is None:
        if trace in SHIPPED_TRACES:
            kind, jobs = _shipped(trace)
            return kind, list(jobs)
        raise ExperimentError(
            f"unknown trace {trace!r}; use {', '.join(SHIPPED_TRACES)} or an uploaded trace", field="trace"
        )
    data = htraces.parse_trace(source, name=trace)
    if data.kind not in ("philly", "alibaba_pods"):
        raise ExperimentError(
            f"trace {trace!r} is {KIND_WORDS.get(data.kind, data.kind)}, not a list of jobs", field="trace"
        )
    return data.kind, data.jobs


@functools.lru_cache(maxsize=len(SHIPPED_TRACES))
def _shipped(trace: str) -> tuple[str, tuple[htraces.Job, ...]]:
    """Parsed once per process (Philly: 82k rows, ~0.5 s); callers get copies, never mutate jobs."""
    if trace == "philly":
        return "philly", tuple(htraces.load_philly())
    if trace == "alibaba":
        return "alibaba_pods", tuple(htraces.load_alibaba_pods())
    # the artifact's other lists: times read where the file has them (multigpu20 has none)
    return "alibaba_pods", tuple(htraces.load_alibaba_pods(htraces.ALIBABA_POD_LISTS[trace], require_times=False))


@functools.lru_cache(maxsize=1)
def _alibaba_full() -> hcluster.ClusterSpec:
    return htraces.alibaba_cluster()


def build_cluster(
    kind: str, params: ExperimentParams, *, seed: int = 0, nodes: Sequence[hcluster.NodeSpec] | None = None
) -> hcluster.ClusterSpec:
    """Alibaba pods run on a stratified ``scale`` fraction of the trace's own nodes (or of ``nodes``);
    Philly-style jobs on a uniform cluster of ``gpus`` GPUs (``gpus_per_node`` per node)."""
    if kind == "alibaba_pods":
        if nodes is not None:
            own = htraces.alibaba_cluster(nodes, name="uploaded nodes")
            return own.scaled(params.scale, seed=seed, name=f"uploaded nodes x{params.scale:g}")
        return _alibaba_full().scaled(params.scale, seed=seed, name=f"alibaba-2023 x{params.scale:g}")
    per = params.gpus_per_node
    n_nodes, rest = divmod(params.gpus, per)
    mem = gpu_spec(params.gpu_model).mem_mb
    nodes = [hcluster.NodeSpec(f"node-{i:04d}", per, params.gpu_model, mem) for i in range(n_nodes)]
    if rest:
        nodes.append(hcluster.NodeSpec(f"node-{n_nodes:04d}", rest, params.gpu_model, mem))
    return hcluster.ClusterSpec(tuple(nodes), f"{params.gpus} x {params.gpu_model} ({per}/node)")


def simulation_size(
    kind: str,
    params: ExperimentParams,
    *,
    trace_jobs: int | None,
    seed: int = 0,
    nodes: Sequence[hcluster.NodeSpec] | None = None,
) -> tuple[int, int]:
    """``(jobs simulated, cluster GPUs)`` of a validated experiment, without running it: what the per-team
    size limit is checked against. ``trace_jobs`` is the trace's job count (None: unknown, the slice's size)."""
    gpus = build_cluster(kind, params, seed=seed, nodes=nodes).n_gpus
    if params.method == "fill":
        jobs = trace_jobs or 0
    else:
        jobs = params.jobs if trace_jobs is None else max(0, min(params.jobs, trace_jobs - params.start))
    return int(jobs), int(gpus)


def _slice(
    jobs: Sequence[htraces.Job], params: ExperimentParams, spec: hcluster.ClusterSpec
) -> tuple[list[htraces.Job], float]:
    """The replay's jobs and the compression factor applied to their arrivals."""
    ordered = sorted(jobs, key=lambda j: (j.submit_time, j.line))
    if params.from_day > 0:
        ordered = [j for j in ordered if j.submit_time >= params.from_day * 86400]
    sl = ordered[params.start : params.start + params.jobs]
    if not sl:
        raise ExperimentError(
            f"the slice start={params.start}, jobs={params.jobs} is empty (the trace has {len(ordered)} jobs)",
            field="start",
        )
    if params.max_duration_s > 0:
        sl = htraces.cap_durations(sl, params.max_duration_s)
    factor = params.compress
    if params.target_load > 0:
        span = max(j.submit_time for j in sl) - min(j.submit_time for j in sl)
        work = sum(j.num_gpus * j.duration_s for j in sl)
        factor = params.target_load * spec.n_gpus * span / work if span > 0 and work > 0 else 1.0
    return htraces.compress_time(sl, factor), factor


def util_distribution(jobs: Sequence[htraces.Job]) -> dict[str, float]:
    """Summary of the TRUE utilization the jobs run at (the stated assumption) and the predictions' error."""
    u = np.array([j.true_util_pct for j in jobs], float)
    p = np.array([j.pred_util_pct for j in jobs], float)
    return {
        "true_mean": float(u.mean()),
        "true_p25": float(np.percentile(u, 25)),
        "true_median": float(np.median(u)),
        "true_p75": float(np.percentile(u, 75)),
        "share_below_20": float((u < 20).mean()),
        "share_above_90": float((u > 90).mean()),
        "pred_mae": float(np.mean(np.abs(p - u))),
    }


@dataclass
class Prepared:
    """An experiment's jobs (workloads assigned) and cluster, and the plain-words statement of both."""

    kind: str
    jobs: list[htraces.Job]
    cluster: hcluster.ClusterSpec
    table: ProfileTable
    scale: str
    facts: dict[str, Any] = field(default_factory=dict)


def prepare_experiment(
    kind: str,
    jobs: Sequence[htraces.Job],
    params: ExperimentParams,
    *,
    seed: int,
    profiles: Sequence[ProfileRecord],
    predictor: Any = None,
    nodes: Sequence[hcluster.NodeSpec] | None = None,
) -> Prepared:
    """The validated experiment's jobs and cluster: the slice (replay) or the GPU pods (fill), each job
    given a model/batch size with TRUE util/memory from the profile table and its PREDICTED ones."""
    recs = [r for r in profiles if r.batch_size >= params.min_batch]
    gpu_models = sorted({r.gpu_model for r in recs})
    if params.gpu_model not in gpu_models:
        raise ExperimentError(
            f"no profile records for GPU model {params.gpu_model!r}"
            f"{f' with batch >= {params.min_batch}' if params.min_batch > 1 else ''}; "
            f"have {', '.join(gpu_models) or 'none'}",
            field="gpu_model",
        )
    table = ProfileTable(recs, params.gpu_model)
    predictions = None
    if params.predictions == "predictor":
        predictions = htraces.predictions_from(predictor, table, out_of_fold=True)
    spec = build_cluster(kind, params, seed=seed, nodes=nodes)
    factor = None
    if params.method == "fill":
        used = list(jobs)  # CPU-only pods too: they take node CPU and are part of FGD's workload
    else:
        timed = [j for j in jobs if j.num_gpus > 0]
        if kind == "alibaba_pods" and timed and all(j.submit_time == 0 and j.duration_s <= 1 for j in timed):
            raise ExperimentError("this pod list has no creation/deletion times: use the fill method", field="method")
        used, factor = _slice(timed, params, spec)
    used = htraces.assign_workloads(used, table, predictions=predictions, seed=seed)
    gpu_jobs = [j for j in used if j.num_gpus > 0]
    facts: dict[str, Any] = {"utilization": util_distribution(gpu_jobs) if gpu_jobs else None}
    if params.method == "replay" and used:
        span = max(j.submit_time for j in used) - min(j.submit_time for j in used)
        load = sum(j.num_gpus * j.duration_s for j in used) / span if span > 0 else None
        facts.update(compression=factor, offered_load=None if load is None else load / spec.n_gpus)
    return Prepared(kind, used, spec, table, _scale_statement(params, len(jobs), used, spec, factor), facts)


def _scale_statement(
    params: ExperimentParams,
    in_trace: int,
    used: Sequence[htraces.Job],
    spec: hcluster.ClusterSpec,
    factor: float | None,
) -> str:
    where = f"{spec.n_gpus} GPUs ({len(spec.nodes)} nodes: {spec.name})"
    if params.method == "fill":
        n_cpu = sum(1 for j in used if j.num_gpus == 0)
        return (
            f"pods sampled with replacement from the {len(used)} pods ({n_cpu} CPU-only), submitted until "
            f"the GPU request reaches {params.until * 100:.0f} % of {where}"
        )
    span = max(j.submit_time for j in used) - min(j.submit_time for j in used)
    parts = [
        f"{len(used)} of {in_trace} jobs (from #{params.start} in submit order"
        + (f", day {params.from_day:g} on" if params.from_day > 0 else "")
        + ")"
    ]
    if params.max_duration_s > 0:
        parts.append(f"durations capped at {params.max_duration_s / 3600:g} h")
    parts.append("at their real submit times" if factor == 1.0 else f"arrivals compressed x{factor:.2f}")
    return ", ".join(parts) + f" over {span / 86400:.1f} days on {where}"


# ------------------------------------------------------------------------------------------ run
def _check_request(
    kind: str, policies: Sequence[str], params: ExperimentParams | dict[str, Any] | None, predictor: Any
) -> tuple[ExperimentParams, list[str]]:
    p = params if isinstance(params, ExperimentParams) else ExperimentParams.from_dict(params)
    p.validate(kind)
    names = list(policies)
    if not names:
        raise ExperimentError("give at least one policy", field="policies")
    bad = [n for n in names if n not in hpolicies.POLICIES]
    if bad:
        raise ExperimentError(f"unknown policy {bad[0]!r}; known: {', '.join(POLICY_NAMES)}", field="policies")
    if p.predictions == "predictor" and predictor is None:
        raise ExperimentError(
            "no predictor: train one (train_predictor) or use predictions='oracle'", field="predictions"
        )
    return p, names


def policy_options(name: str, p: ExperimentParams) -> dict[str, Any]:
    """The options an experiment's parameters give a policy (Horus's queue look-ahead, usage_fgd's gang moves)."""
    if name in ("horus", "horus_migrate"):
        return {"queue_lookahead": p.horus_lookahead}
    if name == "usage_fgd":
        return {"move_gangs": p.usage_fgd_gang_moves}
    return {}


def _run_policy(
    name: str, prep: Prepared, p: ExperimentParams, seed: int, should_stop: StopCheck | None = None
) -> dict[str, Any]:
    policy = hpolicies.make_policy(name, **policy_options(name, p))
    res: hsim.FillResult | hsim.SimulationResult
    if p.method == "fill":
        res = hsim.simulate_fill(
            prep.jobs,
            prep.cluster,
            policy,
            seed=seed,
            until=p.until,
            predictor_error=p.predictor_error,
            should_stop=should_stop,
        )
    else:
        res = hsim.simulate(
            prep.jobs,
            prep.cluster,
            policy,
            seed=seed,
            predictor_error=p.predictor_error,
            backfill=p.backfill,
            interference=hsim.make_interference(p.interference),
            timeseries_points=p.timeseries_points,
            telemetry_delay_s=p.telemetry_delay_s,
            should_stop=should_stop,
        )
    return res.to_dict()


def _predictor_info(predictor: Any, p: ExperimentParams) -> dict[str, Any] | None:
    if predictor is None or p.predictions != "predictor":
        return None
    m = getattr(predictor, "metrics", {}) or {}
    return {
        "util_rmsle": (m.get("util") or {}).get("rmsle"),
        "mem_rmsle": (m.get("mem") or {}).get("rmsle"),
        "k_folds": m.get("k_folds"),
        "n_records": getattr(predictor, "n_records", None),
        "kind": "out-of-fold (held-out model) predictions",
    }


def _assumptions(prep: Prepared, p: ExperimentParams, seed: int) -> dict[str, Any]:
    # the RMSLE of what the policies see: the predictions with the extra noise simulate adds
    seen, _ = noisy_predictions(prep.jobs, p.predictor_error, seed)
    true = np.array([j.true_util_pct for j in prep.jobs], float)
    from_trace = sum(1 for j in prep.jobs if j.util_from_trace)
    return {
        "true_utilization": f"profile table of {p.gpu_model} ({', '.join(prep.table.sources)}); each job gets a "
        "zoo model and batch size by a seeded draw (horus.traces.assign_workloads)"
        + (f"; {from_trace} job(s) run at the trace's own gpu_util (taken as on {p.gpu_model})" if from_trace else ""),
        "true_utilization_per_gpu_type": f"utilizations hold on {p.gpu_model}; on another GPU type a job's is "
        "rescaled by Gavel's measured standalone speed ratio of its model family "
        "(u' = 1 - (1 - u) x thr_new / thr_ref: host time fixed)",
        "jobs_with_trace_utilization": from_trace,
        "policy_telemetry": "policies see predictions and sampled telemetry (per-process utilization, stretched "
        "while sharing; device utilization capped at 100 %), never true utilizations",
        "predicted_utilization": "oracle (= truth)"
        if p.predictions == "oracle"
        else "the predictor's out-of-fold predictions (the model was held out of training)",
        "predictor_error_sigma": p.predictor_error,
        "prediction_util_rmsle": rmsle(seen, true) if len(true) else None,
        "interference": hsim.make_interference(p.interference).describe() if p.method == "replay" else None,
        **prep.facts,
    }


def run_experiment(
    *,
    trace: str | TraceInput,
    policies: Sequence[str],
    seed: int = 0,
    params: ExperimentParams | dict[str, Any] | None = None,
    profiles: Sequence[ProfileRecord],
    predictor: Any = None,
    kind: str | None = None,
    jobs: Sequence[htraces.Job] | None = None,
    progress: Callable[[str], Any] | None = None,
    should_stop: StopCheck | None = None,
) -> dict[str, Any]:
    """Run every policy on the same jobs and cluster. ``trace`` is a :class:`TraceInput` or the name of a
    shipped trace (``jobs``/``kind`` may instead be given pre-parsed, as older callers do).

    ``predictor`` is a :class:`horus.predictor.TrainedPredictor` (required unless
    ``params.predictions == "oracle"``). ``progress(policy_name)`` is called before each policy.
    ``should_stop()`` is asked before each policy and every few events inside it; True abandons the
    experiment with :class:`SimulationStopped` (naming the policies that had finished; no results).
    """
    t0 = time.perf_counter()
    if isinstance(trace, TraceInput):
        ti = trace
    elif jobs is None:
        ti = load_trace(trace)
    elif kind is None:
        raise ExperimentError("pre-parsed jobs need their kind ('philly' or 'alibaba_pods')", field="trace")
    else:
        ti = TraceInput(trace, kind, list(jobs))
    trace, kind, jobs = ti.name, ti.kind, ti.jobs
    p, names = _check_request(kind, policies, params, predictor)
    prep = prepare_experiment(kind, jobs, p, seed=seed, profiles=profiles, predictor=predictor, nodes=ti.nodes)
    results: dict[str, Any] = {}
    for name in names:
        try:
            if should_stop is not None and should_stop():
                raise SimulationStopped("stopped")
            if progress is not None:
                progress(name)
            results[name] = _run_policy(name, prep, p, seed, should_stop)
        except SimulationStopped as exc:
            raise SimulationStopped(
                f"{exc} during policy {name}, after {len(results)} of {len(names)} policies", completed=list(results)
            ) from None
    used = prep.jobs
    span = (max(j.submit_time for j in used) - min(j.submit_time for j in used)) if used else 0.0
    out = {
        "trace": {
            "name": trace,
            "kind": kind,
            "jobs_in_trace": len(jobs),
            "jobs_used": len(used),
            "submit_span_s": span,
        },
        "method": p.method,
        "seed": seed,
        "cluster": prep.cluster.summary(),
        "scale": prep.scale,
        "params": p.to_dict(),
        "assumptions": _assumptions(prep, p, seed),
        "predictor": _predictor_info(predictor, p),
        "policies": results,
        "table": summary_table(p.method, results),
        "wall_s": time.perf_counter() - t0,
    }
    return json_safe(out)


# ------------------------------------------------------------------------------------------ tables
REPLAY_COLUMNS = (
    ("makespan_h", lambda r: r["makespan_s"] / 3600 if r["makespan_s"] is not None else None),
    ("mean_wait_s", lambda r: r["mean_wait_s"]),
    ("p95_wait_s", lambda r: r["p95_wait_s"]),
    ("mean_jct_s", lambda r: r["mean_jct_s"]),
    ("util_mean_pct", lambda r: r["util_mean_pct"]),
    ("occupancy_pct", lambda r: r.get("occupancy_pct")),
    ("shared_frac", lambda r: r["shared_gpu_time_frac"]),
    ("slowdown", lambda r: r["mean_slowdown"]),
    ("oom", lambda r: r["oom_events"]),
    ("migrations", lambda r: r["migrations"]),
)
FILL_COLUMNS = (
    ("allocated_share", lambda r: r["allocated_share"]),
    ("occupied_share", lambda r: r["occupied_share"]),
    ("frag_rate", lambda r: r["frag_rate"]),
    ("unallocated_gpus", lambda r: r["unallocated_gpus"]),
    ("placed", lambda r: r["placed"]),
    ("failed", lambda r: r["failed"]),
)


def summary_table(method: str, results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    cols = FILL_COLUMNS if method == "fill" else REPLAY_COLUMNS
    return [{"policy": name, **{c: fn(r) for c, fn in cols}} for name, r in results.items()]


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table of :func:`summary_table` rows."""
    if not rows:
        return "(no results)"
    cols = list(rows[0])

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)

    body = [[cell(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]

    def line(vals: list[str]) -> str:
        return "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(vals, widths)))

    return "\n".join([line(cols), line(["-" * w for w in widths]), *(line(b) for b in body)])
