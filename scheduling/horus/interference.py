"""How fast jobs run when they share one GPU: a work-conserving model fitted to
measured co-location throughputs, and the old flat penalty as a sensitivity.

Data
    ``data/interference/gavel_oracle_throughputs.json``: measured training
    throughputs (steps/s) of 26 DL job types alone and in every pair sharing
    one K80, P100 or V100, from Gavel (Narayanan et al., OSDI 2020, MIT
    licence). A pair's *normalized* throughput is each job's paired
    throughput over its standalone one (its speed, 1 = unslowed). Pairs that
    did not fit in memory (0.0) are dropped; where the file holds a pair in
    both orders the two measurements are averaged.

Model (per GPU type: interference ``b`` >= 0 fitted, capacity ``C`` = 1 GPU)
    A job with standalone utilization ``u`` spends a share ``u`` of each step
    on the GPU and ``1 - u`` elsewhere (input pipeline, host code). Sharing
    stretches its GPU phases by a factor ``g >= 1``, so its speed is
    ``s = 1 / (u*g + 1 - u)``. Two causes stretch them:

    * interference: ``g_i >= 1 + b * (sum of the partners' utilizations)``
      (kernels of co-located jobs contend for SMs, caches and memory
      bandwidth even when the GPU has idle time); alone this gives
      ``s_i = 1 / (1 + b * u_i * sum_{j != i} u_j)``, the same for both jobs
      of a pair;
    * capacity: together the jobs may deliver at most ``C`` GPUs of
      standalone-equivalent work, ``sum_i u_i * s_i <= C``. Where the
      interference stretch alone leaves more than that, a common stretch
      ``G`` is raised until the GPU is exactly full: ``g_i = max(1 + b*..., G)``.

    A job alone runs at speed 1. Work conservation is built in, not checked
    after the fact: ``k >= 2`` jobs deliver ``sum u_i s_i <= C <= 1`` GPU, so
    ``k`` saturated jobs (``u = 1``) each run at ``<= C/k <= 1/k``, whatever
    ``b`` is. Speeds never rise with load: a partner more, or more
    utilization anywhere, raises every stretch. ``C`` is held at 1: the pairs
    cannot tell any ``C`` in about [0.95, 1] apart (see :func:`fit_gpu`).
    Fitted (``data/interference/fitted_params.json``): ``b`` = 1.115 (V100),
    0.728 (P100), 0.75 (K80; flat in ``b`` there, as nearly every job
    saturates a K80).

Utilization proxy
    Gavel measured throughputs, not GPU utilization, so each job type's
    standalone utilization is a *latent* number per GPU type, fitted jointly
    with ``b``: the utilization that best explains all of that job's pairs
    under the model (it is high for a job that slows down a lot against
    every partner, i.e. it is the job's mean slowdown against all partners,
    read through the model). Pair data alone fix the utilizations only up
    to a trade-off with ``b`` (a larger ``b`` with smaller utilizations fits
    as well), so the scale is anchored by one stated assumption: the job
    type whose two copies slow each other down the most (lowest self-pair
    speed: ResNet-18 batch 256 on V100, 0.46 each) saturates the GPU,
    ``u = 1``. The simulator feeds its own (assumed) true utilizations into
    the fitted ``b``; the latent ones are only the fit's by-product. Memory:
    the data give only whether a pair fit (the 0.0 entries), not
    footprints, so the model has no memory term; whether jobs fit is the
    simulator's out-of-memory rule.

Held-out error (``heldout_by_family``)
    Leave one model family out (ResNet-18, ResNet-50, Transformer, LM,
    Recommendation, A3C, CycleGAN): fit ``b`` and the utilizations of the
    other families' types on the pairs among them; then estimate each
    held-out type's utilization from its pairs with a probe half of the
    training types only (as one would profile a new job against a few
    reference jobs) and predict all its other pairs. The error is the MAE of
    predicted vs measured normalized throughput over those pairs, next to a
    constant, the flat +20 % penalty and a per-job mean-speed baseline.
    Result (``bench/interference_fit.py``): V100 0.123 (constant 0.149, flat
    0.170, job mean 0.134), P100 0.122 (0.163, 0.153, 0.122), K80 0.083
    (0.097, 0.307, 0.069: on K80 the job-mean baseline is better).

Use in the simulator: :class:`FittedInterference` (``from_data()``) gives
each co-located job's speed from the true utilizations of the jobs on one
GPU (``speeds``; ``slowdowns(GpuLoad)`` is the replay's interface, the GPU
type from the cluster spec via :func:`fitted_gpu_type`). It is the replay's
default, registered as ``fitted`` in ``replay.INTERFERENCE_MODELS``.
:class:`FlatSharingPenalty` is the previous model (+20 % whenever a GPU is
shared, regardless of load) in this module's ``speeds`` form; the replay's
own copy of it is ``replay.SharingPenalty`` (``share_penalty``/``capped``),
kept as a labelled sensitivity, not physics.
Plain numpy/scipy, no Django.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "interference"
GAVEL_FILE = DATA_DIR / "gavel_oracle_throughputs.json"
PARAMS_FILE = DATA_DIR / "fitted_params.json"
SOURCE = "Gavel (Narayanan et al., OSDI 2020), stanford-futuredata/gavel, MIT licence"
FITTED_GPU_TYPES = ("k80", "p100", "v100")
DEFAULT_FITTED_TYPE = "v100"
# Cluster GPU models -> the measured type that stands in for them. T4 is
# closest to a P100 in FP32 throughput; A10 and Alibaba's undisclosed G2/G3
# (taken as V100-32GB-like in profiles.py) to a V100. Unknown names: V100.
GPU_TYPE_STAND_IN = {
    "k80": "k80",
    "p100": "p100",
    "t4": "p100",
    "v100": "v100",
    "v100m16": "v100",
    "v100m32": "v100",
    "a10": "v100",
    "g2": "v100",
    "g3": "v100",
}
_B_GRID = np.round(np.arange(0.0, 2.51, 0.125), 3)  # scan of the interference parameter before polishing
_SCAN_NFEV = 25  # per scan point (warm-started); the best point is then polished to convergence
_MAX_B = 10.0
_STEP = 1e-7  # finite-difference step of the fit's Jacobian
_MIN_UTIL = 0.01  # fitted utilizations stay above this (keeps the pair solve well-conditioned)


def fitted_gpu_type(gpu_model: str) -> str:
    """The measured GPU type (``k80``/``p100``/``v100``) whose fit a cluster GPU model uses."""
    return GPU_TYPE_STAND_IN.get(gpu_model.strip().lower(), DEFAULT_FITTED_TYPE)


class InterferenceModel(Protocol):
    """What the simulator needs: co-located jobs' speeds as fractions of standalone."""

    name: str

    def speeds(
        self, utils: Sequence[float], mem_fracs: Sequence[float] | None = None, gpu_type: str = "V100"
    ) -> list[float]: ...

    def describe(self) -> dict[str, Any]: ...


