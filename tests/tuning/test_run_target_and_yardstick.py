"""Issue 12 on runs: the executing worker resolves the run's target (this host's CPU as LLVM names it,
its triple, the run's thread count) and stores it; a target built for another CPU is refused where the
local runner measures; the end of a run measures onnxruntime on the same model and stores, shows and
serves the comparison (a tuned module slower than onnxruntime is labelled so)."""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from tuning import services
from tuning.models import TuningRun

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_broker")]

FAST = {"search_population": 16, "genetic_num_iters": 1, "seed": 1,
        "evaluator": {"number": 2, "repeat": 1, "min_repeat_ms": 5}}


def _host_cpu() -> str:
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def _another_cpu() -> str:
    return "skylake" if _host_cpu() != "skylake" else "znver3"


def test_a_run_executed_here_records_this_hosts_mcpu(model_a, user_owner, monkeypatch):
    """Resolution runs for real (in the engine's child); only the tuning itself is replaced."""
    seen = {}

    def engine_stops_at_once(sink, model_proto, config):
        seen["target"] = dict(config.target)
        raise RuntimeError("stop here")

    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, threads=1,
                             target={"kind": "llvm", "num-cores": 2}, enqueue=False)
    monkeypatch.setattr("tuning.adapters.run_engine", engine_stops_at_once)
    services.execute_run(run_id=run.pk, worker="t")
    run.refresh_from_db()
    assert run.target == {"kind": "llvm", "num-cores": 2}  # what the user asked for is kept
    assert run.resolved_target["mcpu"] == _host_cpu()
    assert run.resolved_target["num-cores"] == 1 and run.resolved_target["mtriple"]
    assert seen["target"] == run.resolved_target  # the engine tunes for the resolved target
    assert run.target_key and _host_cpu() in run.target_key
    from tuning.engine.compile.passes import pipeline_key
    from tuning.engine.compile.targets import identity_of

    assert run.pipeline_key == pipeline_key()  # the pipeline the engine extracts and compiles with
    assert run.result_identity == identity_of(run.target_key, run.pipeline_key)


def test_a_cpu_run_is_timed_cold(model_a, user_owner, monkeypatch):
    """The choice is made with the target, in the engine's child: a CPU run's candidates are timed cold
    whatever its model's size (this one's weights fit any cache). It is stored on the run, the engine
    measures with it, the cache key keeps its records apart from warm ones, the page says it."""
    from recordcache.adapters import cache_key_of
    from tuning.engine.measuring.timer import COLD_CPU_EVALUATOR, EvaluatorConfig

    seen = {}

    def engine_stops_at_once(sink, model_proto, config):
        seen["evaluator"] = config.evaluator
        raise RuntimeError("stop here")

    monkeypatch.setattr("tuning.adapters.run_engine", engine_stops_at_once)
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, threads=1, enqueue=False)
    services.execute_run(run_id=run.pk, worker="t")
    run.refresh_from_db()
    assert run.evaluator["regime"] == "cold"
    assert seen["evaluator"] == COLD_CPU_EVALUATOR == EvaluatorConfig.from_any(run.evaluator)
    assert cache_key_of(run)["target_key"].endswith("|timing=cold")
    assert run.timing_words.startswith("cold: each sample flushes the CPU caches")
    # a run whose options set an evaluator (tests, benches) is measured with that one
    TuningRun.objects.filter(pk=run.pk).update(options={**run.options, **FAST})
    run.refresh_from_db()
    from tuning import adapters

    assert adapters.build_engine_config(run, adapters.run_work_dir(run.pk)).evaluator == EvaluatorConfig.from_any(
        FAST["evaluator"])
    assert run.timing_words == "as the run's options set it"


