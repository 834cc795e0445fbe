"""The verdict rule (tuning.engine.verdict): only compiled timings decide, a spread overlap is "within
noise", an overloaded host never yields a clean verdict, and the estimate's gap is explained."""
from __future__ import annotations

import pytest

from tuning.engine import verdict as v

FAST = [1.00, 1.02, 1.01, 0.99, 1.03, 1.00, 1.01]  # ms, tight
SLOW = [2.00, 2.05, 1.98, 2.01, 2.02, 1.99, 2.03]
NOISY_FAST = [0.8, 1.0, 1.3, 1.1, 0.9, 1.6, 1.4]  # IQR 0.95-1.35: covers FAST's
NOISY_SLOW = [1.0, 1.9, 2.1, 1.5, 2.0, 1.2, 2.2]  # IQR 1.35-2.05: covers SLOW's


def test_a_clear_win_and_a_clear_loss():
    win = v.verdict(FAST, SLOW)
    assert win.label == v.FASTER and win.faster_engine == "tvm"
    assert win.ratio == pytest.approx(1.01 / 2.01)
    assert win.sentence.startswith("Tuned TVM is faster than onnxruntime on this target: deploy the tuned module")
    loss = v.verdict(SLOW, FAST)
    assert loss.label == v.SLOWER and loss.faster_engine == "onnxruntime"
    assert loss.sentence.startswith("Tuned TVM is slower than onnxruntime on this target: deploy onnxruntime")


def test_overlapping_spreads_are_within_noise_whatever_the_medians():
    outcome = v.verdict(FAST, NOISY_FAST)
    assert outcome.tuned_median < outcome.ort_median  # the medians alone would call a winner
    assert outcome.label == v.WITHIN_NOISE and outcome.faster_engine is None
    assert "within noise" in outcome.sentence
    assert v.verdict(NOISY_SLOW, SLOW).label == v.WITHIN_NOISE


def test_median_and_iqr_are_those_of_the_samples():
    outcome = v.verdict([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    assert (outcome.tuned_median, outcome.tuned_iqr) == (3, 2)
    assert (outcome.ort_median, outcome.ort_iqr) == (30, 20)


def test_an_overloaded_host_is_flagged_never_a_clean_verdict():
    outcome = v.verdict(FAST, SLOW, v.HostLoad(load=5.3, cores=2))
    assert outcome.label == v.FLAGGED and outcome.faster_engine is None
    assert "host load 5.30 was above the 2 core(s)" in outcome.flagged_reason
    assert outcome.sentence.startswith("No verdict: host load 5.30")
    # load at or below the cores the timing uses is fine
    assert v.verdict(FAST, SLOW, v.HostLoad(load=2.0, cores=2)).label == v.FASTER
    # without onnxruntime the tuned timing is still flagged
    assert v.verdict(FAST, None, v.HostLoad(load=9.0, cores=1)).label == v.FLAGGED


def test_no_comparison_without_samples():
    assert v.verdict(FAST, None).label == v.NO_COMPARISON
    assert v.verdict(None, SLOW).label == v.NO_COMPARISON
    assert v.verdict(FAST, []).sentence == ""


def test_the_estimate_gap_is_shown_above_15_percent_and_explained():
    assert v.estimate_gap(1.0e-3, 1.1e-3) is None
    gap = v.estimate_gap(220.7e-6, 388.1e-6)  # the run
    assert gap["ratio"] == pytest.approx(388.1 / 220.7) and gap["gap"] > 0.15
    assert "76 % above the per-task estimate" in gap["note"] and "compiled measurement only" in gap["note"]
    below = v.estimate_gap(1.0e-3, 0.5e-3)
    assert "50 % below" in below["note"]
    assert v.estimate_gap(None, 1.0) is None and v.estimate_gap(1.0, None) is None


def _compare(tmp_path, cpu_target, monkeypatch, loads):
    """compile_and_compare on a 2-node model with the host's load average read from ``loads``."""
    import onnx

    from tests.tuning.onnx_builders import tiny_dense
    from tuning.engine import compare

    readings = iter(loads)
    monkeypatch.setattr(compare, "_load_now", lambda: next(readings))
    return compare.compile_and_compare(onnx.load_from_string(tiny_dense()), str(tmp_path), cpu_target,
                                       threads=1, repeat=5, min_repeat_ms=5)


def test_the_final_timing_on_an_overloaded_host_is_repeated_once_then_flagged(tmp_path, cpu_target, monkeypatch):
    res = _compare(tmp_path, cpu_target, monkeypatch, [9.0] * 6)
    assert [a["label"] for a in res["timing_attempts"]] == [v.FLAGGED, v.FLAGGED]
    assert res["verdict"]["label"] == v.FLAGGED and res["faster_engine"] is None
    assert "host load 9.00 was above the 1 core(s)" in res["verdict"]["flagged_reason"]
    assert res["tuned_latency_s"] > 0 and res["tuned_latency_iqr_s"] >= 0  # the numbers are kept, flagged


def test_a_host_that_calms_down_gets_a_clean_verdict_on_the_second_try(tmp_path, cpu_target, monkeypatch):
    res = _compare(tmp_path, cpu_target, monkeypatch, [0.2, 9.0, 0.3, 0.2, 0.4, 0.3])
    assert [a["label"] for a in res["timing_attempts"]][0] == v.FLAGGED and len(res["timing_attempts"]) == 2
    assert res["verdict"]["label"] in (v.FASTER, v.SLOWER, v.WITHIN_NOISE)
    assert res["ratio_to_onnxruntime"] == pytest.approx(res["tuned_latency_s"] / res["onnxruntime_latency_s"])
    assert res["build_host"]["versions"]["apache-tvm"]
