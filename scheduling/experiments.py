"""Trace-driven experiments over ``scheduling.horus``: one call, every policy. No Django here.

:func:`run_experiment` turns (trace, policies, seed, parameters) into one
JSON-serialisable result: it loads the trace, shapes the job slice and the
cluster (its scale always stated), gives each job a model/batch size whose
TRUE utilization and memory come from the profile table and whose PREDICTED
ones come from the predictor's out-of-fold predictions (or the truth, with
``predictions="oracle"``), then runs :func:`horus.simulator.simulate` (replay)
or :func:`horus.simulator.simulate_fill` (the ATC'23 fill method) per policy.

Used by the ``simulate`` command and the ``scheduling.run_simulation`` task.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import IO, Any

from .horus import cluster as hcluster
from .horus import policies as hpolicies
from .horus import simulator as hsim
from .horus import traces as htraces
from .horus.profiles import ProfileRecord, ProfileTable

__all__ = ["ExperimentParams", "ExperimentError", "SHIPPED_TRACES", "POLICY_NAMES", "load_jobs", "build_cluster",
           "run_experiment", "summary_table", "format_table"]

SHIPPED_TRACES = ("philly", "alibaba")
METHODS = ("replay", "fill")
POLICY_NAMES: tuple[str, ...] = tuple(hpolicies.POLICIES)


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
        checks = [
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
        ]
        for ok, name, message in checks:
            if not ok:
                raise ExperimentError(message, field=name)
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def build_cluster(kind: str, params: ExperimentParams, *, seed: int = 0) -> hcluster.ClusterSpec:
    """Alibaba pods run on a stratified ``scale`` fraction of the trace's own nodes; Philly-style jobs
    on a uniform cluster of ``gpus`` GPUs (``gpus_per_node`` per node)."""
    if kind == "alibaba_pods":
        full = htraces.alibaba_cluster()
        return full.scaled(params.scale, seed=seed, name=f"alibaba-2023 x{params.scale:g}")
    per = params.gpus_per_node
    n_nodes, rest = divmod(params.gpus, per)
    from .horus.profiles import gpu_spec

    spec = gpu_spec(params.gpu_model)
    nodes = [hcluster.NodeSpec(f"node-{i:04d}", per, params.gpu_model, spec.mem_mb) for i in range(n_nodes)]
    if rest:
        nodes.append(hcluster.NodeSpec(f"node-{n_nodes:04d}", rest, params.gpu_model, spec.mem_mb))
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


def _slice(jobs: Sequence[htraces.Job], params: ExperimentParams) -> list[htraces.Job]:
    ordered = sorted(jobs, key=lambda j: (j.submit_time, j.line))
    sl = ordered[params.start: params.start + params.jobs]
    if not sl:
        raise ExperimentError(f"the slice start={params.start}, jobs={params.jobs} is empty "
                              f"(the trace has {len(ordered)} jobs)", field="start")
    sl = htraces.compress_time(sl, params.compress)
    if params.max_duration_s > 0:
        sl = htraces.cap_durations(sl, params.max_duration_s)
    return sl


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
    progress=None,
) -> dict[str, Any]:
    """Run every policy on the same jobs and cluster. ``jobs``/``kind`` may be given pre-parsed
    (uploaded traces); otherwise the shipped trace named ``trace`` is loaded.

    ``predictor`` is a :class:`horus.predictor.TrainedPredictor` (required unless
    ``params.predictions == "oracle"``). ``progress(policy_name)`` is called before each policy.
    """
    t0 = time.perf_counter()
    if jobs is None:
        kind, jobs = load_jobs(trace)
    assert kind is not None
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
    gpu_models = sorted({r.gpu_model for r in profiles})
    if p.gpu_model not in gpu_models:
        raise ExperimentError(f"no profile records for GPU model {p.gpu_model!r}; have {', '.join(gpu_models)}",
                              field="gpu_model")
    table = ProfileTable(profiles, p.gpu_model)
    predictions = None
    if p.predictions == "predictor":
        predictions = htraces.predictions_from(predictor, table, out_of_fold=True)

    spec = build_cluster(kind, p, seed=seed)
    if p.method == "fill":
        used = [j for j in jobs if j.num_gpus > 0]
    else:
        used = _slice(jobs, p)
    used = htraces.assign_workloads(used, table, predictions=predictions, seed=seed)

    results: dict[str, Any] = {}
    for name in names:
        if progress is not None:
            progress(name)
        policy = hpolicies.make_policy(name)
        if p.method == "fill":
            res = hsim.simulate_fill(used, spec, policy, seed=seed, until=p.until, predictor_error=p.predictor_error)
        else:
            res = hsim.simulate(used, spec, policy, seed=seed, predictor_error=p.predictor_error,
                                backfill=p.backfill)
        results[name] = res.to_dict()

    span = (max(j.submit_time for j in used) - min(j.submit_time for j in used)) if used else 0.0
    predictor_info = None
    if predictor is not None and p.predictions == "predictor":
        m = getattr(predictor, "metrics", {}) or {}
        predictor_info = {"util_rmsle": (m.get("util") or {}).get("rmsle"),
                          "mem_rmsle": (m.get("mem") or {}).get("rmsle"), "k_folds": m.get("k_folds"),
                          "n_records": getattr(predictor, "n_records", None),
                          "kind": "out-of-fold (held-out model) predictions"}
    out = {
        "trace": {"name": trace, "kind": kind, "jobs_in_trace": len(jobs), "jobs_used": len(used),
                  "submit_span_s": span},
        "method": p.method,
        "seed": seed,
        "cluster": spec.summary(),
        "params": p.to_dict(),
        "assumptions": {
            "true_utilization": f"profile table of {p.gpu_model} ({', '.join(table.sources)}); each job gets a "
                                "zoo model and batch size by a seeded draw (horus.traces.assign_workloads)",
            "predicted_utilization": "oracle (= truth)" if p.predictions == "oracle" else
            "the predictor's out-of-fold predictions (the model was held out of training)",
            "predictor_error_sigma": p.predictor_error,
        },
        "predictor": predictor_info,
        "policies": results,
        "table": summary_table(p.method, results),
        "wall_s": time.perf_counter() - t0,
    }
    return _json_safe(out)


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy scalars
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


REPLAY_COLUMNS = (
    ("makespan_h", lambda r: r["makespan_s"] / 3600 if r["makespan_s"] is not None else None),
    ("mean_wait_s", lambda r: r["mean_wait_s"]),
    ("p95_wait_s", lambda r: r["p95_wait_s"]),
    ("mean_jct_s", lambda r: r["mean_jct_s"]),
    ("util_mean_pct", lambda r: r["util_mean_pct"]),
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