def _resumed_run(model, user, pipeline_key: str):
    """A run an earlier attempt resolved (under `pipeline_key`) and measured, queued again."""
    from tests.factories import MeasurementFactory, TuningTaskFactory
    from tuning.engine.compile.targets import canonical_key, resolve_cpu_target

    run = services.start_run(actor=user, model=model, max_trials=8, threads=1,
                             target={"kind": "llvm", "num-cores": 1}, enqueue=False)
    resolved = {"kind": "llvm", **resolve_cpu_target(num_cores=1)}
    TuningRun.objects.filter(pk=run.pk).update(resolved_target=resolved, target_key=canonical_key(resolved),
                                               pipeline_key=pipeline_key, attempts=1)
    MeasurementFactory.create_batch(3, task=TuningTaskFactory(run=run))
    return run


def test_a_run_resumed_under_another_pipeline_fails_saying_so_and_keeps_its_measurements(model_a, user_owner,
                                                                                         monkeypatch):
    """A run resolved before an upgrade changed the pipeline (the v1 default, here) is not tuned on with
    tasks its records do not match: it fails before the engine starts, naming both pipelines."""
    from tuning.engine.compile import passes as gp
    from tuning.models import Measurement

    old = gp.pipeline_key(gp.SHIPPED_V1)
    run = _resumed_run(model_a, user_owner, old)
    engine_calls = []
    monkeypatch.setattr("tuning.adapters.run_engine", lambda *a, **k: engine_calls.append(a))
    # nor are the old pipeline's journal records committed against the new pipeline's tasks
    monkeypatch.setattr("tuning.adapters.commit_stored_journal", lambda *a, **k: engine_calls.append(a))
    assert services.execute_run(run_id=run.pk, worker="t") == TuningRun.Status.FAILED
    run.refresh_from_db()
    now = gp.pipeline_key(target=run.resolved_target)
    assert now != old and not engine_calls
    assert f"tuned under the pipeline {old}" in run.error and f"compiles with {now}" in run.error, run.error
    assert "start a new run" in run.error
    assert run.pipeline_key == old and Measurement.objects.filter(run=run).count() == 3  # nothing rewritten


def test_a_run_resumed_under_its_own_pipeline_goes_on(model_a, user_owner, monkeypatch):
    from tuning.engine.compile import passes as gp

    run = _resumed_run(model_a, user_owner, gp.pipeline_key(target={"kind": "llvm"}))

    def engine_stops_at_once(sink, model_proto, config):
        raise RuntimeError("the engine started")

    monkeypatch.setattr("tuning.adapters.run_engine", engine_stops_at_once)
    services.execute_run(run_id=run.pk, worker="t")
    run.refresh_from_db()
    assert "the engine started" in run.error, run.error


def test_a_target_built_for_another_cpu_is_refused_with_the_reason(model_a, user_owner):
    """The real engine child refuses before extracting tasks: the run fails saying which CPUs differ. A
    target names a CPU only as a registered node reports it (the closed target schema)."""
    from tests.factories import NodeFactory
    from tuning.engine.compile.targets import host_triple

    other = _another_cpu()
    NodeFactory(name="other-cpu-node", cpu_mcpu=other, cpu_triple=host_triple())
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, threads=1,
                             target={"kind": "llvm", "mcpu": other}, enqueue=False)
    assert services.execute_run(run_id=run.pk, worker="t") == TuningRun.Status.FAILED
    run.refresh_from_db()
    assert run.resolved_target["mcpu"] == other
    assert f"the target was built for the CPU {other!r}, this host is {_host_cpu()!r}" in run.error, run.error


def _finished_run(run: TuningRun, **fields) -> TuningRun:
    values = {"status": TuningRun.Status.SUCCEEDED, "tuned_latency_s": 3e-3, "untuned_latency_s": 6e-3,
              "outputs_match": True, "resolved_target": {"kind": "llvm", "mcpu": "znver3", "num-cores": 1},
              "target_key": '{"kind":"llvm","mcpu":"znver3","num-cores":1}', **fields}
    TuningRun.objects.filter(pk=run.pk).update(**values)
    run.refresh_from_db()
    return run


SLOWER = "Tuned TVM is slower than onnxruntime on this target: deploy onnxruntime"


