"""What keeps co-located jobs apart: the job process's environment, the runtime's memory cap, and the
worker's per-GPU slots (at most 3 jobs on a GPU, whatever reaches its queue)."""
from __future__ import annotations

import multiprocessing

import pytest

from scheduling.gpu_isolation import (
    GpuSlots,
    NoFreeSlot,
    isolation_env,
    job_memory_limit_mb,
    mps_pipe_directory,
    ort_cuda_options,
)

from .fakes import FakeNvml, fake_gpu, make_job


def test_env_exposes_only_the_jobs_gpus_and_without_mps_sets_no_mps_limits():
    env = isolation_env([2], predicted_util_pct=35.4, mem_limit_mb=4096, mps_pipe_dir=None)
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2"}


def test_env_with_mps_partitions_sms_and_pins_memory_per_visible_device(tmp_path):
    (tmp_path / "control").touch()
    pipe = mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    assert pipe == str(tmp_path)
    env = isolation_env([1, 3], predicted_util_pct=35.4, mem_limit_mb=4096.7, mps_pipe_dir=pipe)
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "35"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=4096M"  # ordinals after CUDA_VISIBLE_DEVICES
    assert isolation_env([0], predicted_util_pct=0.2, mem_limit_mb=None, mps_pipe_dir=pipe)[
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"
    assert isolation_env([0], predicted_util_pct=180, mem_limit_mb=None, mps_pipe_dir=pipe)[
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"


def test_no_mps_daemon_means_no_pipe_directory(tmp_path):
    assert mps_pipe_directory({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}) is None


@pytest.mark.parametrize("gpus", [[], [-1]])
def test_env_needs_real_gpu_indices(gpus):
    with pytest.raises(ValueError):
        isolation_env(gpus, predicted_util_pct=10, mem_limit_mb=None, mps_pipe_dir=None)


def test_memory_cap_is_the_prediction_with_headroom_within_the_gpu():
    assert job_memory_limit_mb(4000, 16384) == 5000  # +25 %
    assert job_memory_limit_mb(1000, 16384) == 1512  # at least +512 MB
    assert job_memory_limit_mb(15000, 16384) == 16384
    assert job_memory_limit_mb(None, 16384) is None
    opts = ort_cuda_options(1, 1512)
    assert opts == {"device_id": 1, "gpu_mem_limit": 1512 * 1024 * 1024, "arena_extend_strategy": "kSameAsRequested"}
    assert ort_cuda_options(0, None) == {"device_id": 0}


def test_slots_allow_three_jobs_per_gpu_and_free_on_release(tmp_path):
    held = [GpuSlots(tmp_path, 0) for _ in range(3)]
    assert [s.acquire() for s in held] == [0, 1, 2]
    with pytest.raises(NoFreeSlot, match="all 3 job slots of GPU 0"):
        GpuSlots(tmp_path, 0).acquire()
    with GpuSlots(tmp_path, 1) as other_gpu:  # another GPU has its own slots
        assert other_gpu.slot == 0
    held[1].release()
    assert GpuSlots(tmp_path, 0).acquire() == 1


def _hold_slot(root, ready, done):
    slots = GpuSlots(root, 0, slots=1)
    slots.acquire()
    ready.set()
    done.wait(30)


def test_a_slot_held_by_another_process_is_taken_and_freed_when_it_dies(tmp_path):
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_slot, args=(str(tmp_path), ready, done))
    child.start()
    try:
        assert ready.wait(30)
        with pytest.raises(NoFreeSlot):
            GpuSlots(tmp_path, 0, slots=1).acquire()
    finally:
        child.kill()
        child.join(30)
    assert GpuSlots(tmp_path, 0, slots=1).acquire() == 0  # the kernel dropped the dead process's lock


def test_a_job_reaching_a_full_gpu_goes_back_to_pending(gpu_node, model_a, use_nvml, settings, tmp_path):
    from unittest import mock

    from scheduling import services, tasks

    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path)
    use_nvml(FakeNvml([fake_gpu(), fake_gpu()]))
    job = make_job(model_a)
    with mock.patch.object(tasks.run_job, "apply_async"), mock.patch.object(tasks.place_pending, "delay"):
        (p,) = services.place_pending_jobs(policy="horus")
        busy = [GpuSlots(tmp_path, p.gpu.index) for _ in range(3)]
        for s in busy:
            s.acquire()
        assert services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w") is None
    job.refresh_from_db()
    p.refresh_from_db()
    assert job.state == "pending" and p.released_at is not None


def test_a_run_records_its_slot_and_the_memory_cap_given_to_onnxruntime(gpu_node, model_a, use_nvml, settings,
                                                                         tmp_path, monkeypatch):
    from unittest import mock

    from scheduling import gpu_runtime, services, tasks

    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path)
    use_nvml(FakeNvml([fake_gpu(), fake_gpu()]))
    job = make_job(model_a, mem=2000.0, iterations=2)
    seen = {}

    def capped_stand_in(model, inputs, iterations, device_index, sampler_factory, check, *, mem_limit_mb=None):
        seen["mem_limit_mb"] = mem_limit_mb
        with pytest.raises(NoFreeSlot):  # this job holds GPU's only slot while it runs
            GpuSlots(tmp_path, device_index, slots=1).acquire()
        with sampler_factory() as sampler:
            pass
        return {"runtime": "onnxruntime", "latencies_s": [0.01, 0.01], **sampler.result()}

    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", capped_stand_in)
    with mock.patch.object(tasks.run_job, "apply_async"), mock.patch.object(tasks.place_pending, "delay"):
        (p,) = services.place_pending_jobs(policy="horus")
        services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w")
    job.refresh_from_db()
    assert job.state == "finished", job.error
    assert seen["mem_limit_mb"] == 2512.0
    assert job.result["isolation"] == {"gpu_slot": 0, "gpu_slots": 3, "gpu_mem_limit_mb": 2512.0, "gpu_indices": [0]}
    assert GpuSlots(tmp_path, p.gpu.index, slots=1).acquire() == 0  # released after the run
