"""bench/vs_onnxruntime.py: the wall-time budget, the per-pass ablation rows and the ``overall`` keys."""

import json
from pathlib import Path

import pytest

from bench import vs_onnxruntime as bench
from tuning.engine.compile import passes as gp
from tuning.engine.search.loop import FINISHED_BY_SINK


def _specs(argv):
    args = bench._parse(argv)
    return bench._specs(args, Path("/tmp/unused"), threads=2)


def test_budget_minutes_bounds_tuning_by_wall_time_not_trials():
    specs = _specs(["--models", "small_cnn", "--variants", "mcpu", "--budget-minutes", "2"])
    assert [s["budget_minutes"] for s in specs] == [2.0]
    assert specs[0]["trials"] == bench.UNBOUNDED_TRIALS
    # both given: the trial budget stays, whichever is spent first stops
    specs = _specs(["--models", "small_cnn", "--variants", "mcpu", "--budget-minutes", "2", "--trials", "64"])
    assert specs[0]["trials"] == 64 and specs[0]["budget_minutes"] == 2.0


def test_ablation_gives_one_job_per_pass_selection():
    specs = _specs(["--models", "small_cnn,resnet18", "--variants", "mcpu", "--ablation", "--trials", "8"])
    assert len(specs) == 2 * len(bench.ABLATION)
    small = [s for s in specs if s["model"] == "small_cnn"]
    assert [s["row"] for s in small] == [f"mcpu {label}" for label, _ in bench.ABLATION]
    assert [tuple(s["passes"]) for s in small] == [gp.normalize_passes(p) for _, p in bench.ABLATION]
    assert tuple(small[0]["passes"]) == gp.SHIPPED_V1 and tuple(small[-1]["passes"]) == gp.LAYOUT
    # the second model runs the rows in the reverse order (drift on a shared host spreads over both ends)
    assert [s["row"] for s in specs if s["model"] == "resnet18"] == [s["row"] for s in reversed(small)]
    assert len({s["work_dir"] for s in specs}) == len(specs)


def test_a_forced_evaluator_is_its_own_row_and_reaches_the_engine_config():
    """--evaluator cold/warm: the cache-flush timing TVM documents (one call per sample) or TVM's default in the
    job's TuningConfig, each with a row label of its own, so forced and product-chosen results never share a
    row; without it, the job is timed as the product would time that model on this host."""
    from bench.common import tuning_config
    from tuning.engine.measuring import timer

    (auto,) = _specs(["--models", "small_cnn", "--variants", "mcpu", "--trials", "8"])
    (warm,) = _specs(["--models", "small_cnn", "--variants", "mcpu", "--trials", "8", "--evaluator", "warm"])
    (cold,) = _specs(["--models", "small_cnn", "--variants", "mcpu", "--trials", "8", "--evaluator", "cold"])
    assert (auto["row"], warm["row"], cold["row"]) == ("mcpu", "mcpu warm", "mcpu cold")
    ev = tuning_config(dict(cold, target={"kind": "llvm", "num-cores": 2})).evaluator
    assert ev.enable_cpu_cache_flush and ev.number == 1 and ev.min_repeat_ms == 0
    assert tuning_config(dict(warm, target={"kind": "llvm", "num-cores": 2})).evaluator == timer.default_evaluator("cpu")
    # auto: the product's rule for a CPU target (cold), with its reason in the row
    chosen = bench._evaluator(auto["evaluator"])
    assert chosen == timer.choose_evaluator("cpu").to_dict() and chosen["regime"] == "cold" and chosen["why"]


