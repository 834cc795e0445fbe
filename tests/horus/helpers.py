"""Helpers of the Horus tests (plain Python, no Django): job views, placed jobs, trace jobs."""

from __future__ import annotations

from scheduling.horus.cluster import ClusterState, JobView
from scheduling.horus.traces import Job


def view(job_id: str = "j", *, util: float = 50.0, mem: float = 1000.0, num_gpus: int = 1, milli: int = 1000,
         single_node: bool = False, cpu: int = 0, ram: int = 0) -> JobView:
    return JobView(job_id, 0.0, num_gpus, milli, util, mem, cpu, ram, single_node)


def put(state: ClusterState, job_id: str, gpus, *, pred_util: float, pred_mem: float, true_util: float | None = None,
        true_mem: float | None = None, milli: int = 1000, now: float = 0.0):
    """Place a job directly on a state (as the simulator would)."""
    v = view(job_id, util=pred_util, mem=pred_mem, num_gpus=len(gpus), milli=milli)
    return state.add(v, list(gpus), true_util=pred_util if true_util is None else true_util,
                     true_mem=pred_mem if true_mem is None else true_mem, now=now)


def job(job_id: str, submit: float, duration: float, *, util: float = 50.0, mem: float = 1000.0, num_gpus: int = 1,
        pred_util: float | None = None, pred_mem: float | None = None, milli: int = 1000, single_node: bool = False) -> Job:
    return Job(job_id, submit, duration, num_gpus, milli, single_node=single_node, model="m", batch_size=1,
               true_util_pct=util, true_mem_mb=mem, pred_util_pct=util if pred_util is None else pred_util,
               pred_mem_mb=mem if pred_mem is None else pred_mem)
