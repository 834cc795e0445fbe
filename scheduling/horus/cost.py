"""What a simulation request costs before it runs, in *simulation units* (no Django here).

One simulation unit is one job taken through one placement decision by a baseline policy
(``best_fit``, ``horus``, ...) with a one-job queue window on a cluster of up to about a thousand GPUs.
:func:`estimate_simulation_cost` multiplies it out over everything a request can ask for:

    units = seeds x (jobs prepared + sum over policies of
                     decisions x policy weight x (1 + GPUs / GPU_SCAN) x (1 + (window - 1) / WINDOW_SCAN))

* ``decisions``: replay - the jobs of the slice (each is queued, placed and finished once; an
  out-of-memory retry is rare); fill - the pods it submits before the requested GPUs reach ``until`` x
  the cluster, ``until x GPUs / GPUs requested per sampled pod`` with a 25 % margin for the sampling,
  never more than the fill's own cap, ``10 x GPUs + 1000`` (the cap itself when the trace's mean
  request is unknown).
* ``policy weight``: how much more a policy's decision costs than a baseline's (migrations, FGD's
  fragmentation deltas, usage_fgd's interference bound), from the timings below.
* ``GPUs``: every placement scores the cluster, so a decision grows with it (vectorised: slowly).
* ``window``: the queue positions a scheduling pass offers the policy - ``backfill``, or Horus's
  ``horus_lookahead`` for ``horus``/``horus_migrate``, whichever is larger (never more than the jobs).
  A wider window re-offers waiting jobs at every event: the measured cost grows about as
  ``1 + (window - 1) / 64`` (best_fit x3, fgd x9 at a window of 500).
* ``seeds``: one simulation per seed (the dashboard starts one per seed it is given).

Parameters that shape the trace but not the work (``start``, ``from_day``, ``compress``,
``target_load``, ``max_duration_s``, ``predictor_error``, ``predictions``, ``timeseries_points``,
``telemetry_delay_s``, ``interference``, ``gpu_model``) are not multipliers: they move the estimate by
less than its own error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .experiments import ExperimentParams, policy_options

__all__ = [
    "SECONDS_PER_UNIT",
    "POLICY_WEIGHTS",
    "GPU_SCAN",
    "WINDOW_SCAN",
    "SimulationCost",
    "estimate_simulation_cost",
    "fill_decisions",
]

#: Worker seconds per simulation unit. Measured on the 2-core development host (shared, load ~1):
#: ``run_experiment`` on 5,000 Philly jobs (from #10000, oracle predictions, target load 1.5) on 64 V100s
#: took 0.42-0.60 s per baseline policy (gandiva, random_fit, best_fit, horus; 5,312 units each) =
#: 0.8-1.1e-4 s per unit; on 1,024 GPUs 0.45-0.77 s (10,000 units each). Rounded up to 1.2e-4 s.
SECONDS_PER_UNIT = 1.2e-4

#: A decision's cost relative to a baseline policy's, from the same runs: fifo_exclusive 0.24 s,
#: horus_migrate 0.98-1.52 s, fgd 0.98-1.06 s (replay) and x4-6 best_fit's in the Alibaba fill,
#: usage_fgd 9.2 s (replay) and x8-12 best_fit's in the fill. Rounded up.
POLICY_WEIGHTS: dict[str, float] = {
    "fifo_exclusive": 1.0,
    "gandiva": 1.0,
    "best_fit": 1.0,
    "random_fit": 1.0,
    "horus": 1.0,
    "horus_migrate": 3.0,
    "fgd": 6.0,
    "usage_fgd": 20.0,
}
#: A policy not listed (a new one) is charged as the dearest listed one until it is measured.
DEFAULT_POLICY_WEIGHT = max(POLICY_WEIGHTS.values())
#: GPUs at which one decision costs twice a small cluster's (fgd in the fill: x1.6 from 315 to 1,248 GPUs
#: per pod, so 1,024 is on the safe side).
GPU_SCAN = 1024.0
#: Queue window at which one decision costs twice a one-job window's (fgd: x8.6 from 1 to 500).
WINDOW_SCAN = 64.0


@dataclass(frozen=True)
class SimulationCost:
    """An estimate: ``units`` in total, ``per_policy`` units (one seed), and the worker time they stand for."""

    units: int
    seconds: float
    seeds: int
    jobs: int
    gpus: int
    decisions: int
    per_policy: dict[str, int]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fill_decisions(gpus: int, *, until: float = 1.0, gpu_request_per_pod: float | None = None) -> int:
    """Pods a fill submits: ``until x gpus`` GPUs of requests at ``gpu_request_per_pod`` GPUs a sampled pod
    (CPU-only pods count 0), plus 25 %; at most the cap ``horus.fill.Fill`` puts on it (None: the cap)."""
    cap = 10 * int(gpus) + 1000
    if not gpu_request_per_pod or gpu_request_per_pod <= 0:
        return cap
    return min(cap, math.ceil(1.25 * until * gpus / gpu_request_per_pod) + 1)


def estimate_simulation_cost(
    params: ExperimentParams,
    *,
    policies: Sequence[str],
    jobs: int,
    gpus: int,
    seeds: int = 1,
    gpu_request_per_pod: float | None = None,
) -> SimulationCost:
    """THE cost of a validated experiment (``params.validate`` has set its method) of ``policies`` on
    ``jobs`` jobs (``experiments.simulation_size``) and a ``gpus``-GPU cluster, for ``seeds`` seeds.
    ``gpu_request_per_pod``: a pod list's mean GPU request (fill only; None = unknown)."""
    jobs, gpus, seeds = max(0, int(jobs)), max(0, int(gpus)), max(1, int(seeds))
    decisions = (
        fill_decisions(gpus, until=params.until, gpu_request_per_pod=gpu_request_per_pod)
        if params.method == "fill"
        else jobs
    )
    scan = 1.0 + gpus / GPU_SCAN
    per_policy: dict[str, int] = {}
    for name in policies:
        window = 1
        if params.method != "fill":
            lookahead = int(policy_options(name, params).get("queue_lookahead", 1))
            window = max(1, min(max(int(params.backfill), lookahead), max(jobs, 1)))
        weight = POLICY_WEIGHTS.get(name, DEFAULT_POLICY_WEIGHT)
        per_policy[name] = round(decisions * weight * scan * (1.0 + (window - 1) / WINDOW_SCAN))
    units = seeds * (jobs + sum(per_policy.values()))
    return SimulationCost(
        units=int(units),
        seconds=units * SECONDS_PER_UNIT,
        seeds=seeds,
        jobs=jobs,
        gpus=gpus,
        decisions=int(decisions),
        per_policy=per_policy,
    )