@pytest.mark.parametrize("argv, message", [
    (["--evaluator", "hot"], "invalid choice"),
    (["--budget-minutes", "0"], "--budget-minutes must be positive"),
    (["--budget-minutes", "-3"], "--budget-minutes must be positive"),
    (["--budget-minutes", "soon"], "invalid float value"),
    (["--trials", "0"], "--trials must be positive"),
    (["--paired-rounds", "2"], "--paired-rounds must be 0 or at least 4"),
    (["--paired-rounds", "-1"], "--paired-rounds must be 0 or at least 4"),
    (["--passes", "fold_batchnorm,rm -rf"], "unknown graph pass"),
    (["--ablation", "--passes", "none"], "drop --passes"),
    (["--variants", "mcpu,../../etc"], "unknown variant"),
])
def test_bad_options_are_refused_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        bench._parse(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def _job(variant, passes, ratio, estimate_ms, tuned_ms):
    return {"variant": variant, "passes": list(passes), "ratio": ratio, "estimate_ms": estimate_ms, "tuned_ms": tuned_ms,
            "estimate_vs_compiled": abs(estimate_ms - tuned_ms) / tuned_ms}


def test_overall_takes_the_default_selection_and_the_largest_estimate_gap():
    rows = [{"model": "a", "jobs": {"mcpu v1": _job("mcpu", gp.SHIPPED_V1, 2.0, 1.0, 2.0),
                                    "mcpu +both": _job("mcpu", gp.LAYOUT, 0.5, 1.0, 1.1)}},
            {"model": "b", "jobs": {"mcpu v1": _job("mcpu", gp.SHIPPED_V1, 8.0, 4.0, 4.0),
                                    "mcpu +both": _job("mcpu", gp.LAYOUT, 2.0, 3.0, 3.0),
                                    "mcpu +both failed": {"error": "boom"}}}]
    overall = bench._overall(rows)
    assert gp.DEFAULT == gp.LAYOUT
    assert overall["tvm_vs_ort_latency_ratio"] == pytest.approx(1.0)  # geomean(0.5, 2.0): the default rows
    assert overall["by_row"] == {"mcpu v1": pytest.approx(4.0), "mcpu +both": pytest.approx(1.0)}
    assert overall["estimate_vs_compiled"] == pytest.approx(0.5)  # model a, v1: |1 - 2| / 2 (every row)
    assert overall["tvm_vs_ort_latency_ratio_no_mcpu"] is None
    assert overall["models_at_or_below_parity"] == ["a"]
    assert overall["calibrated_estimate_vs_compiled"] is None  # no job took a compiled checkpoint


def test_the_research_calibration_adds_the_checkpoints_difference():
    """resnet18 on a 2-core znver3 VM: 25.0 ms estimated at the end, the checkpoint 66.71 ms compiled against
    47.64 ms estimated: 44.07 ms, further from the compiled 30.56 ms than the raw estimate."""
    checkpoint = {"estimate_s": 47.64e-3, "compiled_s": 66.71e-3}
    assert bench._calibrated_ms(25.0e-3, checkpoint) == pytest.approx(44.07)
    assert bench._calibrated_ms(25.0e-3, {"estimate_s": 47.64e-3, "error": "EngineCrashed"}) is None
    assert bench._calibrated_ms(None, checkpoint) is None
    rows = [{"model": "r", "jobs": {"mcpu": {**_job("mcpu", gp.LAYOUT, 1.26, 25.0, 30.56),
                                             "calibrated_estimate_vs_compiled": 0.44}}}]
    assert bench._overall(rows)["calibrated_estimate_vs_compiled"] == pytest.approx(0.44)


@pytest.mark.slow
def test_the_bench_runs_on_small_cnn_within_a_wall_budget(tmp_path):
    out = tmp_path / "vs_ort.json"
    assert bench.main(["--quick", "--models", "small_cnn", "--variants", "mcpu", "--budget-minutes", "0.5",
                       "--repeat", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"tvm_vs_ort_latency_ratio", "estimate_vs_compiled", "by_row"} <= set(result["overall"])
    job = result["models"][0]["jobs"]["mcpu"]
    assert job["passes"] == list(gp.DEFAULT) and job["tuned_outputs_agree"] is True
    # the wall budget, not the (unbounded) trial count, ended tuning: finished, so the final re-measure ran
    assert job["status"] == "succeeded" and job["stop_reason"] == FINISHED_BY_SINK
    assert job["final_remeasure_s"] is not None
    assert result["overall"]["tvm_vs_ort_latency_ratio"] == pytest.approx(job["ratio"])
    # the verdict is the interleaved (paired) timing's, the two blocks' ratio kept beside it
    paired = job["paired"]
    assert paired["rounds"] == 30 and job["ratio"] == paired["ratio"] and job["ratio_blocks"] > 0
    assert paired["tvm_median_ms"] > 0 and paired["ort_median_ms"] > 0 and paired["tvm_iqr_ms"] >= 0
    # every job row carries its task table and where its compiled model's time goes
    assert "analysis_error" not in job
    assert sum(t["trials"] for t in job["tasks"]) == job["trials"]
    estimate_us = sum(t["estimate_us"] or 0 for t in job["tasks"])  # partial when a task has no valid record
    assert job["profile"]["estimate_us"] == pytest.approx(estimate_us)
    if job["estimate_ms"] is not None:  # every task measured (a loaded host may get fewer in the wall budget)
        assert estimate_us == pytest.approx(job["estimate_ms"] * 1e3)
    assert {r["row"] for r in job["profile"]["rows"]} >= {t["name"] for t in job["tasks"]}