def _check_utils(utils: Sequence[float], mem_fracs: Sequence[float] | None) -> tuple[float, ...]:
    us = tuple(float(u) for u in utils)
    for u in us:
        if not 0.0 <= u <= 1.0 + 1e-9:  # also rejects NaN
            raise ValueError(f"utilization {u!r} is not a fraction in [0, 1] (pass percent / 100)")
    if mem_fracs is not None and len(mem_fracs) != len(us):
        raise ValueError("mem_fracs must have one entry per job")
    return tuple(min(u, 1.0) for u in us)


# --------------------------------------------------------------------- model


@dataclass(frozen=True)
class GpuParams:
    """Fitted parameters of one GPU type (see the module docstring)."""

    capacity: float  # C: GPUs of standalone-equivalent work co-located jobs deliver together, <= 1
    interference: float  # b: stretch of a job's GPU phases per unit of its partners' utilization

    def __post_init__(self) -> None:
        if not (0.0 < self.capacity <= 1.0 and self.interference >= 0.0):
            raise ValueError(f"need 0 < capacity <= 1 and interference >= 0, got {self}")


def stretched_speeds(utils: Sequence[float], capacity: float, interference: float) -> list[float]:
    """Speeds of the jobs on one GPU (any number of them; ``utils`` fractions in [0, 1])."""
    return list(_stretched(tuple(float(u) for u in utils), float(capacity), float(interference)))


