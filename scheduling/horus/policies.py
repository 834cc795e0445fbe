"""Placement policies: Horus and the baselines, behind one interface.

A policy gets a :class:`~.cluster.JobView` (request + predictions, never the
job's true utilization or memory) and a read-only
:class:`~.cluster.ClusterView`, and returns the GPU indices to run the job on,
or ``None`` to leave it waiting::

    class PlacementPolicy:
        name: str
        def place(self, job: JobView, cluster: ClusterView, now: float) -> list[int] | None
        def rebalance(self, cluster: ClusterView, now: float) -> list[tuple[str, list[int]]]
        def score(self, job: JobView, cluster: ClusterView, gpus: Sequence[int]) -> float | None

``score`` is the policy's own cost of a placement (lower is better; what the
placement service records), ``None`` for a policy that ranks by no cost.
``rebalance`` (optional) returns migrations ``(job_id, new_gpus)``; the
simulator calls it after jobs finish. Hard constraints every policy honours:
the job's GPU count, one node for ``single_node`` jobs, node CPU/RAM where
modelled, and ``gpu_milli`` shares when the cluster enforces them. The
simulator re-checks them and rejects (raises) a placement that breaks one; a
placement whose TRUE memory does not fit fails as an out-of-memory crash.

Policies (registry :data:`POLICIES`):

* ``fifo_exclusive`` - one job per GPU, first fit (YARN-CS FIFO as Tiresias
  models it).
* ``gandiva`` - Gandiva-like packing as the Horus authors' simulator has it:
  cost = 1.3 x (measured mem + job mem) / GPU mem + CURRENT MEASURED
  utilization / 100 + jobs on the GPU; the incoming job's utilization is not
  predicted. Same 3-jobs / 500 MB limits.
* ``best_fit`` - bin packing: the feasible GPU with the least room left
  (milli shares when enforced, else predicted memory), at most 3 jobs/GPU.
* ``random_fit`` - a seeded uniformly random feasible GPU, at most 3 jobs/GPU.
* ``horus`` - Horus (TPDS'22) as its authors run it: cost = 1.3 x (mem in use
  + job mem) / GPU mem + |util + job util - 100| / 100 (x 1.6 when over 100)
  + jobs on the GPU, where ``util`` is the GPU's SAMPLED utilization (what
  telemetry reports, capped at 100 %) and ``job util``/``job mem`` the
  incoming job's PREDICTED ones; lowest wins; at most 3 jobs per GPU and at
  least 500 MB left free when co-locating (an empty GPU is always eligible
  unless the job is known from an OOM crash not to fit); it looks ahead over
  the first 5 waiting jobs (``queue_lookahead``) instead of strict FIFO.
  ``state="predicted"`` (sum of the placed jobs' predictions) is kept as a variant.
* ``horus_migrate`` - Horus plus re-packing on telemetry: a GPU whose measured
  demand (sum of its jobs' sampled per-process utilization) is over 100 %
  moves one job to a GPU where it fits. It sees only what NVML can: sampled
  utilization of running jobs (stretched while they share), never their true
  standalone utilization.
* ``fgd`` - Fragmentation Gradient Descent (ATC'23): the placement that
  least increases the node's expected fragmentation for the target workload,
  node CPU, memory and GPU type included (as FGD's artifact); request-based
  (honours ``gpu_milli`` even when the cluster does not enforce it, so
  whole-GPU jobs never share). CPU-only pods (the fill method) go to the node
  whose fragmentation they grow least.
* ``usage_fgd`` (ours, :mod:`.usage_fgd`, registered by the package) - FGD on
  predicted usage, overcommitting under a fitted-interference bound.

A pod's ``gpu_type`` (Alibaba ``gpu_spec``) is a hard constraint for every policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .cluster import MILLI, ClusterView, JobView, WorkloadType, fgd_fragmentation, workload_types

__all__ = [
    "PlacementPolicy",
    "FifoExclusive",
    "TiresiasLAS",
    "Gandiva",
    "BestFit",
    "RandomFit",
    "Horus",
    "HorusMigrate",
    "MoveScratch",
    "FGD",
    "POLICIES",
    "make_policy",
    "horus_score",
    "HORUS_MAX_JOBS_PER_GPU",
    "HORUS_HEADROOM_MB",
    "HORUS_QUEUE_LOOKAHEAD",
]

HORUS_MAX_JOBS_PER_GPU = 3
HORUS_HEADROOM_MB = 500.0
#: waiting jobs Horus's scheduler considers per pass (the authors' simulator: the first 5 in the queue)
HORUS_QUEUE_LOOKAHEAD = 5


def horus_score(
    util_in_use: np.ndarray | float,
    mem_in_use: np.ndarray | float,
    n_jobs: np.ndarray | float,
    mem_cap: np.ndarray | float,
    job_util: float,
    job_mem: float,
    *,
    mem_weight: float = 1.3,
    over_penalty: float = 1.6,
) -> np.ndarray:
    """Horus placement cost (lower is better), vectorised over GPUs."""
    mem_term = mem_weight * (np.asarray(mem_in_use, float) + job_mem) / np.asarray(mem_cap, float)
    over = np.asarray(util_in_use, float) + job_util - 100.0
    util_term = np.abs(over) / 100.0 * np.where(over > 0, over_penalty, 1.0)
    return mem_term + util_term + np.asarray(n_jobs, float)


def _base_mask(job: JobView, cv: ClusterView, *, respect_milli: bool | None = None) -> np.ndarray:
    """GPUs that satisfy the hard constraints every policy honours."""
    mask = np.ones(cv.n_gpus, dtype=bool)
    if respect_milli if respect_milli is not None else cv.enforce_milli:
        mask &= cv.milli_used + job.gpu_milli <= MILLI
    ok = cv.node_cpu_ok(job)
    if ok is not None:
        mask &= ok
    typed = cv.gpu_type_ok(job)
    if typed is not None:
        mask &= typed
    return mask


def _nodes_with_room(job: JobView, cv: ClusterView) -> np.ndarray:
    """Nodes with a CPU-only job's CPU and memory free."""
    return np.array([cv.node_has_room(job, n) for n in range(cv.n_nodes)], dtype=bool)


