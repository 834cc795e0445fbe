"""Re-placing running jobs from what their own processes measure (fake per-process NVML): a job over its
memory share is stopped and placed again with its measured memory, a GPU pushed past the interference
bound by a wrong prediction loses the job that caused it, and finished jobs' measured figures become
profiles labelled measured that the predictor trains on."""
from __future__ import annotations

import datetime as dt
import os
from unittest import mock

import pytest
from django.utils import timezone

from scheduling import gpu_runtime, services, tasks
from scheduling.models import GpuJob, GpuProfile, Placement

from .fakes import FakeNvml, fake_gpu, make_job


@pytest.fixture(autouse=True)
def _no_celery(settings, tmp_path):
    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path)
    with mock.patch.object(tasks.place_pending, "delay"), mock.patch.object(tasks.run_job, "apply_async"):
        yield


def _running_stand_in(iterations_seen: list, during=None):
    """A runtime that samples this process's per-process NVML figures and runs until told to stop."""

    def runtime(model, inputs, iterations, device_index, sampler_factory, check, **options):
        with sampler_factory() as sampler:
            check.every_s = 0
            for k in range(iterations):
                sampler._sample()
                if during is not None and k == 1:
                    during()
                check()  # reports the figures, then asks whether to stop
                iterations_seen.append(k)
        return {"runtime": "onnxruntime", "latencies_s": [0.01] * iterations, **sampler.result()}

    return runtime


def _place(job, gpu, minutes_ago: float = 5.0) -> Placement:
    job.state = "placed"
    job.save(update_fields=["state"])
    return Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue,
                                    placed_at=timezone.now() - dt.timedelta(minutes=minutes_ago))


def test_a_job_over_its_memory_share_is_stopped_and_placed_again_with_its_measured_memory(
        gpu_node, model_a, use_nvml, monkeypatch):
    gpu = gpu_node.gpus.get(index=0)
    job = make_job(model_a, util=30.0, mem=2000.0, iterations=1000)  # share: 2000 + 512 MB headroom
    p = _place(job, gpu)
    nvml = use_nvml(FakeNvml([fake_gpu(), fake_gpu()], processes={0: [(os.getpid(), 35, 4100.0)]}))
    seen: list = []
    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", _running_stand_in(seen))
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=nvml)
    job.refresh_from_db()
    p.refresh_from_db()
    assert len(seen) < 5  # stopped at its first report, not run to its 1000 iterations
    assert job.state == GpuJob.State.PENDING and job.error == "" and p.released_at is not None
    assert job.predicted_mem_mb == 4100.0  # what it was measured using
    (entry,) = job.replacements
    assert entry["reason"] == "oom" and entry["measured_mem_mb"] == 4100.0 and entry["mem_share_mb"] == 2512.0
    assert entry["seen_by"] == "nvml-process" and entry["from_gpu"] == gpu.pk
    assert entry["predicted_mem_mb_before"] == 2000.0 and entry["predicted_mem_mb_after"] == 4100.0
    (again,) = services.place_pending_jobs(policy="horus")  # the next pass places it with its new memory
    assert again.job_id == job.pk


def test_an_out_of_memory_error_from_the_runtime_is_a_replacement_too_until_the_limit(
        gpu_node, model_a, use_nvml, monkeypatch):
    gpu = gpu_node.gpus.get(index=0)
    job = make_job(model_a, util=30.0, mem=2000.0)
    nvml = use_nvml(FakeNvml([fake_gpu(), fake_gpu()]))

    def fills_its_share_then_fails(model, inputs, iterations, device_index, sampler_factory, check,
                                   mem_limit_mb=None, **options):
        nvml.processes = {0: [(os.getpid(), 10, 0.95 * mem_limit_mb)]}  # what the worker samples of it
        with sampler_factory() as sampler:
            check.every_s = 0
            sampler._sample()
            check()
        raise gpu_runtime.GpuRuntimeError("CUDA failure 2: out of memory")

    def oom(*args, **kwargs):
        raise gpu_runtime.GpuRuntimeError("CUDA failure 2: out of memory")

    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", fills_its_share_then_fails)
    monkeypatch.setitem(gpu_runtime.RUNTIMES, "tvm", oom)
    for k in range(services.MAX_REPLACEMENTS):
        p = _place(job, gpu)
        services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=nvml)
        job.refresh_from_db()
        assert job.state == GpuJob.State.PENDING and len(job.replacements) == k + 1
        last = job.replacements[-1]
        assert last["seen_by"] == "runtime" and "out of memory" in last["error"]
        assert last["measured_by"] == "nvml-process"
        assert last["measured_mem_mb"] == pytest.approx(0.95 * last["mem_share_mb"], abs=0.2)
    assert job.predicted_mem_mb > 2000.0 * 1.5 ** 2  # each time it asks for more than the share it hit
    p = _place(job, gpu)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=nvml)
    job.refresh_from_db()
    assert job.state == GpuJob.State.FAILED and f"re-placed {services.MAX_REPLACEMENTS} times" in job.error


