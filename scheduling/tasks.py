"""Celery tasks: thin wrappers over scheduling.services.

* ``scheduling.heartbeat`` (queue ``telemetry``, celery beat every SCHEDULING_HEARTBEAT_S):
  NVML sample of this host's GPUs -> Node/GPU/GpuTelemetry rows; the beat's tick also
  sends a targeted heartbeat to every other live node's own queue, and places pending jobs.
* ``scheduling.place_pending``: one placement pass with the configured policy.
* ``scheduling.run_job``: sent to ``measure.<node>.gpu<i>`` by the placement; runs the model there.
* ``scheduling.run_simulation``: a stored simulation run (sent by the fair queue, services.simulation_queue).
* ``scheduling.train_predictor``: train and activate a predictor version (queued by the API's train action
  and by the first GPU job that finds no predictor: training never runs inside a request).

A worker registers its node (and the queues it consumes) as soon as it is ready.

Queues come from ``CELERY_TASK_ROUTES`` (config/settings.py) or, for ``run_job``, from the placement;
time limits (soft, then hard) from :data:`TIME_LIMITS_S`. A soft limit raises inside the service, which
records the job or simulation as failed, saying so; the hard limit kills a task that ignores it.
"""
from __future__ import annotations

import datetime
import logging
import socket

import psutil

from celery import current_app, shared_task
from celery.signals import worker_ready
from django.conf import settings

from . import selectors, services

log = logging.getLogger(__name__)

# (soft, hard) seconds per kind of work. A GPU job stops itself at its declared duration (at most
# SCHEDULING_MAX_JOB_DURATION_S, counted from its start, model loading included): the limit leaves room
# for loading and for reporting. Simulations are bounded by the team's simulation size and cost quotas
# (scheduling.horus.cost), one per team is in the worker's queue at a time, and they can be cancelled.
TIME_LIMITS_S: dict[str, tuple[float, float]] = {
    "telemetry": (60.0, 120.0),
    "placement": (300.0, 360.0),
    "gpu_job": (settings.SCHEDULING_MAX_JOB_DURATION_S + 600.0, settings.SCHEDULING_MAX_JOB_DURATION_S + 900.0),
    "simulations": (2 * 3600.0, 2 * 3600.0 + 300.0),
    "predictor": (1800.0, 1900.0),
}


def _limits(kind: str) -> dict[str, float]:
    soft, hard = TIME_LIMITS_S[kind]
    return {"soft_time_limit": soft, "time_limit": hard}


def _consumed_queues(app=None) -> list[str]:
    app = app or current_app
    consuming = getattr(getattr(app, "amqp", None), "queues", None)
    consuming = getattr(consuming, "consume_from", None) if consuming is not None else None
    return sorted(consuming) if consuming else []


@shared_task(name="scheduling.heartbeat", ignore_result=True, **_limits("telemetry"))
def heartbeat(node: str | None = None, queues: list[str] | None = None, fanout: bool = True,
              worker_started: float | None = None) -> dict:
    local = settings.NODE_NAME
    if node and node != local:
        # A targeted heartbeat reached another node's worker (a shared queue): not ours to sample.
        return {"node": node, "skipped": f"delivered to {local}"}
    result = services.record_heartbeat(node_name=local, queues=sorted(set(queues or []) | set(_consumed_queues())))
    if worker_started is not None and queues:
        # A (re)started worker: jobs its previous incarnation left on its GPU queues are settled.
        services.reconcile_restarted_gpu_worker(
            queues=queues, started_before=datetime.datetime.fromtimestamp(worker_started, datetime.UTC))
    if fanout and not node:
        for other, queue in selectors.heartbeat_fanout_targets(exclude=local):
            heartbeat.apply_async(kwargs={"node": other, "fanout": False}, queue=queue)
        services.recover_lost_jobs()
        services.request_interference_replacements()  # the live re-placement rule, on measured load
        services.settle_expired_pod_bindings()  # pods never released: their TTL's GPU time charged
        services.request_placement_pass(only_if_pending=True)
        services.dispatch_simulations()  # a slot freed by a run whose worker died before dispatching the next
    return result.as_dict()


@shared_task(name="scheduling.place_pending", ignore_result=True, **_limits("placement"))
def place_pending(policy: str | None = None) -> list[int]:
    return [p.pk for p in services.place_pending_jobs(policy=policy)]


@shared_task(name="scheduling.run_job", bind=True, acks_late=True, reject_on_worker_lost=True, **_limits("gpu_job"))
def run_job(self, job_id: int, placement_id: int) -> dict | None:
    job = services.execute_job(job_id=job_id, placement_id=placement_id,
                               worker=self.request.hostname or socket.gethostname())
    return None if job is None else {"job": job.pk, "state": job.state, "error": job.error}


@shared_task(name="scheduling.run_simulation", acks_late=True, reject_on_worker_lost=True, **_limits("simulations"))
def run_simulation(run_id: int) -> str | None:
    run = services.execute_simulation(run_id=run_id)
    return None if run is None else run.status


@shared_task(name="scheduling.train_predictor", **_limits("predictor"))
def train_predictor(k_folds: int = 5, seed: int = 0, activate: bool = True, requested_by: int | None = None) -> int:
    return services.run_requested_training(k_folds=k_folds, seed=seed, activate=activate,
                                           requested_by=requested_by).version


@worker_ready.connect
def _register_on_start(sender=None, **kwargs):
    # No database work in the worker's parent process (prefork children would inherit the
    # connection): send a heartbeat to a queue of this node that this worker consumes.
    app = getattr(sender, "app", None)
    queues = _consumed_queues(app)
    if not queues:
        return
    node = settings.NODE_NAME
    own = [q for q in queues if f".{node}." in q] + [q for q in queues if q == "telemetry"] + queues
    started = psutil.Process().create_time()  # before any task this incarnation of the worker runs
    heartbeat.apply_async(kwargs={"node": node, "queues": queues, "fanout": False, "worker_started": started},
                          queue=own[0])
    log.info("node %s: registering (queues %s) via %s", node, ", ".join(queues), own[0])
