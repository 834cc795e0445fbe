"""Builders for the Horus tests (plain functions, imported by the test modules; fixtures live in conftest)."""

from __future__ import annotations

import numpy as np

from scheduling.horus.cluster import ClusterState, JobView
from scheduling.horus.traces import Job


def view(job_id: str = "j", *, util: float = 50.0, mem: float = 1000.0, num_gpus: int = 1, milli: int = 1000,
         single_node: bool = False, cpu: int = 0, ram: int = 0) -> JobView:
    return JobView(job_id, 0.0, num_gpus, milli, util, mem, cpu, ram, single_node)


def put(state: ClusterState, job_id: str, gpus, *, pred_util: float, pred_mem: float, true_util: float | None = None,
        true_mem: float | None = None, milli: int = 1000, now: float = 0.0, single_node: bool = False):
    """Place a job directly on a state (as the simulator would)."""
    v = view(job_id, util=pred_util, mem=pred_mem, num_gpus=len(gpus), milli=milli, single_node=single_node)
    return state.add(v, list(gpus), true_util=pred_util if true_util is None else true_util,
                     true_mem=pred_mem if true_mem is None else true_mem, now=now)


def job(job_id: str, submit: float, duration: float, *, util: float = 50.0, mem: float = 1000.0, num_gpus: int = 1,
        pred_util: float | None = None, pred_mem: float | None = None, milli: int = 1000, single_node: bool = False) -> Job:
    return Job(job_id, submit, duration, num_gpus, milli, single_node=single_node, model="m", batch_size=1,
               true_util_pct=util, true_mem_mb=mem, pred_util_pct=util if pred_util is None else pred_util,
               pred_mem_mb=mem if pred_mem is None else pred_mem)


def random_jobs(n: int, seed: int, *, multi: bool = True) -> list:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(30.0, n))
    out = []
    for i in range(n):
        util = float(rng.choice([2.0, 15.0, 40.0, 70.0, 95.0]))
        mem = float(rng.choice([700.0, 2000.0, 5000.0, 9000.0]))
        ng = int(rng.choice([1, 1, 1, 2, 4])) if multi else 1
        out.append(job(f"j{i}", float(t[i]), float(rng.uniform(50, 2000)), util=util, mem=mem, num_gpus=ng,
                       pred_util=float(np.clip(util * rng.lognormal(0, 0.4), 1, 100)), pred_mem=mem * float(rng.lognormal(0, 0.3))))
    return out
