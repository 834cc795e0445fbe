"""Multi-GPU jobs (gangs): N GPUs of one node placed as one unit or not at all, charged N x their time,
run data-parallel on every GPU with a worker slot on each."""
from __future__ import annotations

from unittest import mock

import pytest

from core.exceptions import QuotaExceeded, ServiceError
from scheduling import gpu_runtime, services, tasks
from scheduling.gpu_isolation import GpuSlots, NoFreeSlot
from scheduling.models import GpuJob, Placement

from .fakes import FakeNvml, fake_gpu, make_job, register_gpu_node


@pytest.fixture(autouse=True)
def _no_celery():
    with mock.patch.object(tasks.place_pending, "delay"), mock.patch.object(tasks.run_job, "apply_async") as run:
        yield run


def test_a_two_gpu_job_is_placed_on_two_gpus_of_one_node_as_one_placement(gpu_node, model_a, _no_celery,
                                                                          django_capture_on_commit_callbacks):
    job = make_job(model_a, num_gpus=2, util=30, mem=2000)
    with django_capture_on_commit_callbacks(execute=True):
        (p,) = services.place_pending_jobs(policy="horus")
    g0, g1 = gpu_node.gpus.order_by("index")
    assert p.job == job and p.gpu == g0 and p.gang_gpu_ids == [g0.pk, g1.pk]
    _no_celery.assert_called_once_with(args=[job.pk, p.pk], queue=g0.queue)  # the lead GPU's worker runs it
    state = services.build_cluster_state([g0, g1], now=p.placed_at).state
    assert list(state.n_jobs) == [1, 1] and list(state.pred_util) == [30.0, 30.0]


def test_a_gang_is_never_split_across_nodes_and_waits_for_room(model_a):
    a = register_gpu_node("node-a")
    b = register_gpu_node("node-b")
    from scheduling.models import GPU

    for node in (a, b):  # the first GPU of each node is full (3 jobs: Horus's limit)
        busy = node.gpus.order_by("index").first()
        others = list(GPU.objects.exclude(pk=busy.pk))
        for g in others:
            services.set_gpu_drained(actor=None, gpu=g, drained=True)
        for _ in range(3):
            make_job(model_a, util=10, mem=500)
        assert len(services.place_pending_jobs(policy="horus")) == 3
        for g in others:
            services.set_gpu_drained(actor=None, gpu=g, drained=False)
    gang = make_job(model_a, num_gpus=2)
    assert services.place_pending_jobs(policy="horus") == []  # two free GPUs exist, but on two nodes
    gang.refresh_from_db()
    assert gang.state == "pending"
    too_big = make_job(model_a, num_gpus=3)
    register_gpu_node("node-c")  # two GPUs: room for the 2-GPU gang, not the 3-GPU one
    placed = services.place_pending_jobs(policy="horus")
    assert [p.job for p in placed] == [gang] and len(placed[0].gang_gpu_ids) == 2
    assert set(placed[0].gang_gpu_ids) == set(GPU.objects.filter(node__name="node-c").values_list("pk", flat=True))
    too_big.refresh_from_db()
    assert too_big.state == "pending"


def test_a_gang_reserves_and_is_charged_gpu_time_for_every_gpu(gpu_node, model_a, user_owner, team_a, predictor):
    team_a.quota.gpu_hours_per_month = 1.0
    team_a.quota.save()
    with pytest.raises(QuotaExceeded):  # 2 GPUs x 40 min = 1.33 GPU-hours
        services.submit_job(actor=user_owner, model=model_a, batch_size=4, duration_estimate_s=2400, num_gpus=2)
    job = services.submit_job(actor=user_owner, model=model_a, batch_size=4, duration_estimate_s=1500, num_gpus=2)
    assert job.num_gpus == 2
    (p,) = services.place_pending_jobs(policy="horus")
    services.cancel_job(actor=user_owner, job=job)
    p.refresh_from_db()
    from core.models import UsageCharge

    charge = UsageCharge.objects.get(idempotency_key=f"gpu_seconds:placement:{p.pk}")
    held = (p.released_at - p.placed_at).total_seconds()
    assert charge.amount == pytest.approx(2 * held)


@pytest.mark.parametrize("num_gpus", [0, 9, "two"])
def test_num_gpus_is_bounded(api_owner, model_a, predictor, num_gpus):
    resp = api_owner.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8, "num_gpus": num_gpus},
                          format="json")
    assert resp.status_code == 400 and "num_gpus" in resp.json()["errors"]
    with pytest.raises(ServiceError):
        services.submit_job(actor=model_a.created_by, model=model_a, batch_size=1, num_gpus=9)


def test_the_api_submits_a_gang(api_owner, model_a, predictor, gpu_node):
    resp = api_owner.post("/api/gpu-jobs/", {"model": model_a.pk, "batch_size": 8, "num_gpus": 2,
                                             "duration_estimate_s": 60}, format="json")
    assert resp.status_code == 201, resp.json()
    assert resp.json()["num_gpus"] == 2
    services.place_pending_jobs(policy="horus")
    detail = api_owner.get(f"/api/gpu-jobs/{resp.json()['id']}/").json()
    assert len(detail["placement"]["gang_gpu_ids"]) == 2


def test_a_gang_runs_a_replica_on_every_gpu_holding_a_slot_on_each(gpu_node, model_a, use_nvml, settings,
                                                                    tmp_path, monkeypatch):
    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path)
    nvml = use_nvml(FakeNvml([fake_gpu(), fake_gpu()]))
    job = make_job(model_a, num_gpus=2, iterations=2)
    (p,) = services.place_pending_jobs(policy="horus")
    ran = []

    def replica(model, inputs, iterations, device_index, sampler_factory, check, **options):
        with pytest.raises(NoFreeSlot):  # this job holds a slot on the GPU while it runs
            GpuSlots(tmp_path, device_index, slots=1).acquire()
        with sampler_factory() as sampler:
            gpu_runtime.timed_iterations(lambda: ran.append(device_index), iterations, check)
        return {"runtime": "onnxruntime", "latencies_s": [0.01 * (device_index + 1)] * iterations,
                **sampler.result()}

    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", replica)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=nvml)
    job.refresh_from_db()
    assert job.state == "finished", job.error
    assert sorted(ran) == [0, 0, 1, 1]
    assert job.result["gpu_indices"] == [0, 1] and len(job.result["replicas"]) == 2
    assert job.result["latency_ms"] == pytest.approx(20.0)  # the slowest replica
    assert job.result["isolation"]["gpu_indices"] == [0, 1]
    assert not Placement.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_failing_replica_stops_the_gang_and_fails_the_job(gpu_node, model_a, use_nvml, settings, tmp_path,
                                                             monkeypatch):
    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path)
    nvml = use_nvml(FakeNvml([fake_gpu(), fake_gpu()]))
    job = make_job(model_a, num_gpus=2, iterations=1_000_000)
    (p,) = services.place_pending_jobs(policy="horus")

    def replica(model, inputs, iterations, device_index, sampler_factory, check, **options):
        if device_index == 1:
            raise gpu_runtime.GpuRuntimeError("replica on GPU 1 hit an illegal memory access")
        check.every_s = 0
        gpu_runtime.timed_iterations(lambda: None, iterations, check)  # stops once the other failed
        raise AssertionError("the lead ran to the end")

    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", replica)
    monkeypatch.setitem(gpu_runtime.RUNTIMES, "tvm", replica)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=nvml)
    job.refresh_from_db()
    assert job.state == "failed" and "replica on GPU 1 hit an illegal memory access" in job.error
    assert GpuJob.objects.get(pk=job.pk).num_gpus == 2
