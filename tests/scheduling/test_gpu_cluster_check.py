"""bench/gpu_cluster_check.sh: on a host without a GPU it says so and exits 0; its job processes take a
GPU slot before anything else and are refused when the GPU's three are held."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling.gpu_isolation import GpuSlots

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="a GPU host runs the real check")
def test_says_no_gpu_here_and_exits_0():
    run = subprocess.run(["bash", "bench/gpu_cluster_check.sh"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("no GPU here") and "PASS" not in run.stdout and "FAIL" not in run.stdout


def test_a_job_process_is_refused_when_the_gpus_three_slots_are_held(tmp_path):
    held = [GpuSlots(tmp_path, 0) for _ in range(3)]
    for s in held:
        s.acquire()
    spec = {"slots_dir": str(tmp_path), "gpu": 0, "model_path": str(tmp_path / "none.onnx"), "batch": 1,
            "iterations": 1, "mem_limit_mb": None, "env": []}
    run = subprocess.run([sys.executable, "bench/gpu_cluster_check.py", "--child", json.dumps(spec)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {"refused": "all 3 job slots of GPU 0 are in use"}
