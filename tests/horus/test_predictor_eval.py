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
