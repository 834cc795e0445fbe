"""The predictor's honest evaluation: leave one model family out, beside a constant and an analytic
FLOPs baseline, with MAE, rank correlation and the unsafe-co-location share (issue 15 item 8)."""
from __future__ import annotations

import numpy as np
import pytest

from scheduling.horus.predictor_eval import _unsafe_share, evaluate_predictor, format_evaluation, model_family
from scheduling.horus.profiles import load_profiles

FAST = {"n_estimators": 20, "max_depth": 3}


def test_families_group_related_models_and_unknown_models_are_their_own():
    assert model_family("vgg11") == model_family("small_cnn") != model_family("resnet18")
    assert model_family("my-new-net") == "my-new-net"


def test_unsafe_share_counts_pairs_called_safe_that_truly_exceed_100():
    pred = np.array([40.0, 50.0, 70.0])
    true = np.array([60.0, 50.0, 30.0])
    got = _unsafe_share(pred, true, ["V100"] * 3)
    # pairs: (40+50=90 safe, true 110 over), (40+70=110 unsafe), (50+70=120 unsafe)
    assert got == {"pairs": 3, "called_safe": 1, "unsafe_share_of_safe": 1.0, "base_rate_over_100": 1 / 3}
    assert _unsafe_share(pred, true, ["V100", "P100", "T4"])["pairs"] == 0  # never across GPU models


def test_evaluation_holds_out_whole_families_and_reports_baselines_beside_the_predictor():
    ev = evaluate_predictor(load_profiles(), xgb_params=FAST)
    assert ev["synthetic"] and ev["sources"] == ["synthetic-roofline-v1"]
    assert {f["held_out_family"] for f in ev["folds"]} == {"residual-cnn", "plain-cnn", "mobile-cnn", "transformer",
                                                           "recurrent"}
    assert next(f for f in ev["folds"] if f["held_out_family"] == "plain-cnn")["models"] == ["small_cnn", "vgg11"]
    assert set(ev["methods"]) == {"predictor", "constant", "analytic_flops"}
    for m in ev["methods"].values():
        assert m["mae_pct"] >= 0 and m["colocation"]["pairs"] > 1000
        assert m["spearman"] is None or -1 <= m["spearman"] <= 1
    text = format_evaluation(ev)
    assert "SYNTHETIC" in text and "analytic_flops" in text and "of them >100%" in text


def test_evaluation_needs_two_families():
    recs = [r for r in load_profiles() if r.model == "resnet18"]
    with pytest.raises(ValueError, match="at least 2 model families"):
        evaluate_predictor(recs)


# ------------------------------------------------------------------ any profile file with a source; online profiling
def _measured_file(tmp_path, rows):
    import json

    (tmp_path / "gpu_profiles_h100.json").write_text(json.dumps({"records": rows}))
    (tmp_path / "zoo_features.json").write_text(json.dumps({"models": {}, "version": 1}))  # not a profile file


def test_profile_sources_read_measured_files_and_fill_zoo_features(tmp_path):
    from scheduling.horus.predictor_eval import load_profile_sources

    _measured_file(tmp_path, [
        {"model": "resnet18", "batch_size": 32, "gpu_model": "H100", "gpu_util_pct": 71.0, "peak_mem_mb": 3000.0,
         "power_w": None, "source": "measured-nvml-h100", "meta": {"mode": "training"}},
        {"model": "no_such_model", "batch_size": 8, "gpu_model": "H100", "gpu_util_pct": 10.0, "peak_mem_mb": 900.0,
         "source": "measured-nvml-h100"},
        {"model": "resnet18", "batch_size": 32, "gpu_model": "H100", "gpu_util_pct": 71.0, "peak_mem_mb": 3000.0},
    ])
    records, skipped = load_profile_sources(tmp_path)
    assert [(r.model, r.source) for r in records] == [("resnet18", "measured-nvml-h100")]
    assert records[0].features["total_flops"] > 0  # the zoo's graph features for resnet18 at batch 32
    assert [s["why"] for s in skipped] == ["no graph features for no_such_model at batch 8", "no 'source' field"]


def test_shipped_profiles_are_all_read_and_synthetic():
    from scheduling.horus.predictor_eval import load_profile_sources

    records, skipped = load_profile_sources()
    assert len(records) == len(load_profiles()) and not skipped
    assert {r.source for r in records} == {"synthetic-roofline-v1"}


def test_online_profile_uses_measured_samples_warm_up_included():
    from scheduling.horus.predictor_eval import online_profile_estimates

    recs = load_profiles()[:2]
    meta = {"util_samples": [0.0] * 10 + [80.0] * 50, "sample_period_s": 1.0}
    measured = type(recs[0])(**{**recs[0].to_dict(), "gpu_util_pct": 80.0, "meta": meta})
    est, is_measured = online_profile_estimates([measured, recs[1]], window_s=20.0, seed=0)
    assert is_measured.tolist() == [True, False]
    assert est[0] == pytest.approx(40.0)  # 10 s of warm-up at 0 and 10 s at 80: a short profile under-reads
    assert abs(est[1] - recs[1].gpu_util_pct) < 10.0  # modeled: truth + the mean of 20 noisy samples


def test_evaluation_reports_online_profiling_beside_the_analytic_baseline_and_labels_it_modeled():
    ev = evaluate_predictor(load_profiles(), seed=0, online_window_s=30.0)
    assert set(ev["methods"]) == {"predictor", "constant", "analytic_flops", "online_profile_30s"}
    assert ev["online_profile"]["records_modeled"] == ev["n_records"] and ev["online_profile"]["gpu_seconds_per_job"] == 30.0
    text = format_evaluation(ev)
    assert "SYNTHETIC" in text and "MODELED" in text
