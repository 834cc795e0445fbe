"""The deployment package (GET /api/runs/{id}/package/): a real compiled module of a 2-node model,
packaged through the service, unzipped and run by its own run.py in an isolated interpreter; a manifest
naming a CPU feature this host lacks makes run.py refuse (exit 3); another team gets 404; the zip's member
names never come from user input."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from django.core.files.base import ContentFile

from core import services as core_services
from tests.tuning.onnx_builders import tiny_dense
from tuning import services
from tuning.engine.deploy.package import MEMBERS
from tuning.models import TuningRun
from tuning.services.package import build_run_package

pytestmark = [pytest.mark.django_db]


@pytest.fixture(scope="module")
def tiny_module(tmp_path_factory) -> tuple[bytes, dict, dict]:
    """relu(x @ W) compiled for this host's CPU (untuned: the package does not care how it was tuned):
    the module's bytes, its resolved target and the build host's facts, as a run's finish records them."""
    import onnx

    from tuning.engine.compile.pipeline import compile_model
    from tuning.engine.compare import build_host_facts
    from tuning.engine.compile.targets import resolve_cpu_target

    target = resolve_cpu_target(num_cores=1)
    path = tmp_path_factory.mktemp("module") / "tuned_module.so"
    compile_model(onnx.load_from_string(tiny_dense()), target, database=None).export_library(str(path))
    return path.read_bytes(), target, build_host_facts(target)


def _succeeded_run(team, user, tiny_module, *, name="dense") -> TuningRun:
    module, target, build_host = tiny_module
    model = core_services.register_model(team=team, name=name, data=tiny_dense(), filename="dense.onnx")
    run = services.start_run(actor=user, model=model, max_trials=8, threads=1, enqueue=False)
    TuningRun.objects.filter(pk=run.pk).update(
        status=TuningRun.Status.SUCCEEDED, resolved_target=target, target_key="key-of-target",
        pipeline_key="relax-pipeline/1", tuned_latency_s=2e-6, tuned_latency_iqr_s=1e-7, untuned_latency_s=3e-6,
        ort_latency_s=4e-6, ort_latency_iqr_s=2e-7, ratio_to_ort=0.5, faster_engine="tvm", verdict="faster",
        estimated_latency_s=1.5e-6,
        summary={"build_host": build_host, "tuned_timer": {"number": 1, "repeat": 15, "min_repeat_ms": 50}})
    run.refresh_from_db()
    run.module_file.save(f"run{run.pk}-tuned.so", ContentFile(module), save=True)
    return run


def _unzip(data: bytes, into: Path) -> Path:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert sorted(zf.namelist()) == sorted(MEMBERS)
        zf.extractall(into)
    return into


def _run_py(folder: Path, *args: str) -> subprocess.CompletedProcess:
    # -I: isolated, only the interpreter's own site-packages; the project is not on sys.path
    return subprocess.run([sys.executable, "-I", str(folder / "run.py"), *args], cwd=folder, capture_output=True,
                          text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "TVM_NUM_THREADS": "1"})


def test_the_package_runs_anywhere_its_target_runs(team_a, user_owner, tiny_module, tmp_path):
    run = _succeeded_run(team_a, user_owner, tiny_module)
    folder = _unzip(build_run_package(run=run), tmp_path / "pkg")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 16], "onnx_shape": [1, 16]}]
    assert manifest["outputs"][0]["name"] == "y" and manifest["outputs"][0]["shape"] == [1, 16]
    target = manifest["target"]
    assert target["kind"] == "llvm" and target["mcpu"] == run.resolved_target["mcpu"] and target["mtriple"]
    assert target["cpu_flags_recorded"] and set(target["required_cpu_flags"]) <= set(target["build_host_cpu_flags"])
    assert manifest["versions"]["apache-tvm"] and manifest["versions"]["apache-tvm-ffi"]
    assert manifest["pipeline"] == {"target_key": "key-of-target", "pipeline_key": "relax-pipeline/1",
                                    "result_identity": run.result_identity}
    latency = manifest["latency"]
    assert (latency["tuned_median_s"], latency["tuned_iqr_s"]) == (2e-6, 1e-7)
    assert (latency["onnxruntime_median_s"], latency["onnxruntime_iqr_s"]) == (4e-6, 2e-7)
    assert latency["verdict"] == "faster" and latency["verdict_sentence"] == run.deploy_verdict
    assert (latency["repeats"], latency["min_repeat_ms"]) == (15, 50)  # how the run timed its figure
    assert manifest["run"]["model_name"] == "dense"

    result = _run_py(folder, "--runs", "5", "--warmup", "1")
    assert result.returncode == 0, result.stderr
    assert "output y: shape [1, 16] float32" in result.stdout
    # the manifest figure's timer beside that figure, and the per-call time an application sees
    assert "latency: median " in result.stdout and "over 15 repeats of at least 50 ms" in result.stdout
    assert "TVM time_evaluator, threads: 1; the timer of the manifest's figure" in result.stdout
    assert "per call from Python: median " in result.stdout and "over 5 runs" in result.stdout
    assert "measured when tuned: median 0.0020 ms (IQR 0.0001 ms) on the build host" in result.stdout

    # a given input is used: relu(x @ W) of zeros is zeros
    np.save(tmp_path / "zeros.npy", np.zeros((1, 16), dtype="float32"))
    result = _run_py(folder, "--runs", "2", "--repeats", "0", "--input", f"x={tmp_path / 'zeros.npy'}",
                     "--save-outputs", str(tmp_path / "out.npz"))
    assert result.returncode == 0, result.stderr
    assert "time_evaluator, " not in result.stdout and "per call from Python" in result.stdout
    assert not np.load(tmp_path / "out.npz")["y"].any()
    # a wrong shape is refused before anything runs
    np.save(tmp_path / "bad.npy", np.zeros((2, 16), dtype="float32"))
    result = _run_py(folder, "--input", f"x={tmp_path / 'bad.npy'}")
    assert result.returncode == 2 and "expected shape [1, 16] float32" in result.stderr