def _choose(job: JobView, cv: ClusterView, cost: np.ndarray, mask: np.ndarray) -> list[int] | None:
    """The ``job.num_gpus`` feasible GPUs of lowest cost (ties: lowest index);
    for ``single_node`` jobs, the node whose k best GPUs cost least."""
    k = job.num_gpus
    idx = np.flatnonzero(mask)
    if len(idx) < k:
        return None
    if k == 1:
        return [int(idx[np.argmin(cost[idx])])]
    if not job.single_node:
        order = np.lexsort((idx, cost[idx]))
        return sorted(int(g) for g in idx[order[:k]])
    best: tuple[float, int] | None = None
    best_gpus: list[int] | None = None
    nodes = cv.gpu_node[idx]
    counts = np.bincount(nodes, minlength=cv.n_nodes)
    for n in np.flatnonzero(counts >= k):
        g = idx[nodes == n]
        order = np.lexsort((g, cost[g]))[:k]
        total = float(cost[g[order]].sum())
        if best is None or total < best[0] - 1e-12:
            best = (total, int(n))
            best_gpus = sorted(int(x) for x in g[order])
    return best_gpus


class PlacementPolicy:
    """Base class. Subclasses set ``name`` and implement :meth:`place`."""

    name = "base"
    #: whether the policy may put several jobs on one GPU
    shares_gpus = False
    #: True if refusing a request implies refusing any request at least as
    #: large in every dimension (GPUs, milli, CPU, RAM, memory, predicted
    #: util, single-node) at the same cluster state; lets the simulator skip
    #: hopeless backfill attempts. Set False in a policy where that fails.
    monotone_feasibility = True
    #: waiting jobs (from the queue's head) offered per scheduling pass; 1 = strict FIFO. The simulator
    #: uses the larger of this and its ``backfill`` window.
    queue_lookahead = 1

    def reset(self, seed: int = 0) -> None:
        """Called by the simulator before a run (clear state, reseed)."""

    def place(self, job: JobView, cluster: ClusterView, now: float) -> list[int] | None:
        raise NotImplementedError

    def rebalance(self, cluster: ClusterView, now: float) -> list[tuple[str, list[int]]]:
        return []

    def reserve(self, job: JobView, cluster: ClusterView) -> JobView:
        """What the policy holds for ``job`` on its GPUs (the fill method asks): its request, by default.
        A policy that overcommits returns a view asking for a smaller ``gpu_milli``."""
        return job

    def target_workload(self, pods: Sequence[Any], popularity: float) -> list[WorkloadType]:
        """The task shapes a fill tells the cluster are its target workload (``ClusterView.workload``):
        FGD's typical pods keyed on GPUs, share, CPU, memory and GPU type, by default."""
        return workload_types(pods, popularity=popularity)

    def place_cpu_pod(self, job: JobView, cluster: ClusterView) -> int | None:
        """The node for a CPU-only pod (no GPUs; the fill method has them), None if none has room.
        Default: first fit (lowest node index)."""
        idx = np.flatnonzero(_nodes_with_room(job, cluster))
        return int(idx[0]) if len(idx) else None

    def score(self, job: JobView, cluster: ClusterView, gpus: Sequence[int]) -> float | None:
        """The policy's cost (lower is better) of putting ``job`` on ``gpus`` at this cluster state, summed
        over the GPUs; ``None`` (the default) when the policy ranks by no cost (first fit, random)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "shares_gpus": self.shares_gpus}


class FifoExclusive(PlacementPolicy):
    """One job per GPU; first fit (lowest GPU index), which also packs nodes."""

    name = "fifo_exclusive"

    def place(self, job, cluster, now):
        if cluster.free_gpus < job.num_gpus:
            return None
        mask = _base_mask(job, cluster) & (cluster.n_jobs == 0)
        return _choose(job, cluster, np.arange(cluster.n_gpus, dtype=float), mask)


class TiresiasLAS(FifoExclusive):
    """Tiresias-style discretized least attained service (Gu et al., NSDI 2019), two queues, no job
    durations known: a job's attained service is its GPUs x time run; below ``threshold_gpu_s`` it is in
    the high queue (level 0), from there on in the low one (level 1). The replay orders its queue by level,
    then arrival, and a waiting job preempts running jobs of a lower level (checkpointed: the restore costs
    the replay's ``migration_cost_s``). Placement is FIFO exclusive's (one job per GPU). Not in
    :data:`POLICIES` (a baseline of the held-out bench, not offered to the API)."""

    name = "las"

    def __init__(self, *, threshold_gpu_s: float = 3600.0):
        if not threshold_gpu_s > 0:
            raise ValueError("threshold_gpu_s must be > 0")
        self.threshold_gpu_s = float(threshold_gpu_s)

    def service_level(self, attained_gpu_s: float) -> int:
        """0 (high queue) below the threshold, 1 (low queue) from it on."""
        return 0 if attained_gpu_s < self.threshold_gpu_s else 1

    def demotion_after(self, attained_gpu_s: float, num_gpus: int) -> float | None:
        """Seconds of running on ``num_gpus`` GPUs until the job drops to the low queue (None: it is there)."""
        left = self.threshold_gpu_s - attained_gpu_s
        return left / max(1, num_gpus) if left > 0 else None

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "queues": 2,
            "threshold_gpu_s": self.threshold_gpu_s,
            "preemptive": True,
            "durations_known": False,
        }


class _SharingPolicy(PlacementPolicy):
    shares_gpus = True

    def __init__(self, *, max_jobs_per_gpu: int = HORUS_MAX_JOBS_PER_GPU, headroom_mb: float = HORUS_HEADROOM_MB):
        self.max_jobs = int(max_jobs_per_gpu)
        self.headroom_mb = float(headroom_mb)

    def _mask(self, job: JobView, cv: ClusterView, mem_in_use: np.ndarray, job_mem: float) -> np.ndarray:
        """Hard constraints + at most ``max_jobs`` per GPU + ``headroom_mb`` left
        free when co-locating. An empty GPU is always eligible unless the job is
        KNOWN (from an earlier out-of-memory crash) not to fit: a prediction
        alone must not keep a job from ever running."""
        mask = _base_mask(job, cv)
        mask &= cv.n_jobs < self.max_jobs
        left = cv.mem_cap_mb - (mem_in_use + job_mem)
        mask &= (left >= self.headroom_mb) | ((cv.n_jobs == 0) & (cv.mem_cap_mb >= job.mem_floor_mb))
        return mask

    def describe(self):
        return {**super().describe(), "max_jobs_per_gpu": self.max_jobs, "headroom_mb": self.headroom_mb}


class _CostRanked(_SharingPolicy):
    """A sharing policy that ranks GPUs by ``cost(job, cluster) -> (cost, feasible mask)``: it places on
    the cheapest feasible GPUs and scores a placement by their cost."""

    def cost(self, job: JobView, cv: ClusterView) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def place(self, job, cluster, now):
        cost, mask = self.cost(job, cluster)
        return _choose(job, cluster, cost, mask)

    def score(self, job, cluster, gpus):
        cost, _ = self.cost(job, cluster)
        return float(np.sum(cost[[int(g) for g in gpus]]))


class Horus(_CostRanked):
    """Horus: lowest :func:`horus_score` on the GPUs' sampled utilization and the job's prediction."""

    name = "horus"
    STATES = ("sampled", "predicted", "measured")

    def __init__(
        self,
        *,
        max_jobs_per_gpu: int = HORUS_MAX_JOBS_PER_GPU,
        headroom_mb: float = HORUS_HEADROOM_MB,
        state: str = "sampled",
        max_util_pct: float | None = None,
        queue_lookahead: int = HORUS_QUEUE_LOOKAHEAD,
    ):
        super().__init__(max_jobs_per_gpu=max_jobs_per_gpu, headroom_mb=headroom_mb)
        if state not in self.STATES:
            raise ValueError(f"state must be one of {', '.join(self.STATES)}")
        #: what the GPU's current load is taken from: its sampled device utilization, capped at 100 %
        #: (the authors' code, default); the sum of the placed jobs' predictions; or the sum of the
        #: running jobs' sampled per-process utilizations, uncapped
        self.state = state
        self.queue_lookahead = max(1, int(queue_lookahead))
        #: optional hard cap (not in the paper): never co-locate where the
        #: predicted utilization sum would exceed this; an empty GPU is always allowed
        self.max_util_pct = max_util_pct

    def _load(self, cv: ClusterView) -> tuple[np.ndarray, np.ndarray]:
        if self.state == "measured":
            return cv.demand_util_pct, cv.meas_mem_mb
        # memory in use: the larger of the placed jobs' predictions and what NVML measures (an
        # under-predicted neighbour must not cause an OOM)
        mem = np.maximum(cv.pred_mem_mb, cv.meas_mem_mb)
        return (cv.pred_util_pct if self.state == "predicted" else cv.meas_util_pct), mem

    def cost(self, job: JobView, cv: ClusterView) -> tuple[np.ndarray, np.ndarray]:
        """``(cost, feasible mask)`` over all GPUs."""
        util, mem = self._load(cv)
        jmem = max(job.pred_mem_mb, job.mem_floor_mb)
        mask = self._mask(job, cv, mem, jmem)
        if self.max_util_pct is not None:
            mask &= (cv.n_jobs == 0) | (util + job.pred_util_pct <= self.max_util_pct)
        return horus_score(util, mem, cv.n_jobs, cv.mem_cap_mb, job.pred_util_pct, jmem), mask

    def describe(self):
        return {
            **super().describe(),
            "state": self.state,
            "max_util_pct": self.max_util_pct,
            "queue_lookahead": self.queue_lookahead,
        }


class MoveScratch:
    """A rebalance round's working copy of the measured load (utilization demand, memory, jobs and milli
    shares per GPU), updated by each move so the next move of the same round sees it."""

    def __init__(self, cluster: ClusterView, max_jobs: int):
        self.dem = np.array(cluster.demand_util_pct, dtype=float)
        self.nj = np.array(cluster.n_jobs, dtype=float)
        self.mem = np.array(cluster.meas_mem_mb, dtype=float)
        self.milli = np.array(cluster.milli_used, dtype=float)
        self.open_gpu = self.nj < max_jobs

    def room(self) -> float:
        """The most utilization any open GPU can still take (0 when none is open)."""
        return 100.0 - float(np.min(np.where(self.open_gpu, self.dem, np.inf))) if self.open_gpu.any() else 0.0

    def move(self, rj, src: int, dst: int, max_jobs: int) -> None:
        u, m, k = rj.meas_util_pct, rj.meas_mem_mb, rj.view.gpu_milli
        self.dem[src] -= u
        self.mem[src] -= m
        self.nj[src] -= 1
        self.milli[src] -= k
        self.dem[dst] += u
        self.mem[dst] += m
        self.nj[dst] += 1
        self.milli[dst] += k
        self.open_gpu[src] = self.nj[src] < max_jobs
        self.open_gpu[dst] = self.nj[dst] < max_jobs


class HorusMigrate(Horus):
    """Horus plus re-packing on measurements.

    * admission: a job is co-located only where the running jobs' MEASURED
      demand plus its PREDICTED utilization stays within ``admit_util_pct``
      (an empty GPU is always fine), so a GPU measured as saturated takes no more;
    * migration: after jobs finish, a GPU whose measured demand exceeds
      ``100 + tolerance_pct`` moves the smallest single-GPU job whose departure
      ends the over-subscription to the GPU of lowest Horus cost (measured
      state) that can take it without exceeding 100 %. A job moves at most
      ``max_migrations`` times, only after ``min_runtime_s`` on its GPU, and
      pays the simulator's ``migration_cost_s``."""

    name = "horus_migrate"

    def __init__(
        self,
        *,
        tolerance_pct: float = 5.0,
        max_migrations: int = 2,
        min_runtime_s: float = 60.0,
        admit_util_pct: float | None = 110.0,
        max_examined: int = 8,
        **kw,
    ):
        super().__init__(**kw)
        self.tolerance = float(tolerance_pct)
        self.max_migrations = int(max_migrations)
        self.min_runtime_s = float(min_runtime_s)
        #: re-pack admission: co-locate only where the MEASURED demand of the
        #: running jobs plus the job's PREDICTED utilization stays within this
        #: (None: no gate, plain Horus placement)
        self.admit_util_pct = admit_util_pct
        #: over-subscribed GPUs examined per rebalance call (bounds the cost)
        self.max_examined = int(max_examined)

    def cost(self, job, cv):
        cost, mask = super().cost(job, cv)
        if self.admit_util_pct is not None:
            mask &= (cv.n_jobs == 0) | (cv.demand_util_pct + job.pred_util_pct <= self.admit_util_pct)
        return cost, mask

    def rebalance(self, cluster, now):
        scratch = self.scratch(cluster)
        if not scratch.open_gpu.any():
            return []
        room = scratch.room()  # most util any open GPU can take
        excess = scratch.dem - 100.0 - self.tolerance
        # a move must end the source's over-subscription, so the job moved
        # needs util >= excess and <= room: GPUs with excess > room are skipped
        hot = np.flatnonzero((excess > 0) & (scratch.nj >= 2) & (excess <= room))
        if len(hot) == 0:
            return []
        moves: list[tuple[str, list[int]]] = []
        # the most over-subscribed first; at most `max_examined` GPUs per call
        for g in hot[np.argsort(-excess[hot], kind="stable")][: self.max_examined]:
            ex = scratch.dem[g] - 100.0 - self.tolerance
            if ex <= 0 or ex > room:
                continue
            cands = [rj for rj in cluster.jobs_on(int(g)) if ex <= rj.meas_util_pct <= room and self.may_move(rj, now)]
            cands.sort(key=lambda rj: (rj.meas_util_pct, rj.view.job_id))  # smallest sufficient move
            for rj in cands:
                t = self.target_gpu(cluster, scratch, rj, int(g))
                if t is None:
                    continue
                moves.append((rj.view.job_id, [t]))
                scratch.move(rj, int(g), t, self.max_jobs)
                room = scratch.room()
                break
            if room <= 0:
                break
        return moves

    def scratch(self, cluster: ClusterView) -> MoveScratch:
        """Copies of the cluster's measured load that one round's moves update, so later ones see them."""
        return MoveScratch(cluster, self.max_jobs)

    def may_move(self, rj, now: float) -> bool:
        """A single-GPU job moved fewer than ``max_migrations`` times, on its GPU ``min_runtime_s`` or longer."""
        return (
            rj.view.num_gpus == 1 and rj.migrations < self.max_migrations and now - rj.start_time >= self.min_runtime_s
        )

    def target_gpu(self, cluster: ClusterView, scratch: MoveScratch, rj, src: int) -> int | None:
        """The GPU of lowest Horus cost (measured state) that takes ``rj`` from ``src`` within 100 %, or None."""
        u, m = rj.meas_util_pct, rj.meas_mem_mb
        dem, mem = scratch.dem, scratch.mem
        mask = scratch.open_gpu & (cluster.mem_cap_mb - (mem + m) >= self.headroom_mb) & (dem + u <= 100.0)
        if cluster.enforce_milli:
            mask &= scratch.milli + rj.view.gpu_milli <= MILLI
        ok = cluster.node_cpu_ok(rj.view)
        if ok is not None:
            mask &= ok & (cluster.gpu_node == cluster.gpu_node[src])  # CPU is reserved on its node
        mask[src] = False
        idx = np.flatnonzero(mask)
        if len(idx) == 0:
            return None
        cost = horus_score(dem[idx], mem[idx], scratch.nj[idx], cluster.mem_cap_mb[idx], u, m)
        return int(idx[np.argmin(cost)])

    def describe(self):
        return {
            **super().describe(),
            "tolerance_pct": self.tolerance,
            "max_migrations": self.max_migrations,
            "min_runtime_s": self.min_runtime_s,
            "admit_util_pct": self.admit_util_pct,
        }


