"""NVML reading (fake pynvml), node registration and the heartbeat task."""
from __future__ import annotations

from unittest import mock

import pytest

from scheduling import services, tasks, telemetry
from scheduling.models import GPU, GpuTelemetry, Node

from .fakes import FakeNvml, fake_gpu, register_gpu_node


@pytest.mark.parametrize("name,mem,expected", [
    ("Tesla V100-SXM2-16GB", 16160, "V100"),
    ("Tesla V100-SXM2-32GB", 32510, "V100M32"),
    ("Tesla P100-PCIE-16GB", 16280, "P100"),
    ("Tesla T4", 15109, "T4"),
    ("NVIDIA A10", 23028, "A10"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100"),
    ("NVIDIA H200", 143771, "H200"),
])
def test_gpu_model_names_are_normalized(name, mem, expected):
    assert telemetry.normalize_gpu_model(name, mem) == expected


def test_read_gpus_with_fake_pynvml(fake_nvml):
    reading = telemetry.read_gpus(fake_nvml)
    assert reading.available and reading.driver_version == "550.54.15"
    g0, g1 = reading.gpus
    assert (g0.index, g0.util_pct, g0.mem_used_mb, g0.power_w, g0.temperature_c) == (0, 7.0, 512.0, 55.5, 41.0)
    assert g0.energy_mj == 123_456_789 and g0.memory_total_mb == 16384 and g0.gpu_model == "V100"
    assert g1.energy_mj is None  # "Not Supported" on that board is not an error


def test_read_gpus_without_driver_says_why(no_nvml):
    reading = telemetry.read_gpus(no_nvml)
    assert not reading.available and reading.gpus == []
    assert reading.summary == "no NVIDIA GPU found (pynvml: NVML Shared Library Not Found)"


def test_heartbeat_task_stores_samples_from_fake_pynvml(db, settings, use_nvml, fake_nvml):
    settings.NODE_NAME = "gpu-box"
    use_nvml(fake_nvml)
    out = tasks.heartbeat(queues=["telemetry", "measure.gpu-box.gpu0", "measure.gpu-box.gpu1"], fanout=False)
    assert out["nvml_available"] and out["samples"] == 2
    node = Node.objects.get(name="gpu-box")
    assert node.nvml_available and node.last_seen is not None and node.cpu_cores > 0
    assert "measure.gpu-box.gpu1" in node.queues
    gpus = list(GPU.objects.filter(node=node).order_by("index"))
    assert [g.queue for g in gpus] == ["measure.gpu-box.gpu0", "measure.gpu-box.gpu1"]
    assert [g.gpu_model for g in gpus] == ["V100", "V100"]
    s0 = GpuTelemetry.objects.get(gpu=gpus[0])
    assert (s0.util_pct, s0.mem_used_mb, s0.power_w, s0.temperature_c, s0.energy_mj) == (7, 512, 55.5, 41, 123_456_789)
    assert GpuTelemetry.objects.get(gpu=gpus[1]).energy_mj is None

    fake_nvml.gpus[0]["util"] = 88
    tasks.heartbeat(fanout=False)
    assert GPU.objects.filter(node=node).count() == 2  # same GPUs, new samples
    assert GpuTelemetry.objects.filter(gpu=gpus[0]).count() == 2
    assert GpuTelemetry.objects.filter(gpu=gpus[0]).order_by("-ts", "-id").first().util_pct == 88


def test_heartbeat_without_gpu_registers_node_with_none(db, settings, use_nvml, no_nvml):
    settings.NODE_NAME = "cpu-box"
    use_nvml(no_nvml)
    out = tasks.heartbeat(fanout=False)
    assert not out["nvml_available"] and out["samples"] == 0
    assert "registered with no GPUs" in out["message"] and "NVML Shared Library Not Found" in out["message"]
    node = Node.objects.get(name="cpu-box")
    assert not node.nvml_available and node.nvml_error == "NVML Shared Library Not Found"
    assert not node.gpus.exists() and not GpuTelemetry.objects.exists()


def test_gpu_that_disappears_is_marked_absent(db):
    node = register_gpu_node("n1", [fake_gpu(), fake_gpu()])
    services.register_node(name="n1", reading=telemetry.read_gpus(FakeNvml([fake_gpu()])))
    assert list(node.gpus.order_by("index").values_list("present", flat=True)) == [True, False]


def test_heartbeat_from_beat_fans_out_to_other_live_nodes(db, settings, use_nvml, no_nvml):
    register_gpu_node("other")
    settings.NODE_NAME = "here"
    use_nvml(no_nvml)
    with mock.patch.object(tasks.heartbeat, "apply_async") as send, \
            mock.patch.object(tasks.place_pending, "delay") as place:
        tasks.heartbeat()
    send.assert_called_once_with(kwargs={"node": "other", "fanout": False}, queue="measure.other.cpu")
    place.assert_not_called()  # nothing pending


def test_targeted_heartbeat_for_another_node_is_skipped(db, settings):
    settings.NODE_NAME = "here"
    assert tasks.heartbeat(node="elsewhere") == {"node": "elsewhere", "skipped": "delivered to here"}
    assert not Node.objects.exists()


def test_gpu_sampler_summarizes_a_run(fake_nvml):
    import time

    with telemetry.GpuSampler(0, interval_s=0.005, nvml=fake_nvml) as sampler:
        fake_nvml.gpus[0].update(util=80, used_mb=4000, energy_mj=123_456_789 + 50_000)
        time.sleep(0.05)
    r = sampler.result()
    assert r["util_max_pct"] == 80 and r["mem_peak_mb"] == 4000 and r["mem_baseline_mb"] == 512
    assert r["energy_j"] == 50.0 and r["energy_source"] == "nvml-counter" and r["samples"] >= 2


def test_rebatched_model_runs_at_the_new_batch(small_cnn_bytes):
    """The job runner's rebatching, checked with onnxruntime's CPU provider (no GPU needed)."""
    import onnxruntime as ort

    from scheduling.gpu_runtime import _inputs, rebatch

    model = rebatch(small_cnn_bytes, 4)
    inputs = _inputs(model)
    assert all(a.shape[0] == 4 for a in inputs.values())
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert sess.run(None, inputs)[0].shape[0] == 4


def test_run_model_without_gpu_raises_no_gpu(no_nvml, small_cnn_bytes):
    from scheduling.gpu_runtime import NoGpuError, run_model_on_gpu

    with pytest.raises(NoGpuError, match=r"^no NVIDIA GPU found \(pynvml: NVML Shared Library Not Found\)$"):
        run_model_on_gpu(small_cnn_bytes, batch_size=1, nvml=no_nvml)