@lru_cache(maxsize=1 << 16)  # the simulator asks again for every GPU whose job set recurs
def _stretched(utils: tuple[float, ...], capacity: float, interference: float) -> tuple[float, ...]:
    """:func:`stretched_speeds`, cached.

    Bisects the common stretch ``G`` on ``[1, k/C]``: at ``G = k/C`` each job's
    work ``u/(u*G + 1 - u) <= 1/G``, so the upper end always satisfies the
    capacity; the returned speeds use that end, never the infeasible one."""
    k = len(utils)
    if k <= 1:
        return (1.0,) * k
    total = sum(utils)
    floor = [1.0 + interference * (total - u) for u in utils]

    def work(stretch: float) -> float:
        return sum(u / (u * max(f, stretch) + 1.0 - u) for u, f in zip(utils, floor))

    stretch = 1.0
    if work(1.0) > capacity:
        lo, hi = 1.0, k / capacity
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if mid == lo or mid == hi:
                break  # converged to adjacent floats: further steps change nothing
            if work(mid) > capacity:
                lo = mid
            else:
                hi = mid
        stretch = hi
    return tuple(1.0 / (u * max(f, stretch) + 1.0 - u) for u, f in zip(utils, floor))


def pair_speeds(u: np.ndarray, capacity: float, interference: float) -> np.ndarray:
    """Closed-form :func:`stretched_speeds` for many pairs at once (``u`` shape ``(n, 2)``).

    Used by the fit, where the bisection would be too slow. Either only the
    job with the lower interference floor is lifted to the common stretch
    (one linear equation), or both are (a quadratic in ``G`` with
    ``p_i = (1 - u_i)/u_i``: ``C G^2 + (C(p1+p2) - 2) G + C p1 p2 - p1 - p2 = 0``)."""
    u = np.clip(np.asarray(u, float), 1e-3, 1.0)
    c = capacity
    floor = 1.0 + interference * u[:, ::-1]
    work = u / (u * floor + 1.0 - u)
    p = (1.0 - u) / u
    rows = np.arange(len(u))
    lo = np.argmin(floor, axis=1)
    hi = 1 - lo
    rest = c - work[rows, hi]
    with np.errstate(divide="ignore", invalid="ignore"):
        one_lifted = 1.0 / rest - p[rows, lo]
    s, q = p.sum(axis=1), p.prod(axis=1)
    lin = c * s - 2.0
    both_lifted = (-lin + np.sqrt(lin * lin - 4.0 * c * (c * q - s))) / (2.0 * c)
    stretch = np.where((rest > 0) & (one_lifted <= floor[rows, hi]), one_lifted, both_lifted)
    stretch = np.where(work.sum(axis=1) > c, stretch, 1.0)
    return 1.0 / (u * np.maximum(floor, stretch[:, None]) + 1.0 - u)


