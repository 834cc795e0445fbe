"""Test doubles and builders for the scheduling tests (a fake pynvml, registered GPU nodes, jobs with
given predictions). Plain functions: tests import them from here, fixtures in conftest.py use them."""
from __future__ import annotations

from types import SimpleNamespace

MB = 1024 * 1024


class FakeNVMLError(Exception):
    pass


class FakeNvml:
    """Just enough of pynvml: per-GPU dicts {name, total_mb, used_mb, util, power_w, temp, energy_mj}."""

    NVML_TEMPERATURE_GPU = 0
    NVMLError = FakeNVMLError

    def __init__(self, gpus=None, *, init_error: str | None = None, processes=None):
        self.gpus = list(gpus or [])
        self.init_error = init_error
        self.calls = 0
        #: per GPU index, [(pid, sm util %, memory MB)] that per-process accounting reports (none by default)
        self.processes = dict(processes or {})
        self.clock_us = 1_000_000

    def nvmlDeviceGetProcessUtilization(self, h, last_seen_us):
        self.clock_us += 1000
        return [SimpleNamespace(pid=pid, timeStamp=self.clock_us, smUtil=util, memUtil=0, encUtil=0, decUtil=0)
                for pid, util, _ in self.processes.get(h, [])]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=int(mem * MB)) for pid, _, mem in self.processes.get(h, [])]

    def nvmlInit(self):
        self.calls += 1
        if self.init_error:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.gpus[h]["name"]

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-fake-{h}"

    def nvmlDeviceGetMemoryInfo(self, h):
        g = self.gpus[h]
        return SimpleNamespace(total=g["total_mb"] * MB, used=g["used_mb"] * MB,
                               free=(g["total_mb"] - g["used_mb"]) * MB)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.gpus[h]["util"], memory=10)

    def nvmlDeviceGetPowerUsage(self, h):
        return int(self.gpus[h]["power_w"] * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 300_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self.gpus[h]["temp"]

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        e = self.gpus[h].get("energy_mj")
        if e is None:
            raise FakeNVMLError("Not Supported")
        return e


def fake_gpu(name="Tesla V100-SXM2-16GB", total_mb=16384, used_mb=512, util=7, power_w=55.5, temp=41,
             energy_mj=123_456_789):
    return {"name": name, "total_mb": total_mb, "used_mb": used_mb, "util": util, "power_w": power_w, "temp": temp,
            "energy_mj": energy_mj}


def register_gpu_node(name="gpunode", gpus=None, *, serve=True):
    """A live node with fake GPUs whose queues its worker serves."""
    from scheduling import services, telemetry
    from scheduling.models import gpu_queue_name

    fake = FakeNvml(gpus if gpus is not None else [fake_gpu(), fake_gpu()])
    reading = telemetry.read_gpus(fake)
    queues = [f"measure.{name}.cpu"] + ([gpu_queue_name(name, i) for i in range(len(fake.gpus))] if serve else [])
    return services.register_node(name=name, reading=reading, hostname=f"{name}.local", cpu_cores=16,
                                  memory_mb=64000, queues=queues)


def make_job(model, *, util=30.0, mem=2000.0, state="pending", estimate=60.0, **extra):
    from scheduling.models import GpuJob

    return GpuJob.objects.create(team_id=model.team_id, model=model, batch_size=extra.pop("batch_size", 8),
                                 duration_estimate_s=estimate, predicted_util_pct=util, predicted_mem_mb=mem,
                                 state=state, **extra)


def run_job_in_this_process(data, *, device_indices, batch_size, iterations, runtime, max_seconds, mem_limit_mb,
                            predicted_util_pct, limits, nvml=None, should_stop=None, report=None,
                            kind="inference", optimizer="adam", learning_rate=None):
    """scheduling.job_process.run_job_in_child without the child: the runtime the child runs, called here
    with the test's NVML, cancel check and live report (tests that monkeypatch the runtime in-process)."""
    from scheduling import gpu_runtime

    return gpu_runtime.run_data_parallel(data, device_indices=list(device_indices), batch_size=batch_size,
                                         iterations=iterations, runtime=runtime, nvml=nvml, should_stop=should_stop,
                                         max_seconds=max_seconds, mem_limit_mb=mem_limit_mb, report=report,
                                         kind=kind, optimizer=optimizer, learning_rate=learning_rate)
