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
