"""The ATC'23 artifact's fill baselines, written from its published algorithm descriptions.

FGD's artifact (hkust-adsl/kubernetes-scheduler-simulator, a Kubernetes scheduler simulator) ranks
NODES, not GPUs: each policy gives every feasible node an INTEGER score in [0, 100], the highest
wins, and ties go to the smallest node name; the GPUs on the chosen node are then picked by the
policy's GPU selection. Before it schedules, the artifact renames every node ``"<k>-<name>"`` with
``k`` (four digits) from a random permutation drawn from the run's seed, so "the smallest name" is a
random node order fixed for the run (``ties="shuffled"``, the default here); ``ties="name"`` keeps
the raw names' order. GpuPacking and GpuClustering tie often (every CPU-only pod, every idle node of
a size): with the raw order they pile onto the first nodes and left +6 to +12 % more GPUs
unallocated than the artifact. These are what the ATC'23 paper's numbers were measured with (its
``experiments/analysis/expected_results``), so the bench compares them with the artifact's
figures. The platform's own ``fgd`` / ``best_fit`` (:mod:`.policies`) are different designs
(GPU-level, float costs, memory in FGD's measure) and stay as they are.

Each policy, as the artifact defines it (``MAX`` = 100):

* ``fgd_ref`` - Fragmentation Gradient Descent: score ``int(sigmoid((F_before - F_after) / 1000)
  x 100)``, ``F`` the node's expected GPU fragmentation (milli-GPUs, every class but "satisfied")
  for the typical pods; a shared-GPU pod scores each GPU that fits and takes the first best one;
  typical pods are keyed on (CPU, GPU share, GPU count, GPU type) - no memory - the most popular
  covering 95 % of the pods, CPU-only pods included; the measure checks node CPU, not memory.
* ``best_fit_ref`` - node-level Best Fit over CPU and GPU: ``s = 0.5 (cpu_free - cpu) / 128000 +
  0.5 (gpu_milli_free - gpu_request) / 8000``, score ``int((1 - s) x 100)``.
* ``gpu_packing_ref`` - shared GPUs first, then idle GPUs of used nodes, then idle nodes:
  ``max(MAX - (sum of the used GPUs' free percent) / 10, MAX / 2)``, ``max(MAX / 2 - idle GPUs
  used, MAX / 3)``, ``max(MAX / 3 - idle GPUs, idle GPUs)``; CPU-only pods score 0.
* ``gpu_clustering_ref`` - pods of one GPU "affinity" (shared GPU, or k whole GPUs) together:
  ``25 x (8000 - gpu_milli_free) / 8000`` (integer) plus 75 (the node holds only this
  affinity), 50 (this and others), 25 (no GPU pod yet) or 0 (only others); CPU-only pods 0.
* ``dot_prod_ref`` - Tetris' dot product, merged GPU dimension, normalised by the largest node
  (128 cores, 8 GPUs): ``int(100 x (1 - (cpu_free x cpu + gpu_free x gpu) / 2))``.
* ``random_ref`` - a uniformly random feasible node; a shared-GPU pod gets a random GPU that fits.

GPU selection: ``fgd_ref`` by its own score, ``random_ref`` at random, the others best fit (the
fitting GPU with least free share, lowest index). Whole-GPU pods take the node's first idle GPUs.
Feasibility is the artifact's filter: node CPU and memory, GPU model, and the GPUs on one node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .cluster import MILLI, ClusterView, JobView, WorkloadType, fgd_fragmentation
from .policies import PlacementPolicy

__all__ = [
    "REFERENCE_POLICIES",
    "ARTIFACT_NAMES",
    "ReferencePolicy",
    "FGDRef",
    "BestFitRef",
    "GpuPackingRef",
    "GpuClusteringRef",
    "DotProdRef",
    "RandomRef",
    "typical_pods",
    "fgd_score",
    "make_reference_policy",
    "TIE_ORDERS",
]

MAX_SCORE = 100
#: how score ties are broken -> what ``describe()`` says
TIE_ORDERS = {
    "shuffled": "smallest node name after the artifact's random renaming (a node order drawn per run)",
    "name": "smallest node name",
}
#: the largest node the artifact normalises by: 128 cores (milli), 8 GPUs (milli)
MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


def typical_pods(pods: Sequence[Any], popularity: float = 0.95) -> list[WorkloadType]:
    """The artifact's typical pods: shapes keyed on (GPU count, GPU share, CPU, GPU type) - memory is not
    part of the key - ranked by count, the fewest covering ``popularity`` of the pods (CPU-only pods
    included), their probabilities re-normalised to 1."""
    if not 0 < popularity <= 1:
        raise ValueError("popularity must be in (0, 1]")
    counts: dict[tuple[int, int, int, str], int] = {}
    for p in pods:
        k = int(p.num_gpus)
        key = (
            k,
            int(min(MILLI, p.gpu_milli)) if k else 0,
            int(getattr(p, "cpu_milli", 0)),
            str(getattr(p, "gpu_type", "") or ""),
        )
        counts[key] = counts.get(key, 0) + 1
    total = sum(counts.values())
    if not total:
        return []
    kept: list[tuple[tuple[int, int, int, str], int]] = []
    covered = 0
    for key, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if covered >= popularity * total:
            break
        kept.append((key, c))
        covered += c
    return [WorkloadType(k, m, c / covered, cpu, 0, gt) for (k, m, cpu, gt), c in kept]


def fgd_score(frag_before: np.ndarray | float, frag_after: np.ndarray | float) -> np.ndarray:
    """The artifact's FGD node score: ``int(sigmoid((before - after) / 1000) x 100)`` (milli-GPUs in)."""
    delta = (np.asarray(frag_before, float) - np.asarray(frag_after, float)) / 1000.0
    return np.floor(MAX_SCORE / (1.0 + np.exp(-delta))).astype(np.int64)


