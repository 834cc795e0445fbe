"""Ready-made experiment setups (used by ``bench/scheduling.py`` and the
Django layer), so every caller states the same scale and assumptions.

* :func:`reference_predictor` - the predictor trained on the seed profiles,
  with its k-fold error.
* :func:`philly_setup` - the Philly trace replayed as is (no time
  compression: its average load is ~374 busy GPUs) on a uniform cluster of
  ``n_gpus`` V100-16GB GPUs, 8 per node.
* :func:`alibaba_replay_setup` - Alibaba-2023 GPU pods from the trace's busy
  window, durations capped (pods still running at the trace end are
  censored), arrivals compressed to a target load, on a stratified
  ``1/scale`` sample of the real nodes.
* :func:`alibaba_fill_setup` - Alibaba-2023 pods and the full 1,213-node
  cluster (or a stratified sample) for the ATC'23 fill method.

Every job gets a zoo model and batch size (seeded, see
:func:`~.traces.assign_workloads`); its TRUE utilization/memory come from the
profile table of the reference GPU (``V100``), its PREDICTED ones from the
predictor's out-of-fold output (a model it was not trained on) unless
``prediction="oracle"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cluster import ClusterSpec
from .predictor import TrainedPredictor, UtilizationPredictor
from .profiles import ProfileRecord, ProfileTable, load_profiles
from .traces import (
    Job,
    alibaba_cluster,
    assign_workloads,
    cap_durations,
    compress_time,
    load_alibaba_nodes,
    load_alibaba_pods,
    load_philly,
    predictions_from,
)

__all__ = [
    "REFERENCE_GPU",
    "Setup",
    "reference_predictor",
    "workload_table",
    "philly_setup",
    "alibaba_replay_setup",
    "alibaba_fill_setup",
    "util_distribution",
]

REFERENCE_GPU = "V100"
_CACHE: dict[str, Any] = {}


@dataclass
class Setup:
    """Jobs + cluster + a plain-words statement of the scale and assumptions."""

    name: str
    jobs: list[Job]
    cluster: ClusterSpec
    scale: str
    assumptions: dict[str, Any] = field(default_factory=dict)


def reference_predictor(records: Sequence[ProfileRecord] | None = None, *, seed: int = 0, k_folds: int = 5) -> TrainedPredictor:
    """Predictor trained on ``records`` (default: the shipped seed profiles), cached."""
    key = f"pred:{seed}:{k_folds}:{id(records) if records is not None else 'seed'}"
    if key not in _CACHE:
        recs = list(records) if records is not None else load_profiles()
        _CACHE[key] = UtilizationPredictor().train(recs, k_folds=k_folds, seed=seed)
    return _CACHE[key]


def workload_table(records: Sequence[ProfileRecord] | None = None, *, min_batch: int = 1) -> ProfileTable:
    """Profile table of the reference GPU, optionally only batch sizes >= ``min_batch``."""
    recs = list(records) if records is not None else load_profiles()
    return ProfileTable([r for r in recs if r.batch_size >= min_batch], REFERENCE_GPU)


def util_distribution(jobs: Sequence[Job]) -> dict[str, float]:
    """Summary of the TRUE utilization the jobs run at (the stated assumption)."""
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


def _assign(jobs: Sequence[Job], *, prediction: str, seed: int, min_batch: int) -> tuple[list[Job], dict[str, Any]]:
    table = workload_table(min_batch=min_batch)
    if prediction == "oracle":
        preds = None
    elif prediction == "predictor":
        preds = predictions_from(reference_predictor(), table)
    else:
        raise ValueError("prediction must be 'predictor' or 'oracle'")
    out = assign_workloads(jobs, table, predictions=preds, seed=seed)
    info = {
        "profiles": table.sources,
        "reference_gpu": REFERENCE_GPU,
        "configs": len(table),
        "min_batch": min_batch,
        "prediction": "out-of-fold XGBoost (held-out models)" if prediction == "predictor" else "oracle (truth)",
        "utilization": util_distribution(out),
    }
    return out, info


def philly_setup(n_gpus: int = 256, *, seed: int = 0, prediction: str = "predictor", min_batch: int = 1,
                 gpus_per_node: int = 8, jobs: Sequence[Job] | None = None) -> Setup:
    if n_gpus % gpus_per_node:
        raise ValueError("n_gpus must be a multiple of gpus_per_node")
    if jobs is None:
        if "philly" not in _CACHE:
            _CACHE["philly"] = load_philly()
        jobs = _CACHE["philly"]
    assigned, info = _assign(jobs, prediction=prediction, seed=seed, min_batch=min_batch)
    spec = ClusterSpec.uniform(n_gpus // gpus_per_node, gpus_per_node, gpu_model=REFERENCE_GPU, gpu_mem_mb=16384,
                               name=f"philly-{n_gpus}", note="V100-16GB, 8 per node (assumed: the trace has no hardware)")
    span = max(j.submit_time for j in assigned)
    load = sum(j.num_gpus * j.duration_s for j in assigned) / span
    return Setup(
        name=f"philly-{n_gpus}gpu",
        jobs=assigned,
        cluster=spec,
        scale=f"all {len(assigned)} Philly jobs at their real submit times (no compression; mean demand "
              f"{load:.0f} GPUs over {span / 86400:.0f} days) on {n_gpus} GPUs ({n_gpus // gpus_per_node} nodes x {gpus_per_node})",
        assumptions={**info, "offered_load": load / n_gpus, "multi_gpu_jobs": "gang across any GPUs (no locality)"},
    )


def _alibaba_pods() -> list[Job]:
    if "alibaba_pods" not in _CACHE:
        _CACHE["alibaba_pods"] = load_alibaba_pods()
    return _CACHE["alibaba_pods"]


def _alibaba_nodes():
    if "alibaba_nodes" not in _CACHE:
        _CACHE["alibaba_nodes"] = load_alibaba_nodes()
    return _CACHE["alibaba_nodes"]


def alibaba_replay_setup(scale: int = 32, *, seed: int = 0, prediction: str = "predictor", target_load: float = 1.5,
                         window_start_day: float = 114.0, max_duration_s: float = 86400.0) -> Setup:
    """Pods submitted from ``window_start_day`` on (before it the trace has ~25
    pods in 114 days), durations capped at ``max_duration_s``, arrivals
    compressed so the whole-GPU demand is ``target_load`` x the GPUs of a
    stratified ``1/scale`` node sample."""
    pods = [p for p in _alibaba_pods() if p.submit_time >= window_start_day * 86400]
    pods = cap_durations(pods, max_duration_s)
    spec = alibaba_cluster(_alibaba_nodes()).scaled(1.0 / scale, seed=seed, name=f"alibaba-2023 1/{scale}")
    span = max(p.submit_time for p in pods) - min(p.submit_time for p in pods)
    work = sum(p.num_gpus * p.duration_s for p in pods)
    factor = target_load * spec.n_gpus * span / work
    pods = compress_time(pods, factor)
    assigned, info = _assign(pods, prediction=prediction, seed=seed, min_batch=1)
    return Setup(
        name=f"alibaba-replay-1/{scale}",
        jobs=assigned,
        cluster=spec,
        scale=f"{len(assigned)} GPU pods from day {window_start_day:.0f} on, durations capped at {max_duration_s / 3600:.0f} h, "
              f"arrivals compressed x{factor:.1f} (whole-GPU demand {target_load:.1f}x capacity) on a stratified 1/{scale} "
              f"sample of the nodes: {len(spec.nodes)} nodes, {spec.n_gpus} GPUs",
        assumptions={**info, "compression": factor, "target_load": target_load, "gpu_sharing": "gpu_milli enforced (<= 1000 per GPU)"},
    )


def alibaba_fill_setup(scale: int = 1, *, seed: int = 0, prediction: str = "predictor") -> Setup:
    spec = alibaba_cluster(_alibaba_nodes())
    if scale > 1:
        spec = spec.scaled(1.0 / scale, seed=seed, name=f"alibaba-2023 1/{scale}")
    assigned, info = _assign(_alibaba_pods(), prediction=prediction, seed=seed, min_batch=1)
    return Setup(
        name="alibaba-fill" + (f"-1/{scale}" if scale > 1 else ""),
        jobs=assigned,
        cluster=spec,
        scale=f"pods sampled with replacement from the {len(assigned)} GPU pods, submitted until the request reaches "
              f"100 % of {spec.n_gpus} GPUs ({len(spec.nodes)} nodes{', the whole cluster' if scale == 1 else f', 1/{scale} sample'})",
        assumptions={**info, "gpu_sharing": "gpu_milli enforced (<= 1000 per GPU)"},
    )
