"""The run-level parallel error is a fraction, and one wild round does not stand for the run."""

import pytest

from tuning.engine.doppler.doppler_rule import DopplerRule
from tuning.engine.doppler.parallel_error import MAX_ROUND_ERROR, as_fraction, summarize_parallel_error


def test_round_errors_become_bounded_fractions():
    assert as_fraction(0.04) == 0.04
    assert as_fraction(-0.04) == 0.04
    assert as_fraction(30.63) == MAX_ROUND_ERROR == 1.0
    assert as_fraction(None) is None and as_fraction(float("nan")) is None


def test_median_over_rounds_keeps_an_outlier_from_standing_for_the_run():
    assert summarize_parallel_error([0.02, 0.03, 152.0]) == pytest.approx(0.03)
    assert summarize_parallel_error([0.02, 0.04]) == pytest.approx(0.03)
    assert summarize_parallel_error([None]) is None and summarize_parallel_error([]) is None


def test_a_rule_with_a_truncated_parallel_timing_reports_a_fraction():
    """A parallel timing 1/150 of the serial one (a truncated measurement) made the old mean read 30-ish."""
    c = DopplerRule(8)
    for _ in range(2):
        c.decide([1.0, 1.01, 0.99], [1.0, 1.0, 1.0])
    c.decide([0.01, 1.0], [1.5, 1.0])  # round error (149 + 0) / 2 = 74.5
    err = c.mean_parallel_error()
    assert 0.0 <= err <= 1.0
    assert err == pytest.approx(0.01, abs=0.01)
