"""Held-out evaluation on Philly with policy and physics apart.

Three separations the bench's headline lacks (issue 42):

* **Slices.** The bench's Philly seeds all replay jobs ``[0, 10000)`` in submit order, the slice
  ``usage_fgd``'s rules were tuned on (:data:`DEV_SLICE`). :func:`heldout_slices` takes windows of
  ``size`` jobs starting at the fixed offsets :data:`HELDOUT_OFFSETS` (20,000, 40,000, 60,000), a rule
  fixed before any result on them was seen; they are disjoint from each other and from the
  development slice (checked, not assumed).
* **Physics.** Gavel's measured pairs are split in two disjoint halves
  (:func:`~.interference.split_pairs`): the simulator's interference model is fitted on one, the
  policy's on the other, and the simulator's constant is then scaled (:data:`MISMATCH_LEVELS`,
  x0.67 / x1.0 / x1.5) while the policy keeps its own fit.
* **Observation.** Policies read telemetry through an :class:`~.observation.ObservationModel`
  (:data:`HELDOUT_OBSERVATION`: 60 s lag, 5 points of noise, device-level counters only).

Per replay, :func:`job_metrics` gives makespan, mean / p95 / p99 JCT, mean / p95 slowdown
(JCT / standalone time), the run stretch (run time / standalone time) and finish-time fairness
(:func:`finish_time_fairness`); :func:`t_interval` gives a 95 % t-interval over slices.

Plain numpy/scipy, no Django.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import policies as hpolicies
from .interference import FittedInterference, GpuParams, scaled_interference
from .observation import ObservationModel
from .replay import Replay, summarize

__all__ = [
    "DEV_SLICE",
    "HELDOUT_OFFSETS",
    "MISMATCH_LEVELS",
    "HELDOUT_POLICIES",
    "HELDOUT_OBSERVATION",
    "heldout_slices",
    "finish_time_fairness",
    "job_metrics",
    "t_interval",
    "make_heldout_policy",
    "HeldoutCell",
    "run_cell",
    "summarize_cells",
]

#: the slice the bench's headline (and usage_fgd's gang rules) were developed on: jobs [0, 10000)
DEV_SLICE = (0, 10_000)
#: held-out windows start here (jobs in submit order), fixed before looking at any result on them
HELDOUT_OFFSETS = (20_000, 40_000, 60_000)
#: the simulator's interference constant relative to its own half-fit; the policy keeps its half-fit
MISMATCH_LEVELS = (0.67, 1.0, 1.5)
HELDOUT_POLICIES = ("fifo_exclusive", "las", "gandiva", "best_fit", "horus", "horus_migrate", "usage_fgd")
HELDOUT_OBSERVATION = ObservationModel(lag_s=60.0, noise_pct=5.0, level="device")


def heldout_slices(
    n_jobs: int, size: int, *, offsets: Sequence[int] = HELDOUT_OFFSETS, dev: tuple[int, int] = DEV_SLICE
) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` job windows of ``size`` jobs at ``offsets`` in a trace of ``n_jobs`` jobs
    (submit order). Raises ``ValueError`` if a window runs past the trace, overlaps another or overlaps
    the development slice ``dev``: the rule must hold, not be bent to fit."""
    if size <= 0:
        raise ValueError("size must be > 0")
    out = [(int(o), int(o) + int(size)) for o in offsets]
    for s, e in out:
        if s < 0 or e > n_jobs:
            raise ValueError(f"window [{s}, {e}) is outside the trace's {n_jobs} jobs")
        if s < dev[1] and dev[0] < e:
            raise ValueError(f"window [{s}, {e}) overlaps the development slice [{dev[0]}, {dev[1]})")
    ordered = sorted(out)
    for (s1, e1), (s2, _) in zip(ordered, ordered[1:]):
        if s2 < e1:
            raise ValueError(f"windows starting at {s1} and {s2} overlap")
    return out


