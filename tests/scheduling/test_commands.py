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


# --------------------------------------------------------------------- simulate --trace PATH (issue 15)
THREE_SATURATED = ("timestamp,duration,num_gpus,gpu_time,cluster,gpu_util\n"
                   + "2017-10-01 00:00:00,3600,1,3600,c1,100\n" * 3)
NODES = "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,8,V100M16\nn2,64000,262144,2,T4\n"
PODS = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,8000,16000,1,500\np2,8000,16000,1,1000\n"
        "p3,4000,8000,2,1000\np4,1000,1000,1,250\n")


def _write(tmp_path, name, text: str | bytes):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(p)


def _without_walls(results: dict) -> dict:
    return {name: {k: v for k, v in r.items() if k != "wall_s"} for name, r in results["policies"].items()}


@pytest.mark.django_db
def test_simulate_a_local_philly_csv_with_true_utilizations(tmp_path):
    path = _write(tmp_path, "three.csv", THREE_SATURATED)
    result = json.loads(run("simulate", "--trace", path, "--gpus", "1", "--gpus-per-node", "1", "--predictions",
                            "oracle", "--json"))
    assert result["trace"]["name"] == "three.csv" and result["trace"]["jobs_used"] == 3
    assert result["assumptions"]["jobs_with_trace_utilization"] == 3
    for name, r in result["policies"].items():
        assert r["makespan_s"] >= 3 * 3600 - 1e-6, name  # three saturated 1-hour jobs on one GPU: >= 3 h
        assert {"mean_wait_s", "util_mean_pct", "occupancy_pct"} <= set(r) and r["util_mean_pct"] <= 100.0 + 1e-9


@pytest.mark.django_db
def test_simulate_a_local_alibaba_pod_list_on_its_node_list(tmp_path):
    pods, nodes = _write(tmp_path, "pods.csv", PODS), _write(tmp_path, "nodes.csv", NODES)
    result = json.loads(run("simulate", "--trace", pods, "--nodes", nodes, "--scale", "1", "--policy", "fgd,best_fit",
                            "--predictions", "oracle", "--json"))
    assert result["method"] == "fill" and result["cluster"]["gpus"] == 10
    assert result["cluster"]["gpu_mix"] == {"T4": 2, "V100M16": 8}
    for r in result["policies"].values():
        assert 0 < r["allocated_share"] <= 1 and r["unallocated_gpus"] >= 0


@pytest.mark.django_db
@pytest.mark.parametrize("files,message", [
    ({"trace": "nope.csv"}, "Cannot read trace .*No such file"),
    ({"trace": b"\x00\xff\xfe garbage \x89PNG"}, "not UTF-8 text|binary content|unknown trace format|bad CSV"),
    ({"trace": "a,b\n1,2\n"}, "unknown trace format"),
    ({"trace": "timestamp,duration,num_gpus\n2017-10-01 00:00:00,-5,1\n"}, "line 2, column 'duration'"),
    ({"trace": "timestamp,duration,num_gpus,gpu_util\n2017-10-01 00:00:00,5,1,250\n"}, "column 'gpu_util'"),
    ({"trace": "timestamp,duration,num_gpus\nyesterday,5,1\n"}, "column 'timestamp'"),
    ({"trace": "timestamp,duration,num_gpus\n"}, "no jobs"),
    ({"trace": NODES}, "is an Alibaba node list"),
    ({"trace": THREE_SATURATED, "nodes": NODES}, "node list goes with an Alibaba pod list"),
    ({"trace": PODS, "nodes": PODS}, "not an Alibaba node list"),
    ({"trace": PODS, "nodes": "sn,cpu_milli,memory_mib,gpu,model\nn1,1,1,99,V100\n"}, "column 'gpu'"),
])
def test_simulate_refuses_malformed_local_files_with_a_readable_error(tmp_path, files, message):
    args = []
    for opt, content in files.items():
        path = str(tmp_path / content) if content == "nope.csv" else _write(tmp_path, f"{opt}.csv", content)
        args += [f"--{opt}", path]
    with pytest.raises(CommandError, match=message):
        run("simulate", *args, "--predictions", "oracle")


