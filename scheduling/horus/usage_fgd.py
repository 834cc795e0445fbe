"""``usage_fgd``: FGD's fragmentation gradient on PREDICTED usage, overcommitting under a bound on
predicted interference. Our policy (not from a paper); registered in :data:`~.policies.POLICIES`.

FGD (ATC'23) packs by requests: a pod asking for a whole GPU gets one even when it will use a
fifth of it, and whole-GPU jobs never share. This policy differs in two places and keeps the rest
of FGD (the target workload, node CPU/memory/GPU-type terms, the least-growth rule):

* **Usage, not requests.** A job is held at its predicted usage, ``u x (1 + margin)`` milli-GPUs
  for a predicted utilization of ``u`` % (never more than it asked for), and a GPU's free capacity
  is 1000 minus what it holds. The fragmentation gradient is computed on that capacity and on the
  target workload's shapes as they will be held.
* **Overcommit only where the physics allows.** A placement beyond the request (a GPU whose
  requests are full) is taken only if the predicted usage fits, the predicted memory fits with
  500 MB to spare, and, under the fitted interference model (:class:`~.interference.FittedInterference`,
  fitted to Gavel's measured pairs) with the PREDICTED utilizations, no job on that GPU would run
  slower than ``min_speed`` of its standalone speed. A placement within the request is FGD's own.

* **Gangs (whole-GPU requests, replay).** A job on several GPUs runs at its slowest GPU's speed and
  cannot be migrated, so (a) the gain of a placement counts the predicted work a gang loses on its
  OTHER GPUs when a partner slows it here, ``(n - 1) x u x (s0 - s1)`` (and a joining gang of ``k``
  drags its other ``k - 1`` GPUs to its speed here); and (b) after jobs finish, a gang that
  telemetry shows slowed below ``min_speed_gang`` (the fitted model on the jobs' sampled
  per-process utilizations) has its single-GPU partner of highest predicted utilization migrated
  (at most ``max_migrations`` times per job) to an idle GPU, or to a GPU without a gang where every
  job keeps ``min_speed_whole``; where no single-GPU partner can go (the partner is another gang),
  the smallest gang on that GPU moves whole to idle GPUs (``move_gangs``, one node where it must).
  ON by default (``gang_aware``); it makes a replay several times slower (the migration scan). On Philly gangs hold 87 % of the GPU time and the makespan is set by
  one 8-GPU, 54-day job: without (a) and (b) it ran up to 2x slower than alone.
* **Running jobs by telemetry** (``telemetry_utils``, on): a RUNNING job is judged by its sampled
  per-process utilization read back to a standalone one through the fitted model
  (:func:`standalone_from_telemetry`), not by its prediction: a mispredicted gang (seed 2: predicted
  6 %, truly 99 %) is seen as busy once it runs. Only the incoming job is a prediction.
* **Look-ahead** over the first 5 waiting jobs, as Horus's authors run Horus (``queue_lookahead``).

Measured on the bench's quick Philly slice (10,000 jobs, 96 GPUs, seeds 0-2, through the bench's
experiment path): predictions + no gang terms 108.5 / 115.7 / 122.5 days; telemetry only
103.1 / 112.8 / 123.4; telemetry + look-ahead 98.5 / 106.4 / 120.7; all three (default)
101.2 / 109.2 / 102.3 at 25.5 / 27.2 / 26.1 days' mean wait (horus_migrate 102.0 / 103.7 / 110.6 at
30.6 / 32.9 / 34.2; horus 26.9 / 26.5 / 27.8). Tried and dropped: large gangs on idle GPUs only
(136 days: under FIFO they wait for 8 idle GPUs) and a speed floor for gangs at placement
(108-110 days at 36-38 days' wait). With telemetry lag (60 s, the default since) seed 0 ran 118 days: one
8-GPU, 54-day gang predicted at 69 % (truly 86 %) was joined all its life by single-GPU jobs and another
heavy gang, because where every option loses work the gain rule still takes the least bad one. Refusing
shared placements whose predicted gain, gangs' losses counted, is below -1 GPU (or 0) fixed seed 0
(99.8 days) but cost every seed 3-8 days of mean wait (seeds 0-2: 99.8 / 103.7 / 108.6 days at
29.9 / 31.6 / 34.4 days' wait; 0: 102.6 at 33.9), so it was dropped. Over seeds 0-4 the default
runs 118.0 / 103.9 / 104.1 / 118.9 / 94.1 days at 25.5 / 27.3 / 26.4 / 27.5 / 22.8 days' wait (horus_migrate
100.9 / 105.5 / 105.0 / 105.9 / 103.5 at 30.4-34.0; horus 106.9-113.2 at 26.5-27.8): ahead on the medians, behind
by up to 17 % on 2 of 5 seeds, each time one long 8-GPU gang stretched 1.7-1.9x. Also tried and dropped:
refusing a shared GPU whose resident gang telemetry already shows below ``min_speed_gang`` (seeds 0-4:
100.4 / 104.8 / 116.9 / 117.4 / 93.0 days: it moves the loss from seed 0 to seed 2, where the 54-day gang is
predicted at 6 % and truly 99 %), and keeping incoming gangs off GPUs holding a gang of 50 % or more
(104.8 / 107.9 / 109.1 days at 34.6-36.6 days' wait).

Gang moves (``move_gangs``, 2026-12-02) are what fixed those two seeds: seeds 0-4 97.9 / 101.1 / 102.4 /
103.5 / 91.1 days at 25.5 / 27.0 / 26.5 / 27.4 / 22.9 days' wait, ahead of horus_migrate on all five (median
0.963) with the wait unchanged; ``bench/scheduling.py --quick`` runs the ablation (``usage_fgd_gang_moves``).

The policy sees predictions (of the incoming job) and telemetry (of running jobs) only; the simulator runs the jobs' true utilizations, so a wrong
prediction costs real interference (``bench/scheduling.py`` sweeps the prediction error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np

from .cluster import MILLI, ClusterView, JobView
from .interference import FittedInterference, stretched_speeds
from .policies import FGD, HORUS_HEADROOM_MB, HORUS_QUEUE_LOOKAHEAD, _base_mask, _choose, _NodeFrag

__all__ = ["UsageFGD", "held_milli"]


#: held shares are rounded up to this many milli-GPUs (few distinct shapes: FGD's gradient is cached per shape)
HELD_STEP = 50


def held_milli(pred_util_pct: float, request_milli: int, margin: float, floor_milli: int) -> int:
    """Milli-GPUs held for a job: its predicted usage with ``margin``, rounded up to :data:`HELD_STEP`,
    at least ``floor_milli``, never more than its request."""
    want = min(max(pred_util_pct, 0.0), 100.0) * 10.0 * (1.0 + margin)
    want = int(np.ceil(want / HELD_STEP - 1e-9) * HELD_STEP)
    return int(min(max(want, floor_milli), min(request_milli, MILLI)))


@lru_cache(maxsize=1)
def _fitted() -> FittedInterference:
    return FittedInterference.from_data()


def _gp(model: FittedInterference | None, gpu_model: str) -> tuple[float, float]:
    """``(capacity, interference)`` of ``model`` (default: the shipped fit) for one GPU model: the
    caches below are keyed by these two numbers, so several models share them safely."""
    p = (model if model is not None else _fitted()).params_for(gpu_model)
    return float(p.capacity), float(p.interference)


class UsageFGD(FGD):
    """FGD on predicted usage with bounded-interference overcommit (module docstring)."""

    name = "usage_fgd"
    shares_gpus = True
    monotone_feasibility = False  # the interference bound depends on the job's utilization

    def __init__(
        self,
        *,
        margin: float = 0.25,
        floor_milli: int = 50,
        min_speed: float = 0.75,
        max_jobs_per_gpu: int = 4,
        headroom_mb: float = HORUS_HEADROOM_MB,
        max_checked: int = 12,
        min_speed_whole: float = 0.5,
        frag_weight: float = 0.5,
        gang_aware: bool = True,
        min_speed_gang: float = 0.75,
        max_migrations: int = 3,
        telemetry_utils: bool = True,
        queue_lookahead: int = HORUS_QUEUE_LOOKAHEAD,
        move_gangs: bool = True,
        interference: FittedInterference | None = None,
    ):
        super().__init__()
        #: the interference model the POLICY believes (default: the shipped fit to all of Gavel's pairs);
        #: the held-out bench gives it one fitted on pairs the simulator's physics was not fitted on
        self.interference = interference if interference is not None else _fitted()
        if not 0.0 < min_speed <= 1.0:
            raise ValueError("min_speed must be in (0, 1]")
        #: extra share held over the predicted utilization (covers prediction error)
        self.margin = float(margin)
        self.floor_milli = int(floor_milli)
        #: the interference bound: every job on an overcommitted GPU keeps at least this speed
        self.min_speed = float(min_speed)
        #: at most this many jobs on a GPU when overcommitting
        self.max_jobs = int(max_jobs_per_gpu)
        self.headroom_mb = float(headroom_mb)
        #: overcommit candidates checked against the bound per placement, in gradient order
        self.max_checked = int(max_checked)
        #: the bound where requests are whole GPUs (Philly): co-located jobs keep at least this speed
        self.min_speed_whole = float(min_speed_whole)
        #: weight of FGD's fragmentation growth (in GPUs) against the delivered-work gain (whole-GPU requests)
        self.frag_weight = float(frag_weight)
        #: count a gang's work on its other GPUs in the gain, and relieve slowed gangs by migration
        self.gang_aware = bool(gang_aware)
        #: a gang measured below this speed has a partner moved off its GPU
        self.min_speed_gang = float(min_speed_gang)
        #: migrations per job at most
        self.max_migrations = int(max_migrations)
        #: where no single-GPU partner can leave a slowed gang's GPU, move a gang on it whole to idle GPUs
        self.move_gangs = bool(move_gangs)
        #: judge a RUNNING job by its sampled per-process utilization (telemetry) instead of its prediction
        self.telemetry_utils = bool(telemetry_utils)
        #: waiting jobs offered per pass (1: strict FIFO; Horus's authors use 5)
        self.queue_lookahead = max(1, int(queue_lookahead))

    # ------------------------------------------------------------------ what is held
    def held(self, job: JobView) -> int:
        return held_milli(job.pred_util_pct, job.gpu_milli, self.margin, self.floor_milli)

    def reserve(self, job, cluster):
        """The fill method's reservation: the predicted usage (where the cluster counts shares)."""
        return replace(job, gpu_milli=self.held(job)) if cluster.enforce_milli else job

    def _free(self, cluster: ClusterView) -> np.ndarray:
        """Free milli per GPU as held: by reservations where shares are counted, else by the
        predicted utilization of the jobs placed."""
        nf = cluster.node_free_milli()
        if not cluster.enforce_milli:
            util = cluster.demand_util_pct if self.telemetry_utils else cluster.pred_util_pct
            used = np.ceil(np.asarray(util) * 10.0 * (1.0 + self.margin))
            free = np.maximum(0, MILLI - np.where(cluster.n_jobs > 0, np.maximum(used, self.floor_milli), 0))
            nf = nf.copy()
            nf[cluster.gpu_node, cluster.gpu_slot] = free.astype(np.int64)
        return nf

    # ------------------------------------------------------------------ placement
    def place(self, job, cluster, now):
        if job.num_gpus > 1 and job.single_node:
            return FGD.place(self, job, cluster, now)  # a one-node gang: FGD's whole-GPU placement
        need = self.held(job)
        nf = self._free(cluster)
        empty = self._mask(job, cluster)
        over = (
            self._overcommit_mask(job, cluster, nf, need) if cluster.enforce_milli else self._shared_mask(job, cluster)
        )
        frag = _NodeFrag(cluster, self._types(job, cluster), replace(job, gpu_milli=need), self._cache)
        chosen: list[int] = []
        for _ in range(job.num_gpus):
            g = self._pick(job, cluster, nf, empty, over, frag, need)
            if g is None:
                return None
            chosen.append(g)
            empty[g] = over[g] = False
            nf[cluster.gpu_node[g], cluster.gpu_slot[g]] -= need
        return sorted(chosen)

    def _pick(
        self,
        job: JobView,
        cv: ClusterView,
        nf: np.ndarray,
        empty: np.ndarray,
        over: np.ndarray,
        frag: _NodeFrag,
        need: int,
    ) -> int | None:
        if not cv.enforce_milli:
            return self._pick_by_gain(job, cv, nf, empty, over, frag, need)
        return self._pick_by_gradient(job, cv, nf, empty, over, frag, need)

    def _shared_mask(self, job: JobView, cv: ClusterView) -> np.ndarray:
        """Shared GPUs with fewer than ``max_jobs`` jobs and the job's predicted memory free (+ headroom)."""
        shared = _base_mask(job, cv, respect_milli=False) & (cv.n_jobs > 0) & (cv.n_jobs < self.max_jobs)
        jmem = max(job.pred_mem_mb, job.mem_floor_mb)
        shared &= cv.mem_cap_mb - (np.maximum(cv.pred_mem_mb, cv.meas_mem_mb) + jmem) >= self.headroom_mb
        return shared

    def _utils_on(self, cv: ClusterView, gpu: int) -> tuple[float, ...]:
        """What the policy takes the utilizations of the jobs on ``gpu`` to be: their predictions, or
        with ``telemetry_utils`` their sampled per-process utilizations (a job alone shows its standalone
        value; a slowed one more, so this errs towards caution)."""
        if not self.telemetry_utils:
            return cv.pred_utils_on(gpu)
        return standalone_from_telemetry(cv.meas_utils_on(gpu), cv.gpu_model[gpu], self.interference)

    def _pick_by_gain(
        self,
        job: JobView,
        cv: ClusterView,
        nf: np.ndarray,
        empty: np.ndarray,
        shared: np.ndarray,
        frag: _NodeFrag,
        need: int,
    ) -> int | None:
        """Whole-GPU requests (no shares counted): the GPU where the job adds the most predicted delivered
        work (an empty GPU: its whole utilization; a shared one: what the fitted model says the GPU
        delivers with it minus without it), less ``frag_weight`` x the fragmentation growth in GPUs;
        a shared GPU only if every job on it keeps ``min_speed_whole``; with ``gang_aware`` the gain
        counts what gangs lose on their other GPUs (:func:`_gang_loss`)."""
        cand = np.flatnonzero(empty | shared)
        if len(cand) == 0:
            return None
        u = min(max(job.pred_util_pct, 1.0), 100.0) / 100.0
        gain = np.full(len(cand), u)
        ok = np.ones(len(cand), dtype=bool)
        ju = _key_of((job.pred_util_pct,))[0]
        models = cv.gpu_model
        for i in np.flatnonzero(~empty[cand]):
            g = int(cand[i])
            utils = self._utils_on(cv, g)
            gain[i], slowest = _gain(_key_of(utils), ju, _gp(self.interference, models[g]))
            ok[i] = slowest >= self.min_speed_whole
            if self.gang_aware:
                counts = cv.gpu_counts_on(g)
                if job.num_gpus > 1 or any(n > 1 for n in counts):
                    gain[i] -= _gang_loss(utils, counts, job.pred_util_pct, job.num_gpus, models[g], self.interference)
        if not ok.any():
            return None
        value = gain - self.frag_weight * frag.delta_single(nf, cand, need) / MILLI
        value = np.where(ok, value, -np.inf)
        return int(cand[int(np.argmax(value))])

    def _pick_by_gradient(
        self,
        job: JobView,
        cv: ClusterView,
        nf: np.ndarray,
        empty: np.ndarray,
        over: np.ndarray,
        frag: _NodeFrag,
        need: int,
    ) -> int | None:
        """The candidate GPU of least fragmentation growth (ties: the least loaded, then the lowest
        index) that is empty or, shared, keeps every job on it above ``min_speed``."""
        cand = np.flatnonzero(empty | over)
        if len(cand) == 0:
            return None
        delta = frag.delta_single(nf, cand, need)
        load = MILLI - nf[cv.gpu_node[cand], cv.gpu_slot[cand]]
        checked = 0
        for i in np.lexsort((cand, load, np.round(delta, 6))):
            g = int(cand[i])
            if empty[g]:
                return g
            if checked < self.max_checked:
                checked += 1
                if self._speed_ok(job, cv, g):
                    return g
        return None

    # ------------------------------------------------------------------ relieving slowed gangs
    def rebalance(self, cluster, now):
        """Relieve gangs that telemetry shows slowed below ``min_speed_gang`` (whole-GPU requests):
        from such a gang's GPU, move the single-GPU partner of highest predicted utilization to
        :meth:`_refuge`. One move per GPU per call. Reads predictions, telemetry and the placement."""
        cv = cluster
        if cv.enforce_milli or not self.gang_aware:
            return []
        moves: list[tuple[str, list[int]]] = []
        taken: set[int] = set()
        for g in map(int, np.flatnonzero(np.asarray(cv.n_jobs) >= 2)):
            counts = cv.gpu_counts_on(g)
            if g in taken or max(counts) < 2:
                continue
            speeds = job_speeds(cv.meas_utils_on(g), cv.gpu_model[g], self.interference)
            if min(sp for n, sp in zip(counts, speeds) if n > 1) >= self.min_speed_gang:
                continue
            movable = sorted(
                (rj for rj in cv.jobs_on(g) if rj.view.num_gpus == 1 and rj.migrations < self.max_migrations),
                key=lambda rj: (-rj.view.pred_util_pct, rj.view.job_id),
            )
            for rj in movable:
                t = self._refuge(rj, cv, exclude=taken | {g})
                if t is not None:
                    moves.append((rj.view.job_id, [t]))
                    taken.update((g, t))
                    break
            else:
                if self.move_gangs:
                    self._move_a_gang(g, cv, taken, moves)
        return moves

    def _move_a_gang(self, g: int, cv: ClusterView, taken: set[int], moves: list) -> None:
        """No single-GPU partner could go: move one gang on ``g`` whole to idle GPUs (the smallest gang
        first, it needs the fewest), where it runs alone; nothing if no gang fits on idle GPUs."""
        gangs = sorted(
            (
                rj
                for rj in cv.jobs_on(g)
                if rj.view.num_gpus > 1 and rj.migrations < self.max_migrations and not taken.intersection(rj.gpus)
            ),
            key=lambda rj: (rj.view.num_gpus, -rj.view.pred_util_pct, rj.view.job_id),
        )
        for rj in gangs:
            dest = self._idle_gpus_for(rj.view, cv, exclude=taken)
            if dest is not None:
                moves.append((rj.view.job_id, dest))
                taken.update(rj.gpus)
                taken.update(dest)
                return

    def _idle_gpus_for(self, job: JobView, cv: ClusterView, exclude: set[int]) -> list[int] | None:
        """``job.num_gpus`` idle GPUs that meet its constraints (one node if it must: the node with the
        fewest idle GPUs that still fit it, so large idle blocks stay whole), or None."""
        mask = _base_mask(job, cv, respect_milli=False) & (np.asarray(cv.n_jobs) == 0)
        if exclude:
            mask[list(exclude)] = False
        cost = np.zeros(len(mask))  # across nodes: the lowest-index idle GPUs
        if job.single_node:  # a GPU costs its node's idle count: the node whose k cost least fits most tightly
            cost = np.bincount(cv.gpu_node[mask], minlength=cv.n_nodes)[cv.gpu_node].astype(float)
        return _choose(job, cv, cost, mask)

    def _refuge(self, rj, cv: ClusterView, exclude: set[int]) -> int | None:
        """Where a partner moved off a gang's GPU goes: the lowest-index idle GPU, else the GPU with no
        gang where it is predicted (fitted model, telemetry) to run fastest with every job there at
        ``min_speed_whole`` or more, memory by prediction with headroom; None if nowhere."""
        job = rj.view
        n_jobs = np.asarray(cv.n_jobs)
        mask = _base_mask(job, cv, respect_milli=False) & (n_jobs < self.max_jobs)
        if exclude:
            mask[list(exclude)] = False
        idle = np.flatnonzero(mask & (n_jobs == 0))
        if len(idle):
            return int(idle[0])
        jmem = max(job.pred_mem_mb, job.mem_floor_mb, rj.meas_mem_mb)
        mask &= cv.mem_cap_mb - (np.maximum(cv.pred_mem_mb, cv.meas_mem_mb) + jmem) >= self.headroom_mb
        best, best_speed = None, self.min_speed_whole
        for t in map(int, np.flatnonzero(mask)):
            if max(cv.gpu_counts_on(t)) > 1:
                continue
            speeds = job_speeds(cv.meas_utils_on(t) + (rj.meas_util_pct,), cv.gpu_model[t], self.interference)
            if min(speeds) < self.min_speed_whole or (best is not None and speeds[-1] <= best_speed):
                continue
            best, best_speed = t, speeds[-1]
        return best

    def _mask(self, job, cluster):
        """Empty GPUs that meet the hard constraints (and, where shares are counted, the held share)."""
        return _base_mask(job, cluster, respect_milli=True) & (cluster.n_jobs == 0)

    def _overcommit_mask(self, job: JobView, cv: ClusterView, nf: np.ndarray, need: int) -> np.ndarray:
        """Shared GPUs where the job fits by held usage and predicted memory (at most ``max_jobs`` jobs
        where shares are not counted)."""
        mask = _base_mask(job, cv, respect_milli=False) & (cv.n_jobs > 0)
        if not cv.enforce_milli:
            mask &= cv.n_jobs < self.max_jobs
        mask &= nf[cv.gpu_node, cv.gpu_slot] >= need
        jmem = max(job.pred_mem_mb, job.mem_floor_mb)
        mem = np.maximum(cv.pred_mem_mb, cv.meas_mem_mb)
        mask &= cv.mem_cap_mb - (mem + jmem) >= self.headroom_mb
        return mask

    def _speed_ok(self, job: JobView, cv: ClusterView, gpu: int) -> bool:
        """Every job on ``gpu`` keeps ``min_speed`` under the fitted model, on predicted utilizations."""
        utils = cv.pred_utils_on(gpu) + (job.pred_util_pct,)
        return min_predicted_speed(utils, cv.gpu_model[gpu], self.interference) >= self.min_speed

    def score(self, job, cluster, gpus):
        return super().score(replace(job, gpu_milli=self.held(job)) if job.num_gpus == 1 else job, cluster, gpus)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "margin": self.margin,
            "floor_milli": self.floor_milli,
            "min_speed": self.min_speed,
            "min_speed_whole": self.min_speed_whole,
            "frag_weight": self.frag_weight,
            "max_jobs_per_gpu": self.max_jobs,
            "headroom_mb": self.headroom_mb,
            "gang_aware": self.gang_aware,
            "min_speed_gang": self.min_speed_gang,
            "max_migrations": self.max_migrations,
            "move_gangs": self.move_gangs,
            "telemetry_utils": self.telemetry_utils,
            "queue_lookahead": self.queue_lookahead,
            "policy_interference_params": {
                g: [p.capacity, p.interference] for g, p in sorted(self.interference.params.items())
            },
            "interference": "fitted (Gavel pairs), on predicted utilizations (migrations: on telemetry)",
        }


