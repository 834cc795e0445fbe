"""A GPU job's model runs in a short-lived child of the worker (scheduling.job_process), never in the worker:
a fresh interpreter with an allow-listed environment plus the job's isolation env, limits CUDA tolerates,
the sandbox account's uid, a wall-clock kill, JSON back. These tests run the REAL child; onnxruntime's CPU
provider stands in for CUDA (tests/scheduling/job_runtimes.py, named in SCHEDULING_JOB_RUNTIMES)."""
from __future__ import annotations

import datetime as dt
import os
import time
from unittest import mock

import psutil
import pytest
from django.utils import timezone

from common import privileges
from scheduling import job_process, services, tasks
from scheduling.gpu_runtime import GpuRuntimeError, JobStopped
from scheduling.models import GpuJob, Placement
from tests.reliability.test_upload_sandbox import _memory_growth

from .fakes import FakeNvml, fake_gpu, make_job, register_gpu_node

RUNTIMES = "tests.scheduling.job_runtimes"


@pytest.fixture
def job_in_this_process():
    """Overrides conftest's seam: the job runs in the real child."""


@pytest.fixture(autouse=True)
def _setup(settings, tmp_path):
    settings.SCHEDULING_GPU_SLOTS_DIR = str(tmp_path / "slots")
    settings.SCHEDULING_JOB_KILL_GRACE_S = 1.0
    with mock.patch.object(tasks.place_pending, "delay"), mock.patch.object(tasks.run_job, "apply_async"):
        yield


class ChildrenNvml(FakeNvml):
    """Per-process accounting that reports the test process (the worker) and, differently, its children."""

    def _procs(self):
        me = os.getpid()
        return [(me, 99, 9999.0)] + [(c.pid, 12, 345.0) for c in psutil.Process(me).children(recursive=True)]

    def nvmlDeviceGetProcessUtilization(self, h, last_seen_us):
        self.processes = {h: self._procs()}
        return super().nvmlDeviceGetProcessUtilization(h, last_seen_us)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self.processes = {h: self._procs()}
        return super().nvmlDeviceGetComputeRunningProcesses(h)


def _placed_on_gpu1(model, runtime_fn: str, settings, **job):
    settings.SCHEDULING_JOB_RUNTIMES = {"onnxruntime": f"{RUNTIMES}:{runtime_fn}"}
    gpu = register_gpu_node().gpus.get(index=1)
    j = make_job(model, state="placed", runtime="onnxruntime", **job)
    p = Placement.objects.create(job=j, gpu=gpu, policy="horus", queue=gpu.queue,
                                 placed_at=timezone.now() - dt.timedelta(seconds=1))
    return j, p