@pytest.mark.parametrize("device_used_mb,replaced", [(15900, True), (8000, False)])
def test_a_runtime_failure_on_a_full_gpu_is_an_out_of_memory_and_not_otherwise(
        gpu_node, model_a, use_nvml, monkeypatch, device_used_mb, replaced):
    """The job's process held little (300 MB of a 2512 MB share); the GPU's memory in use (all processes,
    16384 MB) at failure decides: 97 % full is an out-of-memory (another job took it), half full is not."""
    gpu = gpu_node.gpus.get(index=0)
    job = make_job(model_a, util=30.0, mem=2000.0)
    nvml = use_nvml(FakeNvml([fake_gpu(used_mb=device_used_mb), fake_gpu()], processes={0: [(os.getpid(), 10, 300.0)]}))

    def fails_after_a_sample(model, inputs, iterations, device_index, sampler_factory, check, **options):
        with sampler_factory() as sampler:
            check.every_s = 0
            sampler._sample()
            check()
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA failure 2: out of memory")

    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", fails_after_a_sample)
    p = _place(job, gpu)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=nvml)
    job.refresh_from_db()
    if replaced:
        assert job.state == GpuJob.State.PENDING
        (entry,) = job.replacements
        assert entry["measured_by"] == "nvml-device" and entry["gpu_mem_used_mb"] == 15900.0
    else:
        assert job.state == GpuJob.State.FAILED and job.replacements == [] and "out of memory" in job.error


def _running(model, gpu, *, pred: float, live: float) -> GpuJob:
    job = make_job(model, util=pred, mem=1000.0, state="running", live_util_pct=live, live_mem_mb=900.0,
                   started_at=timezone.now() - dt.timedelta(minutes=5))
    Placement.objects.create(job=job, gpu=gpu, policy="horus", queue=gpu.queue,
                             placed_at=timezone.now() - dt.timedelta(minutes=5))
    return job


def test_a_gpu_pushed_over_the_bound_by_a_wrong_prediction_restarts_its_cause_elsewhere(
        gpu_node, model_a, use_nvml, monkeypatch):
    g0, g1 = gpu_node.gpus.order_by("index")
    _running(model_a, g0, pred=30.0, live=30.0)
    small = _running(model_a, g0, pred=30.0, live=20.0)
    heavy = make_job(model_a, util=30.0, mem=1000.0, iterations=1000)  # predicted 30 %, measured 70 % below
    p = _place(heavy, g0)
    nvml = use_nvml(FakeNvml([fake_gpu(), fake_gpu()], processes={0: [(os.getpid(), 70, 900.0)]}))
    asked: list = []
    seen: list = []
    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", _running_stand_in(
        seen, during=lambda: asked.extend(services.request_interference_replacements())))  # the heartbeat's call
    services.execute_job(job_id=heavy.pk, placement_id=p.pk, worker="w", nvml=nvml)
    # GPU 0: predicted 90 % (within 105 %), measured 70 + 30 + 20 = 120 %: the rule moves the job measured
    # furthest over its prediction (70 vs 30), not the smallest job whose departure would end it (20 %)
    assert asked == [heavy.pk] and len(seen) < 10
    small.refresh_from_db()
    heavy.refresh_from_db()
    assert heavy.state == GpuJob.State.PENDING and small.state == GpuJob.State.RUNNING and not small.replacements
    (entry,) = heavy.replacements
    assert entry["status"] == "done" and entry["reason"] == "interference" and entry["rule"] == "horus_migrate"
    assert entry["chosen_as"].startswith("cause")
    assert entry["gpu_measured_util_pct"] == 120.0 and entry["gpu_predicted_util_pct"] == 90.0
    assert entry["job_measured_util_pct"] == 70.0 and entry["job_predicted_util_pct"] == 30.0
    assert entry["bound_pct"] == 105.0 and entry["to_gpu"] == g1.pk and entry["from_gpu"] == g0.pk
    assert heavy.predicted_util_pct == 70.0  # its measured load is its prediction from now on
    assert services.request_interference_replacements() == []  # 50 % now: nothing more to move


def test_a_gpu_the_policy_knowingly_filled_past_the_bound_is_left_alone(gpu_node, model_a):
    g0, _ = gpu_node.gpus.order_by("index")
    for live in (70.0, 30.0, 20.0):
        _running(model_a, g0, pred=40.0, live=live)  # predicted 120 %: no prediction was wrong
    assert services.request_interference_replacements() == []
    assert not any(j.replacements for j in GpuJob.objects.all())


def test_a_finished_jobs_own_figures_are_stored_as_a_measured_profile_the_predictor_trains_on(
        gpu_node, model_a, use_nvml, monkeypatch, predictor):
    gpu = gpu_node.gpus.get(index=1)
    job = make_job(model_a, util=60.0, mem=3000.0, iterations=3, batch_size=8)
    p = _place(job, gpu)
    nvml = use_nvml(FakeNvml([fake_gpu(), fake_gpu()], processes={1: [(os.getpid(), 12, 1800.0)]}))
    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", _running_stand_in([]))
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=nvml)
    job.refresh_from_db()
    assert job.state == "finished", job.error
    row = GpuProfile.objects.get(source=services.MEASURED_JOB_SOURCE)
    assert (row.util_pct, row.peak_mem_mb, row.batch_size, row.dl_model_id) == (12.0, 1800.0, 8, model_a.pk)
    assert row.meta["job"] == job.pk and row.meta["predicted_util_pct"] == 60.0 and not row.is_synthetic
    records = services.training_records()
    assert any(r.source == services.MEASURED_JOB_SOURCE and r.gpu_util_pct == 12.0 for r in records)
    pv = services.train_predictor(actor=None, k_folds=2, xgb_params={"n_estimators": 5})
    assert services.MEASURED_JOB_SOURCE in pv.sources
