"""Per-process telemetry: a job's own utilization and memory from NVML's per-process accounting, stored
labelled with their source, and read by the policies as the job's measured load (not its prediction)."""
from __future__ import annotations

import os
from unittest import mock

from scheduling import adapters, gpu_runtime, services, tasks
from scheduling.models import GpuJob
from scheduling.telemetry import GpuSampler, job_measurement

from .fakes import FakeNvml, fake_gpu, make_job


def test_the_sampler_attributes_per_process_figures_to_its_pid_only():
    me, other = os.getpid(), os.getpid() + 1
    nvml = FakeNvml([fake_gpu(util=90)], processes={0: [(me, 35, 2100.0), (other, 55, 6000.0)]})
    with GpuSampler(0, nvml=nvml, pid=me, interval_s=3600) as sampler:
        assert sampler.latest_process() == {"util_pct": 35.0, "mem_mb": 2100.0, "gpu_mem_used_mb": 512.0}
    result = sampler.result()
    assert result["proc_util_mean_pct"] == 35.0 and result["proc_mem_peak_mb"] == 2100.0
    assert result["util_mean_pct"] == 90.0  # the device's figure is kept apart


def test_a_driver_without_per_process_accounting_reports_none():
    class NoAccounting(FakeNvml):
        def nvmlDeviceGetProcessUtilization(self, h, ts):
            raise self.NVMLError("Not Supported")

    with GpuSampler(0, nvml=NoAccounting([fake_gpu()]), pid=os.getpid(), interval_s=3600) as sampler:
        pass
    result = sampler.result()
    assert result["proc_util_mean_pct"] is None and result["proc_samples"] == 0
    assert job_measurement(result) == (result["util_mean_pct"], result.get("mem_used_by_job_mb"), "nvml-device")


def test_job_measurement_prefers_the_process_figures():
    assert job_measurement({"proc_util_mean_pct": 20.0, "proc_mem_peak_mb": 900.0, "util_mean_pct": 95.0,
                            "mem_used_by_job_mb": 5000.0}) == (20.0, 900.0, "nvml-process")


def test_a_running_job_reports_its_own_load_and_policies_read_it(gpu_node, model_a, use_nvml, settings, tmp_path,
                                                                  monkeypatch):
    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path)
    job = make_job(model_a, util=60.0, mem=3000.0, iterations=3)
    with mock.patch.object(tasks.run_job, "apply_async"), mock.patch.object(tasks.place_pending, "delay"):
        (p,) = services.place_pending_jobs(policy="horus")
    nvml = use_nvml(FakeNvml([fake_gpu(), fake_gpu()], processes={p.gpu.index: [(os.getpid(), 12, 1800.0)]}))
    seen = {}

    def runtime_stand_in(model, inputs, iterations, device_index, sampler_factory, check, **options):
        with sampler_factory() as sampler:
            sampler._sample()
            check.every_s = 0
            check()  # the once-a-second stop check: the job's figures are reported here
            live = GpuJob.objects.get(pk=job.pk)
            seen["live"] = (live.live_util_pct, live.live_mem_mb, live.live_sampled_at is not None)
            cluster = services.build_cluster_state([p.gpu], now=live.started_at)
            seen["meas"] = cluster.state.view().meas_utils_on(0)
            seen["pred"] = cluster.state.view().pred_utils_on(0)
        return {"runtime": "onnxruntime", "latencies_s": [0.01], **sampler.result()}

    monkeypatch.setitem(gpu_runtime.RUNTIMES, "onnxruntime", runtime_stand_in)
    with mock.patch.object(tasks.place_pending, "delay"):
        services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=nvml)
    assert seen["live"] == (12.0, 1800.0, True)
    assert seen["meas"] == (12.0,) and seen["pred"] == (60.0,)  # measured, not the prediction
    job.refresh_from_db()
    assert job.state == "finished", job.error
    assert (job.measured_util_pct, job.measured_mem_mb, job.measured_source) == (12.0, 1800.0, "nvml-process")


def test_an_unmeasured_placed_job_counts_at_its_prediction(gpu_node, model_a):
    job = make_job(model_a, util=40.0, mem=2500.0)
    with mock.patch.object(tasks.run_job, "apply_async"):
        (p,) = services.place_pending_jobs(policy="horus")
    state = services.build_cluster_state([p.gpu], now=p.placed_at).state
    assert state.view().meas_utils_on(0) == (40.0,)
    GpuJob.objects.filter(pk=job.pk).update(state="running", live_util_pct=7.0, live_mem_mb=900.0)
    state = services.build_cluster_state([p.gpu], now=p.placed_at).state
    assert state.view().meas_utils_on(0) == (7.0,) and list(state.true_mem) == [900.0]
    assert isinstance(adapters.job_view(GpuJob.objects.get(pk=job.pk)).pred_util_pct, float)