@pytest.mark.django_db
def test_simulate_refuses_files_over_the_trace_size_limit(tmp_path, settings):
    import gzip

    settings.SCHEDULING_MAX_TRACE_BYTES = 2000
    big = _write(tmp_path, "big.csv", THREE_SATURATED * 200)
    with pytest.raises(CommandError, match="over the 2,000 bytes trace size limit"):
        run("simulate", "--trace", big, "--predictions", "oracle")
    bomb = _write(tmp_path, "bomb.csv.gz", gzip.compress(THREE_SATURATED.encode() * 500))
    with pytest.raises(CommandError, match="inflates to more than"):
        run("simulate", "--trace", bomb, "--predictions", "oracle")
    with pytest.raises(CommandError, match="is a directory"):
        run("simulate", "--trace", str(tmp_path), "--predictions", "oracle")
    with pytest.raises(CommandError, match="--nodes goes with a local Alibaba pod list"):
        run("simulate", "--trace", "philly", "--nodes", big)


@pytest.mark.django_db
def test_command_and_api_take_one_path_to_the_same_result(api_owner, team_a, django_capture_on_commit_callbacks):
    from scheduling import services, tasks

    params = {"jobs": 80, "start": 5000, "gpus": 8, "predictions": "oracle"}
    with mock.patch.object(tasks.run_simulation, "delay"), django_capture_on_commit_callbacks(execute=True):
        resp = api_owner.post("/api/simulations/", {"team": team_a.pk, "trace": "philly", "seed": 2,
                                                    "policies": ["horus", "horus_migrate", "gandiva"],
                                                    "parameters": params}, format="json")
    assert resp.status_code == 201, resp.json()
    stored = services.execute_simulation(run_id=resp.json()["id"])  # what the task runs
    assert stored.status == "succeeded", stored.error
    cli = json.loads(run("simulate", "--trace", "philly", "--seed", "2", "--policy", "horus,horus_migrate,gandiva",
                         "--jobs", "80", "--start", "5000", "--gpus", "8", "--predictions", "oracle", "--json"))
    assert _without_walls(cli) == _without_walls(stored.results)
    assert cli["params"] == stored.results["params"] and cli["scale"] == stored.results["scale"]


@pytest.mark.django_db
def test_train_predictor_eval_prints_the_family_held_out_figures_and_stores_nothing():
    with mock.patch("scheduling.horus.predictor.DEFAULT_XGB_PARAMS", {"n_estimators": 10, "max_depth": 3}), \
            mock.patch("scheduling.horus.predictor_eval.DEFAULT_XGB_PARAMS", {"n_estimators": 10, "max_depth": 3}):
        out = run("train_predictor", "--eval")
        body = json.loads(run("train_predictor", "--eval", "--json"))
    assert "leave one model family out" in out and "SYNTHETIC" in out and "analytic_flops" in out
    assert set(body["methods"]) == {"predictor", "constant", "analytic_flops"} and body["synthetic"]
    assert not PredictorVersion.objects.exists()


def test_simulation_choices_offer_what_start_simulation_accepts():
    from scheduling import services

    c = services.simulation_choices()
    assert c["shipped_traces"][:2] == ["philly", "alibaba"] and "horus" in c["policies"]
    assert "alibaba_multigpu20" in c["shipped_traces"]  # the artifact's other pod lists are shipped too
    p = c["parameters"]
    assert p["horus_lookahead"] == {"default": 5, "type": "int"}
    assert p["interference"]["choices"][0] == "fitted" and p["method"]["choices"] == ["replay", "fill"]
    assert p["predictor_error"]["default"] == 0.0


@pytest.mark.django_db
def test_the_bench_inputs_are_what_the_service_uses_on_a_fresh_database(monkeypatch):
    """bench/scheduling.py calls run_experiment with experiments.default_inputs(); services.simulate on a
    database without profiles of its own loads the same seed profiles and trains the same predictor."""
    from scheduling import adapters, services
    from scheduling.horus import experiments

    monkeypatch.setattr(experiments, "_PREDICTORS", {})
    params = {"jobs": 60, "start": 4000, "gpus": 8}
    with mock.patch("scheduling.horus.predictor.DEFAULT_XGB_PARAMS", {"n_estimators": 10, "max_depth": 3}):
        service, used_predictor = services.simulate(trace=adapters.trace_input("philly", None), policies=["horus"],
                                                    seed=0, parameters=params)
        bench = experiments.run_experiment(trace="philly", policies=["horus"], seed=0, params=params,
                                           **experiments.default_inputs())
    assert used_predictor and _without_walls(service) == _without_walls(bench)
    assert service["assumptions"] == bench["assumptions"]
