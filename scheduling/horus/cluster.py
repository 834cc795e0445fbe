"""Cluster model shared by the policies and the simulator.

* :class:`NodeSpec` / :class:`ClusterSpec`: what the cluster is.
* :class:`JobView`: what a policy may know about a job - its request and the
  predictor's output, never its true utilization or memory.
* :class:`ClusterState`: live per-GPU state (numpy arrays) mutated only by the
  simulator (or a test), with hard-constraint checks.
* :class:`ClusterView`: the read-only face of a state that policies get:
  predicted sums of what the scheduler placed, and *measured* values (what
  NVML would report for running jobs).
* :func:`fgd_fragmentation`: the ATC'23 fragmentation measure (GPU shares,
  node CPU/memory and GPU type, CPU-only task types), as FGD's artifact
  defines it.

GPU shares are in milli-GPUs (1000 = one whole GPU), as in the Alibaba trace.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "MILLI",
    "NodeSpec",
    "ClusterSpec",
    "JobView",
    "RunningJob",
    "ClusterState",
    "ClusterView",
    "PlacementError",
    "WorkloadType",
    "workload_types",
    "fgd_fragmentation",
    "gpu_type_allows",
]

MILLI = 1000


class PlacementError(ValueError):
    """A policy returned a placement that breaks a hard constraint."""


@dataclass(frozen=True)
class NodeSpec:
    """One machine. ``cpu_milli``/``ram_mib`` of 0 mean "not modelled"."""

    name: str
    num_gpus: int
    gpu_model: str = "V100"
    gpu_mem_mb: float = 16384.0
    cpu_milli: int = 0
    ram_mib: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: ``Node`` is the name the trace parser uses.
Node = NodeSpec


@dataclass(frozen=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]
    name: str = "cluster"
    #: True: a GPU's ``gpu_milli`` shares may not exceed 1000 (Alibaba's GPU
    #: sharing); False: requests are whole GPUs and sharing policies co-locate
    #: jobs regardless (Philly, Horus).
    enforce_milli: bool = False
    note: str = ""

    @classmethod
    def uniform(
        cls,
        n_nodes: int,
        gpus_per_node: int,
        *,
        gpu_model: str = "V100",
        gpu_mem_mb: float = 16384.0,
        name: str | None = None,
        enforce_milli: bool = False,
        note: str = "",
    ) -> ClusterSpec:
        nodes = tuple(NodeSpec(f"node-{i:04d}", gpus_per_node, gpu_model, gpu_mem_mb) for i in range(n_nodes))
        return cls(nodes, name or f"{n_nodes}x{gpus_per_node} {gpu_model}", enforce_milli, note)

    @property
    def n_gpus(self) -> int:
        return sum(n.num_gpus for n in self.nodes)

    def scaled(self, fraction: float, *, seed: int = 0, name: str | None = None) -> ClusterSpec:
        """A stratified sample of the nodes (same mix of GPU model and GPU count), at least one node per stratum."""
        if not 0 < fraction <= 1:
            raise ValueError("fraction must be in (0, 1]")
        rng = np.random.default_rng(seed)
        strata: dict[tuple[str, int], list[NodeSpec]] = {}
        for n in self.nodes:
            strata.setdefault((n.gpu_model, n.num_gpus), []).append(n)
        keep: list[NodeSpec] = []
        for key in sorted(strata):
            group = strata[key]
            k = max(1, int(round(len(group) * fraction)))
            idx = sorted(rng.choice(len(group), size=k, replace=False))
            keep.extend(group[i] for i in idx)
        keep.sort(key=lambda n: n.name)
        return ClusterSpec(tuple(keep), name or f"{self.name} x{fraction:g}", self.enforce_milli, self.note)

    def summary(self) -> dict[str, Any]:
        mix: dict[str, int] = {}
        for n in self.nodes:
            mix[n.gpu_model] = mix.get(n.gpu_model, 0) + n.num_gpus
        return {
            "name": self.name,
            "nodes": len(self.nodes),
            "gpus": self.n_gpus,
            "gpu_mix": dict(sorted(mix.items())),
            "enforce_milli": self.enforce_milli,
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as a policy sees it: its request and predictions only."""

    job_id: str
    submit_time: float
    num_gpus: int
    gpu_milli: int = MILLI  # per GPU
    pred_util_pct: float = 50.0
    pred_mem_mb: float = 2048.0
    cpu_milli: int = 0
    ram_mib: int = 0
    single_node: bool = False
    model: str | None = None
    batch_size: int | None = None
    #: memory the job is known to need after an out-of-memory failure (0 if none)
    mem_floor_mb: float = 0.0
    #: GPU models the job may run on, ``|``-separated (Alibaba's ``gpu_spec``); "" = any
    gpu_type: str = ""


