"""GPU slot groups (CUDA MPS) with a fake device-query layer: no GPU is needed, none is used."""

import os
import subprocess
import sys
import types

import pytest

from tuning.engine.measuring import gpu_slots

from tuning.engine.process import sandbox
from tuning.engine.measuring.gpu_slots import DeviceQuery, MpsStatus, NeedsGPU, ensure_mps, gpu_slot_groups, list_gpus

SMI = "0, NVIDIA H200, GPU-aaa, 9.0, 143771\n1, NVIDIA A100-SXM4-80GB, GPU-bbb, 8.0, 81920\n"


class FakeDriver:
    """nvidia-smi and nvidia-cuda-mps-control as a host with ``smi`` GPUs and, optionally, MPS."""

    def __init__(self, smi=SMI, mps_installed=True, mps_running=False):
        self.smi, self.mps_installed, self.mps_running = smi, mps_installed, mps_running
        self.calls = []

    def which(self, name):
        if name == "nvidia-smi":
            return "/usr/bin/nvidia-smi" if self.smi is not None else None
        return "/usr/bin/" + name if self.mps_installed else None

    def run(self, args, input=None, **kwargs):
        self.calls.append((args, input, (kwargs.get("env") or {}).get("CUDA_MPS_PIPE_DIRECTORY")))
        if args[0] == "nvidia-smi":
            return subprocess.CompletedProcess(args, 0, self.smi, "")
        if args[-1] == "-d":
            self.mps_running = True
            return subprocess.CompletedProcess(args, 0, "", "")
        return subprocess.CompletedProcess(args, 0 if self.mps_running else 1, "", "")

    def query(self):
        return DeviceQuery(run=self.run, which=self.which)


def test_no_gpu_here_says_it_needs_one():
    q = FakeDriver(smi=None).query()
    assert list_gpus(q) == []
    with pytest.raises(NeedsGPU, match="needs a GPU"):
        gpu_slots.require_gpus(q)