def standalone_from_telemetry(
    meas_pct: Sequence[float], gpu_model: str, model: FittedInterference | None = None
) -> tuple[float, ...]:
    """The standalone utilizations (%) of the jobs on one GPU read back from their sampled per-process
    ones: telemetry shows ``m = 1 - (1 - u) / slowdown`` (:func:`~.replay.measured_util`), and the
    fitted model gives the slowdown of utilizations ``u``, so ``u = 1 - (1 - m) x slowdown(u)`` is
    solved by a few fixed-point steps from ``u = m`` (a job alone: ``u = m``). In placement order."""
    if len(meas_pct) <= 1:
        return tuple(meas_pct)
    return _destretch(tuple(round(min(max(m, 0.0), 100.0)) for m in meas_pct), _gp(model, gpu_model))


@lru_cache(maxsize=1 << 16)
def _destretch(meas_pct: tuple[int, ...], gp: tuple[float, float]) -> tuple[float, ...]:
    m = np.array(meas_pct, dtype=float) / 100.0
    u = m.copy()
    for _ in range(8):
        speeds = np.array(stretched_speeds([min(x, 1.0) for x in u], *gp))
        u_next = np.clip(1.0 - (1.0 - m) / speeds, 0.0, m)
        if np.max(np.abs(u_next - u)) < 1e-3:
            u = u_next
            break
        u = 0.5 * (u + u_next)  # damped: the slowdown falls as u does
    return tuple(float(x) * 100.0 for x in u)


