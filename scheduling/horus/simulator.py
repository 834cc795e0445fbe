"""Trace-driven discrete-event simulator of a shared GPU cluster.

Two experiment methods (see DESIGN.md, "Scheduling experiments"):

* :func:`simulate` - **replay**: jobs arrive at their (possibly
  time-compressed, :func:`~.traces.compress_time`) submit times on a (possibly
  scaled-down) cluster, wait in one FIFO queue, run, and leave. Reports
  makespan, wait, JCT, GPU utilization over time, busy GPUs, fragmentation.
* :func:`simulate_fill` - **fill** (the ATC'23 method for Alibaba): pods
  sampled from the trace are submitted one after another and never leave,
  until the submitted GPU request reaches the cluster's capacity; reports the
  share of GPU capacity allocated and the fragmentation along the way.

Model of a running job
    A job has a standalone duration ``d`` (the trace's), a TRUE utilization
    ``u`` and memory ``m`` (from profiles; the policy never sees them) and
    progresses at rate ``1 / slowdown``. Alone on its GPU(s) the rate is 1.
    Sharing a GPU with others, :class:`Interference` gives the slowdown:
    ``(1 + share_penalty + util_slope * others_util/100) * max(1, D/100) ** oversub_exponent``
    where ``D`` is the sum of the true utilizations on the GPU. The default is
    Horus's own simulator: +20 % while sharing, nothing more
    (``oversub_exponent=0``). ``oversub_exponent=1`` adds time-sharing of
    over-subscribed GPUs (demand 150 % stretches everyone 1.5x more), the
    "capped" model that benchmarks report as a sensitivity. A multi-GPU job runs at the
    rate of its slowest GPU. Rates change only at events, so finish times are
    recomputed only for jobs on GPUs whose set of jobs changed.

    A GPU's measured utilization is ``min(100, D)``; cluster utilization is
    the mean over all GPUs. A placement whose TRUE memory does not fit crashes
    the job out-of-memory: it goes back to the head of the queue after
    ``oom_penalty_s`` and is known to need its true memory from then on
    (``JobView.mem_floor_mb``). So no GPU ever holds more memory than it has.

Queue
    One FIFO queue. ``backfill=1`` is strict FIFO (the head blocks the rest,
    as YARN-CS does); ``backfill=W`` lets the first W waiting jobs be placed
    out of order (W large ~ the Kubernetes scheduler, which skips pods that do
    not fit). Waiting jobs are re-offered after a job leaves or migrates
    (placements only remove capacity, so nothing else can unblock them). For a
    policy with ``monotone_feasibility`` (all built-in ones: a request that is
    no smaller in any dimension is never easier to place), a job asking for at
    least as much as one refused in the same pass is not offered again.

Everything is seeded: the same inputs and seed give the same result.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .cluster import MILLI, ClusterSpec, ClusterState, JobView, PlacementError, workload_types
from .policies import PlacementPolicy
from .traces import Job

__all__ = ["Interference", "SimulationResult", "FillResult", "simulate", "simulate_fill", "validate_jobs"]


@dataclass(frozen=True)
class Interference:
    """Slowdown of co-located jobs (see the module docstring)."""

    share_penalty: float = 0.2
    util_slope: float = 0.0
    oversub_exponent: float = 0.0

    def slowdown(self, n_jobs: int, demand: float, job_util: float) -> float:
        if n_jobs <= 1:
            return 1.0
        s = 1.0 + self.share_penalty + self.util_slope * max(0.0, demand - job_util) / 100.0
        if demand > 100.0:
            s *= (demand / 100.0) ** self.oversub_exponent
        return s


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
    util_mean_pct: float
    util_busy_pct: float
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
    jobs: dict[str, list[float]] | None = None

    def to_dict(self, *, with_jobs: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_jobs:
            d.pop("jobs", None)
        return _json_safe(d)


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
        return _json_safe(asdict(self))


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.ndarray):
        return _json_safe(x.tolist())
    return x


def validate_jobs(jobs: Sequence[Job]) -> None:
    """Raise ``ValueError`` unless every job has true and predicted util/memory."""
    for j in jobs:
        if j.true_util_pct is None or j.true_mem_mb is None or j.pred_util_pct is None or j.pred_mem_mb is None:
            raise ValueError(f"job {j.job_id} has no utilization/memory: call traces.assign_workloads first")


def _noisy_predictions(jobs: Sequence[Job], sigma: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    pu = np.array([j.pred_util_pct for j in jobs], float)
    pm = np.array([j.pred_mem_mb for j in jobs], float)
    if sigma > 0:
        rng = np.random.default_rng([seed, 0x5EED])
        pu = np.clip(pu * np.exp(rng.normal(0, sigma, len(jobs))), 1.0, 100.0)
        pm = np.maximum(pm * np.exp(rng.normal(0, sigma, len(jobs))), 1.0)
    return pu, pm


def _views(jobs: Sequence[Job], pu: np.ndarray, pm: np.ndarray) -> list[JobView]:
    return [
        JobView(j.job_id, float(j.submit_time), int(j.num_gpus), int(j.gpu_milli), float(u), float(m),
                int(j.cpu_milli), int(j.ram_mib), bool(j.single_node), j.model, j.batch_size)
        for j, u, m in zip(jobs, pu, pm)
    ]


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


def simulate(
    jobs: Sequence[Job],
    cluster_spec: ClusterSpec,
    policy: PlacementPolicy,
    *,
    seed: int = 0,
    interference: Interference = Interference(),
    predictor_error: float = 0.0,
    backfill: int = 1,
    migration_cost_s: float = 60.0,
    oom_penalty_s: float = 60.0,
    timeseries_points: int = 200,
    frag_samples: int = 256,
    record_jobs: bool = False,
    check_invariants: bool = False,
) -> SimulationResult:
    """Replay ``jobs`` on ``cluster_spec`` under ``policy``.

    ``predictor_error`` (sigma >= 0) multiplies every job's predicted
    utilization and memory by ``exp(N(0, sigma))`` (seeded) on top of whatever
    predictions the jobs carry - the knob for "what if predictions were
    noisier". Jobs needing more GPUs, or more memory per GPU, than the
    cluster has are dropped (``dropped_jobs``); a job the policy refuses even on an idle cluster is
    dropped when nothing else is left to run (``unschedulable_jobs``; without
    this a strict FIFO queue would wait forever). ``record_jobs`` keeps per-job submit/start/finish;
    ``check_invariants`` asserts memory and time invariants at every event
    (slower; for tests).
    """
    t_wall = time.perf_counter()
    validate_jobs(jobs)
    state = ClusterState(cluster_spec)
    n_gpus = state.n_gpus
    biggest = float(state.mem_cap.max())
    kept = [j for j in jobs if 0 < j.num_gpus <= n_gpus and float(j.true_mem_mb) <= biggest]
    dropped = len(jobs) - len(kept)
    order = sorted(range(len(kept)), key=lambda i: (kept[i].submit_time, i))
    jl = [kept[i] for i in order]
    n = len(jl)
    pu, pm = _noisy_predictions(jl, predictor_error, seed)
    views = _views(jl, pu, pm)
    state.workload = workload_types(jl)
    cv = state.view()
    policy.reset(seed)
    has_rebalance = type(policy).rebalance is not PlacementPolicy.rebalance

    true_u = [float(j.true_util_pct) for j in jl]
    true_m = [float(j.true_mem_mb) for j in jl]
    dur = [float(j.duration_s) for j in jl]
    submit = [float(j.submit_time) for j in jl]
    index = {j.job_id: i for i, j in enumerate(jl)}
    if len(index) != n:
        raise ValueError("job ids must be unique")
    start = [math.nan] * n
    finish = [math.nan] * n
    remaining = [0.0] * n
    rate = [0.0] * n
    last = [0.0] * n
    version = [0] * n
    oom_events = 0
    migrations = 0
    unschedulable: list[str] = []

    jobs_on = state.jobs_on
    demand = state.true_util  # live array
    mem_cap = state.mem_cap
    slow = interference.slowdown

    # piecewise-constant accounting
    util_sum = 0.0  # sum over GPUs of min(100, demand)
    shared_gpus = 0  # GPUs with >= 2 jobs
    oversub_gpus = 0  # GPUs with demand > 100
    capped = [0.0] * n_gpus
    njob = [0] * n_gpus
    over = [False] * n_gpus
    t_prev = 0.0
    util_area = busy_area = idle_q_area = shared_area = oversub_area = 0.0
    ts_t: list[float] = []
    ts_util: list[float] = []
    ts_busy: list[float] = []
    ts_queue: list[float] = []
    frag_t: list[float] = []
    frag_v: list[float] = []
    peak_mem_frac = 0.0

    heap: list[tuple[float, int, int, int, int]] = []  # (time, kind, seq, job, version); kind 0 finish, 1 arrival/retry
    seq = 0
    for i in range(n):
        heap.append((submit[i], 1, seq, i, 0))
        seq += 1
    heapq.heapify(heap)
    queue: deque[int] = deque()
    dirty = True
    tried = 0
    window = max(1, int(backfill))
    monotone = bool(getattr(policy, "monotone_feasibility", False)) and window > 1
    events = 0
    frag_every = max(1, (2 * n) // max(1, frag_samples))
    batches = 0

    def refresh_gpu(g: int) -> None:
        nonlocal util_sum, shared_gpus, oversub_gpus
        d = float(demand[g])
        c = d if d < 100.0 else 100.0
        util_sum += c - capped[g]
        capped[g] = c
        k = len(jobs_on[g])
        old = njob[g]
        if (old >= 2) != (k >= 2):
            shared_gpus += 1 if k >= 2 else -1
        njob[g] = k
        now_over = d > 100.0 + 1e-9
        if over[g] != now_over:
            oversub_gpus += 1 if now_over else -1
            over[g] = now_over

    def update_rates(gpus: Sequence[int], now: float) -> None:
        nonlocal seq
        affected: set[int] = set()
        for g in gpus:
            for jid in jobs_on[g]:
                affected.add(index[jid])
        for i in sorted(affected):
            rj = state.running[jl[i].job_id]
            s = 1.0
            for g in rj.gpus:
                f = slow(len(jobs_on[g]), demand[g], true_u[i])
                if f > s:
                    s = f
            r = 1.0 / s
            if r != rate[i]:
                remaining[i] -= rate[i] * (now - last[i])
                last[i] = now
                rate[i] = r
                version[i] += 1
                heapq.heappush(heap, (now + max(remaining[i], 0.0) / r, 0, seq, i, version[i]))
                seq += 1

    def start_job(i: int, gpus: Sequence[int], now: float) -> None:
        nonlocal peak_mem_frac
        state.add(views[i], gpus, true_util=true_u[i], true_mem=true_m[i], now=now)
        if math.isnan(start[i]):
            start[i] = now
            remaining[i] = dur[i]
        last[i] = now
        rate[i] = 0.0
        for g in gpus:
            refresh_gpu(g)
            f = state.true_mem[g] / mem_cap[g]
            if f > peak_mem_frac:
                peak_mem_frac = f
        update_rates(gpus, now)

    def schedule(now: float) -> None:
        nonlocal dirty, tried, oom_events, seq
        if not queue:
            dirty = False
            tried = 0
            return
        i = 0 if dirty else tried
        if i >= window or i >= len(queue):
            return
        failed: list[tuple[float, ...]] = []  # request vectors refused in this pass
        while i < len(queue) and i < window:
            j = queue[i]
            v = views[j]
            req = (v.num_gpus, v.gpu_milli, v.cpu_milli, v.ram_mib, max(v.pred_mem_mb, v.mem_floor_mb),
                   v.pred_util_pct, 1 if v.single_node else 0)
            if monotone and any(all(a >= b for a, b in zip(req, f)) for f in failed):
                i += 1  # asks for at least as much as a job just refused: refused too
                continue
            gpus = policy.place(v, cv, now)
            if gpus is None:
                if monotone and len(failed) < 8:
                    failed.append(req)
                i += 1
                continue
            gpus = [int(g) for g in gpus]
            try:
                state.check_placement(views[j], gpus)
            except PlacementError as e:
                raise PlacementError(f"policy {policy.name!r} at t={now:.0f}s: {e}") from None
            del queue[i]
            if not state.fits_memory(gpus, true_m[j]):
                oom_events += 1
                v = views[j]
                views[j] = JobView(v.job_id, v.submit_time, v.num_gpus, v.gpu_milli, v.pred_util_pct, v.pred_mem_mb,
                                   v.cpu_milli, v.ram_mib, v.single_node, v.model, v.batch_size, mem_floor_mb=true_m[j])
                heapq.heappush(heap, (now + oom_penalty_s, 1, seq, j, -1))
                seq += 1
                continue
            start_job(j, gpus, now)
        tried = i
        dirty = False

    def migrate(now: float) -> bool:
        nonlocal migrations
        moved = False
        for job_id, new_gpus in policy.rebalance(cv, now):
            i = index.get(job_id)
            rj = state.running.get(job_id)
            if i is None or rj is None:
                raise PlacementError(f"policy {policy.name!r} migrates unknown or finished job {job_id}")
            new_gpus = [int(g) for g in new_gpus]
            if sorted(new_gpus) == sorted(rj.gpus):
                continue
            state.check_placement(views[i], new_gpus, ignore=job_id)
            if not state.fits_memory(new_gpus, true_m[i], ignore=job_id):
                continue  # the move would OOM on arrival: the runtime refuses it
            old = rj.gpus
            remaining[i] -= rate[i] * (now - last[i])
            last[i] = now
            state.remove(job_id)
            for g in old:
                refresh_gpu(g)
            state.add(views[i], new_gpus, true_util=true_u[i], true_mem=true_m[i], now=now,
                      migrations=rj.migrations + 1)
            remaining[i] += migration_cost_s  # checkpoint + restore, as extra work
            rate[i] = 0.0
            for g in new_gpus:
                refresh_gpu(g)
            update_rates(list(old) + new_gpus, now)
            migrations += 1
            moved = True
        return moved

    while heap:
        now = heap[0][0]
        # accounting for [t_prev, now)
        dt = now - t_prev
        if dt > 0:
            busy = n_gpus - state.free_gpus
            util_area += util_sum * dt
            busy_area += busy * dt
            shared_area += shared_gpus * dt
            oversub_area += oversub_gpus * dt
            if queue:
                idle_q_area += state.free_gpus * dt
        t_prev = now
        departed = False
        arrived = False
        while heap and heap[0][0] == now:
            t, kind, _, i, ver = heapq.heappop(heap)
            events += 1
            if kind == 0:
                if ver != version[i]:
                    continue
                rj = state.remove(jl[i].job_id)
                finish[i] = t
                for g in rj.gpus:
                    refresh_gpu(g)
                update_rates(rj.gpus, now)
                departed = True
            elif ver == -1:  # retry after OOM: back to the head of the queue
                queue.appendleft(i)
                dirty = True
            else:
                queue.append(i)
                arrived = True
        if departed:
            dirty = True
            if has_rebalance and migrate(now):
                dirty = True
        if dirty or arrived:
            schedule(now)
        while queue and not state.running and not heap:
            # nothing runs and nothing will arrive: the head can never be placed
            # (the cluster is as free as it gets) - drop it as unschedulable
            unschedulable.append(jl[queue.popleft()].job_id)
            dirty = True
            schedule(now)
        batches += 1
        ts_t.append(now)
        ts_util.append(util_sum / n_gpus)
        ts_busy.append(float(n_gpus - state.free_gpus))
        ts_queue.append(float(len(queue)))
        if batches % frag_every == 0:
            fr, free = state.fragmentation()
            frag_t.append(now)
            frag_v.append(fr / free if free > 0 else 0.0)
        if check_invariants:
            assert np.all(state.true_mem <= state.mem_cap + 1e-6), "GPU memory over capacity"
            assert all(len(jobs_on[g]) == state.n_jobs[g] for g in range(n_gpus))
            if state.enforce_milli:
                assert np.all(state.milli_used <= MILLI)

    if queue or state.running:
        raise RuntimeError(f"simulation ended with {len(queue)} queued and {len(state.running)} running jobs")

    done = [i for i in range(n) if not math.isnan(finish[i])]
    t0 = min(submit) if n else 0.0
    t_end = max((finish[i] for i in done), default=t0)
    makespan = t_end - t0
    sub_a = np.array(submit)[done]
    start_a = np.array(start)[done]
    fin_a = np.array(finish)[done]
    dur_a = np.array(dur)[done]
    waits = start_a - sub_a
    jct = fin_a - sub_a
    span = max(t_end - t0, 1e-9)
    nd = len(done)
    ts = {}
    if ts_t:
        tt = np.array(ts_t)
        e, u = _downsample(tt, np.array(ts_util), t_end, timeseries_points)
        _, b = _downsample(tt, np.array(ts_busy), t_end, timeseries_points)
        _, q = _downsample(tt, np.array(ts_queue), t_end, timeseries_points)
        ts = {"t_s": e, "util_pct": u, "busy_gpus": b, "queue_len": q}
    if len(frag_t) >= 2:
        ft = np.array(frag_t)
        w = np.diff(np.append(ft, t_end))
        frag_mean = float(np.sum(np.array(frag_v) * w) / max(w.sum(), 1e-9))
    else:
        frag_mean = float(frag_v[0]) if frag_v else 0.0
    res = SimulationResult(
        policy=policy.name,
        cluster=cluster_spec.summary(),
        seed=seed,
        n_jobs=n,
        dropped_jobs=dropped,
        unschedulable_jobs=len(unschedulable),
        makespan_s=float(makespan),
        mean_wait_s=float(waits.mean()) if nd else 0.0,
        median_wait_s=float(np.median(waits)) if nd else 0.0,
        p95_wait_s=float(np.percentile(waits, 95)) if nd else 0.0,
        mean_jct_s=float(jct.mean()) if nd else 0.0,
        p95_jct_s=float(np.percentile(jct, 95)) if nd else 0.0,
        mean_slowdown=float(np.mean((fin_a - start_a) / dur_a)) if nd else 1.0,
        util_mean_pct=util_area / (n_gpus * span),
        util_busy_pct=util_area / busy_area if busy_area > 0 else 0.0,
        gpus_busy_mean=busy_area / span,
        frag_rate_mean=frag_mean,
        idle_while_queued_frac=idle_q_area / (n_gpus * span),
        shared_gpu_time_frac=shared_area / busy_area if busy_area > 0 else 0.0,
        oversub_gpu_time_frac=oversub_area / busy_area if busy_area > 0 else 0.0,
        peak_mem_frac=peak_mem_frac,
        oom_events=oom_events,
        migrations=migrations,
        events=events,
        wall_s=time.perf_counter() - t_wall,
        timeseries=ts,
        params={
            "policy": policy.describe(),
            "interference": asdict(interference),
            "predictor_error": predictor_error,
            "backfill": window,
            "migration_cost_s": migration_cost_s,
            "oom_penalty_s": oom_penalty_s,
        },
        jobs={"id": [j.job_id for j in jl], "submit": submit, "start": start, "finish": finish, "duration": dur}
        if record_jobs else None,
    )
    return res


def simulate_fill(
    pods: Sequence[Job],
    cluster_spec: ClusterSpec,
    policy: PlacementPolicy,
    *,
    seed: int = 0,
    until: float = 1.0,
    checkpoints: int = 20,
    predictor_error: float = 0.0,
    max_pods: int | None = None,
) -> FillResult:
    """The ATC'23 fill method: sample pods (with replacement, seeded) and
    submit them one by one - never leaving - until the submitted GPU request
    reaches ``until`` x the cluster's GPU capacity. A pod that cannot be placed
    fails (counted) and the next is submitted. Reports allocated share,
    fragmentation (FGD measure for the pods' own task mix) and unallocated
    GPUs, at ``checkpoints`` evenly spaced arrived shares and at the end."""
    t_wall = time.perf_counter()
    gpu_pods = [p for p in pods if p.num_gpus > 0]
    validate_jobs(gpu_pods)
    if not gpu_pods:
        raise ValueError("no GPU pods to sample from")
    state = ClusterState(cluster_spec)
    state.workload = workload_types(gpu_pods)
    cv = state.view()
    policy.reset(seed)
    pu, pm = _noisy_predictions(gpu_pods, predictor_error, seed)
    base_views = _views(gpu_pods, pu, pm)
    capacity = state.n_gpus * MILLI
    rng = np.random.default_rng([seed, 0xF111])
    arrived = allocated = 0.0
    submitted = placed = failed = ooms = 0
    first_fail: float | None = None
    curve: list[dict[str, float]] = []
    marks = [capacity * until * (k + 1) / checkpoints for k in range(checkpoints)]
    next_mark = 0
    limit = max_pods if max_pods is not None else 10 * state.n_gpus + 1000

    def snapshot() -> dict[str, float]:
        fr, free = state.fragmentation()
        return {
            "arrived_share": arrived / capacity,
            "allocated_share": allocated / capacity,
            "occupied_share": 1.0 - state.free_gpus / state.n_gpus,
            "frag_rate": fr / free if free > 0 else 0.0,
            "frag_gpus": fr / MILLI,
            "unallocated_gpus": (capacity - allocated) / MILLI,
            "failed": float(failed),
        }

    while arrived < capacity * until and submitted < limit:
        k = int(rng.integers(len(gpu_pods)))
        p = gpu_pods[k]
        v = base_views[k]
        view = JobView(f"{v.job_id}#{submitted}", 0.0, v.num_gpus, v.gpu_milli, v.pred_util_pct, v.pred_mem_mb,
                       v.cpu_milli, v.ram_mib, v.single_node, v.model, v.batch_size)
        submitted += 1
        req = p.num_gpus * min(p.gpu_milli, MILLI)
        arrived += req
        gpus = policy.place(view, cv, 0.0)
        if gpus is not None:
            gpus = [int(g) for g in gpus]
            try:
                state.check_placement(view, gpus)
            except PlacementError as e:
                raise PlacementError(f"policy {policy.name!r}: {e}") from None
            if state.fits_memory(gpus, float(p.true_mem_mb)):
                state.add(view, gpus, true_util=float(p.true_util_pct), true_mem=float(p.true_mem_mb), now=0.0)
                placed += 1
                allocated += req
            else:
                ooms += 1
                gpus = None
        if gpus is None:
            failed += 1
            if first_fail is None:
                first_fail = arrived / capacity
        while next_mark < len(marks) and arrived >= marks[next_mark]:
            curve.append(snapshot())
            next_mark += 1
    end = snapshot()
    return FillResult(
        policy=policy.name,
        cluster=cluster_spec.summary(),
        seed=seed,
        submitted=submitted,
        placed=placed,
        failed=failed,
        oom_events=ooms,
        allocated_share=end["allocated_share"],
        occupied_share=end["occupied_share"],
        frag_rate=end["frag_rate"],
        frag_gpus=end["frag_gpus"],
        unallocated_gpus=end["unallocated_gpus"],
        first_failure_arrived_share=first_fail,
        curve=curve,
        wall_s=time.perf_counter() - t_wall,
        params={"policy": policy.describe(), "until": until, "predictor_error": predictor_error},
    )
