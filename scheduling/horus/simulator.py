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
    Sharing a GPU with others, the interference model gives the slowdown; it is
    a pluggable object (:class:`~.replay.InterferenceModel`: one GPU's jobs in,
    their slowdowns out), chosen by name (``INTERFERENCE_MODELS``). The default,
    ``fitted`` (:class:`~.interference.FittedInterference`), is physical: fitted
    per GPU type to Gavel's measured co-location throughputs and
    work-conserving (the jobs on one GPU never deliver more than one GPU of
    standalone-equivalent work; three saturated jobs each run at <= 1/3).
    The cluster's GPU model picks the fitted type (T4 -> P100, others -> V100).
    Sensitivities, not physics: ``share_penalty``
    (:class:`~.replay.SharingPenalty`, alias ``Interference``; Horus's own
    simulator, +20 % while sharing whatever the load, so one GPU can do 2.5
    GPUs of work) and ``capped`` (the same, also time-shared over 100 %
    demand). A multi-GPU job runs at the rate of its slowest GPU. Rates change
    only at events, so finish times are recomputed only for jobs on GPUs whose
    set of jobs changed.

    Truth and telemetry: a job runs at its TRUE standalone utilization on the type of the GPU it got
    (:func:`~.profiles.util_on_gpu` rescales the profile's value by Gavel's measured speed ratios);
    policies see its prediction and what telemetry samples - per-process utilization
    ``1 - (1 - u)/slowdown`` (:func:`~.replay.measured_util`) and per GPU their sum, capped at 100 %.

    Utilization: ``util_mean_pct`` is DELIVERED work, each GPU's sum of its
    jobs' ``true util x rate`` (standalone-equivalent GPU time per GPU time,
    counted at most 100 % per GPU; a non-work-conserving model's excess is
    ``over_capacity_work_pct``), the mean over all GPUs and the span.
    ``occupancy_pct`` is what a device counter would show, each GPU's
    ``min(100, D)`` with ``D`` the sum of its jobs' true utilizations.
    A placement whose TRUE memory does not fit crashes
    the job out-of-memory: it goes back to the head of the queue after
    ``oom_penalty_s`` and is known to need its true memory from then on
    (``JobView.mem_floor_mb``). So no GPU ever holds more memory than it has.

Queue
    One FIFO queue. ``backfill=1`` is strict FIFO (the head blocks the rest,
    as YARN-CS does); ``backfill=W`` lets the first W waiting jobs be placed
    out of order (W large ~ the Kubernetes scheduler, which skips pods that do
    not fit). A policy may ask for a look-ahead of its own (``queue_lookahead``: Horus, as its
    authors run it, considers the first 5 waiting jobs); the window is the larger of the two.
    Waiting jobs are re-offered after a job leaves or migrates
    (placements only remove capacity, so nothing else can unblock them). For a
    policy with ``monotone_feasibility`` (all built-in ones: a request that is
    no smaller in any dimension is never easier to place), a job asking for at
    least as much as one refused in the same pass is not offered again.

Structure
    :mod:`.replay` holds the replay: an event queue, the jobs' progress, the
    state machine (:class:`~.replay.Replay`), a separate accounting part
    (integrals of GPU time, occupancy, sharing, waits) and
    :func:`~.replay.summarize`; :mod:`.fill` the fill method. This module is
    the entry point both are called through.

Everything is seeded: the same inputs and seed give the same result.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .cluster import ClusterSpec
from .fill import Fill, FillResult
from .interference import FittedInterference
from .policies import PlacementPolicy
from .replay import (
    DEFAULT_INTERFERENCE,
    INTERFERENCE_MODELS,
    GpuLoad,
    InterferenceModel,
    Replay,
    SharingPenalty,
    SimulationResult,
    make_interference,
    summarize,
)
from .sim_inputs import SimulationStopped, StopCheck, validate_jobs
from .traces import Job

__all__ = [
    "Interference",
    "InterferenceModel",
    "SharingPenalty",
    "GpuLoad",
    "INTERFERENCE_MODELS",
    "DEFAULT_INTERFERENCE",
    "FittedInterference",
    "make_interference",
    "SimulationResult",
    "FillResult",
    "simulate",
    "simulate_fill",
    "validate_jobs",
    "SimulationStopped",
]

#: the historical name of the old (flat +20 %) interference model, now a sensitivity
Interference = SharingPenalty


def simulate(
    jobs: Sequence[Job],
    cluster_spec: ClusterSpec,
    policy: PlacementPolicy,
    *,
    seed: int = 0,
    interference: InterferenceModel = DEFAULT_INTERFERENCE,
    predictor_error: float = 0.0,
    backfill: int = 1,
    migration_cost_s: float = 60.0,
    oom_penalty_s: float = 60.0,
    timeseries_points: int = 200,
    frag_samples: int = 256,
    record_jobs: bool = False,
    check_invariants: bool = False,
    telemetry_delay_s: float = 60.0,
    should_stop: StopCheck | None = None,
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
    (slower; for tests). ``telemetry_delay_s``: how long after a job starts (or its speed changes)
    policies see its sampled utilization (until its first sample, its prediction); 0 = exact, instant
    telemetry. ``should_stop()`` is asked every few event batches; True abandons the replay
    (:class:`~.sim_inputs.SimulationStopped`).
    """
    t_wall = time.perf_counter()
    replay = Replay(
        jobs,
        cluster_spec,
        policy,
        seed=seed,
        interference=interference,
        predictor_error=predictor_error,
        backfill=backfill,
        migration_cost_s=migration_cost_s,
        oom_penalty_s=oom_penalty_s,
        frag_samples=frag_samples,
        check_invariants=check_invariants,
        telemetry_delay_s=telemetry_delay_s,
    ).run(should_stop=should_stop)
    return summarize(
        replay, wall_s=time.perf_counter() - t_wall, timeseries_points=timeseries_points, record_jobs=record_jobs
    )


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
    should_stop: StopCheck | None = None,
) -> FillResult:
    """The ATC'23 fill method: sample pods (with replacement, seeded) and
    submit them one by one - never leaving - until the submitted GPU request
    reaches ``until`` x the cluster's GPU capacity. A pod that cannot be placed
    fails (counted) and the next is submitted. Reports allocated share,
    fragmentation (FGD measure for the pods' own task mix) and unallocated
    GPUs, at ``checkpoints`` evenly spaced arrived shares and at the end."""
    t_wall = time.perf_counter()
    fill = Fill(
        pods,
        cluster_spec,
        policy,
        seed=seed,
        until=until,
        checkpoints=checkpoints,
        predictor_error=predictor_error,
        max_pods=max_pods,
    ).run(should_stop=should_stop)
    return fill.result(wall_s=time.perf_counter() - t_wall)