def min_predicted_speed(utils_pct: Sequence[float], gpu_model: str, model: FittedInterference | None = None) -> float:
    """The slowest job's speed (fraction of standalone) on one GPU under the fitted model."""
    return predicted_work(utils_pct, gpu_model, model)[1]


def _gang_loss(
    utils: tuple[float, ...],
    counts: tuple[int, ...],
    job_util: float,
    job_gpus: int,
    gpu_model: str,
    model: FittedInterference | None = None,
) -> float:
    """Predicted work (GPUs) lost on gangs' OTHER GPUs when a job of predicted utilization ``job_util``
    on ``job_gpus`` GPUs joins a GPU holding jobs of ``utils`` on ``counts`` GPUs each: a gang runs
    at its slowest GPU's speed, so one of ``n`` GPUs slowed here from ``s0`` to ``s1`` loses
    ``(n - 1) x u x (s0 - s1)`` elsewhere (an upper bound: its bottleneck may be another GPU); the
    joining job drags its other ``job_gpus - 1`` GPUs to its speed here."""
    before = job_speeds(utils, gpu_model, model)
    after = job_speeds(utils + (job_util,), gpu_model, model)
    loss = sum(
        (n - 1) * min(max(u, 0.0), 100.0) / 100.0 * (s0 - s1)
        for u, n, s0, s1 in zip(utils, counts, before, after)
        if n > 1
    )
    return loss + (job_gpus - 1) * min(max(job_util, 1.0), 100.0) / 100.0 * (1.0 - after[-1])