@dataclass(frozen=True)
class FittedInterference:
    """The physical model with per-GPU-type parameters fitted to Gavel's pairs."""

    params: Mapping[str, GpuParams]
    name: str = "fitted"  # its name in ``replay.INTERFERENCE_MODELS``

    @classmethod
    def from_data(cls, path: str | Path | None = None) -> FittedInterference:
        """Load the cached fit (``data/interference/fitted_params.json`` by default)."""
        doc = json.loads(Path(path or PARAMS_FILE).read_text())
        return cls({g: GpuParams(**v["params"]) for g, v in doc["gpu_types"].items()})

    def params_for(self, gpu_type: str) -> GpuParams:
        key = gpu_type.lower() if gpu_type.lower() in self.params else fitted_gpu_type(gpu_type)
        return self.params[key if key in self.params else DEFAULT_FITTED_TYPE]

    def speeds(
        self, utils: Sequence[float], mem_fracs: Sequence[float] | None = None, gpu_type: str = "V100"
    ) -> list[float]:
        """Each job's speed (fraction of standalone) on one GPU of ``gpu_type``.

        ``utils``: the jobs' TRUE standalone utilizations as fractions.
        ``mem_fracs`` is checked for length only (no memory term, see above)."""
        p = self.params_for(gpu_type)
        return list(_stretched(_check_utils(utils, mem_fracs), p.capacity, p.interference))

    def slowdowns(self, load: Any) -> list[float]:
        """The replay's interface (``replay.InterferenceModel``): one slowdown (1 / speed) per job of a
        ``replay.GpuLoad``, from the jobs' true utilizations in percent on that GPU's type."""
        utils = [min(max(u, 0.0), 100.0) / 100.0 for u in load.utils_pct]
        mems = [m / load.mem_cap_mb if load.mem_cap_mb > 0 else 0.0 for m in load.mems_mb]
        return [1.0 / s for s in self.speeds(utils, mems, load.gpu_model)]

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "name": self.name,
            "kind": "physical (work-conserving, fitted)",
            "fitted_to": "Gavel's measured co-location throughputs (26 job types, pairs on K80/P100/V100)",
            "source": SOURCE,
            "gpu_type_stand_in": dict(GPU_TYPE_STAND_IN),
            "params": {g: asdict(p) for g, p in sorted(self.params.items())},
        }


def flat_sharing_slowdown(
    n_jobs: int,
    demand_pct: float,
    job_util_pct: float,
    *,
    share_penalty: float,
    util_slope: float = 0.0,
    oversub_exponent: float = 0.0,
) -> float:
    """The old, load-blind rule (one place for the replay's ``SharingPenalty`` and ``FlatSharingPenalty``):
    ``(1 + share_penalty + util_slope * others_util/100) * max(1, D/100) ** oversub_exponent`` for a job
    sharing its GPU (``D`` the GPU's demand in %), 1 alone."""
    if n_jobs <= 1:
        return 1.0
    s = 1.0 + share_penalty + util_slope * max(0.0, demand_pct - job_util_pct) / 100.0
    if demand_pct > 100.0:
        s *= (demand_pct / 100.0) ** oversub_exponent
    return s


@dataclass(frozen=True)
class FlatSharingPenalty:
    """SENSITIVITY, not physics: the Horus paper simulator's +``penalty`` slowdown
    whenever a GPU is shared, whatever the load (so three saturated jobs on one
    GPU deliver 2.5 GPUs of work). ``oversub_exponent=1`` also stretches an
    over-subscribed GPU by its demand (the old "capped" variant)."""

    penalty: float = 0.2
    oversub_exponent: float = 0.0
    name: str = "flat-sharing-penalty"

    def speeds(
        self, utils: Sequence[float], mem_fracs: Sequence[float] | None = None, gpu_type: str = "V100"
    ) -> list[float]:
        us = _check_utils(utils, mem_fracs)
        demand_pct = 100.0 * sum(us)
        return [
            1.0
            / flat_sharing_slowdown(
                len(us), demand_pct, 100.0 * u, share_penalty=self.penalty, oversub_exponent=self.oversub_exponent
            )
            for u in us
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": "sensitivity (not physical)",
            "penalty": self.penalty,
            "oversub_exponent": self.oversub_exponent,
        }


# ---------------------------------------------------------------- data + fit


@dataclass(frozen=True)
class PairSet:
    """Measured pairs on one GPU type: ``speeds[r]`` = normalized throughputs of
    ``jobs[a[r]]`` and ``jobs[b[r]]`` sharing the GPU (``a[r] <= b[r]``)."""

    gpu_type: str
    jobs: tuple[str, ...]
    a: np.ndarray
    b: np.ndarray
    speeds: np.ndarray

    def rows_within(self, members: Sequence[int]) -> np.ndarray:
        m = np.zeros(len(self.jobs), bool)
        m[list(members)] = True
        return m[self.a] & m[self.b]

    def self_speeds(self) -> dict[int, float]:
        """Speed of each job type sharing the GPU with a copy of itself, where it fit."""
        return {int(i): float(self.speeds[r].mean()) for r, (i, j) in enumerate(zip(self.a, self.b)) if i == j}


def family(job_type: str) -> str:
    """Model family of a Gavel job type: ``"ResNet-50 (batch size 64)"`` -> ``"ResNet-50"``."""
    return job_type.split(" (")[0]