def _children() -> set[int]:
    """This process's descendants: other tests' processes (workers, live servers) may be among them, so a
    test compares what is left after a job with what was there before it."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_job_runs_in_a_child_that_sees_only_its_gpu_renumbered_and_no_secrets(model_a, settings, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "worker-secret")
    before = _children()
    job, p = _placed_on_gpu1(model_a, "onnxruntime_on_cpu", settings, batch_size=4096, iterations=1, estimate=600,
                             mem=2000.0)
    with _memory_growth() as grown:
        services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w",
                             nvml=ChildrenNvml([fake_gpu(), fake_gpu()]))
    job.refresh_from_db()
    assert job.state == GpuJob.State.FINISHED, job.error
    child = job.result["child"]
    assert child["pid"] != os.getpid()
    # its GPU only (NVML index 1), opened as CUDA device 0; no database, broker or secret
    assert child["env"] == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert child["device_index"] == 0 and child["options"] == {"mem_limit_mb": 2512.0}
    assert job.result["gpu_index"] == 1 and job.result["batch_size"] == 4096
    limits = child["limits"]
    assert limits["as"][0] == -1  # no address-space cap: the CUDA driver maps huge virtual ranges
    assert limits["cpu"][0] == 2 * 601 and limits["nofile"][0] == 4096 and limits["core"] == [0, 0]
    # the worker sampled the child's pid (12 %, 345 MB), not its own (99 %, 9999 MB)
    assert (job.live_util_pct, job.live_mem_mb) == (12.0, 345.0)
    # small_cnn's inputs at batch 4096 are ~150 MB: made in the child, not in the worker
    assert grown["mb"] < 50, f"the worker grew by {grown['mb']:.0f} MB"
    assert _children() <= before


def test_the_child_runs_as_the_sandbox_account(model_a, settings):
    account = privileges.sandbox_account()
    if account is None:
        pytest.skip("this process may not switch users, or the sandbox account cannot read this Python "
                    "installation (e.g. under a 0700 /root): no privilege drop to check")
    job, p = _placed_on_gpu1(model_a, "onnxruntime_on_cpu", settings, batch_size=1, iterations=1)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=FakeNvml([fake_gpu(), fake_gpu()]))
    job.refresh_from_db()
    assert job.state == GpuJob.State.FINISHED, job.error
    assert job.result["child"]["uid"] == account[0] != os.getuid()


def test_a_job_killed_at_its_wall_clock_cap_fails_with_the_reason(model_a, settings):
    before = _children()
    job, p = _placed_on_gpu1(model_a, "never_returns", settings, batch_size=1, iterations=10, estimate=1.0)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=FakeNvml([fake_gpu(), fake_gpu()]))
    job.refresh_from_db()
    p.refresh_from_db()
    assert job.state == GpuJob.State.FAILED and not job.result
    assert "killed at its wall-clock cap of 2 s (its declared duration of 1 s" in job.error, job.error
    assert p.released_at is not None
    assert _children() <= before  # its process group is gone


class ChildNearItsShareNvml(ChildrenNvml):
    """The job child holds 2400 MB of GPU memory: 96 % of a 2512 MB share."""

    def _procs(self):
        return [(c.pid, 12, 2400.0) for c in psutil.Process(os.getpid()).children(recursive=True)]


def test_a_job_whose_runtime_fails_while_it_holds_its_gpu_memory_share_is_placed_again(model_a, settings):
    """The runtime's allocation failed, and the worker's own sample of the child says why: it held 96 % of
    its 2512 MB share. Re-placed (asking 1.5 x the share it hit), not failed."""
    job, p = _placed_on_gpu1(model_a, "out_of_gpu_memory", settings, batch_size=1, mem=2000.0, estimate=600)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w",
                         nvml=ChildNearItsShareNvml([fake_gpu(), fake_gpu()]))
    job.refresh_from_db()
    assert job.state == GpuJob.State.PENDING and job.error == ""  # re-placed, not failed
    (entry,) = job.replacements
    assert entry["reason"] == "oom" and entry["mem_share_mb"] == 2512.0 and entry["seen_by"] == "runtime"
    assert entry["measured_by"] == "nvml-process" and entry["measured_mem_mb"] == 2400.0
    assert entry["error"].startswith("the job's process reported running out of memory"), entry
    assert job.predicted_mem_mb == pytest.approx(2512.0 * 1.5)


def test_the_same_failure_with_memory_to_spare_fails_the_job(model_a, settings):
    """The same words from a child the worker saw holding 345 MB of its 2512 MB share: the job fails with
    them; no re-placement."""
    job, p = _placed_on_gpu1(model_a, "out_of_gpu_memory", settings, batch_size=1, mem=2000.0, estimate=600)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=ChildrenNvml([fake_gpu(), fake_gpu()]))
    job.refresh_from_db()
    assert job.state == GpuJob.State.FAILED and job.replacements == []
    assert "CUDA failure 2: out of memory" in job.error


def test_a_crashing_child_fails_the_job_and_not_the_worker(model_a, settings):
    job, p = _placed_on_gpu1(model_a, "crashes", settings, batch_size=1)
    services.execute_job(job_id=job.pk, placement_id=p.pk, worker="w", nvml=FakeNvml([fake_gpu(), fake_gpu()]))
    job.refresh_from_db()
    p.refresh_from_db()
    assert job.state == GpuJob.State.FAILED and p.released_at is not None
    assert job.error == "the job's process crashed (SIGSEGV) while running the job's model"


def test_a_cancel_request_kills_the_child(small_cnn_bytes):
    limits = job_process.JobProcessLimits(grace_s=600.0, runtimes={"onnxruntime": f"{RUNTIMES}:never_returns"})
    asked = []
    before = _children()  # other tests' processes (workers, servers) may still be this process's children
    with pytest.raises(JobStopped, match="cancelled"):
        job_process.run_job_in_child(small_cnn_bytes, device_indices=[0], batch_size=1, iterations=1,
                                     runtime="onnxruntime", max_seconds=600.0, mem_limit_mb=None,
                                     predicted_util_pct=None, limits=limits, nvml=FakeNvml([fake_gpu()]),
                                     should_stop=lambda: asked.append(1) or True)
    assert asked and _children() <= before


def test_a_process_the_job_started_is_killed_with_it(small_cnn_bytes):
    """Attack: the run starts a process of its own to outlive its job. The job's whole process group goes."""
    limits = job_process.JobProcessLimits(grace_s=600.0,
                                          runtimes={"onnxruntime": f"{RUNTIMES}:leaves_a_grandchild"})
    seen: set[int] = set()
    before = _children()  # other tests' processes (workers, servers) may still be this process's children

    def cancel_once_both_run() -> bool:
        new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        seen.update(p.pid for p in new)
        return any(p.name() == "sleep" for p in new)

    with pytest.raises(JobStopped):
        job_process.run_job_in_child(small_cnn_bytes, device_indices=[0], batch_size=1, iterations=1,
                                     runtime="onnxruntime", max_seconds=600.0, mem_limit_mb=None,
                                     predicted_util_pct=None, limits=limits, nvml=FakeNvml([fake_gpu()]),
                                     should_stop=cancel_once_both_run)
    assert len(seen) >= 2
    for pid in seen:  # a SIGKILL is delivered when the process is next scheduled: give it a moment
        deadline = time.monotonic() + 10
        while True:
            try:
                status = psutil.Process(pid).status()
            except psutil.NoSuchProcess:
                break
            if status == psutil.STATUS_ZOMBIE or time.monotonic() > deadline:
                assert status == psutil.STATUS_ZOMBIE  # dead, waiting for init to reap it
                break
            time.sleep(0.05)


def test_a_job_on_a_gpu_the_node_does_not_have_starts_no_child(small_cnn_bytes):
    from scheduling.telemetry import NoGpuError

    with pytest.raises(NoGpuError, match="no NVIDIA GPU #3"):
        job_process.run_job_in_child(small_cnn_bytes, device_indices=[3], batch_size=1, iterations=1,
                                     runtime="onnxruntime", max_seconds=60.0, mem_limit_mb=None,
                                     predicted_util_pct=None, limits=job_process.JobProcessLimits(),
                                     nvml=FakeNvml([fake_gpu()]))


def test_a_runtime_name_that_is_not_module_function_is_refused_in_the_child(small_cnn_bytes):
    limits = job_process.JobProcessLimits(runtimes={"onnxruntime": "os.system"})
    with pytest.raises(GpuRuntimeError, match="is not 'module:function'"):
        job_process.run_job_in_child(small_cnn_bytes, device_indices=[0], batch_size=1, iterations=1,
                                     runtime="onnxruntime", max_seconds=60.0, mem_limit_mb=None,
                                     predicted_util_pct=None, limits=limits, nvml=FakeNvml([fake_gpu()]))