def test_gpus_and_their_arch_come_from_the_device(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = list_gpus(FakeDriver().query())
    assert [(g.index, g.arch, g.uuid) for g in gpus] == [(0, "sm_90", "GPU-aaa"), (1, "sm_80", "GPU-bbb")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbb")
    assert [g.index for g in list_gpus(FakeDriver().query())] == [1]


def test_mps_is_started_when_not_running_and_checked(tmp_path):
    drv = FakeDriver(mps_running=False)
    st = ensure_mps(str(tmp_path), drv.query())
    assert st.running and st.started_here and st.pipe_dir == str(tmp_path)
    assert [c[0][-1] for c in drv.calls] == ["nvidia-cuda-mps-control", "-d", "nvidia-cuda-mps-control"]
    assert all(c[2] == str(tmp_path) for c in drv.calls)  # one pipe directory throughout
    again = ensure_mps(str(tmp_path), drv.query())
    assert again.running and not again.started_here


def test_without_mps_a_gpu_measures_in_parallel_only_inside_its_timing_window(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    drv = FakeDriver(mps_installed=False)
    st = ensure_mps(str(tmp_path), drv.query())
    assert not st.running and "not found" in st.reason
    groups = gpu_slot_groups(list_gpus(drv.query()), st, max_dop_per_gpu=4)
    assert [g.max_dop for g in groups] == [4, 4]
    assert all("DLOPT_TIMING_LOCK" in g.env and "CUDA_MPS_PIPE_DIRECTORY" not in g.env for g in groups)
    # timed concurrently, time-sliced contexts would time each other's kernels: serial only
    concurrent = gpu_slot_groups(list_gpus(drv.query()), st, max_dop_per_gpu=4, exclusive_timing=False)
    assert [g.max_dop for g in concurrent] == [1, 1]


def test_one_slot_group_per_gpu_with_mps(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    drv = FakeDriver()
    groups = gpu_slot_groups(list_gpus(drv.query()), ensure_mps(str(tmp_path), drv.query()), max_dop_per_gpu=4)
    assert [(g.gpu.index, g.max_dop, g.mps) for g in groups] == [(0, 4, True), (1, 4, True)]
    assert groups[1].env == {"CUDA_VISIBLE_DEVICES": "GPU-bbb", "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path),
                             "DLOPT_TIMING_LOCK": gpu_slots.timing_lock_path(groups[1].gpu)}
    # shared by the group's workers (whose own TMPDIRs are private), in this user's runtime directory
    assert groups[1].env["DLOPT_TIMING_LOCK"].startswith(sandbox.runtime_root() + os.sep)
    # one timing lock per GPU: two devices' workers never wait on each other
    assert groups[0].env["DLOPT_TIMING_LOCK"] != groups[1].env["DLOPT_TIMING_LOCK"]
    concurrent = gpu_slot_groups(list_gpus(drv.query()), ensure_mps(str(tmp_path), drv.query()), exclusive_timing=False)
    assert all("DLOPT_TIMING_LOCK" not in g.env for g in concurrent)


def _fake_ctx(dop="auto"):
    from tuning.engine.measuring.timer import EvaluatorConfig

    cfg = types.SimpleNamespace(dop=dop, timeout_sec=30.0, evaluator=EvaluatorConfig(), dop_rule=None)
    return types.SimpleNamespace(config=cfg, device_type="cuda", cores=[0, 1], ledger=None, work_dir="/tmp")


def test_the_gpu_runner_needs_a_gpu(monkeypatch):
    from tuning.engine.runners import plugins

    monkeypatch.setattr(gpu_slots, "list_gpus", lambda query=None: [])
    with pytest.raises(NeedsGPU, match="needs a GPU"):
        plugins._gpu_runner(_fake_ctx())


def test_the_gpu_runner_makes_one_device_runner_per_gpu(monkeypatch):
    from tuning.engine.runners import plugins
    from tuning.engine.measuring.timer import default_evaluator

    made = []

    class FakeRunner:
        def __init__(self, **kw):
            self.kw, self.rule, self.ledger, self.device_index = kw, types.SimpleNamespace(dop=1), None, 0
            made.append(self)

    monkeypatch.setattr(gpu_slots, "list_gpus", lambda query=None: list_gpus(FakeDriver().query()))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu_slots, "ensure_mps", lambda pipe_dir, query=None: MpsStatus(True, True, "/tmp/mps"))
    monkeypatch.setattr(plugins, "PooledAsyncRunner", FakeRunner)
    runner = plugins._gpu_runner(_fake_ctx())
    assert len(made) == 2 and len(runner.runners) == 2
    assert [m.kw["worker_env"]["CUDA_VISIBLE_DEVICES"] for m in made] == ["GPU-aaa", "GPU-bbb"]
    assert all(len(m.kw["slots"]) == gpu_slots.MAX_DOP_PER_GPU for m in made)
    assert made[0].kw["evaluator"] == default_evaluator("cuda")  # the GPU default, not the CPU one


def test_multi_device_runner_deals_by_each_devices_dop():
    from tuning.engine.runners.multi_device import MultiDeviceRunner

    class Dev:
        def __init__(self, dop):
            self.rule, self.ledger, self.got, self.device_index = types.SimpleNamespace(dop=dop), None, [], 0

        def run(self, inputs):
            self.got.extend(inputs)
            return [f"fut-{x}" for x in inputs]

    a, b = Dev(3), Dev(1)
    futs = MultiDeviceRunner([a, b])._inst.run(list(range(8)))  # the Python side TVM calls into
    assert futs == [f"fut-{i}" for i in range(8)]  # in the caller's order
    assert (len(a.got), len(b.got)) == (6, 2)


def test_a_queue_worker_and_a_local_runner_on_one_gpu_share_its_timing_lock(monkeypatch):
    """Whichever measures a GPU (a run's local runner, a remote queue's worker), the timing lock is
    the GPU's own (named by its UUID), so their candidates are never timed at the same time."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    drv = FakeDriver()
    group = gpu_slot_groups(list_gpus(drv.query()), MpsStatus(False))[1]
    env = gpu_slots.queue_worker_env(1, drv.query())
    assert env["DLOPT_TIMING_LOCK"] == group.env["DLOPT_TIMING_LOCK"] and "GPU-bbb" in env["DLOPT_TIMING_LOCK"]
    assert env["TVM_USE_RUNTIME_LIB"] == "1"


def test_a_runner_in_a_timing_window_waits_for_the_others_and_keeps_its_own_kernel_cache(tmp_path):
    """Workers of a GPU's slot group time one at a time: a call's (and a round's) deadline allows for
    the pool's other windows, and the workers share a kernel cache of their own, gone at shutdown."""
    from tuning.engine.runners.pooled import PooledAsyncRunner
    from tuning.engine.measuring.slots import Slot

    slots = [Slot(k, (0,), 1) for k in range(4)]
    plain = PooledAsyncRunner._cls(threads=1, slots=slots, timeout_sec=10.0)
    windowed = PooledAsyncRunner._cls(threads=1, slots=slots, timeout_sec=10.0,
                                      worker_env={"DLOPT_TIMING_LOCK": str(tmp_path / "gpu.lock")})
    try:
        assert not plain.exclusive_timing and "DLOPT_CUDA_CACHE_DIR" not in plain.worker_env
        cache = windowed.worker_env["DLOPT_CUDA_CACHE_DIR"]
        assert os.path.isdir(cache) and oct(os.stat(cache).st_mode & 0o777) == "0o700"
        assert windowed.round_timeout(8, 4) > plain.round_timeout(8, 4)
        assert windowed.round_timeout(8, 1) == plain.round_timeout(8, 1)  # alone, nobody to wait for
    finally:
        plain.shutdown()
        windowed.shutdown()
    assert not os.path.exists(cache)


@pytest.mark.skipif(bool(__import__("shutil").which("nvidia-smi")), reason="a GPU host runs the real check")
@pytest.mark.parametrize("args", [[], ["--budgets"]])
def test_gpu_check_says_no_gpu_here_and_exits_0(args):
    """bench/gpu_check.sh on a host without a GPU: a clear message, nothing measured, exit 0; and its
    Python side, run as the module the script runs, reaches the same answer (its imports resolve)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = subprocess.run(["bash", "bench/gpu_check.sh", *args], cwd=root, capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and "no GPU here" in script.stdout
    module = subprocess.run([sys.executable, "-m", "bench.gpu_check", "check", "", "budgets" if args else "all"],
                            cwd=root, capture_output=True, text=True, timeout=120)
    assert module.returncode == 0 and "no GPU here" in module.stdout, module.stderr[-2000:]


def test_gpu_check_budget_judgement():
    """What --budgets reports for a budget: the rank correlation, and per task whether the budget keeps the
    reference's fastest candidate and how much slower (by the reference) the one it picks is."""
    from bench.gpu_check import pick_quality, spearman

    names = ["mm_t32", "mm_t64", "mm_t128", "dw_t32", "dw_t64"]
    reference = [3.0, 2.0, 2.1, 1.0, 5.0]
    assert spearman(reference, reference) == pytest.approx(1.0)
    assert spearman(reference, [-x for x in reference]) == pytest.approx(-1.0)
    same = pick_quality([3.1, 2.05, 2.2, 1.1, 4.0], reference, names)
    assert same == {"tasks": 2, "same_best": 2, "max_regret": 0.0}
    swapped = pick_quality([3.0, 2.2, 2.1, 1.0, 5.0], reference, names)  # mm picks t128, 5 % slower
    assert swapped["same_best"] == 1 and swapped["max_regret"] == pytest.approx(0.05)
    assert pick_quality([None, 2.0, 2.1, 1.0, None], reference, names)["tasks"] == 2  # failures skipped