def finish_time_fairness(
    submit: np.ndarray, finish: np.ndarray, standalone: np.ndarray, num_gpus: np.ndarray, cluster_gpus: int
) -> np.ndarray:
    """Finish-time fairness per job (Themis, NSDI 2020; Gavel's FTF policy):
    ``rho = JCT / (standalone time x contention factor)``, where the contention factor is what a fair
    share would slow the job by: ``max(1, D / G)`` time-averaged over the job's life ``[submit, finish]``,
    ``D`` the GPUs requested by all jobs in the system (submitted, not finished), ``G`` the cluster's GPUs
    (with ``N`` equal jobs of one GPU each this is Themis's ``N`` shares of ``G``). ``rho > 1``: the job
    did worse than its fair share would have given it."""
    submit, finish = np.asarray(submit, float), np.asarray(finish, float)
    g = np.asarray(num_gpus, float)
    times = np.concatenate([submit, finish])
    delta = np.concatenate([g, -g])
    order = np.argsort(times, kind="stable")
    t, d = times[order], np.cumsum(delta[order])
    # contention after each event time; integral of max(1, D/G) as a piecewise-linear function of time
    level = np.maximum(1.0, d / max(cluster_gpus, 1))
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(t))])
    uniq, first = np.unique(t, return_index=True)  # equal times have equal areas (zero-width steps)
    at = area[first]
    life = finish - submit
    integral = np.interp(finish, uniq, at) - np.interp(submit, uniq, at)
    factor = np.where(life > 0, integral / np.where(life > 0, life, 1.0), 1.0)
    factor = np.maximum(factor, 1.0)
    return life / (np.maximum(np.asarray(standalone, float), 1.0) * factor)


def job_metrics(
    submit: Sequence[float],
    start: Sequence[float],
    finish: Sequence[float],
    duration: Sequence[float],
    num_gpus: Sequence[int],
    cluster_gpus: int,
) -> dict[str, float]:
    """The per-replay figures of the held-out table from per-job records (finished jobs only)."""
    sub, st, fin = (np.asarray(x, float) for x in (submit, start, finish))
    dur, ng = np.asarray(duration, float), np.asarray(num_gpus, float)
    done = ~np.isnan(fin)
    sub, st, fin, dur, ng = sub[done], st[done], fin[done], dur[done], ng[done]
    if not len(sub):
        return {}
    jct = fin - sub
    standalone = np.maximum(dur, 1.0)
    slowdown = jct / standalone
    stretch = (fin - st) / standalone
    ftf = finish_time_fairness(sub, fin, dur, ng, cluster_gpus)
    return {
        "makespan_s": float(fin.max() - sub.min()),
        "mean_jct_s": float(jct.mean()),
        "p95_jct_s": float(np.percentile(jct, 95)),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "mean_slowdown": float(slowdown.mean()),
        "p95_slowdown": float(np.percentile(slowdown, 95)),
        "mean_run_stretch": float(stretch.mean()),
        # the TRUE slowdown of running (interference, preemption): its tail beside the mean
        "p95_run_stretch": float(np.percentile(stretch, 95)),
        "p99_run_stretch": float(np.percentile(stretch, 99)),
        "mean_ftf": float(ftf.mean()),
        "p95_ftf": float(np.percentile(ftf, 95)),
        "share_ftf_over_1": float((ftf > 1.0 + 1e-9).mean()),
        "finished_jobs": int(done.sum()),
    }