def job_speeds(
    utils_pct: Sequence[float], gpu_model: str, model: FittedInterference | None = None
) -> tuple[float, ...]:
    """Each job's speed (fraction of standalone) on one GPU under the fitted model, in the order given
    (utilizations in percent, clipped to [0, 100] and rounded to 1 % steps, as :func:`predicted_work`)."""
    if len(utils_pct) <= 1:
        return (1.0,) * len(utils_pct)
    return _speeds(tuple(round(min(max(u, 0.0), 100.0)) / 100.0 for u in utils_pct), _gp(model, gpu_model))


@lru_cache(maxsize=1 << 16)
def _speeds(utils: tuple[float, ...], gp: tuple[float, float]) -> tuple[float, ...]:
    return tuple(stretched_speeds(utils, *gp))


def predicted_work(
    utils_pct: Sequence[float], gpu_model: str, model: FittedInterference | None = None
) -> tuple[float, float]:
    """``(standalone-equivalent work per unit time, slowest job's speed)`` of jobs sharing one GPU under
    the fitted model, for utilizations in percent."""
    return _work(_key_of(tuple(utils_pct)), _gp(model, gpu_model))  # 1 % steps: cache hits


@lru_cache(maxsize=1 << 16)
def _key_of(utils_pct: tuple[float, ...]) -> tuple[float, ...]:
    """:func:`predicted_work`'s cache key: the utilizations as sorted fractions in 1 % steps."""
    return tuple(sorted(round(min(max(u, 0.0), 100.0)) / 100.0 for u in utils_pct))


@lru_cache(maxsize=1 << 16)
def _gain(before: tuple[float, ...], added: float, gp: tuple[float, float]) -> tuple[float, float]:
    """``(predicted work gained by adding a job of utilization ``added`` to a GPU holding ``before``,
    the slowest job's speed after)``; keys as :func:`_key_of` makes them."""
    w0, _ = _work(before, gp)
    w1, slowest = _work(tuple(sorted(before + (added,))), gp)
    return w1 - w0, slowest


@lru_cache(maxsize=1 << 16)
def _work(utils: tuple[float, ...], gp: tuple[float, float]) -> tuple[float, float]:
    if not utils:
        return 0.0, 1.0
    speeds = stretched_speeds(utils, *gp) if len(utils) > 1 else [1.0]
    return float(sum(u * v for u, v in zip(utils, speeds))), float(min(speeds))