class ReferencePolicy(PlacementPolicy):
    """Node-level scoring as the artifact's scheduler does it; subclasses give :meth:`node_scores`."""

    shares_gpus = True
    monotone_feasibility = False  # a higher-scoring node is chosen, not the first that fits
    #: how the GPUs on the chosen node are picked: "best" (least free share that fits) or "random"
    gpu_selection = "best"
    #: the artifact's policy name (its ``experiments/analysis/expected_results`` label)
    artifact_name = ""

    def __init__(self, *, seed: int = 0, ties: str = "shuffled"):
        if ties not in TIE_ORDERS:
            raise ValueError(f"ties must be one of {', '.join(TIE_ORDERS)}")
        self.seed, self.ties = seed, ties
        self.reset(0)

    def reset(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng([self.seed, seed, 0xA7C])
        # a stream of its own, so that shuffling the ties leaves Random's draws as they were
        self._tie_seed = [self.seed, seed, 0x71E]
        self._tie_rank: np.ndarray | None = None
        self._tie_names: tuple[str, ...] = ()

    # ------------------------------------------------------------------ interface
    def place(self, job: JobView, cluster: ClusterView, now: float) -> list[int] | None:
        if job.num_gpus <= 0:
            return None
        nodes = self._feasible_nodes(job, cluster)
        if len(nodes) == 0:
            return None
        scores = self.node_scores(job, cluster, nodes)
        node = self._pick(cluster, nodes, scores)
        return self.select_gpus(job, cluster, node)

    def place_cpu_pod(self, job: JobView, cluster: ClusterView) -> int | None:
        nodes = np.flatnonzero(self._room(job, cluster))
        if len(nodes) == 0:
            return None
        return self._pick(cluster, nodes, self.node_scores(job, cluster, nodes))

    def score(self, job: JobView, cluster: ClusterView, gpus: Sequence[int]) -> float | None:
        """Minus the node's score (lower is better, as the interface wants) of the node ``gpus`` are on."""
        if not len(gpus):
            return None
        node = np.array([int(cluster.gpu_node[int(gpus[0])])])
        return -float(self.node_scores(job, cluster, node)[0])

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "artifact_policy": self.artifact_name,
            "gpu_selection": self.gpu_selection,
            "ties": TIE_ORDERS[self.ties],
        }

    # ------------------------------------------------------------------ hooks
    def node_scores(self, job: JobView, cv: ClusterView, nodes: np.ndarray) -> np.ndarray:
        """Integer score of each of ``nodes`` for ``job`` (higher is better)."""
        raise NotImplementedError

    def select_gpus(self, job: JobView, cv: ClusterView, node: int) -> list[int]:
        free = _free_row(cv, node)
        first = int(cv.node_first_gpu[node])
        if job.num_gpus > 1 or job.gpu_milli >= MILLI:
            # whole GPUs: the first idle ones; a reserved (overcommitted) share: the first that hold it
            return [first + int(s) for s in np.flatnonzero(free >= min(job.gpu_milli, MILLI))[: job.num_gpus]]
        fits = np.flatnonzero(free >= job.gpu_milli)
        if self.gpu_selection == "random":
            return [first + int(self.rng.choice(fits))]
        return [first + int(fits[np.argmin(free[fits])])]  # argmin: the lowest slot among ties

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _room(job: JobView, cv: ClusterView) -> np.ndarray:
        """Nodes with the pod's CPU and memory free (the scheduler's resource filter)."""
        return (cv.node_cpu_free() >= job.cpu_milli) & (cv.node_ram_free() >= job.ram_mib)

    def _feasible_nodes(self, job: JobView, cv: ClusterView) -> np.ndarray:
        ok = self._room(job, cv)
        need = min(job.gpu_milli, MILLI)
        ok &= (cv.node_free_milli() >= need).sum(axis=1) >= job.num_gpus
        typed = cv.gpu_type_ok(job)
        if typed is not None:
            ok &= typed[cv.node_first_gpu]
        return np.flatnonzero(ok & (cv.node_num_gpus > 0))

    def _pick(self, cv: ClusterView, nodes: np.ndarray, scores: np.ndarray) -> int:
        """The highest-scoring node; ties to the smallest node name (the artifact's ``selectHost``), names
        as the artifact's run sees them (:meth:`tie_ranks`)."""
        best = nodes[scores == scores.max()]
        if len(best) == 1:
            return int(best[0])
        return int(best[np.argmin(self.tie_ranks(cv)[best])])

    def tie_ranks(self, cv: ClusterView) -> np.ndarray:
        """Each node's place in the order ties are broken in (0 wins). ``"name"``: the names' order;
        ``"shuffled"``: the artifact's renamed nodes - the i-th node in name order is given the prefix
        ``perm[i]`` of a random permutation (drawn once per run from its seed), and the prefix decides."""
        rank = self._tie_rank
        if rank is None or (self._tie_names is not cv.node_names and self._tie_names != cv.node_names):
            by_name = np.array(sorted(range(cv.n_nodes), key=lambda n: cv.node_names[n]), dtype=np.int64)
            prefix = (
                np.random.default_rng(self._tie_seed).permutation(cv.n_nodes)
                if self.ties == "shuffled"
                else np.arange(cv.n_nodes)
            )
            rank = np.empty(cv.n_nodes, dtype=np.int64)
            rank[by_name] = prefix
            self._tie_rank, self._tie_names = rank, cv.node_names
        return rank


