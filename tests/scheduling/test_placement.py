"""Placing pending jobs: routing to the GPU's queue, policies on live state, no double placement."""
from __future__ import annotations

import datetime as dt
import threading
from unittest import mock

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core.exceptions import ConflictError, ServiceError
from core.permissions import PermissionDenied
from scheduling import services, tasks
from scheduling.models import GPU, GpuJob, GpuTelemetry, Node, Placement

from .fakes import FakeNvml, fake_gpu, make_job, register_gpu_node

# dialect-sensitive (re-run on SQLite by scripts/test.sh): row locks, IntegrityError, a SQLite-only branch
pytestmark = pytest.mark.dialect


@pytest.fixture
def celery_sends():
    """Mock only the Celery sends (run_job to a GPU queue, place_pending to `default`)."""
    with mock.patch.object(tasks.run_job, "apply_async") as run_job, \
            mock.patch.object(tasks.place_pending, "delay") as place:
        yield mock.Mock(run_job=run_job, place=place)


def test_submitted_job_is_predicted_placed_and_routed_to_its_gpu_queue(
        gpu_node, model_a, user_owner, predictor, celery_sends, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = services.submit_job(actor=user_owner, model=model_a, batch_size=8, duration_estimate_s=120)
    assert job.state == "pending" and job.predictor_version == predictor
    assert 0 < job.predicted_util_pct <= 100 and job.predicted_mem_mb > 0 and job.predicted_for_gpu_model == "V100"
    celery_sends.place.assert_called_once()  # a placement pass is queued after commit

    with django_capture_on_commit_callbacks(execute=True):
        placed = services.place_pending_jobs(policy="horus")
    assert len(placed) == 1
    p = placed[0]
    job.refresh_from_db()
    assert job.state == "placed" and job.policy == "horus" and p.job == job and p.score is not None
    assert p.gpu.node == gpu_node and p.queue == f"measure.gpunode.gpu{p.gpu.index}"
    celery_sends.run_job.assert_called_once_with(args=[job.pk, p.pk], queue=p.queue)


def test_horus_spreads_by_predicted_load_and_skips_drained_gpus(gpu_node, model_a, celery_sends):
    g0, g1 = gpu_node.gpus.order_by("index")
    hot = make_job(model_a, util=90, mem=6000)
    services.place_pending_jobs(policy="horus")
    assert Placement.objects.get(job=hot).gpu == g0  # ties go to the lowest index
    nxt = make_job(model_a, util=60, mem=3000)
    services.place_pending_jobs(policy="horus")
    assert Placement.objects.get(job=nxt).gpu == g1  # g0 would be over-subscribed

    services.set_gpu_drained(actor=None, gpu=g1, drained=True)
    third = make_job(model_a, util=5, mem=500)
    services.place_pending_jobs(policy="horus")
    assert Placement.objects.get(job=third).gpu == g0


def test_gandiva_reads_current_telemetry(gpu_node, model_a, celery_sends):
    g0, g1 = gpu_node.gpus.order_by("index")
    now = timezone.now()
    GpuTelemetry.objects.create(gpu=g0, ts=now, util_pct=97, mem_used_mb=12000)  # busy with something else
    GpuTelemetry.objects.create(gpu=g1, ts=now, util_pct=3, mem_used_mb=600)
    job = make_job(model_a)
    services.place_pending_jobs(policy="gandiva", now=now)
    assert Placement.objects.get(job=job).gpu == g1


def test_unserved_stale_or_drained_capacity_is_not_used(db, model_a, celery_sends):
    register_gpu_node("noworker", serve=False)  # its GPU queues have no consumer
    stale = register_gpu_node("stale")
    Node.objects.filter(pk=stale.pk).update(last_seen=timezone.now() - dt.timedelta(hours=1))
    drained = register_gpu_node("drained")
    services.set_node_drained(actor=None, node=drained, drained=True)
    job = make_job(model_a)
    assert services.place_pending_jobs(policy="horus") == []
    job.refresh_from_db()
    assert job.state == "pending"
    celery_sends.run_job.assert_not_called()


def test_unknown_policy_is_refused(gpu_node):
    with pytest.raises(ServiceError, match="Unknown policy 'nope'"):
        services.place_pending_jobs(policy="nope")


def test_database_refuses_a_second_active_placement(gpu_node, model_a):
    job = make_job(model_a, state="placed")
    g0, g1 = gpu_node.gpus.order_by("index")
    now = timezone.now()
    Placement.objects.create(job=job, gpu=g0, policy="horus", queue=g0.queue, placed_at=now)
    with pytest.raises(IntegrityError), transaction.atomic():
        Placement.objects.create(job=job, gpu=g1, policy="horus", queue=g1.queue, placed_at=now)
    Placement.objects.filter(job=job).update(released_at=now)  # released: a new placement is fine
    Placement.objects.create(job=job, gpu=g1, policy="horus", queue=g1.queue, placed_at=now)


@pytest.mark.django_db(transaction=True)
def test_concurrent_placement_passes_never_place_a_job_twice(model_a):
    if connection.vendor != "postgresql":
        pytest.skip("row locking race is exercised on PostgreSQL (pass 1 of make test)")
    register_gpu_node("racer", [fake_gpu() for _ in range(4)])  # 4 x 16 GB
    # 6 GB each: two fit on a GPU with 500 MB headroom, three do not -> capacity 8 jobs.
    jobs = [make_job(model_a, util=20, mem=6000) for _ in range(16)]
    barrier, errors = threading.Barrier(8), []
    policies = ["horus", "gandiva", "best_fit", "horus"] * 2

    def attempt(policy):
        from django.db import connections

        try:
            barrier.wait()
            services.place_pending_jobs(policy=policy, limit=2)  # each pass takes two jobs
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    with mock.patch.object(tasks.run_job, "apply_async") as send:
        threads = [threading.Thread(target=attempt, args=(p,)) for p in policies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    per_job = [Placement.objects.filter(job=j).count() for j in jobs]
    assert max(per_job) == 1, per_job
    assert sum(per_job) == send.call_count == GpuJob.objects.filter(state="placed").count()
    sent_jobs = [c.kwargs["args"][0] for c in send.call_args_list]
    assert len(sent_jobs) == len(set(sent_jobs))
    # Each pass saw the placements of the passes before it (they serialize on the GPU rows):
    # no GPU got a third 6 GB job, and the cluster was filled exactly.
    per_gpu = [Placement.objects.filter(gpu=g, released_at__isnull=True).count() for g in GPU.objects.all()]
    assert per_gpu == [2, 2, 2, 2], per_gpu


def test_run_job_without_gpu_fails_clearly_and_frees_the_gpu(
        gpu_node, model_a, use_nvml, no_nvml, celery_sends, django_capture_on_commit_callbacks):
    job = make_job(model_a)
    (p,) = services.place_pending_jobs(policy="horus")
    use_nvml(no_nvml)
    with django_capture_on_commit_callbacks(execute=True):
        out = tasks.run_job.run(job.pk, p.pk)
    job.refresh_from_db()
    p.refresh_from_db()
    assert out["state"] == "failed" and job.state == "failed"
    assert job.error == "no NVIDIA GPU found (pynvml: NVML Shared Library Not Found)"
    assert p.released_at is not None and job.started_at is not None
    celery_sends.place.assert_called()  # the freed GPU triggers a placement pass
    assert tasks.run_job.run(job.pk, p.pk) is None  # redelivered message: nothing to do


def test_run_job_with_gpu_but_no_cuda_runtime_names_what_is_missing(
        gpu_node, model_a, use_nvml, celery_sends, monkeypatch):
    import tvm

    job = make_job(model_a)
    (p,) = services.place_pending_jobs(policy="horus")
    use_nvml(FakeNvml([fake_gpu(), fake_gpu()]))
    monkeypatch.setattr(tvm, "cuda", lambda i=0: mock.Mock(exist=False))
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w")
    job.refresh_from_db()
    assert job.state == "failed"
    assert "CUDAExecutionProvider" in job.error and "TVM sees no CUDA device" in job.error


def test_cancel_releases_the_placement(gpu_node, model_a, user_owner, celery_sends):
    job = make_job(model_a)
    (p,) = services.place_pending_jobs(policy="horus")
    services.cancel_job(actor=user_owner, job=job)
    p.refresh_from_db()
    job.refresh_from_db()
    assert job.state == "cancelled" and p.released_at is not None
    with pytest.raises(ConflictError):
        services.cancel_job(actor=user_owner, job=job)
    assert services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w") is None


def test_viewer_cannot_submit(model_a, user_viewer, predictor):
    with pytest.raises(PermissionDenied):
        services.submit_job(actor=user_viewer, model=model_a, batch_size=1)
    assert not GpuJob.objects.exists()


def test_jobs_on_a_node_that_went_silent_are_recovered(gpu_node, model_a, celery_sends):
    placed, running = make_job(model_a), make_job(model_a)
    services.place_pending_jobs(policy="horus")
    GpuJob.objects.filter(pk=running.pk).update(state="running")
    assert services.recover_lost_jobs() == {"requeued": [], "failed": []}  # node alive: nothing to do
    Node.objects.filter(pk=gpu_node.pk).update(last_seen=timezone.now() - dt.timedelta(hours=1))
    assert services.recover_lost_jobs() == {"requeued": [placed.pk], "failed": [running.pk]}
    placed.refresh_from_db()
    running.refresh_from_db()
    assert placed.state == "pending" and running.state == "failed" and "gpunode stopped sending" in running.error
    assert not Placement.objects.filter(released_at__isnull=True).exists()
    register_gpu_node("fresh")
    (again,) = services.place_pending_jobs(policy="horus")
    assert again.job == placed and again.gpu.node.name == "fresh"


def test_measured_load_adds_jobs_placed_after_the_latest_sample(gpu_node, model_a, celery_sends):
    g0, g1 = gpu_node.gpus.order_by("index")
    t = timezone.now()
    GpuTelemetry.objects.create(gpu=g0, ts=t - dt.timedelta(seconds=30), util_pct=5, mem_used_mb=500)
    GpuTelemetry.objects.create(gpu=g1, ts=t - dt.timedelta(seconds=30), util_pct=40, mem_used_mb=3000)
    first = make_job(model_a, util=70, mem=4000)
    services.place_pending_jobs(policy="gandiva", now=t - dt.timedelta(seconds=20))
    assert Placement.objects.get(job=first).gpu == g0
    state = services.build_cluster_state([g0, g1], now=t).state
    # g0: its sample predates `first`, so 5 % measured + 70 % predicted; g1: just its sample.
    assert list(state.true_util) == [75.0, 40.0] and list(state.true_mem) == [4500.0, 3000.0]
    assert list(state.pred_util) == [70.0, 0.0] and list(state.n_jobs) == [1, 0]
    GpuTelemetry.objects.create(gpu=g0, ts=t - dt.timedelta(seconds=5), util_pct=66, mem_used_mb=4200)
    state = services.build_cluster_state([g0, g1], now=t).state
    assert list(state.true_util) == [66.0, 40.0]  # a newer sample already shows the job


def test_a_running_job_stops_soon_after_it_is_cancelled(gpu_node, model_a, user_owner, celery_sends, monkeypatch):
    """The GPU is freed at cancel time, so the job must stop using it: the runtime asks between
    inferences (the CUDA runtimes need a GPU, so one stands in here that runs the same stop loop)."""
    from scheduling import gpu_runtime

    job = make_job(model_a, iterations=1000)
    (p,) = services.place_pending_jobs(policy="horus")
    ran = []

    def gpu_stand_in(data, *, iterations, should_stop, **kwargs):
        def one_inference():
            ran.append(1)
            if len(ran) == 3:  # a user cancels while it runs
                services.cancel_job(actor=user_owner, job=job)
        gpu_runtime.timed_iterations(one_inference, iterations, gpu_runtime.StopCheck(should_stop, every_s=0))
        raise AssertionError("the cancelled job ran to the end")

    monkeypatch.setattr(gpu_runtime, "run_model_on_gpu", gpu_stand_in)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w")
    job.refresh_from_db()
    p.refresh_from_db()
    assert len(ran) == 3 and job.state == "cancelled" and p.released_at is not None
    assert not job.result  # nothing recorded as if it had finished


def test_stop_check_asks_at_most_once_per_interval():
    from scheduling.gpu_runtime import JobStopped, StopCheck, timed_iterations

    asked = []
    check = StopCheck(lambda: asked.append(1) or False, every_s=3600)
    assert len(timed_iterations(lambda: None, 50, check)) == 50 and not asked  # no database read per inference
    with pytest.raises(JobStopped):
        timed_iterations(lambda: None, 50, StopCheck(lambda: True, every_s=0))
    assert len(timed_iterations(lambda: None, 5, StopCheck(None, every_s=0))) == 5


def test_a_running_job_is_stopped_at_its_declared_duration(gpu_node, model_a, use_nvml, celery_sends, monkeypatch):
    """`duration_estimate_s` = 1 with 10,000,000 iterations used to pass the quota and then run for hours.
    The job now fails when it reaches its declared duration. No CUDA runtime here: onnxruntime on the CPU
    stands in for the CUDA inference; the rest (GPU lookup, rebatching, the stop check) is the real runtime."""
    import onnxruntime as ort

    from scheduling import gpu_runtime

    use_nvml(FakeNvml([fake_gpu(), fake_gpu()]))
    job = make_job(model_a, estimate=1.0, iterations=10_000_000)
    (p,) = services.place_pending_jobs(policy="horus")
    ran = []

    def cpu_inference(model, inputs, iterations, device_index, sampler_factory, check, **options):
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        with sampler_factory() as sampler:
            lat = gpu_runtime.timed_iterations(lambda: ran.append(sess.run(None, inputs)), iterations, check)
        return {"runtime": "onnxruntime", "latencies_s": lat, **sampler.result()}

    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", cpu_inference)
    out = tasks.run_job.run(job.pk, p.pk)
    job.refresh_from_db()
    p.refresh_from_db()
    assert out["state"] == "failed" and job.state == "failed" and len(ran) < job.iterations
    assert "reached its declared duration (duration_estimate_s = 1 s" in job.error
    assert "at most 86400 s" in job.error
    assert p.released_at is not None and not job.result


def test_stop_check_enforces_a_deadline_without_asking_the_database():
    from scheduling.gpu_runtime import DurationReached, JobStopped, StopCheck

    asked = []
    check = StopCheck(lambda: asked.append(1) or False, every_s=3600, limit_s=5.0, started=0.0)  # long past
    with pytest.raises(DurationReached) as exc:
        check()
    assert isinstance(exc.value, JobStopped) and exc.value.limit_s == 5.0 and not asked
    StopCheck(None, limit_s=3600.0)()  # not reached: returns


def _left_by_a_dead_worker(model_a):
    """A placed job and a running one on GPU queues, both from before the worker (re)started."""
    placed, running = make_job(model_a), make_job(model_a)
    by_job = {p.job_id: p for p in services.place_pending_jobs(policy="horus")}
    GpuJob.objects.filter(pk=running.pk).update(state="running", started_at=timezone.now())
    return placed, running, by_job


def test_restarted_gpu_worker_fails_its_running_job_and_redispatches_its_placed_one(
        gpu_node, model_a, celery_sends, django_capture_on_commit_callbacks):
    placed, running, by_job = _left_by_a_dead_worker(model_a)
    queues = sorted({p.queue for p in by_job.values()})
    with django_capture_on_commit_callbacks(execute=True):
        out = services.reconcile_restarted_gpu_worker(queues=queues,
                                                      started_before=timezone.now() + dt.timedelta(seconds=1))
    assert out == {"failed": [running.pk], "redispatched": [placed.pk]}
    again = by_job[placed.pk]
    celery_sends.run_job.assert_called_once_with(args=[placed.pk, again.pk], queue=again.queue)
    running.refresh_from_db()
    assert running.state == "failed" and "restarted" in running.error
    assert Placement.objects.get(job=running).released_at is not None


def test_redispatch_after_a_restart_goes_through_the_dispatch_path_on_a_broker_outage(
        gpu_node, model_a, celery_sends, django_capture_on_commit_callbacks):
    """The redispatch is sent after commit like any placement; if the broker refuses it the job goes back
    to pending and its GPU is freed (the next placement pass retries), instead of the error escaping."""
    from kombu.exceptions import OperationalError

    placed, _, by_job = _left_by_a_dead_worker(model_a)
    celery_sends.run_job.side_effect = OperationalError("broker down")
    with django_capture_on_commit_callbacks(execute=True):
        out = services.reconcile_restarted_gpu_worker(queues=[by_job[placed.pk].queue],
                                                      started_before=timezone.now() + dt.timedelta(seconds=1))
    assert out["redispatched"] == [placed.pk]
    placed.refresh_from_db()
    assert placed.state == "pending" and not Placement.objects.filter(job=placed, released_at__isnull=True).exists()
