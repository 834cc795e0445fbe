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

Shapes: Philly-style traces run on a uniform cluster of ``gpus`` GPUs; Alibaba pods on a
stratified ``scale`` fraction of the trace's own 1,213 GPU nodes. A replay takes the slice
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
from .sim_inputs import noisy_predictions

__all__ = [
    "ExperimentParams", "ExperimentError", "Prepared", "SHIPPED_TRACES", "METHODS", "POLICY_NAMES",
    "REFERENCE_GPU", "reference_predictor", "util_distribution", "load_jobs", "build_cluster",
    "simulation_size", "prepare_experiment", "run_experiment", "summary_table", "format_table",
]

SHIPPED_TRACES = ("philly", "alibaba")
METHODS = ("replay", "fill")
POLICY_NAMES: tuple[str, ...] = tuple(hpolicies.POLICIES)
REFERENCE_GPU = "V100"


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

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "ExperimentParams":
        data = dict(data or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ExperimentError(f"unknown parameter(s): {', '.join(unknown)}; known: {', '.join(known)}",
                                  field=unknown[0])
        out = cls()
        for name, value in data.items():
            default = getattr(out, name)
            try:
                setattr(out, name, type(default)(value) if value is not None else default)
            except (TypeError, ValueError):
                raise ExperimentError(f"{name} must be a {type(default).__name__}, got {value!r}", field=name) from None
        return out

    def validate(self, kind: str) -> "ExperimentParams":
        if self.method == "":
            self.method = "fill" if kind == "alibaba_pods" else "replay"
        for ok, name, message in self._checks(kind):
            if not ok:
                raise ExperimentError(message, field=name)
        return self

    def _checks(self, kind: str) -> list[tuple[bool, str, str]]:
        return [
            (self.method in METHODS, "method", f"method must be one of {', '.join(METHODS)}"),
            (self.method != "fill" or kind == "alibaba_pods", "method",
             "the fill method needs an Alibaba pod list (fractional GPU requests)"),
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
            (self.interference in hsim.INTERFERENCE_MODELS, "interference",
             f"interference must be one of {', '.join(hsim.INTERFERENCE_MODELS)}"),
            (2 <= self.timeseries_points <= 2000, "timeseries_points", "timeseries_points must be between 2 and 2000"),
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------------------ inputs
_PREDICTORS: dict[tuple[int, int], TrainedPredictor] = {}


def reference_predictor(*, seed: int = 0, k_folds: int = 5) -> TrainedPredictor:
    """The predictor trained on the shipped seed profiles (cached per process), with its k-fold error."""
    key = (seed, k_folds)
    if key not in _PREDICTORS:
        _PREDICTORS[key] = UtilizationPredictor().train(load_profiles(), k_folds=k_folds, seed=seed)
    return _PREDICTORS[key]


def load_jobs(trace: str, source: str | IO[Any] | None = None) -> tuple[str, list[htraces.Job]]:
    """``(kind, jobs)`` of a shipped trace ('philly', 'alibaba') or of an uploaded file (``source``)."""
    if source is None:
        if trace in SHIPPED_TRACES:
            kind, jobs = _shipped(trace)
            return kind, list(jobs)
        raise ExperimentError(f"unknown trace {trace!r}; use {', '.join(SHIPPED_TRACES)} or an uploaded trace",
                              field="trace")
    data = htraces.parse_trace(source, name=trace)
    if data.kind not in ("philly", "alibaba_pods"):
        raise ExperimentError(f"trace {trace!r} is a {data.kind} file, not a list of jobs", field="trace")
    return data.kind, data.jobs


@functools.lru_cache(maxsize=2)
def _shipped(trace: str) -> tuple[str, tuple[htraces.Job, ...]]:
    """Parsed once per process (Philly: 82k rows, ~0.5 s); callers get copies, never mutate jobs."""
    if trace == "philly":
        return "philly", tuple(htraces.load_philly())
    return "alibaba_pods", tuple(htraces.load_alibaba_pods())


@functools.lru_cache(maxsize=1)
def _alibaba_full() -> hcluster.ClusterSpec:
    return htraces.alibaba_cluster()


def build_cluster(kind: str, params: ExperimentParams, *, seed: int = 0) -> hcluster.ClusterSpec:
    """Alibaba pods run on a stratified ``scale`` fraction of the trace's own nodes; Philly-style jobs
    on a uniform cluster of ``gpus`` GPUs (``gpus_per_node`` per node)."""
    if kind == "alibaba_pods":
        return _alibaba_full().scaled(params.scale, seed=seed, name=f"alibaba-2023 x{params.scale:g}")
    per = params.gpus_per_node
    n_nodes, rest = divmod(params.gpus, per)
    mem = gpu_spec(params.gpu_model).mem_mb
    nodes = [hcluster.NodeSpec(f"node-{i:04d}", per, params.gpu_model, mem) for i in range(n_nodes)]
    if rest:
        nodes.append(hcluster.NodeSpec(f"node-{n_nodes:04d}", rest, params.gpu_model, mem))
    return hcluster.ClusterSpec(tuple(nodes), f"{params.gpus} x {params.gpu_model} ({per}/node)")


def simulation_size(kind: str, params: ExperimentParams, *, trace_jobs: int | None,
                    seed: int = 0) -> tuple[int, int]:
    """``(jobs simulated, cluster GPUs)`` of a validated experiment, without running it: what the per-team
    size limit is checked against. ``trace_jobs`` is the trace's job count (None: unknown, the slice's size)."""
    gpus = build_cluster(kind, params, seed=seed).n_gpus
    if params.method == "fill":
        jobs = trace_jobs or 0
    else:
        jobs = params.jobs if trace_jobs is None else max(0, min(params.jobs, trace_jobs - params.start))
    return int(jobs), int(gpus)


def _slice(jobs: Sequence[htraces.Job], params: ExperimentParams, spec: hcluster.ClusterSpec
           ) -> tuple[list[htraces.Job], float]:
    """The replay's jobs and the compression factor applied to their arrivals."""
    ordered = sorted(jobs, key=lambda j: (j.submit_time, j.line))
    if params.from_day > 0:
        ordered = [j for j in ordered if j.submit_time >= params.from_day * 86400]
    sl = ordered[params.start: params.start + params.jobs]
    if not sl:
        raise ExperimentError(f"the slice start={params.start}, jobs={params.jobs} is empty "
                              f"(the trace has {len(ordered)} jobs)", field="start")
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


def prepare_experiment(kind: str, jobs: Sequence[htraces.Job], params: ExperimentParams, *, seed: int,
                       profiles: Sequence[ProfileRecord], predictor: Any = None) -> Prepared:
    """The validated experiment's jobs and cluster: the slice (replay) or the GPU pods (fill), each job
    given a model/batch size with TRUE util/memory from the profile table and its PREDICTED ones."""
    recs = [r for r in profiles if r.batch_size >= params.min_batch]
    gpu_models = sorted({r.gpu_model for r in recs})
    if params.gpu_model not in gpu_models:
        raise ExperimentError(f"no profile records for GPU model {params.gpu_model!r}"
                              f"{f' with batch >= {params.min_batch}' if params.min_batch > 1 else ''}; "
                              f"have {', '.join(gpu_models) or 'none'}", field="gpu_model")
    table = ProfileTable(recs, params.gpu_model)
    predictions = None
    if params.predictions == "predictor":
        predictions = htraces.predictions_from(predictor, table, out_of_fold=True)
    spec = build_cluster(kind, params, seed=seed)
    factor = None
    if params.method == "fill":
        used = list(jobs)  # CPU-only pods too: they take node CPU and are part of FGD's workload
    else:
        used, factor = _slice([j for j in jobs if j.num_gpus > 0], params, spec)
    used = htraces.assign_workloads(used, table, predictions=predictions, seed=seed)
    gpu_jobs = [j for j in used if j.num_gpus > 0]
    facts: dict[str, Any] = {"utilization": util_distribution(gpu_jobs) if gpu_jobs else None}
    if params.method == "replay" and used:
        span = max(j.submit_time for j in used) - min(j.submit_time for j in used)
        load = sum(j.num_gpus * j.duration_s for j in used) / span if span > 0 else None
        facts.update(compression=factor, offered_load=None if load is None else load / spec.n_gpus)
    return Prepared(kind, used, spec, table, _scale_statement(params, len(jobs), used, spec, factor), facts)


def _scale_statement(params: ExperimentParams, in_trace: int, used: Sequence[htraces.Job],
                     spec: hcluster.ClusterSpec, factor: float | None) -> str:
    where = f"{spec.n_gpus} GPUs ({len(spec.nodes)} nodes: {spec.name})"
    if params.method == "fill":
        n_cpu = sum(1 for j in used if j.num_gpus == 0)
        return (f"pods sampled with replacement from the {len(used)} pods ({n_cpu} CPU-only), submitted until "
                f"the GPU request reaches {params.until * 100:.0f} % of {where}")
    span = max(j.submit_time for j in used) - min(j.submit_time for j in used)
    parts = [f"{len(used)} of {in_trace} jobs (from #{params.start} in submit order"
             + (f", day {params.from_day:g} on" if params.from_day > 0 else "") + ")"]
    if params.max_duration_s > 0:
        parts.append(f"durations capped at {params.max_duration_s / 3600:g} h")
    parts.append("at their real submit times" if factor == 1.0 else f"arrivals compressed x{factor:.2f}")
    return ", ".join(parts) + f" over {span / 86400:.1f} days on {where}"


# ------------------------------------------------------------------------------------------ run
def _check_request(kind: str, policies: Sequence[str], params: ExperimentParams | dict[str, Any] | None,
                   predictor: Any) -> tuple[ExperimentParams, list[str]]:
    p = params if isinstance(params, ExperimentParams) else ExperimentParams.from_dict(params)
    p.validate(kind)
    names = list(policies)
    if not names:
        raise ExperimentError("give at least one policy", field="policies")
    bad = [n for n in names if n not in hpolicies.POLICIES]
    if bad:
        raise ExperimentError(f"unknown policy {bad[0]!r}; known: {', '.join(POLICY_NAMES)}", field="policies")
    if p.predictions == "predictor" and predictor is None:
        raise ExperimentError("no predictor: train one (train_predictor) or use predictions='oracle'",
                              field="predictions")
    return p, names


def _run_policy(name: str, prep: Prepared, p: ExperimentParams, seed: int) -> dict[str, Any]:
    policy = hpolicies.make_policy(name)
    if p.method == "fill":
        res = hsim.simulate_fill(prep.jobs, prep.cluster, policy, seed=seed, until=p.until,
                                 predictor_error=p.predictor_error)
    else:
        res = hsim.simulate(prep.jobs, prep.cluster, policy, seed=seed, predictor_error=p.predictor_error,
                            backfill=p.backfill, interference=hsim.make_interference(p.interference),
                            timeseries_points=p.timeseries_points)
    return res.to_dict()


def _predictor_info(predictor: Any, p: ExperimentParams) -> dict[str, Any] | None:
    if predictor is None or p.predictions != "predictor":
        return None
    m = getattr(predictor, "metrics", {}) or {}
    return {"util_rmsle": (m.get("util") or {}).get("rmsle"), "mem_rmsle": (m.get("mem") or {}).get("rmsle"),
            "k_folds": m.get("k_folds"), "n_records": getattr(predictor, "n_records", None),
            "kind": "out-of-fold (held-out model) predictions"}


def _assumptions(prep: Prepared, p: ExperimentParams, seed: int) -> dict[str, Any]:
    # the RMSLE of what the policies see: the predictions with the extra noise simulate adds
    seen, _ = noisy_predictions(prep.jobs, p.predictor_error, seed)
    true = np.array([j.true_util_pct for j in prep.jobs], float)
    return {
        "true_utilization": f"profile table of {p.gpu_model} ({', '.join(prep.table.sources)}); each job gets a "
                            "zoo model and batch size by a seeded draw (horus.traces.assign_workloads)",
        "predicted_utilization": "oracle (= truth)" if p.predictions == "oracle" else
        "the predictor's out-of-fold predictions (the model was held out of training)",
        "predictor_error_sigma": p.predictor_error,
        "prediction_util_rmsle": rmsle(seen, true) if len(true) else None,
        "interference": hsim.make_interference(p.interference).describe() if p.method == "replay" else None,
        **prep.facts,
    }


def run_experiment(
    *,
    trace: str,
    policies: Sequence[str],
    seed: int = 0,
    params: ExperimentParams | dict[str, Any] | None = None,
    profiles: Sequence[ProfileRecord],
    predictor: Any = None,
    kind: str | None = None,
    jobs: Sequence[htraces.Job] | None = None,
    progress: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Run every policy on the same jobs and cluster. ``jobs``/``kind`` may be given pre-parsed
    (uploaded traces); otherwise the shipped trace named ``trace`` is loaded.

    ``predictor`` is a :class:`horus.predictor.TrainedPredictor` (required unless
    ``params.predictions == "oracle"``). ``progress(policy_name)`` is called before each policy.
    """
    t0 = time.perf_counter()
    if jobs is None:
        kind, jobs = load_jobs(trace)
    if kind is None:
        raise ExperimentError("pre-parsed jobs need their kind ('philly' or 'alibaba_pods')", field="trace")
    p, names = _check_request(kind, policies, params, predictor)
    prep = prepare_experiment(kind, jobs, p, seed=seed, profiles=profiles, predictor=predictor)
    results: dict[str, Any] = {}
    for name in names:
        if progress is not None:
            progress(name)
        results[name] = _run_policy(name, prep, p, seed)
    used = prep.jobs
    span = (max(j.submit_time for j in used) - min(j.submit_time for j in used)) if used else 0.0
    out = {
        "trace": {"name": trace, "kind": kind, "jobs_in_trace": len(jobs), "jobs_used": len(used),
                  "submit_span_s": span},
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