def _free_row(cv: ClusterView, node: int) -> np.ndarray:
    """Free milli of each GPU of ``node`` (slot order)."""
    first, k = int(cv.node_first_gpu[node]), int(cv.node_num_gpus[node])
    return MILLI - np.asarray(cv.milli_used[first : first + k], dtype=np.int64)


def _cpu_free(cv: ClusterView, nodes: np.ndarray) -> np.ndarray:
    """Free node CPU (milli); where CPU is not modelled, the largest node's (the term then ranks nothing)."""
    cpu = cv.node_cpu_free()[nodes]
    return np.where(np.isfinite(cpu), cpu, MAX_SPEC_CPU)


def _gpu_free(cv: ClusterView, nodes: np.ndarray) -> np.ndarray:
    nf = cv.node_free_milli()[nodes]
    return np.where(nf >= 0, nf, 0).sum(axis=1)


def _request(job: JobView) -> tuple[float, float]:
    return float(job.cpu_milli), float(job.num_gpus * min(job.gpu_milli, MILLI)) if job.num_gpus else 0.0


class BestFitRef(ReferencePolicy):
    """The artifact's BestFit: least CPU and GPU left on the node after the pod, weighted 0.5 / 0.5."""

    name = "best_fit_ref"
    artifact_name = "05-BestFit"

    def node_scores(self, job, cv, nodes):
        cpu, gpu = _request(job)
        left = 0.5 * (_cpu_free(cv, nodes) - cpu) / MAX_SPEC_CPU + 0.5 * (_gpu_free(cv, nodes) - gpu) / MAX_SPEC_GPU
        return np.trunc((1.0 - left) * MAX_SCORE).astype(np.int64)


class DotProdRef(ReferencePolicy):
    """The artifact's DotProd (Tetris): the smallest dot product of free and requested (CPU, GPU)."""

    name = "dot_prod_ref"
    artifact_name = "02-DotProd"

    def node_scores(self, job, cv, nodes):
        cpu, gpu = _request(job)
        dot = _cpu_free(cv, nodes) / MAX_SPEC_CPU * (cpu / MAX_SPEC_CPU) + _gpu_free(cv, nodes) / MAX_SPEC_GPU * (
            gpu / MAX_SPEC_GPU
        )
        return np.trunc(MAX_SCORE * (1.0 - dot / 2.0)).astype(np.int64)