def test_a_tuned_module_slower_than_onnxruntime_is_labelled_so(model_a, user_owner, client, api_owner):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    run = _finished_run(run, ort_latency_s=1e-3, ratio_to_ort=3.0, faster_engine="onnxruntime",
                        ort_outputs_agree=True, parity_trials=None)
    client.force_login(user_owner)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert f"{SLOWER} (tuned / onnxruntime median 3.00×)" in html
    assert "mcpu znver3" in html and "1.000 ms" in html and "not reached" in html
    body = api_owner.get(f"/api/runs/{run.pk}/").json()
    assert body["faster_engine"] == "onnxruntime" and body["ratio_to_ort"] == 3.0
    assert body["ort_latency_s"] == 1e-3 and body["resolved_target"]["mcpu"] == "znver3"
    assert body["deploy_verdict"].startswith(SLOWER) and body["parity_trials"] is None
    # everywhere the run appears: the run list and its model's page
    for page in ("/runs/", f"/models/{model_a.pk}/"):
        assert SLOWER in client.get(page).content.decode(), page


def test_the_module_download_states_the_decision(model_a, user_owner, api_owner, api_other, api_anon):
    from django.core.files.base import ContentFile

    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    run = _finished_run(run, ort_latency_s=1e-3, ratio_to_ort=3.0, faster_engine="onnxruntime")
    run.module_file.save(f"run{run.pk}-tuned.so", ContentFile(b"\x7fELF"), save=True)
    response = api_owner.get(f"/api/runs/{run.pk}/module/")
    assert response.status_code == 200
    assert response["X-Deploy-Verdict"] == f"{SLOWER} (tuned / onnxruntime median 3.00x)"
    # another team's member gets nothing, not even the verdict; anonymous is refused
    outsider = api_other.get(f"/api/runs/{run.pk}/module/")
    assert outsider.status_code == 404 and "X-Deploy-Verdict" not in outsider
    assert api_anon.get(f"/api/runs/{run.pk}/module/").status_code in (401, 403)


def test_a_faster_tuned_module_says_deploy_it(model_a, user_owner, client):
    run = services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False)
    _finished_run(run, ort_latency_s=4e-3, ratio_to_ort=0.75, faster_engine="tvm", parity_trials=40,
                  parity_wall_s=75.0)
    client.force_login(user_owner)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "faster than onnxruntime on this target: deploy the tuned module" in html
    assert "trial 40 after" in html
    assert SLOWER not in client.get("/runs/").content.decode()