def load_pairs(path: str | Path | None = None) -> dict[str, PairSet]:
    """Gavel's file as :class:`PairSet` per GPU type (format: gpu -> job ->
    ``{"null": alone, other: [this job's, other's throughput when paired]}``)."""
    doc = json.loads(Path(path or GAVEL_FILE).read_text())
    out = {}
    for gpu, table in sorted(doc.items()):
        jobs = tuple(sorted(table))
        alone = {j: float(table[j]["null"]) for j in jobs}
        a, b, x = [], [], []
        for i, ja in enumerate(jobs):
            for k in range(i, len(jobs)):
                jb = jobs[k]
                seen = [(t[0], t[1]) for t in (table[ja][jb],) if t[0] > 0 and t[1] > 0]
                seen += [(t[1], t[0]) for t in (table[jb][ja],) if t[0] > 0 and t[1] > 0]
                if seen:  # 0.0 = did not fit in memory; both orders measured -> mean
                    a.append(i)
                    b.append(k)
                    x.append([np.mean([s[0] for s in seen]) / alone[ja], np.mean([s[1] for s in seen]) / alone[jb]])
        out[gpu] = PairSet(gpu, jobs, np.array(a), np.array(b), np.array(x))
    return out


@dataclass(frozen=True)
class GpuFit:
    """One GPU type's fit: parameters, latent utilization per job type, in-sample error."""

    gpu_type: str
    params: GpuParams
    utils: dict[str, float]
    anchor: str
    n_pairs: int
    in_sample_mae: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": asdict(self.params),
            "anchor": self.anchor,
            "n_pairs": self.n_pairs,
            "in_sample_mae": self.in_sample_mae,
            "utils": self.utils,
        }


def _rounded(v: float) -> float:
    return float(round(float(v), 6))


class _LatentProblem:
    """Least-squares residuals of one GPU type's pairs among ``members``, as a
    function of ``theta = [b, utilizations of the non-anchor members]``."""

    def __init__(self, pairs: PairSet, members: Sequence[int], capacity: float) -> None:
        self.pairs, self.capacity = pairs, capacity
        rows = pairs.rows_within(members)
        self.n_rows = int(rows.sum())
        self.a, self.b, self.x = pairs.a[rows], pairs.b[rows], pairs.speeds[rows]
        selfs = pairs.self_speeds()
        self.anchor = min((i for i in members if i in selfs), key=lambda i: selfs[i])
        self.free = [i for i in members if i != self.anchor]
        self.utils = np.ones(len(pairs.jobs))
        self.column = np.full(len(pairs.jobs), -1)
        self.column[self.free] = np.arange(1, 1 + len(self.free))

    def _u(self, theta: np.ndarray) -> np.ndarray:
        self.utils[self.free] = theta[1:]
        return np.stack([self.utils[self.a], self.utils[self.b]], 1)

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        return (pair_speeds(self._u(theta), self.capacity, theta[0]) - self.x).ravel()

    def jacobian(self, theta: np.ndarray) -> np.ndarray:
        # A row depends on b and its two jobs' utilizations only: three
        # perturbed evaluations give every column (steps point into the bounds).
        u, c = self._u(theta), self.capacity
        base = pair_speeds(u, c, theta[0])
        jac = np.zeros((2 * len(self.a), len(theta)))
        jac[:, 0] = ((pair_speeds(u, c, theta[0] + _STEP) - base) / _STEP).ravel()
        rows = np.arange(2 * len(self.a)).reshape(-1, 2)
        for side, jobs in ((0, self.a), (1, self.b)):
            du = u.copy()
            du[:, side] -= _STEP
            d = (pair_speeds(du, c, theta[0]) - base) / -_STEP
            fitted = self.column[jobs] >= 0
            for out in (0, 1):  # += so a self-pair gets both sides' terms
                np.add.at(jac, (rows[fitted, out], self.column[jobs][fitted]), d[fitted, out])
        return jac

    def solve(self, theta0: np.ndarray, fix_b: bool, max_nfev: int | None = None) -> tuple[float, np.ndarray]:
        """Least squares from ``theta0`` (``b`` held where ``fix_b``): (cost, theta)."""
        from scipy.optimize import least_squares

        n = len(self.free)
        lo, hi = np.r_[0.0, np.full(n, _MIN_UTIL)], np.r_[_MAX_B, np.ones(n)]
        if fix_b:
            b = theta0[0]
            sol = least_squares(
                lambda t: self.residuals(np.r_[b, t]),
                theta0[1:],
                bounds=(lo[1:], hi[1:]),
                jac=lambda t: self.jacobian(np.r_[b, t])[:, 1:],
                max_nfev=max_nfev,
                tr_solver="lsmr",
            )
            return float(sol.cost), np.r_[b, sol.x]
        sol = least_squares(
            self.residuals, theta0, jac=self.jacobian, bounds=(lo, hi), max_nfev=max_nfev, tr_solver="lsmr"
        )
        return float(sol.cost), sol.x