class GpuPackingRef(ReferencePolicy):
    """The artifact's GpuPacking: shared GPUs, then idle GPUs of used nodes, then idle nodes."""

    name = "gpu_packing_ref"
    artifact_name = "04-GpuPacking"

    def node_scores(self, job, cv, nodes):
        if job.num_gpus <= 0:
            return np.zeros(len(nodes), dtype=np.int64)
        need = min(job.gpu_milli, MILLI)
        nf = cv.node_free_milli()[nodes]
        idle = (nf >= MILLI).sum(axis=1)
        all_idle = idle == np.asarray(cv.node_num_gpus)[nodes]
        case3 = np.maximum(MAX_SCORE // 3 - idle, idle)  # an idle node: the fewer its GPUs, the better
        if job.num_gpus == 1 and need < MILLI:
            # the GPU it takes: the fitting one with least free share (the artifact scans least free first)
            least = np.where(nf >= need, nf, np.iinfo(np.int64).max).min(axis=1)
            shared = np.maximum(MAX_SCORE - (least * 100 // MILLI) // 10, MAX_SCORE // 2)
            used = np.where(least >= MILLI, max(MAX_SCORE // 2 - 1, MAX_SCORE // 3), shared)
        else:  # whole GPUs on a used node are idle GPUs of it
            used = np.full(len(nodes), max(MAX_SCORE // 2 - job.num_gpus, MAX_SCORE // 3))
        return np.where(all_idle, case3, used).astype(np.int64)


def _affinity(gpu_milli: int, num_gpus: int) -> str:
    """A GPU pod's affinity tag: "share" (part of one GPU) or "<k>-gpu" (k whole GPUs)."""
    return "share" if num_gpus == 1 and gpu_milli < MILLI else f"{num_gpus}-gpu"


class GpuClusteringRef(ReferencePolicy):
    """The artifact's GpuClustering: pods of the same GPU affinity on the same nodes."""

    name = "gpu_clustering_ref"
    artifact_name = "03-GpuClustering"

    def reset(self, seed: int = 0) -> None:
        super().reset(seed)
        self._tags: dict[int, frozenset[str]] = {}
        self._sig: np.ndarray | None = None

    def _node_tags(self, cv: ClusterView) -> dict[int, frozenset[str]]:
        """Affinities of the GPU pods on each node, recomputed only for nodes whose GPUs changed."""
        used = np.asarray(cv.milli_used)
        sig = getattr(self, "_sig", None)
        if sig is None or sig.shape != used.shape:
            self._tags, changed = {}, np.unique(cv.gpu_node[used > 0])
        else:
            changed = np.unique(cv.gpu_node[sig != used])
        for n in changed:
            first, k = int(cv.node_first_gpu[n]), int(cv.node_num_gpus[n])
            tags = {
                _affinity(rj.view.gpu_milli, rj.view.num_gpus) for g in range(first, first + k) for rj in cv.jobs_on(g)
            }
            self._tags[int(n)] = frozenset(tags)
        self._sig = used.copy()
        return self._tags

    def node_scores(self, job, cv, nodes):
        out = np.zeros(len(nodes), dtype=np.int64)
        if job.num_gpus <= 0:
            return out
        tags = self._node_tags(cv)
        mine = _affinity(job.gpu_milli, job.num_gpus)
        used = (MAX_SPEC_GPU - _gpu_free(cv, nodes)) * (MAX_SCORE // 4) // MAX_SPEC_GPU
        for i, n in enumerate(nodes):
            t = tags.get(int(n), frozenset())
            if mine in t:
                base = 75 if len(t) == 1 else 50
            else:
                base = 25 if not t else 0
            out[i] = used[i] + base
        return out


class RandomRef(ReferencePolicy):
    """The artifact's Random: a uniformly random feasible node, a random GPU that fits."""

    name = "random_ref"
    artifact_name = "01-Random"
    gpu_selection = "random"

    def node_scores(self, job, cv, nodes):
        out = np.zeros(len(nodes), dtype=np.int64)
        out[int(self.rng.integers(len(nodes)))] = MAX_SCORE
        return out


class FGDRef(ReferencePolicy):
    """The artifact's FGD: the node (and, for a shared-GPU pod, the GPU) whose expected fragmentation
    for the typical pods grows least, through the integer sigmoid score."""

    name = "fgd_ref"
    artifact_name = "06-FGD"
    gpu_selection = "fgd"

    def reset(self, seed: int = 0) -> None:
        super().reset(seed)
        #: per request shape (GPUs, share, CPU): the node state the rows were computed for and the
        #: scores (nodes, slots); a placement changes one node, so only changed rows are recomputed
        self._cache: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._types: Sequence[WorkloadType] | None = None

    def target_workload(self, pods, popularity):
        return typical_pods(pods, popularity)

    def _types_of(self, job: JobView, cv: ClusterView) -> Sequence[WorkloadType]:
        types = cv.workload or [
            WorkloadType(
                job.num_gpus, min(job.gpu_milli, MILLI) if job.num_gpus else 0, 1.0, job.cpu_milli, 0, job.gpu_type
            )
        ]
        if types is not getattr(self, "_types", None):
            self._types, self._cache = types, {}
        return types

    def _slot_scores(self, job: JobView, cv: ClusterView) -> np.ndarray:
        """``(nodes, max_gpus)`` scores: of taking the pod's share from that GPU (a shared-GPU pod), or
        the same score in every slot of the node (whole GPUs or a CPU-only pod); garbage where unfit."""
        types = self._types_of(job, cv)
        need = min(job.gpu_milli, MILLI) if job.num_gpus else 0
        key = (job.num_gpus, need, job.cpu_milli)
        nf, cpu = cv.node_free_milli(), cv.node_cpu_free()
        got = self._cache.get(key)
        if got is None:
            changed = np.arange(cv.n_nodes)
            got = (nf.copy(), cpu.copy(), np.zeros(nf.shape, dtype=np.int64))
            self._cache[key] = got
        else:
            changed = np.flatnonzero((got[0] != nf).any(axis=1) | (got[1] != cpu))
        if len(changed):
            sig_nf, sig_cpu, scores = got
            scores[changed] = self._rows(job, cv, types, nf, cpu, changed, need)
            sig_nf[changed], sig_cpu[changed] = nf[changed], cpu[changed]
        return got[2]

    @staticmethod
    def _rows(job, cv, types, nf, cpu, nodes, need) -> np.ndarray:
        access = cv.type_access(types)
        width = nf.shape[1]
        before = fgd_fragmentation(
            nf[nodes], types, cpu_free=cpu[nodes], access=None if access is None else access[nodes]
        )
        if job.num_gpus == 1 and need < MILLI:
            rows = np.repeat(nodes, width)
            slots = np.tile(np.arange(width), len(nodes))
            after = nf[rows].copy()
            after[np.arange(len(rows)), slots] -= need
            fa = fgd_fragmentation(
                after, types, cpu_free=cpu[rows] - job.cpu_milli, access=None if access is None else access[rows]
            )
            return fgd_score(np.repeat(before, width), fa).reshape(len(nodes), width)
        after = nf[nodes].copy()
        if job.num_gpus:
            idle = np.cumsum(after >= MILLI, axis=1)  # take the first idle GPUs, as the artifact does
            after[(after >= MILLI) & (idle <= job.num_gpus)] -= MILLI
        fa = fgd_fragmentation(
            after, types, cpu_free=cpu[nodes] - job.cpu_milli, access=None if access is None else access[nodes]
        )
        return np.repeat(fgd_score(before, fa)[:, None], width, axis=1)

    def _fitting(self, job: JobView, cv: ClusterView, nodes: np.ndarray) -> np.ndarray:
        """``(len(nodes), max_gpus)``: the GPUs the pod's share fits on (every slot for other pods)."""
        nf = cv.node_free_milli()[nodes]
        if job.num_gpus == 1 and job.gpu_milli < MILLI:
            return nf >= job.gpu_milli
        return np.ones(nf.shape, dtype=bool)

    def node_scores(self, job, cv, nodes):
        s = self._slot_scores(job, cv)[nodes]
        return np.where(self._fitting(job, cv, nodes), s, -1).max(axis=1)

    def select_gpus(self, job, cv, node):
        if job.num_gpus == 1 and job.gpu_milli < MILLI:
            s = np.where(self._fitting(job, cv, np.array([node]))[0], self._slot_scores(job, cv)[node], -1)
            slot = int(np.argmax(s))  # the first GPU of the best score
            return [int(cv.node_first_gpu[node]) + slot]
        return super().select_gpus(job, cv, node)


PolicyFactory = Callable[..., PlacementPolicy]

#: name -> factory of the artifact's six baselines
REFERENCE_POLICIES: dict[str, type[ReferencePolicy]] = {
    cls.name: cls for cls in (RandomRef, DotProdRef, GpuClusteringRef, GpuPackingRef, BestFitRef, FGDRef)
}
#: our name -> the artifact's label in its expected results
ARTIFACT_NAMES = {name: cls.artifact_name for name, cls in REFERENCE_POLICIES.items()}


def make_reference_policy(name: str, **options: Any) -> PlacementPolicy:
    """One of the artifact's baselines by name (``KeyError`` lists them)."""
    try:
        factory = REFERENCE_POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown reference policy {name!r}; known: {', '.join(REFERENCE_POLICIES)}") from None
    return factory(**options)
