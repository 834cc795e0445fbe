"""Overcommit at equal terms: any placement policy given ``usage_fgd``'s reservation rule.

``usage_fgd`` holds a pod at its PREDICTED usage (``held_milli``: predicted utilization x (1 +
margin), rounded up, at least a floor, never more than the request) while the fill scores every
policy on REQUESTS, so part of its lead over FGD is the GPUs it does not hold. :class:`WithReservation`
gives a baseline the same rule, and nothing else of ``usage_fgd`` (no interference bound, no job cap per
GPU): the placement is the wrapped policy's own, on capacity counted by reservations. Its name is the
wrapped one's plus ``+reserve`` (``best_fit_ref+reserve``). Where a cluster does not count shares (a
Philly replay) a reservation means nothing and the wrapper is the wrapped policy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .cluster import ClusterView, JobView, WorkloadType
from .policies import PlacementPolicy
from .usage_fgd import UsageFGD, held_milli

__all__ = ["WithReservation", "with_reservation"]


class WithReservation(PlacementPolicy):
    """``inner``'s placements, holding each pod at its predicted usage as ``usage_fgd`` does."""

    def __init__(self, inner: PlacementPolicy, *, margin: float | None = None, floor_milli: int | None = None):
        ref = UsageFGD.__init__.__kwdefaults__  # the same margin and floor as usage_fgd's defaults
        self.inner = inner
        self.margin = float(ref["margin"] if margin is None else margin)
        self.floor_milli = int(ref["floor_milli"] if floor_milli is None else floor_milli)
        self.name = f"{inner.name}+reserve"
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
        return self.inner.place(job, cluster, now)

    def place_cpu_pod(self, job: JobView, cluster: ClusterView) -> int | None:
        return self.inner.place_cpu_pod(job, cluster)

    def rebalance(self, cluster: ClusterView, now: float) -> list[tuple[str, list[int]]]:
        return self.inner.rebalance(cluster, now)

    def score(self, job: JobView, cluster: ClusterView, gpus: Sequence[int]) -> float | None:
        return self.inner.score(job, cluster, gpus)

    def target_workload(self, pods: Sequence[Any], popularity: float) -> list[WorkloadType]:
        return self.inner.target_workload(pods, popularity)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "name": self.name, "reservation": "predicted usage (usage_fgd's rule)",
                "margin": self.margin, "floor_milli": self.floor_milli}


def with_reservation(inner: PlacementPolicy, **options: Any) -> WithReservation:
    """``inner`` given ``usage_fgd``'s reservation rule (see the module docstring)."""
    return WithReservation(inner, **options)
