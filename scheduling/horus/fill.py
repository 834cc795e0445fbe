"""The fill method (ATC'23) as a small class: sampled pods are submitted one by one and never leave,
until the submitted GPU request reaches a share of the cluster's capacity (see :mod:`.simulator`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from common.jsonsafe import json_safe

from .cluster import MILLI, ClusterSpec, ClusterState, JobView, workload_types
from .policies import PlacementPolicy
from .sim_inputs import checked_placement, job_views, noisy_predictions, validate_jobs
from .traces import Job

__all__ = ["FillResult", "Fill"]


@dataclass
class FillResult:
    """Outcome of a fill experiment. ``to_dict()`` is JSON-serialisable."""

    policy: str
    cluster: dict[str, Any]
    seed: int
    submitted: int
    placed: int
    failed: int
    oom_events: int
    allocated_share: float  # placed GPU request / capacity at the end
    occupied_share: float  # GPUs with any pod / all GPUs
    frag_rate: float  # fragmented / unallocated GPU capacity at the end
    frag_gpus: float
    unallocated_gpus: float
    first_failure_arrived_share: float | None
    curve: list[dict[str, float]]
    wall_s: float
    params: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


class Fill:
    """One fill run; :meth:`run` submits pods until the target share, :meth:`result` reports."""

    def __init__(self, pods: Sequence[Job], spec: ClusterSpec, policy: PlacementPolicy, *, seed: int = 0,
                 until: float = 1.0, checkpoints: int = 20, predictor_error: float = 0.0,
                 max_pods: int | None = None):
        self.pods = [p for p in pods if p.num_gpus > 0]
        validate_jobs(self.pods)
        if not self.pods:
            raise ValueError("no GPU pods to sample from")
        self.spec, self.policy, self.seed = spec, policy, seed
        self.until, self.predictor_error = until, predictor_error
        self.state = ClusterState(spec)
        self.state.workload = workload_types(self.pods)
        self.cv = self.state.view()
        policy.reset(seed)
        pu, pm = noisy_predictions(self.pods, predictor_error, seed)
        self.views = job_views(self.pods, pu, pm)
        self.capacity = self.state.n_gpus * MILLI
        self.rng = np.random.default_rng([seed, 0xF111])
        self.arrived = self.allocated = 0.0
        self.submitted = self.placed = self.failed = self.ooms = 0
        self.first_fail: float | None = None
        self.curve: list[dict[str, float]] = []
        self.marks = [self.capacity * until * (k + 1) / checkpoints for k in range(checkpoints)]
        self.limit = max_pods if max_pods is not None else 10 * self.state.n_gpus + 1000

    def run(self) -> "Fill":
        next_mark = 0
        while self.arrived < self.capacity * self.until and self.submitted < self.limit:
            self._submit_one()
            while next_mark < len(self.marks) and self.arrived >= self.marks[next_mark]:
                self.curve.append(self.snapshot())
                next_mark += 1
        return self

    def _submit_one(self) -> None:
        """Sample a pod, submit it; it is placed (and stays) or counted as failed."""
        k = int(self.rng.integers(len(self.pods)))
        p, v = self.pods[k], self.views[k]
        view = JobView(f"{v.job_id}#{self.submitted}", 0.0, v.num_gpus, v.gpu_milli, v.pred_util_pct, v.pred_mem_mb,
                       v.cpu_milli, v.ram_mib, v.single_node, v.model, v.batch_size)
        self.submitted += 1
        req = p.num_gpus * min(p.gpu_milli, MILLI)
        self.arrived += req
        gpus = checked_placement(self.policy, view, self.state, self.cv, 0.0)
        if gpus is not None:
            if self.state.fits_memory(gpus, float(p.true_mem_mb)):
                self.state.add(view, gpus, true_util=float(p.true_util_pct), true_mem=float(p.true_mem_mb), now=0.0)
                self.placed += 1
                self.allocated += req
                return
            self.ooms += 1
        self.failed += 1
        if self.first_fail is None:
            self.first_fail = self.arrived / self.capacity

    def snapshot(self) -> dict[str, float]:
        fr, free = self.state.fragmentation()
        return {
            "arrived_share": self.arrived / self.capacity,
            "allocated_share": self.allocated / self.capacity,
            "occupied_share": 1.0 - self.state.free_gpus / self.state.n_gpus,
            "frag_rate": fr / free if free > 0 else 0.0,
            "frag_gpus": fr / MILLI,
            "unallocated_gpus": (self.capacity - self.allocated) / MILLI,
            "failed": float(self.failed),
        }

    def result(self, *, wall_s: float) -> FillResult:
        end = self.snapshot()
        return FillResult(
            policy=self.policy.name,
            cluster=self.spec.summary(),
            seed=self.seed,
            submitted=self.submitted,
            placed=self.placed,
            failed=self.failed,
            oom_events=self.ooms,
            allocated_share=end["allocated_share"],
            occupied_share=end["occupied_share"],
            frag_rate=end["frag_rate"],
            frag_gpus=end["frag_gpus"],
            unallocated_gpus=end["unallocated_gpus"],
            first_failure_arrived_share=self.first_fail,
            curve=self.curve,
            wall_s=wall_s,
            params={"policy": self.policy.describe(), "until": self.until, "predictor_error": self.predictor_error},
        )