@dataclass(slots=True)
class RunningJob:
    """A placed job. ``meas_*`` are what telemetry reports once the job runs: its per-process
    utilization as NVML samples it (while sharing, stretched by its partners: not its standalone
    value) and its memory. ``true_util_pct`` (the job's standalone utilization on this GPU type) is
    the simulator's alone: :meth:`ClusterView.jobs_on` hands policies copies without it."""

    view: JobView
    gpus: tuple[int, ...]
    start_time: float
    meas_util_pct: float
    meas_mem_mb: float
    migrations: int = 0
    true_util_pct: float = float("nan")


@dataclass(frozen=True)
class WorkloadType:
    """A task shape for FGD: ``num_gpus`` GPUs of ``milli`` each (0 GPUs: a CPU-only task), the
    node CPU and memory it asks for, the GPU models it accepts (``gpu_type``, "" = any), with
    probability ``p``."""

    num_gpus: int
    milli: int
    p: float
    cpu_milli: int = 0
    ram_mib: int = 0
    gpu_type: str = ""


def gpu_type_allows(gpu_type: str, gpu_model: str) -> bool:
    """Whether a request for ``gpu_type`` (``|``-separated models, "" = any) may use a ``gpu_model`` GPU
    (FGD artifact's ``IsNodeAccessibleToPodByType``)."""
    wanted = [t for t in gpu_type.split("|") if t]
    return not wanted or gpu_model in wanted


def workload_types(jobs: Iterable[Any], *, popularity: float = 1.0, with_resources: bool = True) -> list[WorkloadType]:
    """FGD's target workload: the popularity of task shapes in a job list.

    A shape is ``(num_gpus, gpu_milli, cpu_milli, ram_mib, gpu_type)`` (``with_resources=False``: GPUs
    only). CPU-only jobs count as shapes of 0 GPUs. As FGD's artifact (``GetTypicalPods``), only the
    most popular shapes are kept, the fewest that cover ``popularity`` of the jobs (its default 95 %),
    re-normalised; ties in count keep the shape order."""
    if not 0 < popularity <= 1:
        raise ValueError("popularity must be in (0, 1]")
    counts: dict[tuple[int, int, int, int, str], int] = {}
    for j in jobs:
        ng = int(j.num_gpus)
        res = (
            (int(getattr(j, "cpu_milli", 0)), int(getattr(j, "ram_mib", 0)), str(getattr(j, "gpu_type", "") or ""))
            if with_resources
            else (0, 0, "")
        )
        key = (ng, int(min(MILLI, j.gpu_milli)) if ng else 0, *res)
        counts[key] = counts.get(key, 0) + 1
    total = sum(counts.values())
    if not total:
        return []
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    kept, covered = [], 0
    for key, c in ranked:
        if covered >= popularity * total - 1e-9:
            break
        kept.append((key, c))
        covered += c
    return [WorkloadType(k, m, c / covered, cpu, ram, gt) for (k, m, cpu, ram, gt), c in sorted(kept)]