def test_run_py_refuses_a_host_without_the_targets_cpu_features(team_a, user_owner, tiny_module, tmp_path):
    run = _succeeded_run(team_a, user_owner, tiny_module)
    folder = _unzip(build_run_package(run=run), tmp_path / "pkg")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["target"]["required_cpu_flags"].append("avx512_fake")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    result = _run_py(folder)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "this host cannot run this package" in result.stderr and "avx512_fake" in result.stderr
    assert "latency" not in result.stdout


def test_the_api_serves_the_package_to_the_team_only(team_a, user_owner, tiny_module, api_owner, api_other,
                                                     api_anon):
    run = _succeeded_run(team_a, user_owner, tiny_module)
    response = api_owner.get(f"/api/runs/{run.pk}/package/")
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"] == f'attachment; filename="run{run.pk}-package.zip"'
    with zipfile.ZipFile(io.BytesIO(response.content)) as zf:
        assert sorted(zf.namelist()) == sorted(MEMBERS)
    outsider = api_other.get(f"/api/runs/{run.pk}/package/")
    assert outsider.status_code == 404 and "X-Deploy-Verdict" not in outsider
    assert api_anon.get(f"/api/runs/{run.pk}/package/").status_code in (401, 403)


def test_a_run_without_a_module_has_no_package(model_a, user_owner, api_owner):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    response = api_owner.get(f"/api/runs/{run.pk}/package/")
    assert response.status_code == 404 and "not finished successfully" in response.json()["detail"]


def test_member_names_are_fixed_whatever_the_model_is_called(team_a, user_owner, tiny_module, api_owner):
    run = _succeeded_run(team_a, user_owner, tiny_module, name="../../etc/evil\"; x=.so")
    response = api_owner.get(f"/api/runs/{run.pk}/package/")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="run{run.pk}-package.zip"'
    with zipfile.ZipFile(io.BytesIO(response.content)) as zf:
        assert sorted(zf.namelist()) == sorted(MEMBERS)
        assert json.loads(zf.read("manifest.json"))["run"]["model_name"] == run.model.name  # data, not a path


def test_the_run_page_offers_the_package_and_says_how_to_use_it(team_a, user_owner, tiny_module, client):
    run = _succeeded_run(team_a, user_owner, tiny_module)
    client.force_login(user_owner)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert f'href="/api/runs/{run.pk}/package/"' in html
    for line in services.package.package_usage(run):
        assert line in html


def _with_latency(folder: Path, **values) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["latency"].update(values)
    path.write_text(json.dumps(manifest))


def test_run_py_times_the_module_as_the_manifest_says_and_ignores_an_edited_timer(team_a, user_owner, tiny_module,
                                                                                  tmp_path):
    folder = _unzip(build_run_package(run=_succeeded_run(team_a, user_owner, tiny_module)), tmp_path / "pkg")
    _with_latency(folder, repeats=3, min_repeat_ms=1)
    result = _run_py(folder, "--runs", "1", "--warmup", "0")
    assert result.returncode == 0, result.stderr
    assert "over 3 repeats of at least 1 ms" in result.stdout and "IQR n/a: one sample" in result.stdout
    assert "over 2 repeats" in _run_py(folder, "--runs", "1", "--repeats", "2").stdout  # the user's choice wins

    for bad in ("abc", -1, 10**12, 2.5, True):
        _with_latency(folder, repeats=2, min_repeat_ms=bad)
        result = _run_py(folder, "--runs", "1")
        assert result.returncode == 0, result.stderr
        assert f"latency.min_repeat_ms is {bad!r}, not a whole number from 0 to 10000; ignored" in result.stderr
        assert "over 2 repeats of at least 50 ms" in result.stdout
        assert "the manifest does not record how its figure was timed" in result.stdout
    _with_latency(folder, tuned_median_s="fast", tuned_iqr_s=None)
    result = _run_py(folder, "--runs", "1", "--repeats", "0")
    assert result.returncode == 0 and "measured when tuned" not in result.stdout and "time_evaluator" not in result.stdout
    assert _run_py(folder, "--repeats", "-1").returncode == 2


def test_a_run_finished_before_its_timer_was_recorded_packages_without_one(team_a, user_owner, tiny_module,
                                                                           tmp_path):
    run = _succeeded_run(team_a, user_owner, tiny_module)
    TuningRun.objects.filter(pk=run.pk).update(summary={"build_host": run.summary["build_host"]})
    run.refresh_from_db()
    folder = _unzip(build_run_package(run=run), tmp_path / "pkg")
    assert json.loads((folder / "manifest.json").read_text())["latency"]["min_repeat_ms"] is None
    result = _run_py(folder, "--runs", "1", "--repeats", "2")
    assert result.returncode == 0, result.stderr
    assert "over 2 repeats of at least 50 ms" in result.stdout
    assert "the manifest does not record how its figure was timed" in result.stdout


def test_run_pys_fallback_timer_is_the_final_timings():
    # run.py cannot import the project: its fallback for a manifest without a timer is a copy of compare's
    from tuning.engine import compare
    from tuning.engine.deploy import package_run

    assert (package_run.DEFAULT_REPEATS, package_run.DEFAULT_MIN_REPEAT_MS) == (
        compare.FINAL_REPEATS, compare.FINAL_MIN_REPEAT_MS)
