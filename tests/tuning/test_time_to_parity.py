"""Time to parity: the first stored measurement at which the best-so-far end-to-end estimate (sum over
tasks of weight x best latency) reached onnxruntime's latency, from the stored curve."""
from __future__ import annotations

import datetime as dt

import pytest

from tests.factories import MeasurementFactory, TuningRunFactory, TuningTaskFactory
from tuning.models import Measurement
from tuning.selectors import best_so_far_curve, time_to_parity
from tuning.services.finish import _store_time_to_parity

pytestmark = pytest.mark.django_db


@pytest.fixture
def run():
    """Two tasks (weights 1 and 2); measured in this order: task 0 at 4 ms, task 1 failing, task 1 at 3 ms
    (estimate 10 ms), task 0 at 1 ms (7 ms), task 1 at 2 ms (5 ms), one measurement a minute."""
    run = TuningRunFactory(succeeded=True)
    tasks = [TuningTaskFactory(run=run, weight=1.0), TuningTaskFactory(run=run, weight=2.0)]
    for minute, (task, latency) in enumerate([(0, 4e-3), (1, None), (1, 3e-3), (0, 1e-3), (1, 2e-3)], 1):
        m = MeasurementFactory(task=tasks[task], latency_s=latency, error="" if latency else "build failed")
        Measurement.objects.filter(pk=m.pk).update(created_at=run.started_at + dt.timedelta(minutes=minute))
    return run


def test_parity_is_the_first_estimate_at_or_below_the_goal(run):
    assert time_to_parity(run, 7e-3) == {"trials": 4, "wall_s": pytest.approx(240.0), "estimate_s": pytest.approx(7e-3)}
    assert time_to_parity(run, 10e-3)["trials"] == 3  # before that, task 1 had no valid measurement
    assert time_to_parity(run, 4.9e-3) is None  # never reached
    assert time_to_parity(run, None) is None  # no onnxruntime latency
    # the curve the run page plots is the same walk
    assert best_so_far_curve(run)["end_to_end"]["estimate_s"] == pytest.approx([10e-3, 7e-3, 5e-3])


def test_the_finish_stores_it(run):
    run.ort_latency_s, run.tuned_latency_s, run.verdict = 6e-3, 5e-3, "faster"
    _store_time_to_parity(run)
    assert (run.parity_trials, run.parity_wall_s) == (5, pytest.approx(300.0))
    run.verdict = "within noise"
    _store_time_to_parity(run)
    assert run.parity_trials == 5
    run.ort_latency_s = 1e-3
    _store_time_to_parity(run)
    assert run.parity_trials is None and run.parity_wall_s is None


@pytest.mark.parametrize("verdict", ["slower", "overloaded", "no comparison"])
def test_an_estimate_that_crossed_onnxruntime_claims_nothing_unless_the_compiled_model_did(run, verdict):
    """The issue's run: the estimate reached onnxruntime at some trial while the compiled model was 1.54x
    slower. Parity is a claim about the compiled model, so it is not stored."""
    run.ort_latency_s, run.tuned_latency_s, run.verdict = 6e-3, 9.24e-3, verdict
    _store_time_to_parity(run)
    assert run.parity_trials is None and run.parity_wall_s is None
