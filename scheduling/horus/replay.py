"""The replay method as a small event-driven class (the model is described in :mod:`.simulator`).

* :class:`InterferenceModel` - the plug point for the physics: given one GPU's jobs
  (:class:`GpuLoad`), their slowdowns. The default, ``fitted``
  (:class:`~.interference.FittedInterference`), is work-conserving and fitted to Gavel's measured
  co-location pairs; :class:`SharingPenalty` is the old model, kept as labelled sensitivities
  (``share_penalty``: Horus's simulator, +20 % while sharing; ``capped``: also time-shared over 100 %).
* :class:`EventQueue` - arrivals, finishes and out-of-memory retries in time order.
* :class:`ReplayJobs` - the jobs in submit order and their progress (remaining work, rate).
* :class:`Accounting` - piecewise-constant integrals over time (GPU time, occupancy, sharing,
  idle-while-queued), the time series and fragmentation samples.
* :class:`Replay` - the state machine: queue, placement, rates, migrations.
* :func:`summarize` - a finished replay as a :class:`SimulationResult`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypedDict, cast, runtime_checkable

import numpy as np

from common.jsonsafe import json_safe

from .cluster import MILLI, ClusterSpec, ClusterState, JobView, PlacementError, workload_types
from .interference import FittedInterference, flat_sharing_slowdown
from .observation import ObservationModel, observe, per_process_util
from .policies import PlacementPolicy
from .profiles import speed_on_gpu, util_on_gpu
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

__all__ = [
    "GpuLoad",
    "InterferenceModel",
    "SharingPenalty",
    "INTERFERENCE_MODELS",
    "DEFAULT_INTERFERENCE",
    "make_interference",
    "measured_util",
    "SimulationResult",
    "EventQueue",
    "ReplayJobs",
    "Accounting",
    "Replay",
    "summarize",
]


# ------------------------------------------------------------------------------------------ interference
@dataclass(frozen=True, slots=True)
class GpuLoad:
    """What an interference model sees of one GPU: its type and memory, the sum of the TRUE standalone
    utilizations on it (``demand_pct``, as the cluster state keeps it) and each job's own."""

    gpu: int
    gpu_model: str
    mem_cap_mb: float
    demand_pct: float
    job_ids: tuple[str, ...]
    utils_pct: tuple[float, ...]
    mems_mb: tuple[float, ...]


@runtime_checkable
class InterferenceModel(Protocol):
    """Slowdown (>= 1) of each job sharing a GPU; a job's rate is 1 / its largest slowdown over its GPUs.
    Called for a GPU with two or more jobs when its set of jobs changes, so the answer must depend on
    the ``GpuLoad`` alone (the replay keeps it until the next change). ``describe()`` is recorded with
    the results."""

    @property
    def name(self) -> str: ...

    def slowdowns(self, load: GpuLoad) -> Sequence[float]:
        """One slowdown per job of ``load``, in ``load.job_ids`` order."""
        ...

    def describe(self) -> dict[str, Any]: ...


class JobTimes(TypedDict):
    """Each job's id and times in seconds, in submit order (``summarize(record_jobs=True)``)."""

    id: list[str]
    submit: list[float]
    start: list[float]
    finish: list[float]
    duration: list[float]


class AttainedServicePolicy(Protocol):
    """A least-attained-service policy (Tiresias): what the replay calls when ``Replay.las`` is set."""

    def service_level(self, attained_gpu_s: float) -> int: ...

    def demotion_after(self, attained_gpu_s: float, num_gpus: int) -> float | None: ...


@dataclass(frozen=True)
class SharingPenalty:
    """The old model, a SENSITIVITY (not physics):
    ``(1 + share_penalty + util_slope * others_util/100) * max(1, D/100) ** oversub_exponent``
    for a job sharing its GPU (``D`` the GPU's demand), 1 alone. The defaults are Horus's own simulator
    (+20 % while sharing, load-blind); ``oversub_exponent=1`` time-shares over-subscribed GPUs. Not
    work-conserving: three saturating jobs on one GPU deliver 2.5 GPUs of work (the replay counts
    delivered utilization at most 100 % per GPU and reports the excess, ``over_capacity_work_pct``)."""

    share_penalty: float = 0.2
    util_slope: float = 0.0
    oversub_exponent: float = 0.0
    name: str = "share_penalty"

    def slowdown(self, n_jobs: int, demand: float, job_util: float) -> float:
        return flat_sharing_slowdown(
            n_jobs,
            demand,
            job_util,
            share_penalty=self.share_penalty,
            util_slope=self.util_slope,
            oversub_exponent=self.oversub_exponent,
        )

    def slowdowns(self, load: GpuLoad) -> Sequence[float]:
        n = len(load.job_ids)
        return [self.slowdown(n, load.demand_pct, u) for u in load.utils_pct]

    def describe(self) -> dict[str, Any]:
        fields = {k: v for k, v in asdict(self).items() if k != "name"}
        return {"model": self.name, "kind": "sensitivity (not physical, not work-conserving)", **fields}


#: the default: work-conserving, fitted to Gavel's measured pairs (``data/interference/``)
DEFAULT_INTERFERENCE: InterferenceModel = FittedInterference.from_data()