def fgd_fragmentation(
    node_free: np.ndarray,
    types: Sequence[WorkloadType],
    *,
    cpu_free: np.ndarray | None = None,
    ram_free: np.ndarray | None = None,
    access: np.ndarray | None = None,
) -> np.ndarray:
    """Expected GPU fragmentation of each node (milli-GPUs), ATC'23 "Beware of
    Fragmentation" as its artifact computes it (``NodeGpuShareFragAmount``).

    ``node_free``: ``(nodes, max_gpus)`` free milli per GPU, padded with -1;
    ``cpu_free``/``ram_free``: ``(nodes,)`` free node CPU (milli) and memory
    (MiB), None or inf = not modelled; ``access``: ``(nodes, types)`` whether
    the node's GPU model is one the type accepts (None = all).

    For a task type m, node n's free GPU capacity is all fragment unless m can
    run there: m asks for GPUs (a CPU-only type finds every idle GPU a
    fragment), the GPU model matches, the node has m's CPU and memory free, and
    m's GPUs fit; when m can run, the free capacity on GPUs too small for m's
    per-GPU share is fragment. Result = sum over types of p_m x F_n(m). A task
    wider than the node (a multi-node gang) counts as needing all its GPUs.
    (The artifact checks CPU only; memory is checked here too, as placement does.)
    """
    if not types:
        return np.zeros(node_free.shape[0])
    # the GPU part depends only on (per-GPU share, GPU count): computed once per distinct pair
    need, k, inv, p, cpu_req, ram_req = _prepared(types)
    nf = node_free[:, :, None]  # (nodes, gpus, 1) against (shapes,)
    valid = nf >= 0
    free = np.where(valid, nf, 0).astype(np.float64)
    total = free.sum(axis=1)  # (nodes, 1)
    small = np.where(nf < need, free, 0.0).sum(axis=1)[:, inv]  # (nodes, types); padding has free 0
    # a task wider than the node (a multi-node gang) can use the node if all its GPUs fit
    k_eff = np.minimum(k, valid.sum(axis=1))  # (nodes, shapes)
    runs = (((nf >= need).sum(axis=1) >= k_eff) & (k > 0))[:, inv]  # (nodes, types)
    if cpu_free is not None:
        runs &= np.asarray(cpu_free, float)[:, None] >= cpu_req
    if ram_free is not None:
        runs &= np.asarray(ram_free, float)[:, None] >= ram_req
    if access is not None:
        runs &= access
    return (np.where(runs, small, total) * p).sum(axis=1)


#: the last workload :func:`fgd_fragmentation` prepared (one per run): ``(types object, arrays)``.
#: Keyed by identity, so a workload list must not be changed in place once in use (none is).
_PREP: list[Any] = [None, None]


def _prepared(types: Sequence[WorkloadType]) -> tuple[np.ndarray, ...]:
    """``(need, k, inv, p, cpu_req, ram_req)`` of a workload: its distinct (per-GPU share, GPU count)
    shapes, each type's shape index, probability and CPU/memory request."""
    if _PREP[0] is types:
        return _PREP[1]
    shapes, inv = np.unique(
        np.array([[min(t.milli, MILLI), t.num_gpus] for t in types], dtype=np.int64), axis=0, return_inverse=True
    )
    out = (
        shapes[:, 0].copy(),
        shapes[:, 1].copy(),
        inv.reshape(-1),
        np.array([t.p for t in types], dtype=np.float64),
        np.array([t.cpu_milli for t in types], float),
        np.array([t.ram_mib for t in types], float),
    )
    _PREP[0], _PREP[1] = types, out
    return out


