"""Celery tasks: thin wrappers over scheduling.services.

* ``scheduling.heartbeat`` (queue ``telemetry``, celery beat every SCHEDULING_HEARTBEAT_S):
  NVML sample of this host's GPUs -> Node/GPU/GpuTelemetry rows; the beat's tick also
  sends a targeted heartbeat to every other live node's own queue, and places pending jobs.
* ``scheduling.place_pending``: one placement pass with the configured policy.
* ``scheduling.run_job``: sent to ``measure.<node>.gpu<i>`` by the placement; runs the model there.
* ``scheduling.run_simulation``: a stored simulation run.
* ``scheduling.train_predictor``: train and activate a predictor version.

A worker registers its node (and the queues it consumes) as soon as it is ready.
"""
from __future__ import annotations

import datetime
import logging
import socket

import psutil

from celery import current_app, shared_task
from celery.signals import worker_ready
from django.conf import settings

from . import services

log = logging.getLogger(__name__)


def _consumed_queues(app=None) -> list[str]:
    app = app or current_app
    consuming = getattr(getattr(app, "amqp", None), "queues", None)
    consuming = getattr(consuming, "consume_from", None) if consuming is not None else None
    return sorted(consuming) if consuming else []


@shared_task(name="scheduling.heartbeat", ignore_result=True)  # queue: CELERY_TASK_ROUTES
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
            queues=queues, started_before=datetime.datetime.fromtimestamp(worker_started, datetime.timezone.utc))
    if fanout and not node:
        for other, queue in services.heartbeat_fanout_targets(exclude=local):
            heartbeat.apply_async(kwargs={"node": other, "fanout": False}, queue=queue)
        services.recover_lost_jobs()
        if services.GpuJob.objects.filter(state=services.GpuJob.State.PENDING).exists():
            place_pending.delay()
    return result.as_dict()


@shared_task(name="scheduling.place_pending", ignore_result=True)
def place_pending(policy: str | None = None) -> list[int]:
    return [p.pk for p in services.place_pending_jobs(policy=policy)]


@shared_task(name="scheduling.run_job", bind=True, acks_late=True, reject_on_worker_lost=True)
def run_job(self, job_id: int, placement_id: int) -> dict | None:
    job = services.execute_job(job_id=job_id, placement_id=placement_id,
                               worker=self.request.hostname or socket.gethostname())
    return None if job is None else {"job": job.pk, "state": job.state, "error": job.error}


@shared_task(name="scheduling.run_simulation", acks_late=True)
def run_simulation(run_id: int) -> str | None:
    run = services.execute_simulation(run_id=run_id)
    return None if run is None else run.status


@shared_task(name="scheduling.train_predictor")
def train_predictor(k_folds: int = 5, seed: int = 0) -> int:
    return services.train_predictor(actor=None, k_folds=k_folds, seed=seed).version


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