def t_interval(values: Sequence[float | None], conf: float = 0.95) -> dict[str, float | int | None]:
    """Mean and two-sided Student-t interval over independent replicates (here: slices)."""
    from scipy.stats import t as student_t

    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], float)
    n = len(x)
    if n == 0:
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    mean = float(x.mean())
    if n == 1:
        return {"mean": mean, "lo": None, "hi": None, "n": 1}
    half = float(student_t.ppf(0.5 + conf / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return {"mean": mean, "lo": mean - half, "hi": mean + half, "n": n}


def make_heldout_policy(
    name: str, policy_model: FittedInterference, *, horus_lookahead: int = 5
) -> hpolicies.PlacementPolicy:
    """A fresh policy; ``usage_fgd`` gets ``policy_model`` (its own fit), ``las`` is Tiresias's LAS."""
    if name == "las":
        return hpolicies.TiresiasLAS()
    if name == "usage_fgd":
        return hpolicies.make_policy(name, interference=policy_model)
    if name in ("horus", "horus_migrate"):
        return hpolicies.make_policy(name, queue_lookahead=horus_lookahead)
    return hpolicies.make_policy(name)


def model_from_params(params: dict[str, tuple[float, float]], name: str) -> FittedInterference:
    """A :class:`FittedInterference` from ``{gpu_type: (capacity, b)}`` (picklable across processes)."""
    return FittedInterference({g: GpuParams(float(c), float(b)) for g, (c, b) in params.items()}, name=name)


def model_params(model: FittedInterference) -> dict[str, tuple[float, float]]:
    return {g: (p.capacity, p.interference) for g, p in model.params.items()}


@dataclass(frozen=True)
class HeldoutCell:
    """One replay of the held-out grid."""

    slice_start: int
    gpus: int
    mismatch: float
    policy: str


def run_cell(
    jobs: Sequence[Any],
    spec: Any,
    cell: HeldoutCell,
    *,
    sim_model: FittedInterference,
    policy_model: FittedInterference,
    observation: ObservationModel = HELDOUT_OBSERVATION,
    seed: int = 0,
) -> dict[str, Any]:
    """Replay ``jobs`` on ``spec`` under ``cell.policy`` with the simulator's physics ``sim_model`` scaled
    by ``cell.mismatch`` and the policy believing ``policy_model``; the row of the held-out table."""
    physics = scaled_interference(sim_model, cell.mismatch)
    policy = make_heldout_policy(cell.policy, policy_model)
    t0 = time.perf_counter()
    replay = Replay(jobs, spec, policy, seed=seed, interference=physics, observation=observation).run()
    res = summarize(replay, wall_s=time.perf_counter() - t0, timeseries_points=2, record_jobs=True)
    gpus_of = {j.job_id: j.num_gpus for j in jobs}
    rec: Mapping[str, Any] = res.jobs or {}
    metrics = job_metrics(
        rec["submit"], rec["start"], rec["finish"], rec["duration"], [gpus_of[i] for i in rec["id"]], spec.n_gpus
    )
    return {
        "slice_start": cell.slice_start,
        "gpus": cell.gpus,
        "mismatch": cell.mismatch,
        "policy": cell.policy,
        **metrics,
        "util_mean_pct": res.util_mean_pct,
        "dropped_jobs": res.dropped_jobs,
        "unschedulable_jobs": res.unschedulable_jobs,
        "preemptions": res.preemptions,
        "migrations": res.migrations,
        "oom_events": res.oom_events,
        "wall_s": res.wall_s,
    }


SUMMARY_METRICS = (
    "makespan_s",
    "mean_jct_s",
    "p95_jct_s",
    "p99_jct_s",
    "mean_slowdown",
    "p95_slowdown",
    "mean_run_stretch",
    "p95_run_stretch",
    "p99_run_stretch",
    "util_mean_pct",
    "mean_ftf",
    "p95_ftf",
)


def summarize_cells(rows: Sequence[dict[str, Any]], *, reference: str = "horus_migrate") -> list[dict[str, Any]]:
    """Per (cluster size, mismatch, policy): each metric's mean and 95 % t-interval over slices, and the
    paired per-slice ratio to ``reference`` (makespan, mean JCT, p99 JCT) with its interval."""
    out = []
    keys = sorted(
        {(r["gpus"], r["mismatch"], r["policy"]) for r in rows},
        key=lambda k: (k[0], k[1], HELDOUT_POLICIES.index(k[2]) if k[2] in HELDOUT_POLICIES else 99),
    )
    for gpus, mm, pol in keys:
        mine = {r["slice_start"]: r for r in rows if (r["gpus"], r["mismatch"], r["policy"]) == (gpus, mm, pol)}
        ref = {r["slice_start"]: r for r in rows if (r["gpus"], r["mismatch"], r["policy"]) == (gpus, mm, reference)}
        entry: dict[str, Any] = {"gpus": gpus, "mismatch": mm, "policy": pol, "slices": sorted(mine)}
        for m in SUMMARY_METRICS:
            entry[m] = t_interval([mine[s].get(m) for s in sorted(mine)])
        for m in ("makespan_s", "mean_jct_s", "p99_jct_s"):
            pairs = [mine[s][m] / ref[s][m] for s in sorted(mine) if s in ref and ref[s].get(m)]
            entry[f"{m}_vs_{reference}"] = t_interval(pairs)
            entry[f"{m}_vs_{reference}_per_slice"] = pairs
        out.append(entry)
    return out