class ClusterState:
    """Live per-GPU state. Arrays are indexed by GPU (0..n_gpus-1), GPUs of a
    node contiguous. Only :meth:`add` / :meth:`remove` change it."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.enforce_milli = spec.enforce_milli
        nodes = spec.nodes
        if not nodes or spec.n_gpus == 0:
            raise ValueError("cluster has no GPUs")
        self.n_nodes = len(nodes)
        self.n_gpus = spec.n_gpus
        self.gpu_node = np.repeat(np.arange(self.n_nodes), [n.num_gpus for n in nodes])
        self.node_first_gpu = np.concatenate([[0], np.cumsum([n.num_gpus for n in nodes])[:-1]]).astype(int)
        self.node_num_gpus = np.array([n.num_gpus for n in nodes], dtype=int)
        self.gpu_slot = np.arange(self.n_gpus) - self.node_first_gpu[self.gpu_node]
        self.max_gpus_per_node = int(self.node_num_gpus.max())
        self.mem_cap = np.repeat(np.array([n.gpu_mem_mb for n in nodes], float), self.node_num_gpus)
        self.gpu_model = [n.gpu_model for n in nodes for _ in range(n.num_gpus)]
        self.node_gpu_model = tuple(n.gpu_model for n in nodes)
        self._access: dict[tuple[WorkloadType, ...], np.ndarray] = {}
        self.cpu_pods: dict[str, tuple[int, JobView]] = {}  # CPU-only pods placed (fill): id -> (node, view)
        self.node_cpu_cap = np.array([n.cpu_milli for n in nodes], float)
        self.node_ram_cap = np.array([n.ram_mib for n in nodes], float)
        self.node_cpu_used = np.zeros(self.n_nodes)
        self.node_ram_used = np.zeros(self.n_nodes)
        self.cpu_modelled = bool(self.node_cpu_cap.any())
        self.n_jobs = np.zeros(self.n_gpus, dtype=np.int64)
        self.milli_used = np.zeros(self.n_gpus, dtype=np.int64)
        self.pred_util = np.zeros(self.n_gpus)
        self.pred_mem = np.zeros(self.n_gpus)
        self.true_util = np.zeros(self.n_gpus)  # sum of true (standalone) util of jobs on the GPU
        self.meas_util = np.zeros(self.n_gpus)  # sum of the jobs' measured (telemetry) per-process util
        self.true_mem = np.zeros(self.n_gpus)
        self.jobs_on: list[list[str]] = [[] for _ in range(self.n_gpus)]
        self.running: dict[str, RunningJob] = {}
        self.free_gpus = self.n_gpus  # GPUs with no job
        self.workload: list[WorkloadType] = []
        self._view: ClusterView | None = None

    # ------------------------------------------------------------------ checks
    def check_placement(self, job: JobView, gpus: Sequence[int], *, ignore: str | None = None) -> None:
        """Raise :class:`PlacementError` unless ``gpus`` is a valid placement of
        ``job`` under the hard constraints (count, distinct, in range, same
        node when asked, milli shares when enforced, node CPU/RAM)."""
        if len(gpus) != job.num_gpus:
            raise PlacementError(f"job {job.job_id} needs {job.num_gpus} GPUs, got {len(gpus)}")
        if len(set(gpus)) != len(gpus):
            raise PlacementError(f"job {job.job_id}: duplicate GPUs {list(gpus)}")
        for g in gpus:
            if not 0 <= g < self.n_gpus:
                raise PlacementError(f"job {job.job_id}: no GPU {g}")
        nodes = {int(self.gpu_node[g]) for g in gpus}
        if job.single_node and len(nodes) > 1:
            raise PlacementError(f"job {job.job_id} must run on one node, got nodes {sorted(nodes)}")
        if job.gpu_type:
            for n in nodes:
                if not gpu_type_allows(job.gpu_type, self.node_gpu_model[n]):
                    raise PlacementError(
                        f"job {job.job_id} asks for {job.gpu_type}, node {n} has {self.node_gpu_model[n]}"
                    )
        if self.enforce_milli:
            for g in gpus:
                used = self.milli_used[g]
                if ignore is not None and ignore in self.jobs_on[g]:
                    used -= self.running[ignore].view.gpu_milli
                if used + job.gpu_milli > MILLI:
                    raise PlacementError(
                        f"job {job.job_id}: GPU {g} has {MILLI - used} milli free, needs {job.gpu_milli}"
                    )
        if self.cpu_modelled and ignore is None:
            for n in nodes:
                if self.node_cpu_cap[n] and self.node_cpu_used[n] + job.cpu_milli > self.node_cpu_cap[n]:
                    raise PlacementError(f"job {job.job_id}: node {n} lacks CPU")
                if self.node_ram_cap[n] and self.node_ram_used[n] + job.ram_mib > self.node_ram_cap[n]:
                    raise PlacementError(f"job {job.job_id}: node {n} lacks RAM")

    def node_has_room(self, job: JobView, node: int) -> bool:
        """Whether ``node`` has ``job``'s CPU and memory free (always, where they are not modelled)."""
        cap_c, cap_r = self.node_cpu_cap[node], self.node_ram_cap[node]
        return bool(
            (not cap_c or self.node_cpu_used[node] + job.cpu_milli <= cap_c)
            and (not cap_r or self.node_ram_used[node] + job.ram_mib <= cap_r)
        )

    def add_cpu_pod(self, job: JobView, node: int) -> None:
        """Place a CPU-only pod (no GPUs) on ``node``, taking its CPU and memory; raises
        :class:`PlacementError` where they do not fit."""
        if job.num_gpus != 0:
            raise PlacementError(f"job {job.job_id} asks for GPUs: place it with add()")
        if job.job_id in self.cpu_pods or job.job_id in self.running:
            raise PlacementError(f"job {job.job_id} is already running")
        if not 0 <= node < self.n_nodes or not self.node_has_room(job, node):
            raise PlacementError(f"job {job.job_id}: node {node} lacks CPU or RAM")
        self.node_cpu_used[node] += job.cpu_milli
        self.node_ram_used[node] += job.ram_mib
        self.cpu_pods[job.job_id] = (node, job)

    def fits_memory(self, gpus: Sequence[int], mem_mb: float, *, ignore: str | None = None) -> bool:
        """Whether ``mem_mb`` more (true) memory fits on every GPU in ``gpus``."""
        for g in gpus:
            used = self.true_mem[g]
            if ignore is not None and ignore in self.jobs_on[g]:
                used -= self.running[ignore].meas_mem_mb
            if used + mem_mb > self.mem_cap[g] + 1e-9:
                return False
        return True

    # ------------------------------------------------------------------ mutation
    def add(
        self,
        job: JobView,
        gpus: Sequence[int],
        *,
        true_util: float,
        true_mem: float,
        now: float,
        migrations: int = 0,
        meas_util: float | None = None,
    ) -> RunningJob:
        """Place ``job`` (no constraint checks: call :meth:`check_placement` first). ``meas_util`` is
        what telemetry reports for it until :meth:`set_measured_util` (default: ``true_util``)."""
        meas = float(true_util if meas_util is None else meas_util)
        if job.job_id in self.running:
            raise PlacementError(f"job {job.job_id} is already running")
        gpus = tuple(int(g) for g in gpus)
        for g in gpus:
            if not self.jobs_on[g]:
                self.free_gpus -= 1
            self.jobs_on[g].append(job.job_id)
            self.n_jobs[g] += 1
            self.milli_used[g] += job.gpu_milli
            self.pred_util[g] += job.pred_util_pct
            self.pred_mem[g] += max(job.pred_mem_mb, job.mem_floor_mb)
            self.true_util[g] += true_util
            self.meas_util[g] += meas
            self.true_mem[g] += true_mem
        if self.cpu_modelled:
            for n in {int(self.gpu_node[g]) for g in gpus}:
                self.node_cpu_used[n] += job.cpu_milli
                self.node_ram_used[n] += job.ram_mib
        rj = RunningJob(job, gpus, now, meas, true_mem, migrations, float(true_util))
        self.running[job.job_id] = rj
        return rj

    def remove(self, job_id: str) -> RunningJob:
        rj = self.running.pop(job_id)
        job = rj.view
        for g in rj.gpus:
            self.jobs_on[g].remove(job_id)
            self.n_jobs[g] -= 1
            self.milli_used[g] -= job.gpu_milli
            self.pred_util[g] -= job.pred_util_pct
            self.pred_mem[g] -= max(job.pred_mem_mb, job.mem_floor_mb)
            self.true_util[g] -= rj.true_util_pct
            self.meas_util[g] -= rj.meas_util_pct
            self.true_mem[g] -= rj.meas_mem_mb
            if not self.jobs_on[g]:
                self.free_gpus += 1
                # clear float drift on an empty GPU
                self.pred_util[g] = self.pred_mem[g] = self.true_util[g] = self.true_mem[g] = 0.0
                self.meas_util[g] = 0.0
        if self.cpu_modelled:
            for n in {int(self.gpu_node[g]) for g in rj.gpus}:
                self.node_cpu_used[n] -= job.cpu_milli
                self.node_ram_used[n] -= job.ram_mib
        return rj

    def set_measured_util(self, job_id: str, pct: float) -> None:
        """Telemetry now reports ``pct`` per-process utilization for a running job (on each of its GPUs)."""
        rj = self.running[job_id]
        for g in rj.gpus:
            self.meas_util[g] += pct - rj.meas_util_pct
        rj.meas_util_pct = float(pct)

    def node_free_milli(self) -> np.ndarray:
        """``(nodes, max_gpus)`` free milli per GPU, padded with -1."""
        out = np.full((self.n_nodes, self.max_gpus_per_node), -1, dtype=np.int64)
        out[self.gpu_node, self.gpu_slot] = np.maximum(0, MILLI - self.milli_used)
        return out

    def node_cpu_free(self) -> np.ndarray:
        """``(nodes,)`` free CPU (milli); inf where not modelled."""
        return np.where(self.node_cpu_cap > 0, self.node_cpu_cap - self.node_cpu_used, np.inf)

    def node_ram_free(self) -> np.ndarray:
        """``(nodes,)`` free memory (MiB); inf where not modelled."""
        return np.where(self.node_ram_cap > 0, self.node_ram_cap - self.node_ram_used, np.inf)

    def type_access(self, types: Sequence[WorkloadType]) -> np.ndarray | None:
        """``(nodes, types)``: the node's GPU model is one the type accepts (None: every type takes any)."""
        key = tuple(types)
        if not any(t.gpu_type for t in key):
            return None
        got = self._access.get(key)
        if got is None:
            got = np.array([[gpu_type_allows(t.gpu_type, m) for t in key] for m in self.node_gpu_model], dtype=bool)
            self._access = {key: got}  # one workload per run: keep the latest only
        return got

    def fragmentation(self, types: Sequence[WorkloadType] | None = None) -> tuple[float, float]:
        """``(fragmented milli-GPUs, free milli-GPUs)`` of the whole cluster (node CPU, memory and GPU
        model included, see :func:`fgd_fragmentation`)."""
        t = self.workload if types is None else types
        nf = self.node_free_milli()
        free = float(np.maximum(nf, 0).sum())
        if not t:
            return 0.0, free
        frag = fgd_fragmentation(
            nf, t, cpu_free=self.node_cpu_free(), ram_free=self.node_ram_free(), access=self.type_access(t)
        )
        return float(frag.sum()), free

    def view(self) -> ClusterView:
        if self._view is None:
            self._view = ClusterView(self)
        return self._view