class Gandiva(Horus):
    """Gandiva-like packing, as the Horus authors' simulator models it: the
    Horus constraints and memory term, but the utilization term is the GPU's
    CURRENT MEASURED utilization only (lower is better) - the incoming job's
    utilization is not predicted. The job's memory (its predicted/declared
    peak) is used, as in that simulator."""

    name = "gandiva"

    def __init__(self, **kw):
        kw.setdefault("queue_lookahead", 1)  # strict FIFO, as the baselines run
        super().__init__(state="measured", **kw)

    def cost(self, job, cv):
        jmem = max(job.pred_mem_mb, job.mem_floor_mb)
        mem = cv.meas_mem_mb
        mask = self._mask(job, cv, mem, jmem)
        score = 1.3 * (mem + jmem) / cv.mem_cap_mb + cv.meas_util_pct / 100.0 + cv.n_jobs
        return score, mask


class BestFit(_CostRanked):
    """Bin packing: least room left after placement (milli shares when the
    cluster enforces them, else predicted memory); ties to the lowest index."""

    name = "best_fit"

    def cost(self, job: JobView, cluster: ClusterView) -> tuple[np.ndarray, np.ndarray]:
        """``(room left after placement, feasible mask)`` over all GPUs."""
        jmem = max(job.pred_mem_mb, job.mem_floor_mb)
        mem = np.maximum(cluster.pred_mem_mb, cluster.meas_mem_mb)
        mask = self._mask(job, cluster, mem, jmem)
        if cluster.enforce_milli:
            cost = (MILLI - cluster.milli_used - job.gpu_milli) / MILLI + 1e-3 * (
                cluster.mem_cap_mb - mem - jmem
            ) / cluster.mem_cap_mb
        else:
            cost = (cluster.mem_cap_mb - mem - jmem) / cluster.mem_cap_mb
        return np.asarray(cost, float), mask

    def place_cpu_pod(self, job, cluster):
        """The node with the least CPU left after the pod (ties: lowest index)."""
        ok = _nodes_with_room(job, cluster)
        if not ok.any():
            return None
        left = np.where(ok, cluster.node_cpu_free() - job.cpu_milli, np.inf)
        return int(np.argmin(left))


