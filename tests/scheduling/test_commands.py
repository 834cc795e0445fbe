"""Management commands: simulate (table and --json), profile_gpu without a GPU, train_predictor,
load_seed_profiles."""
from __future__ import annotations

import io
import json
from unittest import mock

import pytest
from django.core.management import CommandError, call_command

from scheduling.models import GpuProfile, PredictorVersion, SimulationRun


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_simulate_json_on_a_small_philly_slice():
    out = run("simulate", "--trace", "philly", "--policy", "all", "--seed", "1", "--jobs", "120", "--start", "3000",
              "--gpus", "8", "--predictions", "oracle", "--json")
    result = json.loads(out)
    assert result["trace"] == {"name": "philly", "kind": "philly", "jobs_in_trace": 82247, "jobs_used": 120,
                               "submit_span_s": result["trace"]["submit_span_s"]}
    assert result["cluster"]["gpus"] == 8 and result["method"] == "replay" and result["seed"] == 1
    names = [r["policy"] for r in result["table"]]
    assert "horus" in names and "gandiva" in names and "fifo_exclusive" in names and len(names) >= 7
    for name in names:
        r = result["policies"][name]
        assert r["n_jobs"] == 120 and r["makespan_s"] > 0
    assert result["policies"]["fifo_exclusive"]["shared_gpu_time_frac"] == 0
    again = json.loads(run("simulate", "--trace", "philly", "--policy", "horus", "--seed", "1", "--jobs", "120",
                           "--start", "3000", "--gpus", "8", "--predictions", "oracle", "--json"))
    assert again["policies"]["horus"]["makespan_s"] == result["policies"]["horus"]["makespan_s"]  # seeded


@pytest.mark.django_db
def test_simulate_table_on_alibaba_fill_with_trained_predictor(team_a):
    with mock.patch("scheduling.horus.predictor.DEFAULT_XGB_PARAMS", {"n_estimators": 10, "max_depth": 3}):
        out = run("simulate", "--trace", "alibaba", "--policy", "fgd,best_fit,horus", "--scale", "0.01",
                  "--save", "--team", team_a.slug)
    assert "method fill" in out and "alibaba-2023 x0.01" in out and "util RMSLE" in out
    header = out.splitlines()[4]
    assert header.split()[:3] == ["policy", "allocated_share", "occupied_share"]
    assert PredictorVersion.objects.filter(active=True).count() == 1  # trained because none existed
    run_ = SimulationRun.objects.get()
    assert run_.status == "succeeded" and run_.policies == ["fgd", "best_fit", "horus"]
    assert run_.parameters["scale"] == 0.01 and run_.results["cluster"]["gpus"] < 100


@pytest.mark.django_db
def test_simulate_rejects_bad_arguments():
    with pytest.raises(CommandError, match="Unknown policy 'nope'"):
        run("simulate", "--trace", "philly", "--policy", "nope")
    with pytest.raises(CommandError, match="scale must be in"):
        run("simulate", "--trace", "alibaba", "--scale", "2", "--predictions", "oracle")
    with pytest.raises(CommandError, match="No uploaded trace 999"):
        run("simulate", "--trace", "999")


@pytest.mark.django_db
def test_profile_gpu_refuses_without_a_gpu_and_stores_nothing(use_nvml, no_nvml):
    use_nvml(no_nvml)
    with pytest.raises(CommandError) as exc:
        run("profile_gpu", "--model", "resnet18", "--batch-sizes", "1", "8", "32")
    assert str(exc.value) == "no NVIDIA GPU found (pynvml: NVML Shared Library Not Found)"
    assert not GpuProfile.objects.exists()


@pytest.mark.django_db
def test_profile_gpu_with_a_gpu_but_no_cuda_runtime_stores_nothing(use_nvml, fake_nvml, monkeypatch):
    import tvm

    use_nvml(fake_nvml)
    monkeypatch.setattr(tvm, "cuda", lambda i=0: mock.Mock(exist=False))
    with pytest.raises(CommandError, match="1 batch size\\(s\\) failed: bs 1: no GPU runtime"):
        run("profile_gpu", "--model", "small_cnn", "--batch-sizes", "1")
    assert not GpuProfile.objects.exists()


@pytest.mark.django_db
def test_load_seed_profiles_and_train_predictor_commands():
    out = run("load_seed_profiles")
    n = GpuProfile.objects.count()
    assert f"loaded {n} profile records" in out and n > 100
    run("load_seed_profiles")  # idempotent
    assert GpuProfile.objects.count() == n
    with mock.patch("scheduling.horus.predictor.DEFAULT_XGB_PARAMS", {"n_estimators": 10, "max_depth": 3}):
        summary = json.loads(run("train_predictor", "--k-folds", "2", "--json"))
        text = run("train_predictor", "--k-folds", "2", "--no-activate")
    assert summary["version"] == 1 and summary["active"] and summary["n_records"] == n
    assert summary["util_rmsle"] > 0 and summary["grouped_by"] == "model"
    assert "predictor v2:" in text and "SYNTHETIC" in text and "RMSLE" in text
    assert list(PredictorVersion.objects.values_list("version", "active")) == [(2, False), (1, True)]