def fit_gpu(pairs: PairSet, members: Sequence[int] | None = None, *, capacity: float = 1.0) -> GpuFit:
    """Fit ``b`` and the members' utilizations on the pairs among ``members``
    (default: all job types), ``C`` held at ``capacity``. The member with the
    lowest self-pair speed is the anchor (``u = 1``); least squares on all
    normalized throughputs.

    The error is not smooth in ``b`` (where the capacity bound starts to bind
    it has kinks and local minima), so ``b`` is first scanned on a grid (the
    utilizations refitted at each point, warm-started) and the best point
    polished. ``C`` is not fitted: with ``b`` near 1 the interference stretch
    alone keeps a pair under one GPU of work, so the pairs cannot tell any
    ``C`` in about [0.95, 1] apart (same error); the physical bound 1 is kept."""
    members = sorted(range(len(pairs.jobs)) if members is None else members)
    prob = _LatentProblem(pairs, members, capacity)
    theta = np.r_[0.0, np.full(len(prob.free), 0.6)]
    best = (math.inf, theta)
    for b in _B_GRID:
        cost, theta = prob.solve(np.r_[b, theta[1:]], fix_b=True, max_nfev=_SCAN_NFEV)
        best = min(best, (cost, theta), key=lambda t: t[0])
    cost, theta = prob.solve(best[1], fix_b=False)
    if cost > best[0]:
        theta = best[1]
    mae = float(np.abs(prob.residuals(theta)).mean())
    return GpuFit(
        pairs.gpu_type,
        GpuParams(capacity, _rounded(theta[0])),
        {pairs.jobs[i]: _rounded(prob.utils[i]) for i in members},
        pairs.jobs[prob.anchor],
        prob.n_rows,
        _rounded(mae),
    )