#: named interference models (``ExperimentParams.interference``; ``fitted`` is the default)
INTERFERENCE_MODELS: dict[str, InterferenceModel] = {
    "fitted": DEFAULT_INTERFERENCE,
    "share_penalty": SharingPenalty(),
    "capped": SharingPenalty(share_penalty=0.2, oversub_exponent=1.0, name="capped"),
}


def make_interference(name: str) -> InterferenceModel:
    try:
        return INTERFERENCE_MODELS[name]
    except KeyError:
        raise KeyError(f"unknown interference model {name!r}; known: {', '.join(INTERFERENCE_MODELS)}") from None


def measured_util(true_util_pct: float, slowdown: float) -> float:
    """The per-process utilization telemetry samples for a job of standalone utilization ``u`` slowed
    ``slowdown``-fold by sharing: the models stretch its GPU phases only (a step takes
    ``slowdown x`` as long, its host part ``1 - u`` unchanged), so its kernels are resident
    ``1 - (1 - u) / slowdown`` of the time - more than ``u`` while it is slowed. This, not ``u``, is
    what NVML can tell a policy about a co-located job."""
    return per_process_util(true_util_pct, slowdown)


# ------------------------------------------------------------------------------------------ result
@dataclass
class SimulationResult:
    """Outcome of a replay. ``to_dict()`` is JSON-serialisable."""

    policy: str
    cluster: dict[str, Any]
    seed: int
    n_jobs: int
    dropped_jobs: int
    unschedulable_jobs: int
    makespan_s: float
    mean_wait_s: float
    median_wait_s: float
    p95_wait_s: float
    mean_jct_s: float
    p95_jct_s: float
    mean_slowdown: float
    util_mean_pct: float  # delivered standalone-equivalent GPU time per GPU time (<= 100)
    util_busy_pct: float  # the same per busy GPU time
    gpus_busy_mean: float
    frag_rate_mean: float
    idle_while_queued_frac: float
    shared_gpu_time_frac: float
    oversub_gpu_time_frac: float
    peak_mem_frac: float
    oom_events: int
    migrations: int
    events: int
    wall_s: float
    timeseries: dict[str, list[float]]
    params: dict[str, Any]
    jobs: JobTimes | None = None
    occupancy_pct: float = 0.0  # the GPUs' sum of their jobs' standalone utilizations, capped at 100 each
    over_capacity_work_pct: float = 0.0  # work a non-work-conserving model claims beyond one GPU per GPU
    peak_gpu_delivered_pct: float = 0.0  # the most one GPU delivered at any time (before the cap)
    preemptions: int = 0  # jobs stopped and requeued by a least-attained-service queue
    # the TRUE slowdown's tail: run time / standalone time (interference, preemption), per finished job
    p95_slowdown: float = 1.0
    p99_slowdown: float = 1.0
    p99_jct_s: float = 0.0

    def to_dict(self, *, with_jobs: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_jobs:
            d.pop("jobs", None)
        return json_safe(d)


# ------------------------------------------------------------------------------------------ parts
FINISH, ARRIVAL, TELEMETRY, DEMOTE = 0, 1, 2, 3
RETRY = -1  # the version of an arrival event that is an out-of-memory retry


class EventQueue:
    """``(time, kind, seq, job, version)`` in time order; finishes before arrivals (then telemetry
    samples) at the same time, then in push order. A finish whose version is not the job's current one
    is stale (its rate changed); a telemetry sample whose version is not the job's current start is
    stale (the job finished or was restarted since)."""

    def __init__(self, submit: Sequence[float]):
        self._heap = [(t, ARRIVAL, i, i, 0) for i, t in enumerate(submit)]
        heapq.heapify(self._heap)
        self._seq = len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def next_time(self) -> float:
        return self._heap[0][0]

    def push(self, t: float, kind: int, job: int, version: int) -> None:
        heapq.heappush(self._heap, (t, kind, self._seq, job, version))
        self._seq += 1

    def pop_at(self, now: float):
        """Events at ``now``, including those pushed while they are handled."""
        while self._heap and self._heap[0][0] == now:
            t, kind, _, job, version = heapq.heappop(self._heap)
            yield t, kind, job, version


class ReplayJobs:
    """The kept jobs in submit order, their views and truth, and their progress: ``remaining`` work
    (standalone seconds) as of ``last``, at ``rate``; ``version`` counts rate changes."""

    def __init__(self, jobs: Sequence[Job], views: list[JobView]):
        self.jobs = list(jobs)
        self.views = views
        n = len(self.jobs)
        self.true_util = [j.run_util_pct for j in self.jobs]  # on the GPU model ``util_gpu_model[i]``
        self.util_gpu_model = [j.util_gpu_model for j in self.jobs]
        self.true_mem = [j.run_mem_mb for j in self.jobs]
        self.duration = [float(j.duration_s) for j in self.jobs]
        self.submit = [float(j.submit_time) for j in self.jobs]
        self.index = {j.job_id: i for i, j in enumerate(self.jobs)}
        if len(self.index) != n:
            raise ValueError("job ids must be unique")
        self.start = [math.nan] * n
        self.finish = [math.nan] * n
        self.remaining = [0.0] * n
        self.rate = [0.0] * n
        #: standalone speed on the GPUs it runs on, relative to the GPU its duration was measured on
        #: (Gavel's per-type throughputs; a gang runs at its slowest GPU's): rate = type_speed / slowdown
        self.type_speed = [1.0] * n
        self.last = [0.0] * n
        self.version = [0] * n
        self.epoch = [0] * n  # starts so far (a telemetry sample belongs to one start)

    def __len__(self) -> int:
        return len(self.jobs)

    def progress(self, i: int, now: float) -> None:
        """Book the work done since ``last`` at the current rate."""
        self.remaining[i] -= self.rate[i] * (now - self.last[i])
        self.last[i] = now

    def true_util_on(self, i: int, gpu_models: Sequence[str]) -> float:
        """Job ``i``'s TRUE standalone utilization on GPUs of these models (:func:`.profiles.util_on_gpu`:
        a slower GPU is busier for the same job); a job spanning types runs at its busiest one's."""
        ref, u = self.util_gpu_model[i], self.true_util[i]
        if ref is None:
            return u
        return max(util_on_gpu(u, measured_on=ref, run_on=m, model=self.jobs[i].model) for m in set(gpu_models))

    def speed_on(self, i: int, gpu_models: Sequence[str]) -> float:
        """Job ``i``'s standalone speed on GPUs of these models relative to the one its duration and
        utilization were measured on (:func:`.profiles.speed_on_gpu`); a gang runs at its slowest GPU's."""
        ref = self.util_gpu_model[i]
        if ref is None:
            return 1.0
        return min(speed_on_gpu(measured_on=ref, run_on=m, model=self.jobs[i].model) for m in set(gpu_models))

    def learn_memory(self, i: int) -> None:
        """After an out-of-memory crash the job is known to need its true memory."""
        v = self.views[i]
        self.views[i] = JobView(
            v.job_id,
            v.submit_time,
            v.num_gpus,
            v.gpu_milli,
            v.pred_util_pct,
            v.pred_mem_mb,
            v.cpu_milli,
            v.ram_mib,
            v.single_node,
            v.model,
            v.batch_size,
            mem_floor_mb=self.true_mem[i],
        )


class Accounting:
    """Time integrals of the cluster's piecewise-constant state between events, kept incrementally:
    ``refresh_gpu`` after a GPU's jobs change, ``refresh_delivered`` after its jobs' rates change,
    ``advance`` before an event batch, ``sample`` after it.

    Two utilizations: *occupancy* (``util_sum``), each GPU's sum of its jobs' standalone utilizations
    capped at 100 (what a device counter shows: the GPU is busy, however slowly the jobs go), and
    *delivered* work (``delivered_sum``), each GPU's sum of ``util x rate`` over its jobs - the
    standalone-equivalent GPU time it does, counted at most 100 % per GPU; the excess a
    non-work-conserving model claims is kept apart (``over_sum``)."""

    def __init__(self, n_gpus: int, frag_every: int):
        self.n_gpus = n_gpus
        self.frag_every = frag_every
        self.util_sum = 0.0  # occupancy: sum over GPUs of min(100, demand)
        self.delivered_sum = 0.0  # sum over GPUs of min(100, sum of util x rate)
        self.over_sum = 0.0  # sum over GPUs of max(0, sum of util x rate - 100)
        self.delivered = [0.0] * n_gpus  # per GPU, uncapped
        self.peak_delivered = 0.0
        self.shared_gpus = 0  # GPUs with >= 2 jobs
        self.oversub_gpus = 0  # GPUs with demand > 100
        self._capped = [0.0] * n_gpus
        self._njob = [0] * n_gpus
        self._over = [False] * n_gpus
        self.t_prev = 0.0
        self.util_area = self.busy_area = self.idle_q_area = self.shared_area = self.oversub_area = 0.0
        self.delivered_area = self.over_area = 0.0
        self.ts_t: list[float] = []
        self.ts_util: list[float] = []
        self.ts_delivered: list[float] = []
        self.ts_busy: list[float] = []
        self.ts_queue: list[float] = []
        self.frag_t: list[float] = []
        self.frag_v: list[float] = []
        self.peak_mem_frac = 0.0
        self.batches = 0

    def refresh_gpu(self, g: int, demand: float, n_jobs: int) -> None:
        d = float(demand)
        c = d if d < 100.0 else 100.0
        self.util_sum += c - self._capped[g]
        self._capped[g] = c
        if (self._njob[g] >= 2) != (n_jobs >= 2):
            self.shared_gpus += 1 if n_jobs >= 2 else -1
        self._njob[g] = n_jobs
        now_over = d > 100.0 + 1e-9
        if self._over[g] != now_over:
            self.oversub_gpus += 1 if now_over else -1
            self._over[g] = now_over

    def refresh_delivered(self, g: int, work_pct: float) -> None:
        """GPU ``g`` now delivers ``work_pct`` (sum over its jobs of true util % x rate)."""
        old = self.delivered[g]
        self.delivered_sum += min(work_pct, 100.0) - min(old, 100.0)
        self.over_sum += max(work_pct - 100.0, 0.0) - max(old - 100.0, 0.0)
        self.delivered[g] = work_pct
        if work_pct > self.peak_delivered:
            self.peak_delivered = work_pct

    def note_memory(self, frac: float) -> None:
        if frac > self.peak_mem_frac:
            self.peak_mem_frac = frac

    def advance(self, now: float, free_gpus: int, queued: bool) -> None:
        """Integrate ``[t_prev, now)``."""
        dt = now - self.t_prev
        if dt > 0:
            self.util_area += self.util_sum * dt
            self.delivered_area += self.delivered_sum * dt
            self.over_area += self.over_sum * dt
            self.busy_area += (self.n_gpus - free_gpus) * dt
            self.shared_area += self.shared_gpus * dt
            self.oversub_area += self.oversub_gpus * dt
            if queued:
                self.idle_q_area += free_gpus * dt
        self.t_prev = now

    def sample(self, now: float, state: ClusterState, queue_len: int) -> None:
        self.batches += 1
        self.ts_t.append(now)
        self.ts_util.append(self.util_sum / self.n_gpus)
        self.ts_delivered.append(self.delivered_sum / self.n_gpus)
        self.ts_busy.append(float(self.n_gpus - state.free_gpus))
        self.ts_queue.append(float(queue_len))
        if self.batches % self.frag_every == 0:
            fr, free = state.fragmentation()
            self.frag_t.append(now)
            self.frag_v.append(fr / free if free > 0 else 0.0)


# ------------------------------------------------------------------------------------------ replay
class Replay:
    """One replay of ``jobs`` on ``spec`` under ``policy``; :meth:`run` then :func:`summarize`."""

    def __init__(
        self,
        jobs: Sequence[Job],
        spec: ClusterSpec,
        policy: PlacementPolicy,
        *,
        seed: int = 0,
        interference: InterferenceModel = DEFAULT_INTERFERENCE,
        predictor_error: float = 0.0,
        backfill: int = 1,
        migration_cost_s: float = 60.0,
        oom_penalty_s: float = 60.0,
        frag_samples: int = 256,
        check_invariants: bool = False,
        telemetry_delay_s: float = 60.0,
        observation: ObservationModel | None = None,
    ):
        validate_jobs(jobs)
        self.spec, self.policy, self.seed = spec, policy, seed
        self.interference = interference
        self.predictor_error = predictor_error
        self.migration_cost_s, self.oom_penalty_s = migration_cost_s, oom_penalty_s
        #: telemetry lags: a job's per-process utilization (NVML samples it over a period) reaches the
        #: policy this long after it starts or its speed changes; until its first sample the policy sees
        #: its prediction. 0: telemetry is exact and instant (a job placed in a scheduling pass would
        #: show its TRUE utilization to the next job's placement in the same pass)
        #: how telemetry samples (lag, noise, per-process or device level); ``observation`` replaces
        #: ``telemetry_delay_s`` when given (its ``lag_s`` is the delay)
        self.observation = observation if observation is not None else ObservationModel(lag_s=float(telemetry_delay_s))
        self.telemetry_delay_s = float(self.observation.lag_s)
        self._obs_rng = np.random.default_rng([int(seed), 0x0B5E]) if self.observation.noise_pct > 0 else None
        self.check_invariants = check_invariants
        self.state = state = ClusterState(spec)
        biggest = float(state.mem_cap.max())
        kept = [j for j in jobs if 0 < j.num_gpus <= state.n_gpus and j.run_mem_mb <= biggest]
        self.dropped = len(jobs) - len(kept)
        order = sorted(range(len(kept)), key=lambda i: (kept[i].submit_time, i))
        jl = [kept[i] for i in order]
        pu, pm = noisy_predictions(jl, predictor_error, seed)
        views = job_views(jl, pu, pm)
        state.workload = workload_types(jl)
        self.cv = state.view()
        policy.reset(seed)
        self.has_rebalance = type(policy).rebalance is not PlacementPolicy.rebalance
        self.jobs = ReplayJobs(jl, views)
        self.events = EventQueue(self.jobs.submit)
        self.queue: deque[int] = deque()
        self.dirty = True  # capacity freed (or the queue's head changed) since the last pass
        self.tried = 0  # queue positions the last pass already refused
        #: queue positions offered per pass: the backfill window, or the policy's own look-ahead
        #: (Horus's authors look at the first 5 waiting jobs), whichever is larger
        self.window = max(1, int(backfill), int(getattr(policy, "queue_lookahead", 1)))
        self.monotone = bool(getattr(policy, "monotone_feasibility", False)) and self.window > 1
        self.acct = Accounting(state.n_gpus, max(1, (2 * len(jl)) // max(1, frag_samples)))
        #: per GPU, its jobs' slowdowns as of its last change (None: one job or none)
        self._slow: list[dict[str, float] | None] = [None] * state.n_gpus
        self.oom_events = self.migrations = self.n_events = self.preemptions = 0
        self.unschedulable: list[str] = []
        #: a least-attained-service policy (Tiresias): the queue is ordered by the policy's level of each
        #: job's attained GPU service, and a waiting job of a higher level preempts running lower ones
        self.las = callable(getattr(policy, "service_level", None))
        self.attained = [0.0] * len(self.jobs)  # GPU-seconds of service booked (while not running)
        self.run_since = [math.nan] * len(self.jobs)

    # ---------------------------------------------------------------- main loop
    def run(self, *, should_stop: StopCheck | None = None) -> Replay:
        """Handle every event in time order. ``should_stop`` (if given) is asked every
        ``STOP_CHECK_EVERY`` event batches; when it says True the replay raises :class:`SimulationStopped`."""
        batches = 0
        while self.events:
            batches += 1
            if should_stop is not None and batches % STOP_CHECK_EVERY == 0 and should_stop():
                raise SimulationStopped(f"stopped after {self.n_events} events")
            now = self.events.next_time()
            self.acct.advance(now, self.state.free_gpus, bool(self.queue))
            self._step(now)
            self.acct.sample(now, self.state, len(self.queue))
            if self.check_invariants:
                self._assert_invariants()
        if self.queue or self.state.running:
            raise RuntimeError(
                f"simulation ended with {len(self.queue)} queued and {len(self.state.running)} running jobs"
            )
        return self

    def _step(self, now: float) -> None:
        """Handle every event at ``now``, then offer the queue to the policy."""
        departed = arrived = False
        for t, kind, i, version in self.events.pop_at(now):
            self.n_events += 1
            if kind == FINISH:
                if version == self.jobs.version[i]:
                    self._finish(i, t)
                    departed = True
            elif kind == TELEMETRY:
                self._sample_telemetry(i, version)
            elif kind == DEMOTE:
                if version == self.jobs.epoch[i] and self.jobs.jobs[i].job_id in self.state.running:
                    self.dirty = True  # its level fell: a waiting job may now preempt it
            elif version == RETRY:  # after an out-of-memory crash: back to the head of the queue
                self.queue.appendleft(i)
                self.dirty = True
            else:
                self.queue.append(i)
                arrived = True
        if departed:
            self.dirty = True
            if self.has_rebalance and self._migrate(now):
                self.dirty = True
        if self.dirty or arrived:
            self._pass(now)
        while self.queue and not self.state.running and not self.events:
            # nothing runs and nothing will arrive: the head can never be placed (the cluster is as
            # free as it gets) - drop it as unschedulable
            self.unschedulable.append(self.jobs.jobs[self.queue.popleft()].job_id)
            self.dirty = True
            self._pass(now)

    def _pass(self, now: float) -> None:
        if self.las:
            self._schedule_las(now)
        else:
            self._schedule(now)

    # ---------------------------------------------------------------- cluster changes
    def _refresh(self, gpus: Sequence[int]) -> None:
        for g in gpus:
            self.acct.refresh_gpu(g, self.state.true_util[g], len(self.state.jobs_on[g]))

    def _finish(self, i: int, t: float) -> None:
        self._book_service(i, t)
        rj = self.state.remove(self.jobs.jobs[i].job_id)
        self.jobs.finish[i] = t
        self._refresh(rj.gpus)
        self._update_rates(rj.gpus, t)

    def _true_util(self, i: int, gpus: Sequence[int]) -> float:
        return self.jobs.true_util_on(i, [self.state.gpu_model[g] for g in gpus])

    def _start(self, i: int, gpus: Sequence[int], now: float) -> None:
        J, state = self.jobs, self.state
        J.epoch[i] += 1
        # no telemetry before its first sample: the policy sees what it predicted
        state.add(
            J.views[i],
            gpus,
            true_util=self._true_util(i, gpus),
            true_mem=J.true_mem[i],
            now=now,
            meas_util=None if self.telemetry_delay_s <= 0 else J.views[i].pred_util_pct,
        )
        if math.isnan(J.start[i]):
            J.start[i] = now
            J.remaining[i] = J.duration[i]
        J.last[i] = now
        J.rate[i] = 0.0
        J.type_speed[i] = J.speed_on(i, [state.gpu_model[g] for g in gpus])
        for g in gpus:
            self.acct.refresh_gpu(g, state.true_util[g], len(state.jobs_on[g]))
            self.acct.note_memory(state.true_mem[g] / state.mem_cap[g])
        self._update_rates(gpus, now)
        if self.las:
            self.run_since[i] = now
            left = cast(AttainedServicePolicy, self.policy).demotion_after(self.attained[i], len(gpus))
            if left is not None and left > 0:
                self.events.push(now + left, DEMOTE, i, J.epoch[i])

    def _gpu_load(self, g: int) -> GpuLoad:
        s = self.state
        ids = tuple(s.jobs_on[g])
        running = [s.running[j] for j in ids]
        return GpuLoad(
            g,
            s.gpu_model[g],
            float(s.mem_cap[g]),
            float(s.true_util[g]),
            ids,
            tuple(rj.true_util_pct for rj in running),
            tuple(rj.meas_mem_mb for rj in running),
        )

    def _update_rates(self, gpus: Sequence[int], now: float) -> None:
        """``gpus`` changed their set of jobs: ask the interference model about them (a GPU with one job
        or none needs no model: alone, a job runs at rate 1), then give every job on them its new rate
        (and a new finish event where the rate changed). A job's rate is 1 / its largest slowdown.
        Then the delivered work of these GPUs and of every GPU of a job whose rate changed is rebooked."""
        J, jobs_on, slow = self.jobs, self.state.jobs_on, self._slow
        touched = set(gpus)
        changed: list[int] = []
        for g in gpus:
            if len(jobs_on[g]) >= 2:
                load = self._gpu_load(g)
                slow[g] = dict(zip(load.job_ids, self.interference.slowdowns(load)))
            else:
                slow[g] = None
        for i in sorted({J.index[jid] for g in gpus for jid in jobs_on[g]}):
            job_id = J.jobs[i].job_id
            s = 1.0
            for g in self.state.running[job_id].gpus:
                factors = slow[g]
                if factors is not None and factors[job_id] > s:
                    s = factors[job_id]
            r = J.type_speed[i] / s
            if r != J.rate[i]:
                J.progress(i, now)
                J.rate[i] = r
                J.version[i] += 1
                self.events.push(now + max(J.remaining[i], 0.0) / r, FINISH, i, J.version[i])
                touched.update(self.state.running[job_id].gpus)
                changed.append(i)
        for i in changed:  # after every rate is new: a device-level sample sums the GPU's jobs
            if self.telemetry_delay_s <= 0:
                self._observe(i)
            else:
                self.events.push(now + self.telemetry_delay_s, TELEMETRY, i, J.epoch[i])
        for g in touched:
            self.acct.refresh_delivered(g, self._delivered_on(g))

    def _sample_telemetry(self, i: int, epoch: int) -> None:
        """A telemetry sample of job ``i`` (of its start ``epoch``): its per-process utilization at its
        current speed becomes what policies see."""
        J = self.jobs
        rj = self.state.running.get(J.jobs[i].job_id)
        if rj is None or epoch != J.epoch[i] or J.rate[i] <= 0:
            return
        self._observe(i)

    def _process_util(self, job_id: str) -> float:
        i = self.jobs.index[job_id]
        # the interference slowdown alone: a slower GPU type is already in the job's (busier) true util there
        return measured_util(
            self.state.running[job_id].true_util_pct, self.jobs.type_speed[i] / max(self.jobs.rate[i], 1e-12)
        )

    def _observe(self, i: int) -> None:
        """Set what policies read of running job ``i`` from the observation model (its truth stays here)."""
        s, job_id = self.state, self.jobs.jobs[i].job_id
        rj = s.running[job_id]
        on_gpus: list[list[float]] = []
        if self.observation.level == "device":
            on_gpus = [[self._process_util(j) for j in s.jobs_on[g]] for g in rj.gpus]
        draw = float(self._obs_rng.standard_normal()) if self._obs_rng is not None else 0.0
        s.set_measured_util(job_id, observe(self.observation, self._process_util(job_id), on_gpus, draw))

    def _delivered_on(self, g: int) -> float:
        """Standalone-equivalent work GPU ``g`` does now, in % of one GPU: its jobs' true util (on this GPU
        type) x their speed under interference (rate / type speed)."""
        J, running = self.jobs, self.state.running
        return sum(
            running[jid].true_util_pct * J.rate[J.index[jid]] / J.type_speed[J.index[jid]]
            for jid in self.state.jobs_on[g]
        )

    # ---------------------------------------------------------------- queue
    def _schedule(self, now: float) -> None:
        """Offer the first ``window`` waiting jobs (from the first not yet refused) to the policy."""
        if not self.queue:
            self.dirty, self.tried = False, 0
            return
        i = 0 if self.dirty else self.tried
        if i >= self.window or i >= len(self.queue):
            return
        failed: list[tuple[float, ...]] = []  # request vectors refused in this pass
        while i < len(self.queue) and i < self.window:
            j = self.queue[i]
            req = self._request(self.jobs.views[j])
            if self.monotone and any(all(a >= b for a, b in zip(req, f)) for f in failed):
                i += 1  # asks for at least as much as a job just refused: refused too
                continue
            gpus = checked_placement(
                self.policy, self.jobs.views[j], self.state, self.cv, now, where=f" at t={now:.0f}s"
            )
            if gpus is None:
                if self.monotone and len(failed) < 8:
                    failed.append(req)
                i += 1
                continue
            del self.queue[i]
            if self.state.fits_memory(gpus, self.jobs.true_mem[j]):
                self._start(j, gpus, now)
            else:  # crashes out of memory; retried at the queue's head, its memory known
                self.oom_events += 1
                self.jobs.learn_memory(j)
                self.events.push(now + self.oom_penalty_s, ARRIVAL, j, RETRY)
        self.tried = i
        self.dirty = False

    @staticmethod
    def _request(v: JobView) -> tuple[float, ...]:
        return (
            v.num_gpus,
            v.gpu_milli,
            v.cpu_milli,
            v.ram_mib,
            max(v.pred_mem_mb, v.mem_floor_mb),
            v.pred_util_pct,
            1 if v.single_node else 0,
        )

    # ---------------------------------------------------------------- least attained service
    def _book_service(self, i: int, now: float) -> None:
        if self.las and not math.isnan(self.run_since[i]):
            self.attained[i] += self.jobs.jobs[i].num_gpus * (now - self.run_since[i])
            self.run_since[i] = math.nan

    def attained_service(self, i: int, now: float) -> float:
        """Job ``i``'s attained service in GPU-seconds (GPUs held x time run) as of ``now``."""
        run = 0.0 if math.isnan(self.run_since[i]) else self.jobs.jobs[i].num_gpus * (now - self.run_since[i])
        return self.attained[i] + run

    def _level(self, i: int, now: float) -> int:
        return int(cast(AttainedServicePolicy, self.policy).service_level(self.attained_service(i, now)))

    def _schedule_las(self, now: float) -> None:
        """Order the queue by level, then arrival (FIFO within a level), offer it; while the first waiting
        job outranks running jobs and the GPUs they hold would let it start, preempt them (most attained
        first) and offer again."""
        for _ in range(len(self.state.running) + 1):
            self.queue = deque(sorted(self.queue, key=lambda j: (self._level(j, now), j)))
            self.dirty = True
            self._schedule(now)
            if not self.queue or not self._preempt_for(self.queue[0], now):
                return

    def _preempt_for(self, j: int, now: float) -> bool:
        """Preempt running jobs of a lower level than waiting job ``j`` so that it fits by GPU count (on
        one node where it must); False (nothing preempted) if even all of them would not make room."""
        s, J = self.state, self.jobs
        level = self._level(j, now)
        victims = [J.index[jid] for jid in s.running if self._level(J.index[jid], now) > level]
        if not victims:
            return False
        need = J.jobs[j].num_gpus
        idle = [g for g in range(s.n_gpus) if not s.jobs_on[g]]
        if J.jobs[j].single_node:  # the node where the fewest GPU-seconds of service are lost
            best = None
            for n in sorted({int(s.gpu_node[g]) for g in range(s.n_gpus)}):
                free = sum(1 for g in idle if s.gpu_node[g] == n)
                here = sorted(
                    (v for v in victims if any(s.gpu_node[g] == n for g in s.running[J.jobs[v].job_id].gpus)),
                    key=lambda v: (-self.attained_service(v, now), v),
                )
                chosen = []
                for v in here:
                    if free >= need:
                        break
                    chosen.append(v)
                    free += sum(1 for g in s.running[J.jobs[v].job_id].gpus if s.gpu_node[g] == n)
                if free >= need and (best is None or len(chosen) < len(best)):
                    best = chosen
            if best is None or not best:
                return False
            chosen = best
        else:
            free, chosen = len(idle), []
            for v in sorted(victims, key=lambda v: (-self.attained_service(v, now), v)):
                if free >= need:
                    break
                chosen.append(v)
                free += len(s.running[J.jobs[v].job_id].gpus)
            if free < need or not chosen:
                return False
        for v in chosen:
            self._preempt(v, now)
        return True

    def _preempt(self, i: int, now: float) -> None:
        """Stop running job ``i`` (checkpointed: its remaining work kept, plus the restore cost) and
        requeue it."""
        J = self.jobs
        J.progress(i, now)
        self._book_service(i, now)
        rj = self.state.remove(J.jobs[i].job_id)
        J.remaining[i] += self.migration_cost_s
        J.rate[i] = 0.0
        J.version[i] += 1  # its finish event is stale
        self._refresh(rj.gpus)
        self._update_rates(rj.gpus, now)
        self.queue.append(i)
        self.preemptions += 1

    # ---------------------------------------------------------------- migration
    def _migrate(self, now: float) -> bool:
        moved = False
        for job_id, new_gpus in self.policy.rebalance(self.cv, now):
            i = self.jobs.index.get(job_id)
            rj = self.state.running.get(job_id)
            if i is None or rj is None:
                raise PlacementError(f"policy {self.policy.name!r} migrates unknown or finished job {job_id}")
            new_gpus = [int(g) for g in new_gpus]
            if sorted(new_gpus) == sorted(rj.gpus):
                continue
            self.state.check_placement(self.jobs.views[i], new_gpus, ignore=job_id)
            if not self.state.fits_memory(new_gpus, self.jobs.true_mem[i], ignore=job_id):
                continue  # the move would OOM on arrival: the runtime refuses it
            self._move(i, rj.gpus, new_gpus, now, rj.migrations + 1)
            moved = True
        return moved

    def _move(self, i: int, old: Sequence[int], new: list[int], now: float, migrations: int) -> None:
        J, state = self.jobs, self.state
        J.progress(i, now)
        was = state.remove(J.jobs[i].job_id)
        self._refresh(old)
        # telemetry shows its last sample until the next one on its new GPUs
        state.add(
            J.views[i],
            new,
            true_util=self._true_util(i, new),
            true_mem=J.true_mem[i],
            now=now,
            migrations=migrations,
            meas_util=None if self.telemetry_delay_s <= 0 else was.meas_util_pct,
        )
        J.remaining[i] += self.migration_cost_s  # checkpoint + restore, as extra work
        J.rate[i] = 0.0
        J.type_speed[i] = J.speed_on(i, [state.gpu_model[g] for g in new])
        self._refresh(new)
        self._update_rates(list(old) + new, now)
        self.migrations += 1

    def _assert_invariants(self) -> None:
        s = self.state
        assert np.all(s.true_mem <= s.mem_cap + 1e-6), "GPU memory over capacity"
        assert all(len(s.jobs_on[g]) == s.n_jobs[g] for g in range(s.n_gpus))
        assert all(abs(self.acct.delivered[g] - self._delivered_on(g)) < 1e-6 for g in range(s.n_gpus)), (
            "delivered-work bookkeeping out of date"
        )
        if s.enforce_milli:
            assert np.all(s.milli_used <= MILLI)

    def params(self) -> dict[str, Any]:
        return {
            "policy": self.policy.describe(),
            "interference": self.interference.describe(),
            "predictor_error": self.predictor_error,
            "backfill": self.window,
            "migration_cost_s": self.migration_cost_s,
            "oom_penalty_s": self.oom_penalty_s,
            "telemetry_delay_s": self.telemetry_delay_s,
            "observation": self.observation.describe(),
        }


# ------------------------------------------------------------------------------------------ summary
def _downsample(t: np.ndarray, v: np.ndarray, t_end: float, n: int) -> tuple[list[float], list[float]]:
    """Time-weighted bucket means of a piecewise-constant series (value v[k] on [t[k], t[k+1]))."""
    if len(t) == 0 or t_end <= t[0]:
        return [], []
    tt = np.append(t, t_end)
    area = np.concatenate([[0.0], np.cumsum(v * np.diff(tt))])
    edges = np.linspace(t[0], t_end, n + 1)
    a = np.interp(edges, tt, area)
    width = np.diff(edges)
    return [float(x) for x in edges[:-1]], [float(x) for x in np.diff(a) / width]


def _timeseries(acct: Accounting, t_end: float, points: int) -> dict[str, list[float]]:
    if not acct.ts_t:
        return {}
    tt = np.array(acct.ts_t)
    e, u = _downsample(tt, np.array(acct.ts_delivered), t_end, points)
    _, o = _downsample(tt, np.array(acct.ts_util), t_end, points)
    _, b = _downsample(tt, np.array(acct.ts_busy), t_end, points)
    _, q = _downsample(tt, np.array(acct.ts_queue), t_end, points)
    return {"t_s": e, "util_pct": u, "occupancy_pct": o, "busy_gpus": b, "queue_len": q}


def _frag_mean(acct: Accounting, t_end: float) -> float:
    """Time-weighted mean of the fragmentation samples (each holds until the next)."""
    if len(acct.frag_t) >= 2:
        ft = np.array(acct.frag_t)
        w = np.diff(np.append(ft, t_end))
        return float(np.sum(np.array(acct.frag_v) * w) / max(w.sum(), 1e-9))
    return float(acct.frag_v[0]) if acct.frag_v else 0.0


def _job_stats(J: ReplayJobs) -> tuple[float, float, dict[str, float]]:
    """``(first submit, last finish, wait/JCT/slowdown statistics)`` of the jobs that finished."""
    n = len(J)
    done = [i for i in range(n) if not math.isnan(J.finish[i])]
    t0 = min(J.submit) if n else 0.0
    t_end = max((J.finish[i] for i in done), default=t0)
    sub, start, fin = np.array(J.submit)[done], np.array(J.start)[done], np.array(J.finish)[done]
    waits, jct = start - sub, fin - sub
    if not done:
        return (
            t0,
            t_end,
            {
                "mean_wait_s": 0.0,
                "median_wait_s": 0.0,
                "p95_wait_s": 0.0,
                "mean_jct_s": 0.0,
                "p95_jct_s": 0.0,
                "mean_slowdown": 1.0,
            },
        )
    stretch = (fin - start) / np.maximum(np.array(J.duration)[done], 1e-9)
    return (
        t0,
        t_end,
        {
            "mean_wait_s": float(waits.mean()),
            "median_wait_s": float(np.median(waits)),
            "p95_wait_s": float(np.percentile(waits, 95)),
            "mean_jct_s": float(jct.mean()),
            "p95_jct_s": float(np.percentile(jct, 95)),
            "mean_slowdown": float(np.mean(stretch)),
            "p95_slowdown": float(np.percentile(stretch, 95)),
            "p99_slowdown": float(np.percentile(stretch, 99)),
            "p99_jct_s": float(np.percentile(jct, 99)),
        },
    )


def summarize(
    replay: Replay, *, wall_s: float, timeseries_points: int = 200, record_jobs: bool = False
) -> SimulationResult:
    """The result of a finished :class:`Replay`: job statistics, time-averaged cluster figures, series."""
    J, acct, n_gpus = replay.jobs, replay.acct, replay.state.n_gpus
    t0, t_end, stats = _job_stats(J)
    span = max(t_end - t0, 1e-9)
    busy = acct.busy_area
    return SimulationResult(
        policy=replay.policy.name,
        cluster=replay.spec.summary(),
        seed=replay.seed,
        n_jobs=len(J),
        dropped_jobs=replay.dropped,
        unschedulable_jobs=len(replay.unschedulable),
        makespan_s=float(t_end - t0),
        **stats,
        util_mean_pct=acct.delivered_area / (n_gpus * span),
        util_busy_pct=acct.delivered_area / busy if busy > 0 else 0.0,
        occupancy_pct=acct.util_area / (n_gpus * span),
        over_capacity_work_pct=acct.over_area / (n_gpus * span),
        peak_gpu_delivered_pct=acct.peak_delivered,
        gpus_busy_mean=busy / span,
        frag_rate_mean=_frag_mean(acct, t_end),
        idle_while_queued_frac=acct.idle_q_area / (n_gpus * span),
        shared_gpu_time_frac=acct.shared_area / busy if busy > 0 else 0.0,
        oversub_gpu_time_frac=acct.oversub_area / busy if busy > 0 else 0.0,
        peak_mem_frac=acct.peak_mem_frac,
        oom_events=replay.oom_events,
        migrations=replay.migrations,
        preemptions=replay.preemptions,
        events=replay.n_events,
        wall_s=wall_s,
        timeseries=_timeseries(acct, t_end, timeseries_points),
        params=replay.params(),
        jobs={
            "id": [j.job_id for j in J.jobs],
            "submit": J.submit,
            "start": J.start,
            "finish": J.finish,
            "duration": J.duration,
        }
        if record_jobs
        else None,
    )