class RandomFit(_SharingPolicy):
    """A uniformly random feasible GPU (seeded), same constraints as best_fit."""

    name = "random_fit"

    def __init__(self, *, seed: int = 0, **kw):
        super().__init__(**kw)
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def reset(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng([self.seed, seed])

    def place(self, job, cluster, now):
        jmem = max(job.pred_mem_mb, job.mem_floor_mb)
        mask = self._mask(job, cluster, np.maximum(cluster.pred_mem_mb, cluster.meas_mem_mb), jmem)
        if mask.sum() < job.num_gpus:
            return None
        return _choose(job, cluster, self.rng.random(cluster.n_gpus), mask)

    def place_cpu_pod(self, job, cluster):
        idx = np.flatnonzero(_nodes_with_room(job, cluster))
        return int(self.rng.choice(idx)) if len(idx) else None


class FGD(PlacementPolicy):
    """Fragmentation Gradient Descent (Weng et al., USENIX ATC'23): choose the
    placement whose node's expected fragmentation (for the target workload,
    ``cluster.workload``) grows least. The measure and the placement see GPU
    shares, node CPU and memory and GPU model (:func:`~.cluster.fgd_fragmentation`);
    a CPU-only pod goes to the node whose fragmentation its CPU grows least.
    Request-based: ``gpu_milli`` shares are always honoured, so whole-GPU jobs
    never share a GPU."""

    name = "fgd"

    def __init__(self) -> None:
        self._cache = _DeltaCache()

    def reset(self, seed: int = 0) -> None:
        self._cache = _DeltaCache()

    def place(self, job, cluster, now):
        if job.gpu_milli >= MILLI and cluster.free_gpus < job.num_gpus:
            return None  # whole GPUs needed and not enough empty ones
        mask = self._mask(job, cluster)
        frag = _NodeFrag(cluster, self._types(job, cluster), job, self._cache)
        nf = self._free(cluster)
        need = min(job.gpu_milli, MILLI)
        if job.num_gpus == 1:
            idx = np.flatnonzero(mask)
            if len(idx) == 0:
                return None
            return [int(idx[np.argmin(np.round(frag.delta_single(nf, idx, need), 6))])]  # ties: lowest index
        if job.single_node:
            return self._place_node(job, cluster, nf, mask, need, frag)
        # a gang across nodes: place one GPU at a time, each by least delta
        chosen: list[int] = []
        m = mask.copy()
        nf = nf.copy()
        for _ in range(job.num_gpus):
            idx = np.flatnonzero(m)
            if len(idx) == 0:
                return None
            g = int(idx[np.argmin(np.round(frag.delta_single(nf, idx, need), 6))])
            chosen.append(g)
            m[g] = False
            nf[cluster.gpu_node[g], cluster.gpu_slot[g]] -= need
        return sorted(chosen)

    def place_cpu_pod(self, job, cluster):
        """The node whose fragmentation grows least when the pod takes its CPU and memory."""
        ok = np.flatnonzero(_nodes_with_room(job, cluster))
        if len(ok) == 0:
            return None
        frag = _NodeFrag(cluster, self._types(job, cluster), job)
        nf = self._free(cluster)[ok]
        return int(ok[np.argmin(frag.of(nf, ok, taken=True) - frag.of(nf, ok, taken=False))])

    def score(self, job, cluster, gpus):
        """The growth of expected fragmentation (milli-GPUs) on the nodes the placement touches."""
        frag = _NodeFrag(cluster, self._types(job, cluster), job)
        before = self._free(cluster)
        after = before.copy()
        for g in gpus:
            after[cluster.gpu_node[g], cluster.gpu_slot[g]] -= min(job.gpu_milli, MILLI)
        nodes = np.unique(cluster.gpu_node[list(gpus)])
        return float(np.sum(frag.of(after[nodes], nodes, taken=True) - frag.of(before[nodes], nodes, taken=False)))

    # hooks a variant of FGD overrides (see horus.usage_fgd)
    def _mask(self, job: JobView, cluster: ClusterView) -> np.ndarray:
        return _base_mask(job, cluster, respect_milli=True)

    def _free(self, cluster: ClusterView) -> np.ndarray:
        """``(nodes, max_gpus)`` free milli per GPU, as FGD counts it (the requests placed)."""
        return cluster.node_free_milli()

    @staticmethod
    def _types(job: JobView, cluster: ClusterView) -> list[WorkloadType]:
        return cluster.workload or [
            WorkloadType(job.num_gpus, min(job.gpu_milli, MILLI), 1.0, job.cpu_milli, job.ram_mib, job.gpu_type)
        ]

    @staticmethod
    def _place_node(job, cv, nf, mask, need, frag: _NodeFrag) -> list[int] | None:
        k = job.num_gpus
        best: tuple[float, int] | None = None
        best_gpus = None
        idx = np.flatnonzero(mask)
        nodes = cv.gpu_node[idx]
        for n in np.unique(nodes):
            g = idx[nodes == n]
            if len(g) < k:
                continue
            # fill the fullest GPUs first (least free left unusable)
            free = nf[n, cv.gpu_slot[g]]
            pick = g[np.lexsort((g, free))[:k]]
            after = nf[n].copy()
            after[cv.gpu_slot[pick]] -= need
            at = np.array([n])
            d = float(frag.of(after[None, :], at, taken=True)[0] - frag.of(nf[n][None, :], at, taken=False)[0])
            if best is None or d < best[0] - 1e-12:
                best = (d, int(n))
                best_gpus = sorted(int(x) for x in pick)
        return best_gpus


class _NodeFrag:
    """FGD's fragmentation of chosen nodes for one job's placement: the nodes' CPU/memory free before
    (``taken=False``) or after (``taken=True``) the job takes its CPU and memory there."""

    def __init__(self, cv: ClusterView, types: Sequence[WorkloadType], job: JobView, cache: _DeltaCache | None = None):
        self.cv, self.types, self.job, self.cache = cv, types, job, cache
        self.cpu, self.ram = cv.node_cpu_free(), cv.node_ram_free()
        self.access = cv.type_access(types)

    def of(self, node_free: np.ndarray, nodes: np.ndarray, *, taken: bool) -> np.ndarray:
        """Fragmentation of rows ``node_free`` (one per entry of ``nodes``)."""
        cpu, ram = self.cpu[nodes], self.ram[nodes]
        if taken:
            cpu, ram = cpu - self.job.cpu_milli, ram - self.job.ram_mib
        acc = None if self.access is None else self.access[nodes]
        return fgd_fragmentation(node_free, self.types, cpu_free=cpu, ram_free=ram, access=acc)

    def delta_single(self, nf: np.ndarray, idx: np.ndarray, need: int) -> np.ndarray:
        """Fragmentation increase of taking ``need`` from each candidate GPU ``idx`` (and the job's
        CPU/memory from its node). With a cache, only the nodes whose state changed since the last
        call for the same request shape are recomputed; without one, the work is per distinct
        (node, free) pair (GPUs of one node with the same free amount are interchangeable)."""
        cv = self.cv
        nodes = cv.gpu_node[idx]
        if self.cache is not None:
            return self.cache.deltas(self, nf, need)[nodes, cv.gpu_slot[idx]]
        slot_free = nf[nodes, cv.gpu_slot[idx]]
        keys = nodes.astype(np.int64) * (MILLI + 1) + slot_free
        uk, first, inv = np.unique(keys, return_index=True, return_inverse=True)
        d = self.rows_delta(nf, nodes[first], cv.gpu_slot[idx[first]], need)
        return d[inv.reshape(-1)]

    def rows_delta(self, nf: np.ndarray, nodes: np.ndarray, slots: np.ndarray, need: int) -> np.ndarray:
        """Fragmentation increase of taking ``need`` from GPU ``slots[i]`` of node ``nodes[i]``."""
        before = nf[nodes]
        after = before.copy()
        after[np.arange(len(nodes)), slots] -= need
        # one measure over the rows after and, once per distinct node, before (rows are independent)
        un, inv = np.unique(nodes, return_inverse=True)
        cpu = np.concatenate([self.cpu[nodes] - self.job.cpu_milli, self.cpu[un]])
        ram = np.concatenate([self.ram[nodes] - self.job.ram_mib, self.ram[un]])
        acc = None if self.access is None else self.access[np.concatenate([nodes, un])]
        f = fgd_fragmentation(np.concatenate([after, nf[un]]), self.types, cpu_free=cpu, ram_free=ram, access=acc)
        return f[: len(nodes)] - f[len(nodes) :][inv.reshape(-1)]


class _DeltaCache:
    """FGD's per-GPU fragmentation growth for each request shape, kept between placements: a
    placement changes one node, so only that node's rows are recomputed (found by comparing the
    nodes' free GPU shares, CPU and memory with those the rows were computed for)."""

    def __init__(self) -> None:
        self.types: Sequence[WorkloadType] | None = None
        self.shapes: dict[tuple[int, int, int, str], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}

    def deltas(self, frag: _NodeFrag, nf: np.ndarray, need: int) -> np.ndarray:
        """``(nodes, max_gpus)`` growth of taking ``need`` from each GPU (garbage where it does not fit)."""
        if frag.types is not self.types:
            self.types, self.shapes = frag.types, {}
        job = frag.job
        key = (need, job.cpu_milli, job.ram_mib, job.gpu_type)
        got = self.shapes.get(key)
        if got is None:
            changed = np.arange(nf.shape[0])
            got = (nf.copy(), frag.cpu.copy(), frag.ram.copy(), np.zeros(nf.shape))
            self.shapes[key] = got
        else:
            changed = np.flatnonzero((got[0] != nf).any(axis=1) | (got[1] != frag.cpu) | (got[2] != frag.ram))
        if len(changed):
            sig_nf, sig_cpu, sig_ram, delta = got
            width = nf.shape[1]
            nodes = np.repeat(changed, width)
            slots = np.tile(np.arange(width), len(changed))
            delta[changed] = frag.rows_delta(nf, nodes, slots, need).reshape(len(changed), width)
            sig_nf[changed], sig_cpu[changed], sig_ram[changed] = nf[changed], frag.cpu[changed], frag.ram[changed]
        return got[3]


PolicyFactory = Callable[..., PlacementPolicy]

#: name -> factory (keyword arguments are the policy's options)
POLICIES: dict[str, PolicyFactory] = {
    "fifo_exclusive": FifoExclusive,
    "gandiva": Gandiva,
    "best_fit": BestFit,
    "random_fit": RandomFit,
    "horus": Horus,
    "horus_migrate": HorusMigrate,
    "fgd": FGD,
}


def make_policy(name: str, **options: Any) -> PlacementPolicy:
    """Instantiate a registered policy by name (``KeyError`` lists the names)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return factory(**options)