def _rows_of(pairs: PairSet, job: int, partners: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Partner index and (job's, partner's) speed of every pair of ``job`` with ``partners``."""
    ps = set(partners) - {job}
    idx, xs = [], []
    for r, (i, k) in enumerate(zip(pairs.a, pairs.b)):
        if i == job and k in ps:
            idx.append(k)
            xs.append(pairs.speeds[r])
        elif k == job and i in ps:
            idx.append(i)
            xs.append(pairs.speeds[r][::-1])
    return np.array(idx, int), np.array(xs).reshape(-1, 2)


def fit_job_util(pairs: PairSet, job: int, partners: Sequence[int], utils: np.ndarray, params: GpuParams) -> float:
    """A new job type's utilization from its pairs with ``partners`` (whose
    utilizations and the GPU's parameters stay fixed): 1-D least squares."""
    from scipy.optimize import minimize_scalar

    idx, x = _rows_of(pairs, job, partners)
    if not len(idx):
        raise ValueError(f"{pairs.jobs[job]} has no measured pair with the given partners")

    def sse(u: float) -> float:
        pred = pair_speeds(np.stack([np.full(len(idx), u), utils[idx]], 1), params.capacity, params.interference)
        return float(((pred - x) ** 2).sum())

    return float(minimize_scalar(sse, bounds=(_MIN_UTIL, 1.0), method="bounded", options={"xatol": 1e-6}).x)


def _job_mean_speeds(
    pairs: PairSet, rows: np.ndarray, job_rows: Mapping[int, tuple[np.ndarray, np.ndarray]]
) -> dict[int, float]:
    """Baseline: each job type's mean speed, over the ``rows`` it appears in
    (training types) or over its own probe pairs (``job_rows``, held-out types)."""
    means: dict[int, float] = {int(i): float(np.mean(x[:, 0])) for i, (_, x) in job_rows.items()}
    for i in range(len(pairs.jobs)):
        if i not in means:
            own = np.r_[pairs.speeds[rows & (pairs.a == i), 0], pairs.speeds[rows & (pairs.b == i), 1]]
            if len(own):
                means[i] = float(own.mean())
    return means


def _heldout_fold(pairs: PairSet, held: list[int]) -> dict[str, Any]:
    """One fold of :func:`heldout_by_family`: predictions on the held-out pairs."""
    train = [i for i in range(len(pairs.jobs)) if i not in held]
    fit = fit_gpu(pairs, train)
    utils = np.array([fit.utils.get(j, np.nan) for j in pairs.jobs])
    probe = train[::2]  # every other training type (sorted by name) profiles the new jobs
    probe_rows = {j: _rows_of(pairs, j, probe) for j in held}
    estimable = [j for j in held if len(probe_rows[j][0])]
    for j in estimable:
        utils[j] = fit_job_util(pairs, j, probe, utils, fit.params)
    touches = np.isin(pairs.a, held) | np.isin(pairs.b, held)
    test = touches & ~(np.isin(pairs.a, probe) | np.isin(pairs.b, probe))
    test &= ~np.isnan(utils[pairs.a]) & ~np.isnan(utils[pairs.b])
    a, b, x = pairs.a[test], pairs.b[test], pairs.speeds[test]
    pred = pair_speeds(np.stack([utils[a], utils[b]], 1), fit.params.capacity, fit.params.interference)
    train_rows = pairs.rows_within(train)
    jm = _job_mean_speeds(pairs, train_rows, {j: probe_rows[j] for j in estimable})
    return {
        "family": family(pairs.jobs[held[0]]),
        "params": asdict(fit.params),
        "n_test_pairs": int(test.sum()),
        "not_estimable": [pairs.jobs[j] for j in held if j not in estimable],
        "measured": x,
        "predicted": pred,
        "baselines": {
            "constant": np.full_like(x, pairs.speeds[train_rows].mean()),
            "flat_0.2": np.full_like(x, 1.0 / 1.2),
            "job_mean": np.array([[jm[i], jm[k]] for i, k in zip(a, b)]).reshape(-1, 2),
        },
    }


def _combined_stats(speeds: np.ndarray) -> dict[str, float]:
    total = speeds.sum(axis=1)
    return {"median": _rounded(np.median(total)), "min": _rounded(total.min()), "max": _rounded(total.max())}


def heldout_by_family(pairs: PairSet) -> dict[str, Any]:
    """Leave-one-family-out error on one GPU type (see the module docstring).

    Pooled over folds: MAE of the model and of the baselines on every held-out
    pair's two normalized throughputs, and the pair's combined throughput
    (sum of the two) predicted vs measured."""
    fams = sorted({family(j) for j in pairs.jobs})
    folds = [_heldout_fold(pairs, [i for i, j in enumerate(pairs.jobs) if family(j) == f]) for f in fams]
    meas = np.concatenate([f["measured"] for f in folds])
    pred = np.concatenate([f["predicted"] for f in folds])
    base = {k: np.concatenate([f["baselines"][k] for f in folds]) for k in folds[0]["baselines"]}
    return {
        "gpu_type": pairs.gpu_type,
        "method": "leave one model family out; held-out utilizations from probe pairs",
        "n_pair_predictions": int(len(meas)),
        "mae": _rounded(np.abs(pred - meas).mean()),
        "baseline_mae": {k: _rounded(np.abs(v - meas).mean()) for k, v in base.items()},
        "combined_predicted": _combined_stats(pred),
        "combined_measured": _combined_stats(meas),
        "folds": [
            {
                "family": f["family"],
                "params": f["params"],
                "n_test_pairs": f["n_test_pairs"],
                "mae": _rounded(np.abs(f["predicted"] - f["measured"]).mean()) if f["n_test_pairs"] else None,
                "not_estimable": f["not_estimable"],
            }
            for f in folds
        ],
    }


def fit_all(path: str | Path | None = None) -> dict[str, Any]:
    """Fit every GPU type; the JSON document :meth:`FittedInterference.from_data` reads."""
    fits = {g: fit_gpu(p) for g, p in load_pairs(path).items()}
    return {
        "source": SOURCE,
        "data_file": "data/interference/gavel_oracle_throughputs.json",
        "model": "s_i = 1/(u_i*g_i + 1 - u_i), g_i = max(1 + b*sum_{j!=i} u_j, G), sum_i u_i*s_i <= C = 1",
        "utilization_proxy": "latent per job type and GPU type, fitted jointly; anchor (u=1): lowest self-pair speed",
        "gpu_types": {g: f.to_dict() for g, f in sorted(fits.items())},
    }


def pair_subset(pairs: PairSet, rows: np.ndarray) -> PairSet:
    """The pairs of ``rows`` (a boolean mask or indices) as a :class:`PairSet` of the same job types."""
    idx = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, int)
    return PairSet(pairs.gpu_type, pairs.jobs, pairs.a[idx], pairs.b[idx], pairs.speeds[idx])


