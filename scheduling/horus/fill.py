"""The fill method (ATC'23) as a small class: sampled pods are submitted one by one and never leave,
until the submitted GPU request reaches a share of the cluster's capacity (see :mod:`.simulator`).

As in FGD's artifact, the pods are sampled from the whole pod list, CPU-only pods included: they take
node CPU and memory (which can leave a node's idle GPUs unusable) and are part of FGD's target
workload (its most popular task shapes covering :data:`FGD_POPULARITY` of the pods). A policy may
reserve less than a pod's request on a GPU (:meth:`~.policies.PlacementPolicy.reserve`, only
``usage_fgd`` does): allocation is still counted by requests, and the reservations' predicted and
TRUE interference are reported beside it (``sharing``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from common.jsonsafe import json_safe

from .cluster import MILLI, ClusterSpec, ClusterState, JobView
from .interference import FittedInterference
from .policies import PlacementPolicy
from .profiles import util_on_gpu
from .sim_inputs import (
    STOP_CHECK_EVERY,
    SimulationStopped,
    StopCheck,
    checked_placement,
    job_views,
    noisy_predictions,
    validate_jobs,
)
from .traces import Job

__all__ = ["FillResult", "Fill", "FGD_POPULARITY", "BOUND_MIN_SPEED", "sharing_stats"]

#: share of the pods FGD's typical task shapes cover (the artifact's ``podPopularityThreshold``, 95 %)
FGD_POPULARITY = 0.95


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
    cpu_pods: dict[str, int] = field(default_factory=dict)  # CPU-only pods submitted / placed / failed
    reserved_share: float = 0.0  # milli the policy reserved on GPUs / capacity (< allocated: overcommitted)
    sharing: dict[str, Any] = field(default_factory=dict)  # interference of the final placement

    def to_dict(self) -> dict[str, Any]:
        return json_safe(asdict(self))


class Fill:
    """One fill run; :meth:`run` submits pods until the target share, :meth:`result` reports."""

    def __init__(
        self,
        pods: Sequence[Job],
        spec: ClusterSpec,
        policy: PlacementPolicy,
        *,
        seed: int = 0,
        until: float = 1.0,
        checkpoints: int = 20,
        predictor_error: float = 0.0,
        max_pods: int | None = None,
        popularity: float = FGD_POPULARITY,
        sampling: str = "replacement",
        tune: float = 1.3,
    ):
        self.pods = list(pods)
        validate_jobs(self.pods)
        if not any(p.num_gpus > 0 for p in self.pods):
            raise ValueError("no GPU pods to sample from")
        self.spec, self.policy, self.seed = spec, policy, seed
        self.until, self.predictor_error = until, predictor_error
        self.state = ClusterState(spec)
        self.state.workload = policy.target_workload(self.pods, popularity)
        self.cv = self.state.view()
        policy.reset(seed)
        pu, pm = noisy_predictions(self.pods, predictor_error, seed)
        self.views = job_views(self.pods, pu, pm)
        self.capacity = self.state.n_gpus * MILLI
        self.rng = np.random.default_rng([seed, 0xF111])
        self.arrived = self.allocated = self.reserved = 0.0
        self.submitted = self.placed = self.failed = self.ooms = 0
        self.cpu_count = {"submitted": 0, "placed": 0, "failed": 0}
        self.first_fail: float | None = None
        self.curve: list[dict[str, float]] = []
        self.marks = [self.capacity * until * (k + 1) / checkpoints for k in range(checkpoints)]
        self.limit = max_pods if max_pods is not None else 10 * self.state.n_gpus + 1000
        self.popularity = popularity
        if sampling not in ("replacement", "tuned"):
            raise ValueError("sampling must be 'replacement' or 'tuned'")
        self.sampling, self.tune = sampling, float(tune)
        self.order = self._tuned_order() if sampling == "tuned" else None

    def run(self, *, should_stop: StopCheck | None = None) -> Fill:
        """Submit pods until the target share; ``should_stop`` (if given) is asked every ``STOP_CHECK_EVERY``
        pods, and True raises :class:`SimulationStopped`."""
        next_mark = 0
        while self.arrived < self.capacity * self.until and self.submitted < self.limit:
            if should_stop is not None and self.submitted % STOP_CHECK_EVERY == 0 and should_stop():
                raise SimulationStopped(f"stopped after {self.submitted} pods")
            self._submit_one()
            while next_mark < len(self.marks) and self.arrived >= self.marks[next_mark]:
                self.curve.append(self.snapshot())
                next_mark += 1
        return self

    def _tuned_order(self) -> list[int]:
        """The ATC'23 artifact's workload tuning: every pod of the list once, then pods drawn uniformly
        (with replacement) and appended until the list's GPU request reaches ``tune`` x capacity (pods
        removed at random instead where it is above), the whole stream shuffled."""
        req = [p.num_gpus * min(p.gpu_milli, MILLI) for p in self.pods]
        order = list(range(len(self.pods)))
        total, target = float(sum(req)), self.tune * self.capacity
        while total > target and order:
            total -= req[order.pop(int(self.rng.integers(len(order))))]
        while True:
            k = int(self.rng.integers(len(self.pods)))
            # the artifact stops at the first draw whose per-GPU share would pass the target
            if total + min(self.pods[k].gpu_milli, MILLI) > target:
                break
            total += req[k]
            order.append(k)
        self.rng.shuffle(order)
        return order

    def _submit_one(self) -> None:
        """Sample a pod, submit it; it is placed (and stays) or counted as failed."""
        if self.order is not None:
            if self.submitted >= len(self.order):
                self.limit = self.submitted  # the tuned stream is used up
                return
            k = self.order[self.submitted]
        else:
            k = int(self.rng.integers(len(self.pods)))
        p = self.pods[k]
        view = replace(self.views[k], job_id=f"{p.job_id}#{self.submitted}", submit_time=0.0)
        self.submitted += 1
        if p.num_gpus == 0:
            self._submit_cpu_pod(view)
            return
        req = p.num_gpus * min(p.gpu_milli, MILLI)
        self.arrived += req
        held = self.policy.reserve(view, self.cv)
        gpus = checked_placement(self.policy, held, self.state, self.cv, 0.0)
        if gpus is not None:
            if self.state.fits_memory(gpus, p.run_mem_mb):
                self.state.add(held, gpus, true_util=self._true_util(p, gpus), true_mem=p.run_mem_mb, now=0.0)
                self.placed += 1
                self.allocated += req
                self.reserved += held.num_gpus * min(held.gpu_milli, MILLI)
                return
            self.ooms += 1
        self.failed += 1
        if self.first_fail is None:
            self.first_fail = self.arrived / self.capacity

    def _true_util(self, p: Job, gpus: Sequence[int]) -> float:
        """The pod's TRUE utilization on the GPU type it got (its profile's holds for ``util_gpu_model``;
        a slower type is busier for the same work, :func:`.profiles.util_on_gpu`)."""
        if p.util_gpu_model is None:
            return p.run_util_pct
        return max(
            util_on_gpu(p.run_util_pct, measured_on=p.util_gpu_model, run_on=m, model=p.model)
            for m in {self.state.gpu_model[g] for g in gpus}
        )

    def _submit_cpu_pod(self, view: JobView) -> None:
        """A CPU-only pod takes CPU and memory on the node its policy picks (no GPU request)."""
        self.cpu_count["submitted"] += 1
        node = self.policy.place_cpu_pod(view, self.cv)
        if node is None:
            self.cpu_count["failed"] += 1
            return
        self.state.add_cpu_pod(view, int(node))
        self.cpu_count["placed"] += 1

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
            params={
                "policy": self.policy.describe(),
                "until": self.until,
                "predictor_error": self.predictor_error,
                "sampling": self.sampling,
                **({"tune": self.tune} if self.sampling == "tuned" else {}),
                "fgd_popularity": self.popularity,
                "fgd_task_shapes": len(self.state.workload),
            },
            cpu_pods=dict(self.cpu_count),
            reserved_share=self.reserved / self.capacity,
            sharing=sharing_stats(self.state),
        )


#: the interference bound checked on TRUE utilizations: every pod keeps this share of its standalone speed
#: (``usage_fgd``'s ``min_speed``: the bound it enforces on its PREDICTIONS)
BOUND_MIN_SPEED = 0.75


def sharing_stats(
    state: ClusterState, model: FittedInterference | None = None, min_speed: float = BOUND_MIN_SPEED
) -> dict[str, Any]:
    """How the final placement shares GPUs, under the fitted interference model with the pods' TRUE
    utilizations: GPUs with more than one pod, the pods' mean, 95th- and 99th-percentile slowdown
    (1 / speed), the share of pods slowed by more than 25 %, and the GPUs where a pod runs below
    ``min_speed`` (the interference bound, judged on the truth). (A fill has no time: this is what
    running the final placement would cost, not a measurement.)"""
    model = model or _fitted_model()
    slow: list[float] = []
    shared = over = 0
    for g, ids in enumerate(state.jobs_on):
        if not ids:
            continue
        utils = [min(1.0, state.running[j].meas_util_pct / 100.0) for j in ids]
        speeds = model.speeds(utils, gpu_type=state.gpu_model[g]) if len(ids) > 1 else [1.0]
        shared += len(ids) > 1
        over += min(speeds) < min_speed - 1e-12
        slow.extend(1.0 / max(s, 1e-9) for s in speeds)
    arr = np.array(slow) if slow else np.ones(1)
    return {
        "shared_gpus": shared,
        "mean_slowdown": float(arr.mean()),
        "p95_slowdown": float(np.percentile(arr, 95)),
        "p99_slowdown": float(np.percentile(arr, 99)),
        "share_slowed_over_25pct": float((arr > 1.25).mean()),
        "bound_min_speed": min_speed,
        "gpus_over_bound": int(over),
        "model": "fitted (true utilizations)",
    }


_FITTED_CACHE: list[FittedInterference] = []


def _fitted_model() -> FittedInterference:
    if not _FITTED_CACHE:
        _FITTED_CACHE.append(FittedInterference.from_data())
    return _FITTED_CACHE[0]