def _ro(a: np.ndarray) -> np.ndarray:
    v = a.view()
    v.flags.writeable = False
    return v


class ClusterView:
    """Read-only view of a :class:`ClusterState` for policies.

    Per-GPU arrays (read-only numpy views, live):

    * ``mem_cap_mb``, ``gpu_node``, ``gpu_slot``
    * ``n_jobs``, ``milli_used``
    * ``pred_util_pct``, ``pred_mem_mb``: sums of the *predictions* of the jobs
      the scheduler placed there (what Horus reasons with)
    * ``meas_util_pct``: device utilization as NVML samples it, ``min(100, sum)``
      of the running jobs' measured per-process utilization
    * ``demand_util_pct``: that sum uncapped (may exceed 100). Measured, not the
      jobs' standalone utilizations: a job slowed by its partners shows its
      stretched busy share (the simulator's ``Replay`` keeps it up to date)
    * ``meas_mem_mb``: measured memory in use

    Per node: ``node_cpu_free``, ``node_ram_free`` (inf when not modelled).
    """

    def __init__(self, state: ClusterState):
        self._s = state
        self.n_gpus = state.n_gpus
        self.n_nodes = state.n_nodes
        self.enforce_milli = state.enforce_milli
        self.mem_cap_mb = _ro(state.mem_cap)
        self.gpu_node = _ro(state.gpu_node)
        self.gpu_slot = _ro(state.gpu_slot)
        self.node_first_gpu = _ro(state.node_first_gpu)
        self.node_num_gpus = _ro(state.node_num_gpus)
        self.n_jobs = _ro(state.n_jobs)
        self.milli_used = _ro(state.milli_used)
        self.pred_util_pct = _ro(state.pred_util)
        self.pred_mem_mb = _ro(state.pred_mem)
        self.demand_util_pct = _ro(state.meas_util)
        self.meas_mem_mb = _ro(state.true_mem)
        self.gpu_model = tuple(state.gpu_model)
        self.node_gpu_model = state.node_gpu_model
        #: node names (the artifact's policies break score ties by the smallest name)
        self.node_names = tuple(n.name for n in state.spec.nodes)
        self._type_ok: dict[str, np.ndarray] = {}

    @property
    def meas_util_pct(self) -> np.ndarray:
        return np.minimum(self._s.meas_util, 100.0)

    @property
    def free_gpus(self) -> int:
        """GPUs with no job at all."""
        return self._s.free_gpus

    @property
    def cpu_modelled(self) -> bool:
        return self._s.cpu_modelled

    @property
    def workload(self) -> list[WorkloadType]:
        """Target workload (task shapes and popularity) for FGD-style policies."""
        return self._s.workload

    def node_cpu_ok(self, job: JobView) -> np.ndarray | None:
        """Per-GPU bool: the GPU's node has the job's CPU and RAM free (None = not modelled)."""
        s = self._s
        if not s.cpu_modelled or (job.cpu_milli == 0 and job.ram_mib == 0):
            return None
        ok = ((s.node_cpu_cap == 0) | (s.node_cpu_used + job.cpu_milli <= s.node_cpu_cap)) & (
            (s.node_ram_cap == 0) | (s.node_ram_used + job.ram_mib <= s.node_ram_cap)
        )
        return ok[s.gpu_node]

    def node_free_milli(self) -> np.ndarray:
        return self._s.node_free_milli()

    def node_cpu_free(self) -> np.ndarray:
        return self._s.node_cpu_free()

    def node_ram_free(self) -> np.ndarray:
        return self._s.node_ram_free()

    def node_has_room(self, job: JobView, node: int) -> bool:
        return self._s.node_has_room(job, node)

    def type_access(self, types: Sequence[WorkloadType]) -> np.ndarray | None:
        return self._s.type_access(types)

    def gpu_type_ok(self, job: JobView) -> np.ndarray | None:
        """Per-GPU bool: the GPU's model is one the job accepts (None: it accepts any)."""
        if not job.gpu_type:
            return None
        ok = self._type_ok.get(job.gpu_type)
        if ok is None:
            ok = np.array([gpu_type_allows(job.gpu_type, m) for m in self._s.node_gpu_model], dtype=bool)[
                self._s.gpu_node
            ]
            self._type_ok[job.gpu_type] = ok
        return ok

    def jobs_on(self, gpu: int) -> tuple[RunningJob, ...]:
        """Running jobs on a GPU (their views, GPUs, start time and measured util/memory), as copies
        without the true utilization: what telemetry can tell a policy."""
        s = self._s
        return tuple(_telemetry_copy(s.running[j]) for j in s.jobs_on[gpu])

    def pred_utils_on(self, gpu: int) -> tuple[float, ...]:
        """The PREDICTED utilizations (%) of the jobs on a GPU, in placement order (what the scheduler
        itself placed there; no telemetry copies made)."""
        s = self._s
        run = s.running
        return tuple([run[j].view.pred_util_pct for j in s.jobs_on[gpu]])

    def meas_utils_on(self, gpu: int) -> tuple[float, ...]:
        """The MEASURED per-process utilizations (%) of the jobs on a GPU, as telemetry samples them
        (stretched while they share), in placement order."""
        s = self._s
        run = s.running
        return tuple([run[j].meas_util_pct for j in s.jobs_on[gpu]])

    def gpu_counts_on(self, gpu: int) -> tuple[int, ...]:
        """How many GPUs each job on a GPU holds (placement order; its request)."""
        s = self._s
        run = s.running
        return tuple([run[j].view.num_gpus for j in s.jobs_on[gpu]])

    def start_times_on(self, gpu: int) -> tuple[float, ...]:
        """When each job on a GPU started (placement order; what any scheduler's bookkeeping knows)."""
        s = self._s
        run = s.running
        return tuple([run[j].start_time for j in s.jobs_on[gpu]])

    def running(self, job_id: str) -> RunningJob | None:
        rj = self._s.running.get(job_id)
        return None if rj is None else _telemetry_copy(rj)


def _telemetry_copy(rj: RunningJob) -> RunningJob:
    return RunningJob(rj.view, rj.gpus, rj.start_time, rj.meas_util_pct, rj.meas_mem_mb, rj.migrations)