@pytest.mark.slow
def test_a_tiny_run_stores_serves_and_shows_the_onnxruntime_comparison(model_a, user_owner, client):
    """End to end through `manage.py tune --json` (in-process, the Celery task's body): a tiny budget on
    the tiny CNN, then the finish measures onnxruntime at the run's thread count and stores it next to
    the tuned latency; the JSON summary and the run page carry it."""
    out = io.StringIO()
    call_command("tune", str(model_a.pk), "--trials", "8", "--trials-per-round", "8", "--threads", "1",
                 "--target", '{"kind": "llvm", "num-cores": 1}', "--population", "16", "--seed", "1", "--json",
                 "--no-progress", stdout=out, stderr=io.StringIO())
    summary = json.loads(out.getvalue())
    run = TuningRun.objects.get(pk=summary["run"])
    assert run.status == "succeeded", run.error
    assert run.resolved_target["mcpu"] == _host_cpu() and summary["resolved_target"] == run.resolved_target
    assert run.ort_latency_s > 0 and run.ort_outputs_agree is True
    assert run.ratio_to_ort == pytest.approx(run.tuned_latency_s / run.ort_latency_s)
    # the verdict over the compiled timings (any label: this host is shared), named alike everywhere
    assert run.verdict in ("faster", "slower", "within noise", "overloaded") and summary["verdict"] == run.verdict
    assert run.faster_engine == {"faster": "tvm", "slower": "onnxruntime"}.get(run.verdict, "")
    assert summary["faster_engine"] == (run.faster_engine or None)
    assert run.tuned_latency_iqr_s >= 0 and run.ort_latency_iqr_s >= 0 and run.timing_load is not None
    assert summary["tuned_latency_iqr_ms"] == pytest.approx(run.tuned_latency_iqr_s * 1e3)
    assert run.summary["build_host"]["cpu_flags"] and len(run.summary["tuned_samples_s"]) > 1
    # how the tuned module was timed, kept for the deployment package's run.py
    assert run.summary["tuned_timer"] == {"number": 1, "repeat": 15, "min_repeat_ms": 50}
    assert summary["onnxruntime_latency_ms"] == pytest.approx(run.ort_latency_s * 1e3)
    assert summary["ratio_to_onnxruntime"] == run.ratio_to_ort and summary["onnxruntime_outputs_agree"] is True
    ort = run.summary["onnxruntime"]
    assert ort["threads"] == 1 and ort["provider"] == "CPUExecutionProvider" and ort["repeats"] > 1
    client.force_login(user_owner)
    html = client.get(f"/runs/{run.pk}/").content.decode()
    assert "onnxruntime latency" in html and (SLOWER in html) == (run.faster_engine == "onnxruntime")
    assert summary["deploy_verdict"] == run.deploy_verdict and summary["pipeline_key"] == run.pipeline_key
    # the graph passes it was tuned with, in words, on the page and in the summary (the CPU default: NHWC)
    assert summary["pipeline"] == run.pipeline_words and "convs in NHWC" in run.pipeline_words
    assert run.pipeline_words in html
    # how its candidates were chosen to be timed (a CPU run: cold), and why, alike everywhere
    from django.utils.html import escape

    assert run.evaluator["regime"] == "cold" and summary["evaluator"] == run.evaluator
    assert summary["timing"] == run.timing_words and run.timing_words.startswith("cold: ")
    assert escape(run.timing_words) in html
    assert summary["untuned_latency_ms"] and summary["tuned_latency_ms"]
    # time to parity, from the stored curve: consistent with the final estimate and onnxruntime
    from tuning.selectors import time_to_parity

    confirmed = run.verdict in ("faster", "within noise")
    assert (run.parity_trials is not None) == (confirmed and time_to_parity(run, run.ort_latency_s) is not None)


def test_the_compare_page_shows_the_onnxruntime_ratio(model_a, user_owner, client):
    slow, fast = (services.start_run(actor=user_owner, model=model_a, max_trials=8, enqueue=False) for _ in "ab")
    _finished_run(slow, ort_latency_s=1e-3, ratio_to_ort=3.0, faster_engine="onnxruntime")
    _finished_run(fast, ort_latency_s=1e-3, ratio_to_ort=0.5, faster_engine="tvm")
    client.force_login(user_owner)
    html = client.get(f"/runs/compare/?runs={slow.pk}&runs={fast.pk}").content.decode()
    assert "3.00× (slower than onnxruntime)" in html and "0.50×</td>" in html and "mcpu znver3" in html


def test_the_tune_command_says_which_target_it_built_for():
    """The text summary names the resolved target (the host's CPU as LLVM names it), not only the
    request (``{"kind": "llvm"}`` names no CPU)."""
    from tuning.management.commands.tune import Command

    out = io.StringIO()
    cmd = Command(stdout=out)
    summary = {"run": 1, "status": "succeeded", "wall_seconds": 1.0, "measurements": 8, "final_dop": 1,
               "resolved_target": {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}, "tasks": [],
               "tuned_latency_ms": None, "onnxruntime_latency_ms": None, "onnxruntime_error": ""}
    cmd._print({**summary, "pipeline": "BatchNorm folded into the convs (dlopt-relax/2)", "timing": "cold: why"})
    assert 'Target as built and measured: {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}' in out.getvalue()
    assert "Graph passes: BatchNorm folded into the convs (dlopt-relax/2)" in out.getvalue()
    assert "Candidate timing: cold: why" in out.getvalue()
    out.truncate(0)
    cmd._print({**summary, "resolved_target": None})
    assert "Target as built" not in out.getvalue() and "Graph passes" not in out.getvalue()
    assert "Candidate timing" not in out.getvalue()