def split_pairs(pairs: PairSet, *, seed: int = 0) -> tuple[PairSet, PairSet]:
    """Two disjoint halves of one GPU type's measured pairs, by a seeded permutation of the pair rows
    (each measured pair lands in exactly one half; a job type appears in both with other partners).
    The first half is the POLICY's, the second the SIMULATOR's: a policy that fits its interference
    model on its half never saw a measurement the simulator's physics was fitted on."""
    order = np.random.default_rng([int(seed), 0x5911]).permutation(len(pairs.a))
    half = len(order) // 2
    return pair_subset(pairs, np.sort(order[:half])), pair_subset(pairs, np.sort(order[half:]))


def fit_split(
    path: str | Path | None = None, *, seed: int = 0, gpu_types: Sequence[str] = ("v100",)
) -> tuple[FittedInterference, FittedInterference, dict[str, Any]]:
    """``(policy's model, simulator's model, facts)``: :func:`fit_gpu` on each half of
    :func:`split_pairs` for each of ``gpu_types`` (other GPU types fall back to the first listed,
    as :meth:`FittedInterference.params_for` does)."""
    all_pairs = load_pairs(path)
    policy, sim, facts = {}, {}, {}
    for g in gpu_types:
        a, b = split_pairs(all_pairs[g], seed=seed)
        fa, fb = fit_gpu(a), fit_gpu(b)
        policy[g], sim[g] = fa.params, fb.params
        facts[g] = {
            "policy_pairs": int(len(a.a)),
            "simulator_pairs": int(len(b.a)),
            "policy_b": fa.params.interference,
            "simulator_b": fb.params.interference,
            "policy_in_sample_mae": fa.in_sample_mae,
            "simulator_in_sample_mae": fb.in_sample_mae,
        }
    return (
        FittedInterference(policy, name="fitted-policy-half"),
        FittedInterference(sim, name="fitted-simulator-half"),
        {"split_seed": seed, "by_gpu_type": facts},
    )


def scaled_interference(model: FittedInterference, factor: float, *, name: str | None = None) -> FittedInterference:
    """``model`` with every GPU type's interference constant ``b`` multiplied by ``factor`` (the
    mismatch knob: the simulator's physics x0.67 / x1.5 while the policy keeps its own fit)."""
    if not factor > 0:
        raise ValueError("factor must be > 0")
    params = {g: GpuParams(p.capacity, min(p.interference * factor, _MAX_B)) for g, p in model.params.items()}
    return FittedInterference(params, name=name or f"{model.name} x{factor:g}")


def write_params(doc: Mapping[str, Any], path: str | Path | None = None) -> Path:
    """Write the fitted parameters (the cache :meth:`FittedInterference.from_data` loads)."""
    out = Path(path or PARAMS_FILE)
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return out
