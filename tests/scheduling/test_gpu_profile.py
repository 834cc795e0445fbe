"""bench/gpu_profile.sh on a host without a GPU: says so, exits 0, and its dry path builds every planned
model and writes the plan (10 families: CNNs, transformers, recurrent; inference and training)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(bool(shutil.which("nvidia-smi")), reason="a GPU host runs the real profile")
def test_says_no_gpu_here_and_its_dry_run_plans_ten_families(tmp_path):
    out = tmp_path / "plan.json"
    run = subprocess.run(["bash", "bench/gpu_profile.sh", "--dry-run", "--json", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("no GPU here") and "dry run: 50 runs planned over 10 families" in run.stdout
    plan = json.loads(out.read_text())
    assert plan["measured"] is False and plan["source"] == "none" and plan["device"] is None
    assert len(plan["families"]) >= 10 and {"cnn", "transformer", "recurrent"} <= set(plan["families"].values())
    kinds = {(r["kind"], r["batch_size"]) for r in plan["runs"]}
    assert {("inference", 1), ("inference", 32), ("train", 8), ("train", 32)} <= kinds
    assert plan["models_built"] == 30


def test_without_dry_run_nothing_is_written(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU host runs the real profile")
    out = tmp_path / "p.json"
    run = subprocess.run(["bash", "bench/gpu_profile.sh", "--json", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("no GPU here") and not out.exists()


def _harness():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_profile_under_test", ROOT / "bench" / "gpu_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_on_a_gpu_host_the_json_says_measured_and_names_the_device(tmp_path, monkeypatch, capsys):
    """The harness's bookkeeping around its child runs (GPU detection and the child faked: no GPU here)."""
    gp = _harness()
    device = {"name": "NVIDIA H100 80GB HBM3", "gpu_model": "H100", "memory_total_mb": 81559.0}
    monkeypatch.setattr(gp, "gpu_or_reason", lambda: (True, "1 GPU", device))
    monkeypatch.setattr(gp, "cuda_runtimes", lambda: {"tvm": False, "onnxruntime": True})
    monkeypatch.setattr(gp, "run_one", lambda spec, iterations: {**spec, "runtime": "onnxruntime",
                                                                 "proc_util_mean_pct": 40.0, "proc_mem_peak_mb": 900.0})
    out = tmp_path / "profile.json"
    assert gp.main(["--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["source"] == "measured" and report["device"]["name"] == "NVIDIA H100 80GB HBM3"
    assert len(report["families_measured"]) == 10 and len(report["profiles"]) == 30  # every inference run
    assert {s["why"] for s in report["skipped"]} == {"a training step needs TVM built with CUDA"}
    monkeypatch.setattr(gp, "cuda_runtimes", lambda: {"tvm": False, "onnxruntime": False})
    assert gp.main([]) == 2 and "no runtime here can use it" in capsys.readouterr().out
