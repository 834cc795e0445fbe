"""Overcommit at equal terms: any placement policy given ``usage_fgd``'s reservation rule.

``usage_fgd`` holds a pod at its PREDICTED usage (``held_milli``: predicted utilization x (1 +
margin), rounded up, at least a floor, never more than the request) while the fill scores every
policy on REQUESTS, so part of its lead over FGD is the GPUs it does not hold. :class:`WithReservation`
gives a baseline the same rule, and nothing else of ``usage_fgd`` (no interference bound, no job cap per
GPU): the placement is the wrapped policy's own, on capacity counted by reservations. Its name is the
wrapped one's plus ``+reserve`` (``best_fit_ref+reserve``). Like ``usage_fgd`` it co-locates a pod only
where its PREDICTED memory fits beside the GPU's jobs with ``headroom_mb`` to spare (a GPU that fails is
shown to the wrapped policy as full); ``memory_check=False`` (``+reserve-nomem``) drops that, and the
memory-blind ``*_ref`` policies then stack pods until their true memory overflows (the fill's OOM count). Where a cluster does not count shares (a
Philly replay) a reservation means nothing and the wrapper is the wrapped policy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .cluster import MILLI, ClusterView, JobView, WorkloadType
from .policies import HORUS_HEADROOM_MB, PlacementPolicy
from .usage_fgd import UsageFGD, held_milli

__all__ = ["WithReservation", "with_reservation"]


class WithReservation(PlacementPolicy):
    """``inner``'s placements, holding each pod at its predicted usage as ``usage_fgd`` does."""

    def __init__(
        self,
        inner: PlacementPolicy,
        *,
        margin: float | None = None,
        floor_milli: int | None = None,
        memory_check: bool = True,
        headroom_mb: float = HORUS_HEADROOM_MB,
    ):
        ref = UsageFGD.__init__.__kwdefaults__ or {}  # the same margin and floor as usage_fgd's defaults
        self.inner = inner
        self.margin = float(ref["margin"] if margin is None else margin)
        self.floor_milli = int(ref["floor_milli"] if floor_milli is None else floor_milli)
        self.memory_check = bool(memory_check)
        self.headroom_mb = float(headroom_mb)
        self.name = f"{inner.name}+reserve" + ("" if self.memory_check else "-nomem")
        self.shares_gpus = True
        self.monotone_feasibility = False  # what is held depends on the prediction, not only the request
        self.queue_lookahead = inner.queue_lookahead

    def reserve(self, job: JobView, cluster: ClusterView) -> JobView:
        if not cluster.enforce_milli:
            return self.inner.reserve(job, cluster)
        return replace(job, gpu_milli=held_milli(job.pred_util_pct, job.gpu_milli, self.margin, self.floor_milli))

    def reset(self, seed: int = 0) -> None:
        self.inner.reset(seed)

    def place(self, job: JobView, cluster: ClusterView, now: float) -> list[int] | None:
        if self.memory_check and cluster.enforce_milli:
            cluster = _MemoryMasked(cluster, self._memory_ok(job, cluster))  # type: ignore[assignment]
        return self.inner.place(job, cluster, now)

    def _memory_ok(self, job: JobView, cv: ClusterView) -> np.ndarray:
        """Per GPU: idle, or the job's predicted memory fits beside its jobs' with the headroom (usage_fgd's rule)."""
        jmem = max(job.pred_mem_mb, job.mem_floor_mb)
        room = cv.mem_cap_mb - (np.maximum(cv.pred_mem_mb, cv.meas_mem_mb) + jmem) >= self.headroom_mb
        return (np.asarray(cv.n_jobs) == 0) | room

    def place_cpu_pod(self, job: JobView, cluster: ClusterView) -> int | None:
        return self.inner.place_cpu_pod(job, cluster)

    def rebalance(self, cluster: ClusterView, now: float) -> list[tuple[str, list[int]]]:
        return self.inner.rebalance(cluster, now)

    def score(self, job: JobView, cluster: ClusterView, gpus: Sequence[int]) -> float | None:
        return self.inner.score(job, cluster, gpus)

    def target_workload(self, pods: Sequence[Any], popularity: float) -> list[WorkloadType]:
        return self.inner.target_workload(pods, popularity)

    def describe(self) -> dict[str, Any]:
        return {
            **self.inner.describe(),
            "name": self.name,
            "reservation": "predicted usage (usage_fgd's rule)",
            "margin": self.margin,
            "floor_milli": self.floor_milli,
            "memory_check": self.memory_check,
            "headroom_mb": self.headroom_mb,
        }


class _MemoryMasked:
    """A :class:`ClusterView` in which GPUs without room for the job's memory look full (``milli_used`` =
    1000), so an unchanged policy cannot pick them; everything else reads through."""

    def __init__(self, cv: ClusterView, ok: np.ndarray):
        self._cv = cv
        self.milli_used = np.where(ok, cv.milli_used, MILLI)

    def node_free_milli(self) -> np.ndarray:
        out = np.array(self._cv.node_free_milli(), copy=True)
        out[self._cv.gpu_node, self._cv.gpu_slot] = np.maximum(0, MILLI - self.milli_used)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cv, name)


def with_reservation(inner: PlacementPolicy, **options: Any) -> WithReservation:
    """``inner`` given ``usage_fgd``'s reservation rule (see the module docstring)."""
    return WithReservation(inner, **options)
